// The kernel threads (core/kernels/parallel.hpp): parallel_for covers every index exactly once, passes
// exceptions on and runs nested calls serially; the kernels other than split GEMMs give the same
// bits on any thread count; training repeats bit for bit on a given thread count and agrees to
// rounding across thread counts.
//
// Shapes: B batch, T sequence length, C d_model, F FFN width, V vocabulary.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xmath.hpp>

#include "train_steps.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"

using namespace xgrad;

namespace {

// Restores one thread when a test case ends.
struct ThreadCount {
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(1); }
};

std::vector<int> coverage(std::size_t n, std::size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> empty_ranges{0};  // Catch2's assertions are not thread-safe: count, assert after
  parallel_for(n, grain, [&](std::size_t lo, std::size_t hi) {
    if (lo >= hi) empty_ranges.fetch_add(1);
    for (std::size_t i = lo; i < hi; ++i) hits[i].fetch_add(1);
  });
  REQUIRE(empty_ranges.load() == 0);
  std::vector<int> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = hits[i].load();
  return out;
}

}  // namespace

TEST_CASE("parallel_for visits every index exactly once, for any thread count and grain", "[parallel]") {
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    REQUIRE(num_threads() == threads);
    for (std::size_t n : {0, 1, 7, 1000, 100003}) {
      for (std::size_t grain : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 40}) {
        INFO("threads " << threads << ", n " << n << ", grain " << grain);
        const std::vector<int> hits = coverage(n, grain);
        REQUIRE(hits == std::vector<int>(n, 1));
      }
    }
  }
}

TEST_CASE("parallel_for splits large inputs and keeps small ones on the calling thread", "[parallel]") {
  ThreadCount tc(2);
  std::atomic<int> ranges{0};
  parallel_for(1000, 100, [&](std::size_t, std::size_t) { ranges.fetch_add(1); });
  CHECK(ranges.load() == 2);
  ranges = 0;
  parallel_for(150, 100, [&](std::size_t lo, std::size_t hi) {
    ranges.fetch_add(1);
    CHECK((lo == 0 && hi == 150));
  });
  CHECK(ranges.load() == 1);
}

TEST_CASE("parallel_for rethrows a body's exception on the calling thread and stays usable", "[parallel]") {
  ThreadCount tc(2);
  auto throwing = [](std::size_t lo, std::size_t) {
    if (lo > 0) throw std::runtime_error("range starting at " + std::to_string(lo));
  };
  CHECK_THROWS_WITH(parallel_for(1000, 10, throwing), Catch::Contains("range starting at"));
  REQUIRE(coverage(5000, 10) == std::vector<int>(5000, 1));
}

TEST_CASE("parallel_for inside a body runs serially and still covers its range", "[parallel]") {
  ThreadCount tc(2);
  std::vector<std::atomic<int>> hits(400 * 50);
  parallel_for(400, 10, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      parallel_for(50, 1, [&](std::size_t a, std::size_t b) {
        for (std::size_t j = a; j < b; ++j) hits[i * 50 + j].fetch_add(1);
      });
    }
  });
  for (const auto& h : hits) REQUIRE(h.load() == 1);
}

TEST_CASE("set_num_threads rejects a count below 1 and a call from inside a body", "[parallel][bad_input]") {
  CHECK_THROWS_AS(set_num_threads(0), Error);
  CHECK_THROWS_WITH(set_num_threads(-2), Catch::Contains("set_num_threads: thread count must be at least 1, got -2"));
  ThreadCount tc(2);
  CHECK_THROWS_WITH(parallel_for(1000, 10, [](std::size_t, std::size_t) { set_num_threads(1); }),
                    Catch::Contains("set_num_threads: called from inside a parallel_for body"));
  REQUIRE(num_threads() == 2);
}

namespace {

// Forward values and input gradients of fn on one input, with `threads` kernel threads.
std::vector<Array> value_and_grads(int threads, const std::function<Tensor(const Tensor&)>& fn, const Array& x0) {
  ThreadCount tc(threads);
  manual_seed(11);  // dropout's keep flags
  Tensor x(x0, true);
  const Tensor y = fn(x);
  Generator g(12);
  const Tensor weights(g.uniform(y.shape(), -1.f, 1.f));
  sum(y * weights).backward();
  return {y.value(), x.grad()};
}

// fn's values and input gradients on 2 and 3 threads are those on 1, bit for bit.
void require_same_bits_on_1_2_3_threads(const std::function<Tensor(const Tensor&)>& fn, const Array& x0) {
  const std::vector<Array> one = value_and_grads(1, fn, x0);
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const std::vector<Array> many = value_and_grads(threads, fn, x0);
    REQUIRE(many[0] == one[0]);
    REQUIRE(many[1] == one[1]);
  }
}

}  // namespace

TEST_CASE(
    "the elementwise, softmax, layer-norm, rms-norm, dropout, batched-matmul and attention kernels give the same bits "
    "on 1, 2 "
    "and 3 threads",
    "[parallel][determinism][gemm]") {
  Generator g(10);
  const Array x = g.uniform({16, 4, 32, 32}, -3.f, 3.f);  // 65536 elements: every kernel splits
  const Tensor gamma(g.uniform({32}, 0.5f, 1.5f)), beta(g.uniform({32}, -0.5f, 0.5f));
  const Tensor other(g.uniform({16, 4, 32, 32}, -1.f, 1.f));
  Mask causal = xt::zeros<bool>(Shape{32, 32});
  for (std::size_t t = 0; t < 32; ++t)
    for (std::size_t s = t + 1; s < 32; ++s) causal(t, s) = true;
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> kernels =
      {
          {"gelu", [](const Tensor& a) { return gelu(a); }},
          {"gelu tanh", [](const Tensor& a) { return gelu(a, GeluApprox::tanh); }},
          {"gated_unit silu", [&](const Tensor& a) { return gated_unit(a, other, GatedActivation::silu); }},
          {"gated_unit gelu", [&](const Tensor& a) { return gated_unit(other, a, GatedActivation::gelu); }},
          {"gated_unit gelu_tanh", [&](const Tensor& a) { return gated_unit(a, a, GatedActivation::gelu_tanh); }},
          {"softmax", [](const Tensor& a) { return softmax(a); }},
          {"softmax over axis 2", [](const Tensor& a) { return softmax(a, 2); }},
          {"masked_softmax", [&](const Tensor& a) { return masked_softmax(a, causal); }},
          {"layer_norm", [&](const Tensor& a) { return layer_norm(a, gamma, beta); }},
          {"rms_norm", [&](const Tensor& a) { return rms_norm(a, gamma); }},
          {"dropout", [](const Tensor& a) { return dropout(a, 0.25f); }},
          {"a sum of two uses", [&](const Tensor& a) { return a * other + exp(a * 0.1f); }},
          {"batched matmul", [](const Tensor& a) { return matmul(a, a, false, true); }},
          {"attention_weights and attend",
           [](const Tensor& a) {
    const Tensor x = reshape(a, {64, 32, 32});  // (B, T, C) with 4 heads of 8
    return attend(attention_weights(x, x, 4, 0.35f, true), x, 4);
           }},
  };
  for (const auto& [name, fn] : kernels) {
    INFO(name);
    require_same_bits_on_1_2_3_threads(fn, x);
  }
}

// rms_norm's weight gradient sums over rows: the rows go in fixed chunks whose partial sums are
// added in order, so the thread count changes no bit. 2051 rows of 64 are 65 chunks of 32 (the
// last one short), split across the threads.
TEST_CASE("rms_norm's values and x and gamma gradients give the same bits on 1, 2 and 3 threads",
          "[parallel][determinism][rms_norm]") {
  Generator g(14);
  const Array x0 = g.uniform({2051, 64}, -3.f, 3.f), gamma0 = g.uniform({64}, 0.5f, 1.5f);
  const Array weights = g.uniform({2051, 64}, -1.f, 1.f);
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    Tensor x(x0, true), gamma(gamma0, true);
    const Tensor y = rms_norm(x, gamma);
    sum(y * Tensor(weights)).backward();
    return std::vector<Array>{y.value(), x.grad(), gamma.grad()};
  };
  const std::vector<Array> one = run(1);
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const std::vector<Array> many = run(threads);
    REQUIRE(many[0] == one[0]);
    REQUIRE(many[1] == one[1]);
    REQUIRE(many[2] == one[2]);
  }
}

// Attention splits its work by batch entries, and by heads when there are fewer entries than
// threads; neither may change a bit. 97 entries do not split evenly; 1 entry splits by heads.
TEST_CASE("attention gives the same bits on 1, 2 and 3 threads for 97 entries and for 1",
          "[parallel][determinism][gemm]") {
  Generator g(13);
  for (const Shape& shape : {Shape{97, 32, 32}, Shape{1, 64, 32}, Shape{3, 128, 64}}) {
    INFO("input " << shape_str(shape));
    const Array x = g.uniform(shape, -3.f, 3.f);
    require_same_bits_on_1_2_3_threads(
        [](const Tensor& a) { return attend(attention_weights(a, a, 4, 0.35f, true), a, 4); }, x);
  }
}

TEST_CASE("training steps repeat bit for bit on a given thread count", "[parallel][determinism][gemm]") {
  for (int threads : {1, 2, 3}) {
    INFO("threads " << threads);
    const testing::StepResult a = testing::train_steps(threads), b = testing::train_steps(threads);
    REQUIRE(a.losses == b.losses);
    for (std::size_t k = 0; k < a.params.size(); ++k) {
      INFO("parameter " << a.params[k].first);
      REQUIRE(a.params[k].second == b.params[k].second);
    }
  }
}

// Splitting a GEMM changes how OpenBLAS blocks it, and with it the last bits of some sums (a
// product computed as two halves differs from the whole in about 1 element in 10, by an ulp or
// so). Across thread counts, training therefore agrees to rounding, not to the bit.
TEST_CASE("training steps on 2 and 3 threads agree with 1 thread to rounding", "[parallel][determinism][gemm]") {
  const testing::StepResult one = testing::train_steps(1);
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const testing::StepResult many = testing::train_steps(threads);
    REQUIRE(many.losses.size() == one.losses.size());
    for (std::size_t s = 0; s < one.losses.size(); ++s) CHECK(many.losses[s] == Approx(one.losses[s]).epsilon(1e-5));
    REQUIRE(many.params.size() == one.params.size());
    for (std::size_t k = 0; k < one.params.size(); ++k) {
      INFO("parameter " << one.params[k].first);
      REQUIRE(many.params[k].first == one.params[k].first);
      const float diff = xt::amax(xt::abs(many.params[k].second - one.params[k].second))();
      CHECK(diff < 1e-4f);
    }
  }
}
