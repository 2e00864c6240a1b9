// Threads and the tape: a graph belongs to the thread that recorded it (misuse is a clear error),
// and several threads may train one module at once, its parameters' gradients summing safely.
//
// Shapes: B batch, T length, C d_model, H heads, F FFN width.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <xtensor/xmath.hpp>

#include "run_program.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"

using namespace xgrad;
using xgrad::testing::ScopedEnv;

namespace {

// Runs fn on a new thread and hands back what it threw (Catch2's assertions are not
// thread-safe, so tests assert on the main thread).
std::exception_ptr on_thread(const std::function<void()>& fn) {
  std::exception_ptr error;
  std::thread([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  return error;
}

// Runs body(thread index) on `count` threads released together, so their passes overlap;
// rethrows the first exception any of them threw.
void run_together(int count, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::exception_ptr> errors(count);
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < count) std::this_thread::yield();
      try {
        body(t);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Sets the kernel thread count for a test case and restores the previous one.
struct KernelThreads {
  explicit KernelThreads(int n) : previous(num_threads()) { set_num_threads(n); }
  ~KernelThreads() { set_num_threads(previous); }
  int previous;
};

constexpr std::size_t B = 2, T = 8, C = 32, H = 4, F = 64;

nn::AttentionMask causal() {
  nn::AttentionMask mask;
  mask.causal = true;
  return mask;
}

// The input of pass k: the same for every thread and every run.
Tensor pass_input(int k) {
  Generator g(1000 + static_cast<std::uint64_t>(k));
  return Tensor(g.uniform({B, T, C}, -1.f, 1.f));
}

// One forward and backward of the block on input k, adding into its parameters' gradients.
// L = mean(y * y) + mean(y), so the gradient reaches every parameter.
void train_pass(const nn::TransformerBlock& block, int k) {
  const Tensor y = block.forward(pass_input(k), causal()).output;
  (mean(y * y) + mean(y)).backward();
}

std::vector<Array> gradients(const nn::Module& m) {
  std::vector<Array> out;
  for (const auto& [name, p] : m.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(p.has_grad());
    out.push_back(p.grad());
  }
  return out;
}

// max |got - want| <= rel * max |want|, per parameter.
void require_close(const nn::Module& m, const std::vector<Array>& got, const std::vector<Array>& want, float rel) {
  const NamedTensors params = m.named_parameters();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("parameter " << params[i].first);
    REQUIRE(got[i].shape() == want[i].shape());
    const float scale = xt::amax(xt::abs(want[i]))();
    const float diff = xt::amax(xt::abs(got[i] - want[i]))();
    REQUIRE(scale > 0.f);
    CHECK(diff <= rel * scale);
  }
}

nn::TransformerBlockOptions block_options(float dropout) {
  return nn::TransformerBlockOptions(C, H).d_ff(F).dropout(dropout).norm(nn::Norm::pre);
}

}  // namespace

TEST_CASE("backward on another thread than the one that recorded the graph is a clear error", "[threads][bad_input]") {
  Tensor w(Array{1.f, 2.f}, true);
  Tensor y = sum(w * w);
  const std::exception_ptr error = on_thread([&] { y.backward(); });
  REQUIRE(error);
  REQUIRE_THROWS_AS(std::rethrow_exception(error), Error);
  REQUIRE_THROWS_WITH(std::rethrow_exception(error), Catch::Contains("backward") && Catch::Contains("another thread") &&
                                                         Catch::Contains("thread that recorded it"));
  REQUIRE_FALSE(w.has_grad());
  // The refused call left the graph intact: the recording thread can still use it.
  y.backward();
  REQUIRE((w.grad() == Array{2.f, 4.f}));

  // A graph recorded by a thread that has ended (its tape is gone) is refused the same way.
  Tensor z;
  REQUIRE_FALSE(on_thread([&] { z = sum(w * 3.f); }));
  REQUIRE_THROWS_WITH(z.backward(), Catch::Contains("backward") && Catch::Contains("another thread"));
  REQUIRE((w.grad() == Array{2.f, 4.f}));
}

TEST_CASE("an op on one thread taking a non-leaf recorded on another is refused when recorded",
          "[threads][bad_input]") {
  Tensor w(Array{1.f, 2.f, 3.f}, true);
  Tensor h = (w * w).set_name("h");  // recorded here
  Tensor v(Array{1.f, 1.f, 1.f}, true);
  const std::exception_ptr error = on_thread([&] { Tensor z = h * v; });
  REQUIRE(error);
  REQUIRE_THROWS_WITH(std::rethrow_exception(error), Catch::Contains("mul: input 0 ('h')") &&
                                                         Catch::Contains("another thread") &&
                                                         Catch::Contains("detach()"));
  // Without grad mode nothing is recorded, so nothing is lost: the value may be used.
  REQUIRE_FALSE(on_thread([&] {
    NoGradGuard guard;
    if (sum(h * v).item() != 14.f) throw std::runtime_error("wrong value under NoGradGuard");
  }));
  // detach() hands the value over as a leaf: the other thread's graph is its own.
  Array v_grad;
  REQUIRE_FALSE(on_thread([&] {
    sum(h.detach() * v).backward();
    v_grad = v.grad();
  }));
  REQUIRE((v_grad == Array{1.f, 4.f, 9.f}));
  REQUIRE_FALSE(w.has_grad());
  sum(h).backward();  // the recording thread's graph is untouched
  REQUIRE((w.grad() == Array{2.f, 4.f, 6.f}));
}

TEST_CASE("two threads training one TransformerBlock sum its gradients like the same passes run serially",
          "[threads][nn][gemm]") {
  KernelThreads kernels(2);
  constexpr int kPerThread = 20;
  Generator init(5);
  nn::TransformerBlock block(block_options(0.f), init);
  block.train();

  block.zero_grad();
  for (int k = 0; k < 2 * kPerThread; ++k) train_pass(block, k);
  const std::vector<Array> serial = gradients(block);
  // One pass's share is about 1/40 of the sum: a lost or doubled pass is far outside 1e-4.
  block.zero_grad();
  for (int k = 0; k < 2 * kPerThread - 1; ++k) train_pass(block, k);
  const std::vector<Array> one_missing = gradients(block);
  const float missing_diff = xt::amax(xt::abs(one_missing[0] - serial[0]))();
  const float serial_scale = xt::amax(xt::abs(serial[0]))();
  CHECK(missing_diff > 1e-3f * serial_scale);

  for (int run = 0; run < 4; ++run) {
    INFO("run " << run);
    block.zero_grad();
    run_together(2, [&](int t) {
      for (int i = 0; i < kPerThread; ++i) train_pass(block, t * kPerThread + i);
      if (tape_size() != 0) throw std::runtime_error("a thread's tape kept entries after its passes");
    });
    require_close(block, gradients(block), serial, 1e-4f);
  }
}

TEST_CASE("two threads training one TransformerBlock with dropout finish with finite gradients",
          "[threads][nn][gemm]") {
  KernelThreads kernels(2);
  constexpr int kPerThread = 20;
  Generator init(6), masks(7);
  nn::TransformerBlock block(block_options(0.2f), init);
  nn::Dropout shared_dropout(0.3f, masks);  // one Generator drawn from by both threads
  block.train();
  shared_dropout.train();
  for (int run = 0; run < 3; ++run) {
    INFO("run " << run);
    block.zero_grad();
    run_together(2, [&](int t) {
      for (int i = 0; i < kPerThread; ++i) {
        const Tensor y = block.forward(shared_dropout.forward(pass_input(t * kPerThread + i)), causal()).output;
        mean(y * y).backward();
      }
    });
    for (const auto& [name, p] : block.named_parameters()) {
      INFO("parameter " << name);
      REQUIRE(p.has_grad());
      const bool finite = xt::all(xt::isfinite(p.grad()));
      const float largest = xt::amax(xt::abs(p.grad()))();
      CHECK(finite);
      CHECK(largest > 0.f);
    }
  }
}

TEST_CASE("threads sharing a Generator draw every number exactly once", "[threads][random]") {
  constexpr int kDraws = 5000;
  Generator shared(11), reference(11);
  std::vector<std::vector<std::uint64_t>> drawn(2);
  run_together(2, [&](int t) {
    for (int i = 0; i < kDraws; ++i) drawn[t].push_back(shared.next_u64());
  });
  std::vector<std::uint64_t> got = drawn[0], want;
  got.insert(got.end(), drawn[1].begin(), drawn[1].end());
  for (int i = 0; i < 2 * kDraws; ++i) want.push_back(reference.next_u64());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  REQUIRE(got == want);
  REQUIRE(shared.state() == reference.state());

  // next_u64 is two 32-bit draws, first one high: the same stream as before it existed.
  Generator a(3), b(3);
  const std::uint32_t hi = a.next_u32(), lo = a.next_u32();
  REQUIRE(b.next_u64() == (std::uint64_t{hi} << 32 | lo));
  // Copies carry the state and go on independently.
  Generator c = a;
  Generator d(99);
  d = a;
  const std::uint32_t next = a.next_u32();
  REQUIRE(c.next_u32() == next);
  REQUIRE(d.next_u32() == next);
}

TEST_CASE("hooks on a shared leaf run once per pass, one pass at a time, from both threads", "[threads][hooks]") {
  KernelThreads kernels(2);
  constexpr int kPerThread = 25;
  constexpr std::size_t N = 4096;
  Tensor w(Generator(4).uniform({N}, -1.f, 1.f), true);
  // Plain (non-atomic) counters: the engine runs a leaf's hooks under the leaf's mutex.
  int calls = 0;
  std::vector<float> firsts;
  std::atomic<int> inside{0}, overlaps{0};
  w.register_hook([&](Array& g) {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    ++calls;
    firsts.push_back(g(0));
    g *= 2.f;
    inside.fetch_sub(1);
  });
  auto input = [](int k) { return Tensor(Generator(200 + static_cast<std::uint64_t>(k)).uniform({N}, -1.f, 1.f)); };
  // L_k = sum(tanh(w) * x_k) + sum(w * x_k): dL/dw = (1 - tanh(w)^2) x_k + x_k, then doubled by the hook
  run_together(2, [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      const Tensor x = input(t * kPerThread + i);
      (sum(tanh(w) * x) + sum(w * x)).backward();
    }
  });
  REQUIRE(calls == 2 * kPerThread);
  REQUIRE(overlaps.load() == 0);

  const Array dt = 1.f - xt::square(xt::tanh(w.value()));
  std::vector<float> want_firsts;
  Array want = xt::zeros<float>({N});
  for (int k = 0; k < 2 * kPerThread; ++k) {
    const Array x = input(k).value();
    const Array g = dt * x + x;
    want_firsts.push_back(g(0));
    want += 2.f * g;
  }
  // Each call saw one pass's gradient (not a sum of passes, not another thread's half).
  std::sort(firsts.begin(), firsts.end());
  std::sort(want_firsts.begin(), want_firsts.end());
  REQUIRE(firsts.size() == want_firsts.size());
  for (std::size_t i = 0; i < firsts.size(); ++i) CHECK(firsts[i] == Approx(want_firsts[i]).margin(1e-6));
  const float diff = xt::amax(xt::abs(w.grad() - want))(), scale = xt::amax(xt::abs(want))();
  CHECK(diff <= 1e-4f * scale);
}

TEST_CASE("on one thread, accumulated leaf gradients are the bitwise sum of the passes, on any thread",
          "[threads][determinism][gemm]") {
  Generator init(8);
  nn::TransformerBlock block(block_options(0.f), init);
  block.train();
  // Each pass alone, then the same passes accumulated: the engine adds a pass's gradient to
  // the stored one elementwise, in pass order, exactly as done here by hand.
  std::vector<Array> by_hand;
  for (int k = 0; k < 3; ++k) {
    block.zero_grad();
    train_pass(block, k);
    const std::vector<Array> g = gradients(block);
    if (by_hand.empty()) {
      by_hand = g;
    } else {
      for (std::size_t i = 0; i < g.size(); ++i) by_hand[i] = by_hand[i] + g[i];
    }
  }
  block.zero_grad();
  for (int k = 0; k < 3; ++k) train_pass(block, k);
  const std::vector<Array> main_thread = gradients(block);
  for (std::size_t i = 0; i < by_hand.size(); ++i) REQUIRE((main_thread[i] == by_hand[i]));

  // The same passes on another thread give the same bits.
  block.zero_grad();
  REQUIRE_FALSE(on_thread([&] {
    for (int k = 0; k < 3; ++k) train_pass(block, k);
  }));
  const std::vector<Array> other_thread = gradients(block);
  for (std::size_t i = 0; i < by_hand.size(); ++i) REQUIRE((other_thread[i] == main_thread[i]));
}

TEST_CASE("parallel_for from two user threads at once covers every index once and never waits on the other",
          "[threads][parallel]") {
  KernelThreads kernels(2);
  constexpr std::size_t n = 1 << 16;
  std::vector<std::vector<int>> hits(2, std::vector<int>(n, 0));
  run_together(2, [&](int t) {
    for (int rep = 0; rep < 200; ++rep) {
      parallel_for(n, 1024, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) ++hits[t][i];
        // A body may ask for the thread count while its caller holds the kernel threads.
        if (num_threads() != 2) throw std::runtime_error("num_threads inside a body");
        // And nest: the inner call runs serially on this thread.
        parallel_for(4, 1, [](std::size_t, std::size_t) {});
      });
    }
  });
  for (int t = 0; t < 2; ++t) REQUIRE(hits[t] == std::vector<int>(n, 200));
}

// ---------------------------------------------------------------------------------------------
// Threads the system refuses. The child below runs in its own process (the test binary again, run
// by the test after it), where a limit can be lowered without touching the test's own threads.

namespace {

std::size_t threads_of_this_process() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 8, "Threads:") == 0) return std::stoul(line.substr(8));
  }
  return 0;
}

}  // namespace

// XGRAD_THREAD_LIMIT=nproc: as user nobody with RLIMIT_NPROC = its threads + 1 (root is exempt from
// RLIMIT_NPROC); XGRAD_THREAD_LIMIT=as: RLIMIT_AS 40 MiB past the address space in use (each thread
// reserves an 8 MiB stack). Then asks for 64 threads, expects an Error, and checks the pool.
TEST_CASE("child: set_num_threads under a thread limit", "[.thread_limit_child]") {
  const char* mode = std::getenv("XGRAD_THREAD_LIMIT");
  REQUIRE(mode != nullptr);
  set_num_threads(2);
  REQUIRE(num_threads() == 2);
  if (std::string(mode) == "nproc") {
    const rlim_t n = threads_of_this_process() + 1;
    const rlimit rl{n, n};
    REQUIRE(::setrlimit(RLIMIT_NPROC, &rl) == 0);
    REQUIRE(::setgid(65534) == 0);
    REQUIRE(::setuid(65534) == 0);
  } else {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    const rlim_t n = static_cast<rlim_t>(pages * static_cast<double>(::sysconf(_SC_PAGESIZE))) + (rlim_t{40} << 20);
    const rlimit rl{n, n};
    REQUIRE(::setrlimit(RLIMIT_AS, &rl) == 0);
  }
  // XGRAD_THREAD_REQUEST: the count asked for (64 unless given).
  const char* request = std::getenv("XGRAD_THREAD_REQUEST");
  std::string message;
  try {
    set_num_threads(request ? std::atoi(request) : 64);
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("message: %s\n", message.c_str());
  REQUIRE_FALSE(message.empty());
  // The pool keeps its 2 threads and works.
  REQUIRE(num_threads() == 2);
  std::vector<int> hits(1 << 20, 0);
  parallel_for(hits.size(), 1024, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) ++hits[i];
  });
  REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  set_num_threads(1);
  REQUIRE(num_threads() == 1);
  set_num_threads(2);  // the threads stopped above make room again
  REQUIRE(num_threads() == 2);
  std::printf("ok\n");
}

TEST_CASE("set_num_threads names the count, the threads running, the OS reason and the limit when threads cannot start",
          "[threads][bad_input][gemm]") {
  char self[4096] = {};
  REQUIRE(::readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  testing::TempDir dir("xgrad_thread_limit");
  std::vector<std::string> modes = {"as"};
  if (::geteuid() == 0) modes.push_back("nproc");  // needs the switch to user nobody
  for (const std::string& mode : modes) {
    INFO("limit " << mode);
    const ScopedEnv limit("XGRAD_THREAD_LIMIT", mode);
    // Under a tight RLIMIT_AS, OpenBLAS's own threads retry a failing mmap forever at exit; the
    // child runs without them.
    const ScopedEnv one_blas_thread("OPENBLAS_NUM_THREADS", "1");
    testing::Limits limits;
    limits.seconds = 60;
    const testing::Outcome o = testing::run_program(dir, self, {"[.thread_limit_child]"}, limits);
    INFO(o);
    REQUIRE(o.exited);
    REQUIRE(o.code == 0);
    using Catch::Matchers::Contains;
    REQUIRE_THAT(o.out, Contains("message: set_num_threads(64): could not start thread ") && Contains(" of 64 (") &&
                            Contains(" running, the calling thread included): Resource temporarily unavailable (") &&
                            Contains("; the pool keeps its 2 threads") && Contains("\nok\n"));
    REQUIRE_THAT(o.out, Contains(mode == "nproc" ? "RLIMIT_NPROC is " : "RLIMIT_AS is "));
  }
}

TEST_CASE("set_num_threads refuses a count past kMaxThreads before it starts a thread, and keeps the pool",
          "[threads][bad_input][bug][gemm]") {
  // A root process has no RLIMIT_NPROC: INT_MAX would have started threads until the machine had
  // none left (and 8 MiB of stack address space each) before failing.
  const int before = num_threads();
  for (const int n : {std::numeric_limits<int>::max(), 1 << 20, kMaxThreads + 1}) {
    REQUIRE_THROWS_WITH(set_num_threads(n), Catch::Matchers::StartsWith("set_num_threads(" + std::to_string(n) +
                                                                        "): more than the 1024 "
                                                                        "threads the pool takes (this machine has "));
    REQUIRE(num_threads() == before);
  }
  // With address space for a few more threads only, a count past the limit still gets this
  // message, not "could not start thread": it is refused before the first thread starts.
  char self[4096] = {};
  REQUIRE(::readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  testing::TempDir dir("xgrad_thread_limit");
  const ScopedEnv limit("XGRAD_THREAD_LIMIT", "as"), request("XGRAD_THREAD_REQUEST", std::to_string(kMaxThreads + 1)),
      one_blas_thread("OPENBLAS_NUM_THREADS", "1");
  const testing::Outcome o = testing::run_program(dir, self, {"[.thread_limit_child]"});
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 0);
  REQUIRE_THAT(o.out, Catch::Matchers::Contains("message: set_num_threads(" + std::to_string(kMaxThreads + 1) +
                                                "): more than the 1024 threads the pool takes") &&
                          Catch::Matchers::Contains("\nok\n"));
}
