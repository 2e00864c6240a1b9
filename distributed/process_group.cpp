// The process group over MPI_COMM_WORLD. Every MPI call's result is checked: MPI's default
// handler would abort without saying which call failed.
#include "xgrad/distributed/process_group.hpp"

#include <mpi.h>

#include <cstdlib>
#include <limits>
#include <vector>

#include "xgrad/core/error.hpp"

namespace xgrad::distributed {

namespace {

// MPI counts are ints; longer buffers go in pieces of this many elements.
constexpr std::size_t kChunk = std::size_t{1} << 30;

void check(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(call, ": rank ", rank, ": MPI error: ", std::string(text, static_cast<std::size_t>(len)));
}

// Finalizes MPI at exit, after every other static destructor that might still use it.
struct Finalizer {
  ~Finalizer() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    MPI_Finalize();
  }
};

MPI_Request* as_request(std::uintptr_t& handle) { return reinterpret_cast<MPI_Request*>(handle); }

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

ProcessGroup& ProcessGroup::world() {
  static Finalizer finalizer;
  static ProcessGroup group;
  return group;
}

ProcessGroup::ProcessGroup() {
  if (!launched_by_mpi()) return;
  int provided = 0;
  // Only the thread that runs backward calls MPI; the kernel threads never do.
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) fail("ProcessGroup: MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

void ProcessGroup::check_lengths(const char* call, std::size_t n) {
  if (size_ == 1) return;
  // One small collective gives the longest and the shortest length at once.
  unsigned long long mine[2] = {n, std::numeric_limits<unsigned long long>::max() - n}, all[2];
  check(MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD), call, rank_);
  const unsigned long long longest = all[0], shortest = std::numeric_limits<unsigned long long>::max() - all[1];
  if (longest != shortest) {
    fail(call, ": rank ", rank_, " passed ", n, " elements, but the ranks' lengths range from ", shortest, " to ", longest,
         " (every rank must pass the same length)");
  }
}

void ProcessGroup::allreduce_sum(float* data, std::size_t n) {
  check_lengths("allreduce_sum", n);
  if (size_ == 1) return;
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - at));
    check(MPI_Allreduce(MPI_IN_PLACE, data + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce_sum", rank_);
  }
}

void ProcessGroup::allreduce_mean(float* data, std::size_t n) {
  allreduce_sum(data, n);
  const float inv = 1.f / static_cast<float>(size_);
  if (size_ > 1) {
    for (std::size_t i = 0; i < n; ++i) data[i] *= inv;
  }
}

double ProcessGroup::allreduce_sum(double v) {
  if (size_ == 1) return v;
  double out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "allreduce_sum", rank_);
  return out;
}

std::uint64_t ProcessGroup::allreduce_max(std::uint64_t v) {
  if (size_ == 1) return v;
  unsigned long long in = v, out = 0;
  check(MPI_Allreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD), "allreduce_max", rank_);
  return out;
}

std::uint64_t ProcessGroup::allreduce_min(std::uint64_t v) {
  if (size_ == 1) return v;
  unsigned long long in = v, out = 0;
  check(MPI_Allreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD), "allreduce_min", rank_);
  return out;
}

Request ProcessGroup::iallreduce_sum(float* data, std::size_t n) {
  Request r;
  if (size_ == 1) return r;
  if (n > kChunk) fail("iallreduce_sum: rank ", rank_, ": ", n, " elements is more than one call takes (", kChunk, ")");
  auto* req = new MPI_Request;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req);
  if (rc != MPI_SUCCESS) {
    delete req;
    check(rc, "iallreduce_sum", rank_);
  }
  r.handle_ = reinterpret_cast<std::uintptr_t>(req);
  return r;
}

bool Request::test() {
  if (!handle_) return true;
  int done = 0;
  MPI_Request* req = as_request(handle_);
  check(MPI_Test(req, &done, MPI_STATUS_IGNORE), "Request::test", ProcessGroup::world().rank());
  if (done) {
    delete req;
    handle_ = 0;
  }
  return done != 0;
}

void Request::wait() {
  if (!handle_) return;
  MPI_Request* req = as_request(handle_);
  const int rc = MPI_Wait(req, MPI_STATUS_IGNORE);
  delete req;
  handle_ = 0;
  check(rc, "Request::wait", ProcessGroup::world().rank());
}

void ProcessGroup::broadcast(float* data, std::size_t n, int root) {
  if (root < 0 || root >= size_) fail("broadcast: root ", root, " is not a rank of this group of ", size_);
  check_lengths("broadcast", n);
  if (size_ == 1) return;
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - at));
    check(MPI_Bcast(data + at, count, MPI_FLOAT, root, MPI_COMM_WORLD), "broadcast", rank_);
  }
}

void ProcessGroup::broadcast(std::string& s, int root) {
  if (root < 0 || root >= size_) fail("broadcast: root ", root, " is not a rank of this group of ", size_);
  if (size_ == 1) return;
  unsigned long long n = s.size();
  check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD), "broadcast", rank_);
  s.resize(n);
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min<std::size_t>(kChunk, n - at));
    check(MPI_Bcast(s.data() + at, count, MPI_CHAR, root, MPI_COMM_WORLD), "broadcast", rank_);
  }
}

void ProcessGroup::barrier() {
  if (size_ > 1) check(MPI_Barrier(MPI_COMM_WORLD), "barrier", rank_);
}

void ProcessGroup::abort(int code) {
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace xgrad::distributed

#if defined(__SANITIZE_ADDRESS__)
// Open MPI and PMIx unload the components they do not select (in MPI_Init) and the rest (in
// MPI_Finalize). LeakSanitizer, which runs at exit, then reports their never-freed allocations
// as "<unknown module>", which no suppression can name. In sanitizer builds only, libraries stay
// mapped, so tests/lsan_openmpi.supp names Open MPI's leaks and nothing else is hidden.
extern "C" int dlclose(void*) { return 0; }
#endif
