// The process group over a duplicate of MPI_COMM_WORLD. Every MPI call's result is checked: MPI's
// default handler would abort without saying which call failed. Every collective is started
// non-blocking and polled with a deadline, after an agreement on what the call is.
#include "xgrad/distributed/process_group.hpp"

#include <mpi.h>
#include <stdlib.h>  // on_exit

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "xgrad/core/error.hpp"

namespace xgrad::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// MPI counts are ints; longer buffers go in pieces of this many elements.
constexpr std::size_t kChunk = std::size_t{1} << 30;
constexpr unsigned long long kAll = std::numeric_limits<unsigned long long>::max();

void check(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(call, ": rank ", rank, ": MPI error: ", std::string(text, static_cast<std::size_t>(len)));
}

MPI_Comm comm_of(std::uintptr_t handle) {
  static_assert(sizeof(MPI_Comm) <= sizeof(std::uintptr_t), "MPI_Comm must fit in a uintptr_t");
  MPI_Comm comm;
  std::memcpy(&comm, &handle, sizeof comm);
  return comm;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Polls `done` until it returns true or `timeout` seconds pass (then false, with the seconds
// waited). The first 100 us spin (short waits stay short); then sleeps that double from 50 us
// to 1 ms, so a long wait costs a poll per millisecond.
template <class Done>
bool poll(Done&& done, double timeout, double& waited) {
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds nap(0);
  for (;;) {
    if (done()) return true;
    waited = seconds_since(start);
    if (waited >= timeout) return false;
    if (waited < 1e-4) {
      std::this_thread::yield();
      continue;
    }
    nap = std::clamp(nap * 2, std::chrono::microseconds(50), std::chrono::microseconds(1000));
    std::this_thread::sleep_for(nap);
  }
}

[[noreturn]] void end_job(std::uintptr_t comm, const std::string& line, int code = 1) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  MPI_Abort(comm_of(comm), code);
  std::_Exit(code);
}

std::string timeout_line(const std::string& what, int rank, double waited, double timeout) {
  char seconds[64];
  std::snprintf(seconds, sizeof seconds, "%.1f s (the timeout is %g s", waited, timeout);
  return what + ": rank " + std::to_string(rank) + " waited " + seconds +
         "; XGRAD_DIST_TIMEOUT sets it) for the other ranks: one is stopped, hung, gone, or in other collectives; "
         "ending the job";
}

const char* doing(Call call) {
  switch (call) {
    case Call::allreduce_sum:
      return "in allreduce_sum";
    case Call::allreduce_sum_double:
      return "in allreduce_sum (double)";
    case Call::allreduce_max:
      return "in allreduce_max";
    case Call::allreduce_min:
      return "in allreduce_min";
    case Call::iallreduce_sum:
      return "in iallreduce_sum";
    case Call::broadcast:
      return "in broadcast";
    case Call::broadcast_string:
      return "in broadcast (string)";
    case Call::barrier:
      return "in barrier";
    case Call::data_parallel:
      return "constructing a DataParallel";
    case Call::exit:
      return "leaving the program";
  }
  return "in an unknown call";
}

// What a timeout names: the call and its size.
std::string describe(Call call, std::uint64_t n) {
  const std::string count = std::to_string(n);
  switch (call) {
    case Call::allreduce_sum:
      return "allreduce_sum of " + count + " floats";
    case Call::allreduce_sum_double:
      return "allreduce_sum of a double";
    case Call::allreduce_max:
      return "allreduce_max of an integer";
    case Call::allreduce_min:
      return "allreduce_min of an integer";
    case Call::iallreduce_sum:
      return "iallreduce_sum of " + count + " floats";
    case Call::broadcast:
      return "broadcast of " + count + " floats";
    case Call::broadcast_string:
      return "broadcast of a string";
    case Call::barrier:
      return "barrier";
    case Call::data_parallel:
      return "DataParallel (the check that every rank is constructing one)";
    case Call::exit:
      return "exit (the check that every rank is leaving the program)";
  }
  return "an unknown call";
}

// The agreement before each collective: one MAX-allreduce of four integers gives the largest
// and the smallest (call, rank) and length. In an allreduce of max(call << 32 | rank) and of
// max(~(call << 32 | rank)), the first names the highest call (and its highest rank), the second
// the lowest call (and its lowest rank).
struct Agreement {
  unsigned long long in[4] = {}, out[4] = {};

  void fill(Call call, int rank, std::uint64_t n) {
    const unsigned long long key =
        (static_cast<unsigned long long>(call) << 32) | static_cast<unsigned long long>(rank);
    in[0] = key;
    in[1] = ~key;
    in[2] = n;
    in[3] = kAll - n;
  }
  int start(MPI_Comm comm, MPI_Request* request) {
    return MPI_Iallreduce(in, out, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm, request);
  }

  // Empty when every rank is in `call` (with the same n, if check_lengths); else what differs.
  std::string difference(Call call, int rank, std::uint64_t n, bool check_lengths) const {
    const unsigned long long high = out[0], low = ~out[1];
    const auto call_of = [](unsigned long long key) { return static_cast<Call>(key >> 32); };
    const auto rank_of = [](unsigned long long key) { return static_cast<int>(key & 0xffffffffull); };
    if (call_of(high) != call_of(low)) {
      const unsigned long long other = call_of(high) != call ? high : low;
      return "rank " + std::to_string(rank) + " is " + doing(call) + " while rank " + std::to_string(rank_of(other)) +
             " is " + doing(call_of(other)) + " (every rank must make the same collective calls, in the same order)";
    }
    const unsigned long long longest = out[2], shortest = kAll - out[3];
    if (check_lengths && longest != shortest) {
      return "rank " + std::to_string(rank) + " passed " + std::to_string(n) +
             " elements, but the ranks' lengths range from " + std::to_string(shortest) + " to " +
             std::to_string(longest) + " (every rank must pass the same length)";
    }
    return {};
  }
};

}  // namespace

const char* call_name(Call call) {
  switch (call) {
    case Call::allreduce_sum:
    case Call::allreduce_sum_double:
      return "allreduce_sum";
    case Call::allreduce_max:
      return "allreduce_max";
    case Call::allreduce_min:
      return "allreduce_min";
    case Call::iallreduce_sum:
      return "iallreduce_sum";
    case Call::broadcast:
    case Call::broadcast_string:
      return "broadcast";
    case Call::barrier:
      return "barrier";
    case Call::data_parallel:
      return "DataParallel";
    case Call::exit:
      return "exit";
  }
  return "unknown";
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

ProcessGroup& ProcessGroup::world() {
  static ProcessGroup group;
  return group;
}

ProcessGroup::ProcessGroup() {
  if (const char* v = std::getenv("XGRAD_DIST_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(seconds > 0))
      fail("ProcessGroup: XGRAD_DIST_TIMEOUT '", v, "' is not a number of seconds > 0");
    timeout_ = seconds;
  }
  if (!launched_by_mpi()) return;
  int provided = 0;
  // Only the thread that runs backward calls MPI; the kernel threads never do.
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    fail("ProcessGroup: MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "ProcessGroup", rank_);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::memcpy(&comm_, &comm, sizeof comm);
  // The status main returned (or exit was given) decides how the job ends: glibc passes it here.
  // Elsewhere leaving is taken as a success: the check at exit still ends the job at once when
  // another rank is in a collective, and by the timeout when it is busy elsewhere.
#if defined(__GLIBC__)
  on_exit(&ProcessGroup::leave, this);
#else
  std::atexit([] { ProcessGroup::leave(0, &ProcessGroup::world()); });
#endif
}

void ProcessGroup::leave(int status, void* self) {
  ProcessGroup& g = *static_cast<ProcessGroup*>(self);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g.size_ > 1) {
    // MPI_Finalize would wait for every rank, and a rank waiting in a collective for this one
    // would never get there.
    if (status != 0) {
      end_job(g.comm_,
              "ProcessGroup: rank " + std::to_string(g.rank_) + " is leaving the program with status " +
                  std::to_string(status) + ": ending the job",
              status);
    }
    try {
      g.agree_and_check(Call::exit, 0, false);
    } catch (const std::exception& e) {
      end_job(g.comm_, e.what());
    }
  }
  MPI_Comm comm = comm_of(g.comm_);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  MPI_Finalize();
}

void ProcessGroup::set_timeout(double seconds) {
  if (!(seconds > 0)) fail("ProcessGroup::set_timeout: ", seconds, " is not a number of seconds > 0");
  timeout_ = seconds;
}

void ProcessGroup::agree_and_check(Call call, std::uint64_t n, bool check_lengths) {
  if (size_ == 1) return;
  Agreement a;
  a.fill(call, rank_, n);
  MPI_Request request = MPI_REQUEST_NULL;
  const char* name = call_name(call);
  check(a.start(comm_of(comm_), &request), name, rank_);
  double waited = 0;
  const bool done = poll(
      [&] {
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), name, rank_);
    return flag != 0;
      },
      timeout_, waited);
  if (!done) end_job(comm_, timeout_line(describe(call, n), rank_, waited, timeout_));
  const std::string difference = a.difference(call, rank_, n, check_lengths);
  if (!difference.empty()) fail(name, ": ", difference);
}

void ProcessGroup::agree(Call call, std::uint64_t n) { agree_and_check(call, n, true); }

namespace {

// Runs one started collective to its end, or ends the job at the timeout.
void finish(MPI_Request& request, Call call, std::uint64_t n, int rank, std::uintptr_t comm, double timeout) {
  double waited = 0;
  const bool done = poll(
      [&] {
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), call_name(call), rank);
    return flag != 0;
      },
      timeout, waited);
  if (!done) end_job(comm, timeout_line(describe(call, n), rank, waited, timeout));
}

}  // namespace

void ProcessGroup::allreduce_sum(float* data, std::size_t n) {
  if (size_ == 1) return;
  agree_and_check(Call::allreduce_sum, n, true);
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - at));
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, data + at, count, MPI_FLOAT, MPI_SUM, comm_of(comm_), &r), "allreduce_sum",
          rank_);
    finish(r, Call::allreduce_sum, n, rank_, comm_, timeout_);
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
  agree_and_check(Call::allreduce_sum_double, 1, true);
  double out = 0;
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, comm_of(comm_), &r), "allreduce_sum", rank_);
  finish(r, Call::allreduce_sum_double, 1, rank_, comm_, timeout_);
  return out;
}

std::uint64_t ProcessGroup::allreduce_max(std::uint64_t v) {
  if (size_ == 1) return v;
  agree_and_check(Call::allreduce_max, 1, true);
  unsigned long long in = v, out = 0;
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_of(comm_), &r), "allreduce_max", rank_);
  finish(r, Call::allreduce_max, 1, rank_, comm_, timeout_);
  return out;
}

std::uint64_t ProcessGroup::allreduce_min(std::uint64_t v) {
  if (size_ == 1) return v;
  agree_and_check(Call::allreduce_min, 1, true);
  unsigned long long in = v, out = 0;
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm_of(comm_), &r), "allreduce_min", rank_);
  finish(r, Call::allreduce_min, 1, rank_, comm_, timeout_);
  return out;
}

// The agreement's and the reduction's requests, and what the messages name.
struct Request::State {
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // agreement, reduction
  Agreement agreement;
  bool agreed = false;
  std::uint64_t n = 0;
  std::string what;
  double timeout = 0;
  int rank = 0;
  std::uintptr_t comm = 0;
};

Request::Request() = default;
Request::Request(Request&&) noexcept = default;
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (pending()) wait();
    state_ = std::move(other.state_);
  }
  return *this;
}
Request::~Request() {
  if (pending()) wait();
}

Request ProcessGroup::iallreduce_sum(float* data, std::size_t n, std::string what, double timeout) {
  // Checked on one process too, so a bad value does not wait for a run under mpirun; NaN was taken as 0.
  if (!(timeout >= 0)) fail("iallreduce_sum: timeout ", timeout, " is not a number of seconds >= 0 (0: the group's)");
  Request r;
  if (size_ == 1) return r;
  if (n > kChunk) fail("iallreduce_sum: rank ", rank_, ": ", n, " elements is more than one call takes (", kChunk, ")");
  auto s = std::make_unique<Request::State>();
  s->n = n;
  s->what = std::move(what);
  s->timeout = timeout > 0 ? timeout : timeout_;
  s->rank = rank_;
  s->comm = comm_;
  s->agreement.fill(Call::iallreduce_sum, rank_, n);
  check(s->agreement.start(comm_of(comm_), &s->requests[0]), "iallreduce_sum", rank_);
  const int rc =
      MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_of(comm_), &s->requests[1]);
  if (rc != MPI_SUCCESS) {
    // The agreement is in flight and MPI owns its buffers: this rank cannot go on.
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    end_job(comm_, s->what + ": rank " + std::to_string(rank_) +
                       ": MPI error: " + std::string(text, static_cast<std::size_t>(len)));
  }
  r.state_ = std::move(s);
  return r;
}

bool Request::test() {
  if (!state_) return true;
  State& s = *state_;
  if (!s.agreed) {
    int flag = 0;
    if (MPI_Test(&s.requests[0], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      end_job(s.comm, s.what + ": rank " + std::to_string(s.rank) + ": MPI error");
    if (!flag) return false;
    s.agreed = true;
    // This rank's reduction is in flight and no other rank will join it: only the end is left.
    const std::string difference = s.agreement.difference(Call::iallreduce_sum, s.rank, s.n, true);
    if (!difference.empty()) end_job(s.comm, s.what + ": " + difference + "; ending the job");
  }
  int flag = 0;
  if (MPI_Test(&s.requests[1], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
    end_job(s.comm, s.what + ": rank " + std::to_string(s.rank) + ": MPI error");
  if (flag) state_.reset();
  return flag != 0;
}

void Request::wait() {
  if (!state_) return;
  double waited = 0;
  if (!poll([this] { return test(); }, state_->timeout, waited)) {
    end_job(state_->comm, timeout_line(state_->what, state_->rank, waited, state_->timeout));
  }
}

void ProcessGroup::broadcast(float* data, std::size_t n, int root) {
  if (root < 0 || root >= size_) fail("broadcast: root ", root, " is not a rank of this group of ", size_);
  if (size_ == 1) return;
  agree_and_check(Call::broadcast, n, true);
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - at));
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data + at, count, MPI_FLOAT, root, comm_of(comm_), &r), "broadcast", rank_);
    finish(r, Call::broadcast, n, rank_, comm_, timeout_);
  }
}

void ProcessGroup::broadcast(std::string& s, int root) {
  if (root < 0 || root >= size_) fail("broadcast: root ", root, " is not a rank of this group of ", size_);
  if (size_ == 1) return;
  agree_and_check(Call::broadcast_string, 0, false);
  unsigned long long n = s.size();
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_of(comm_), &r), "broadcast", rank_);
  finish(r, Call::broadcast_string, 0, rank_, comm_, timeout_);
  s.resize(n);
  for (std::size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min<std::size_t>(kChunk, n - at));
    check(MPI_Ibcast(s.data() + at, count, MPI_CHAR, root, comm_of(comm_), &r), "broadcast", rank_);
    finish(r, Call::broadcast_string, 0, rank_, comm_, timeout_);
  }
}

void ProcessGroup::barrier() {
  // The agreement is itself a barrier: no rank leaves it before every rank has entered.
  agree_and_check(Call::barrier, 0, false);
}

void ProcessGroup::abort(int code) {
  if (size_ > 1) MPI_Abort(comm_of(comm_), code);
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
