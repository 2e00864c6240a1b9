// Tests of the gradient checker itself (it catches a 1% error in one element, leaves its inputs
// alone, steps around kinks, rejects misuse), and closed-form checks of backward (layer 1).
// The per-op gradchecks live in test_ops_gradcheck.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;

namespace {

using Ins = std::vector<Tensor>;

Tensor randn(const Shape& shape, std::uint64_t seed, float scale = 1.f) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, scale), true);
}

// "(1, 2)": the way gradcheck's report names an element of a tensor of this shape.
std::string index_text(const Shape& shape, std::size_t flat) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  std::string out = "(";
  for (std::size_t k = 0; k < idx.size(); ++k) out += (k ? ", " : "") + std::to_string(idx[k]);
  return out + ")";
}

// The projection r that gradcheck (with these options) seeds backward with for an output of
// this shape, observed through a hook on the output of an identity function. The tests below
// use it to know each element's analytic gradient without assuming how r is drawn.
Array observed_projection(const Shape& out_shape, const GradcheckOptions& opt = {}) {
  auto seen = std::make_shared<Array>();
  const GradcheckResult res = gradcheck(
      [seen](const Ins& in) {
    Tensor y = mul(in[0], 1.f);
    if (y.requires_grad()) y.register_hook([seen](Array& g) { *seen = g; });
    return y;
      },
      {Tensor(Array(xt::zeros<float>(out_shape)), true)}, opt);
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(seen->shape() == out_shape);
  return *seen;
}

// Flat indices of the elements whose |g| >= threshold.
std::vector<std::size_t> large_elements(const Array& g, double threshold) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g.data()[i]) >= threshold) out.push_back(i);
  }
  return out;
}

// The first element where |got - want| > atol + rtol |want|, with both values, or "" if none.
std::string first_mismatch(const Array& got, const std::vector<double>& want, double rtol, double atol) {
  if (got.size() != want.size())
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got.data()[i];
    if (!(std::abs(g - want[i]) <= atol + rtol * std::abs(want[i]))) {
      return "element " + index_text(got.shape(), i) + ": got " + std::to_string(g) + ", want " +
             std::to_string(want[i]);
    }
  }
  return "";
}

#define REQUIRE_MATCHES(got, want, rtol, atol)                           \
  do {                                                                   \
    const std::string mismatch_ = first_mismatch(got, want, rtol, atol); \
    INFO(mismatch_);                                                     \
    REQUIRE(mismatch_.empty());                                          \
  } while (0)

}  // namespace

// ---------------------------------------------------------------------------------------------
// (a), (b): the checker catches a 1% error in a single gradient element and passes the truth

TEST_CASE("gradcheck catches a 1% error in one element of d(x*x)", "[gradcheck][checker]") {
  const Shape shape{3, 4};
  const Tensor x = randn(shape, 1);
  const Array r = observed_projection(shape);
  // analytic gradient of <x * x, r> is 2 x r
  Array true_grad = 2.f * x.value() * r;

  // y = x * x with the gradient arriving at y scaled by `factor` at element k (or nowhere)
  auto square_with_error = [](std::size_t k, float factor) {
    return [k, factor](const Ins& in) {
      Tensor y = mul(in[0], in[0]);
      if (y.requires_grad()) y.register_hook([k, factor](Array& g) { g.data()[k] *= factor; });
      return y;
    };
  };

  SECTION("the uncorrupted function passes") {
    const GradcheckResult res = gradcheck(square_with_error(0, 1.f), {x});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked == x.size());
    REQUIRE(res.skipped == 0);
  }

  SECTION("a 1% error is reported, naming the element") {
    const std::vector<std::size_t> ks = large_elements(true_grad, 0.1);
    REQUIRE(ks.size() >= 4);
    // the smallest qualifying gradient is the hardest case: include it
    std::size_t smallest = ks[0];
    for (std::size_t k : ks) {
      if (std::abs(true_grad.data()[k]) < std::abs(true_grad.data()[smallest])) smallest = k;
    }
    std::vector<std::size_t> tried = {smallest, ks.front(), ks[ks.size() / 2], ks.back()};
    for (std::size_t k : tried) {
      const double gk = true_grad.data()[k];
      INFO("element " << index_text(shape, k) << " with gradient " << gk);
      const GradcheckResult res = gradcheck(square_with_error(k, 1.01f), {x});
      INFO(res.report);
      REQUIRE_FALSE(res.ok);
      REQUIRE_FALSE(static_cast<bool>(res));
      REQUIRE_THAT(res.report, Contains("input 0 element " + index_text(shape, k)));
      // only that element is off, by 1% of its gradient
      REQUIRE(res.max_abs_error == Approx(0.01 * std::abs(gk)).epsilon(0.05));
    }
  }
}

TEST_CASE("gradcheck catches a 1% error in one input-gradient element of a matmul/softmax composition",
          "[gradcheck][checker][gemm]") {
  // out = softmax(a @ b) @ c with a (3, 4), b (4, 5), c (5, 3)
  const Tensor a = randn({3, 4}, 11);
  const Tensor b = randn({4, 5}, 12);
  const Tensor c = randn({5, 3}, 13, 2.f);
  // The gradient delivered to input `which` passes through `hook` (in the recorded call only).
  auto composition = [](std::size_t which, std::function<void(Array&)> hook) {
    return [which, hook](const Ins& in) {
      if (hook && grad_enabled()) {
        Tensor leaf = in[which];  // a handle to gradcheck's leaf copy
        leaf.register_hook(hook);
      }
      return matmul(softmax(matmul(in[0], in[1]), -1), in[2]);
    };
  };

  // The true gradients, recorded on the way into each leaf; this run must pass.
  std::vector<Array> true_grads(3);
  for (std::size_t which = 0; which < 3; ++which) {
    Array* slot = &true_grads[which];
    const GradcheckResult res = gradcheck(composition(which, [slot](Array& g) { *slot = g; }), {a, b, c});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked == a.size() + b.size() + c.size());
  }

  for (std::size_t which = 0; which < 3; ++which) {
    const std::vector<std::size_t> ks = large_elements(true_grads[which], 0.1);
    REQUIRE(!ks.empty());
    for (std::size_t k : {ks.front(), ks.back()}) {
      const Shape& shape = true_grads[which].shape();
      INFO("input " << which << " element " << index_text(shape, k) << " with gradient "
                    << true_grads[which].data()[k]);
      const GradcheckResult res = gradcheck(composition(which, [k](Array& g) { g.data()[k] *= 1.01f; }), {a, b, c});
      INFO(res.report);
      REQUIRE_FALSE(res.ok);
      REQUIRE_THAT(res.report, Contains("input " + std::to_string(which) + " element " + index_text(shape, k)));
    }
  }
}

TEST_CASE("gradcheck catches a gradient that is missing entirely", "[gradcheck][checker]") {
  // a hook that zeroes the whole gradient of y = 3 x
  const GradcheckResult res = gradcheck(
      [](const Ins& in) {
    Tensor y = mul(in[0], 3.f);
    if (y.requires_grad()) y.register_hook([](Array& g) { g.fill(0.f); });
    return y;
      },
      {randn({2, 2}, 21)});
  REQUIRE_FALSE(res.ok);
  REQUIRE_THAT(res.report, Contains("input 0 element"));
}

// ---------------------------------------------------------------------------------------------
// (c) inputs are left alone

TEST_CASE("gradcheck leaves the caller's tensors unchanged", "[gradcheck][checker]") {
  Tensor x = randn({2, 3}, 31);
  Tensor w = randn({3}, 32);
  const Tensor fixed(Generator(33).normal({2, 3}, 0.f, 1.f), false);
  // x already holds a gradient from an earlier backward; w holds none
  sum(mul(x, x)).backward();
  const Array x_value = x.value(), x_grad = x.grad(), w_value = w.value(), fixed_value = fixed.value();

  const GradcheckResult res =
      gradcheck([](const Ins& in) { return mul(add(mul(in[0], in[1]), in[2]), in[0]); }, {x, w, fixed});
  INFO(res.report);
  REQUIRE(res.ok);

  REQUIRE(x.value() == x_value);
  REQUIRE(w.value() == w_value);
  REQUIRE(fixed.value() == fixed_value);
  REQUIRE(x.has_grad());
  REQUIRE(x.grad() == x_grad);
  REQUIRE_FALSE(w.has_grad());
  REQUIRE_FALSE(fixed.has_grad());
  REQUIRE(x.requires_grad());
  REQUIRE(w.requires_grad());
  REQUIRE_FALSE(fixed.requires_grad());
  REQUIRE(grad_enabled());
}

// ---------------------------------------------------------------------------------------------
// (d) kinks

TEST_CASE("gradcheck skip_kinks skips relu at exactly 0 and counts it", "[gradcheck][checker]") {
  const Shape shape{8};
  const Array r = observed_projection(shape);
  // Zeros go where the projection is large, so the kink is plain in the one-sided differences.
  std::vector<std::size_t> zeros = large_elements(r, 0.3);
  REQUIRE(zeros.size() >= 2);
  zeros.resize(2);
  Tensor x = randn(shape, 41);
  for (float& v : x.mutable_value()) v = v < 0 ? v - 0.2f : v + 0.2f;  // others well away from 0
  for (std::size_t k : zeros) x.mutable_value().data()[k] = 0.f;
  auto fn = [](const Ins& in) { return relu(in[0]); };

  GradcheckOptions skip;
  skip.skip_kinks = true;
  const GradcheckResult with_skip = gradcheck(fn, {x}, skip);
  INFO(with_skip.report);
  REQUIRE(with_skip.ok);
  REQUIRE(with_skip.skipped == 2);
  REQUIRE(with_skip.checked == shape[0] - 2);
  REQUIRE_THAT(with_skip.report, Contains("2 skipped"));

  // Without skipping, the central difference at 0 (half the slope) disagrees with relu'(0) = 0.
  const GradcheckResult without = gradcheck(fn, {x});
  INFO(without.report);
  REQUIRE_FALSE(without.ok);
  REQUIRE(without.skipped == 0);
  REQUIRE_THAT(without.report, Contains("element " + index_text(shape, zeros[0])));

  // Away from 0 nothing is skipped.
  Tensor far(x.value(), true);
  for (std::size_t k : zeros) far.mutable_value().data()[k] = 1.f;
  const GradcheckResult smooth = gradcheck(fn, {far}, skip);
  REQUIRE(smooth.ok);
  REQUIRE(smooth.skipped == 0);
  REQUIRE(smooth.checked == shape[0]);
}

// The kink test works on the slopes' own scale: relu at 0 is skipped however small or large the
// projection and the function's scale make its slopes (it once needed |slope jump| > 0.1 (1 + |numeric|),
// so relu(x) * 0.01 at 0, or a projection entry of 0.05, failed instead of being skipped).
TEST_CASE("gradcheck skip_kinks skips relu, abs, clamp and max ties at their kinks on any scale",
          "[gradcheck][checker]") {
  const Shape shape{32};
  const Array r = observed_projection(shape);
  double smallest = 1;
  for (float v : r) smallest = std::min(smallest, std::abs(static_cast<double>(v)));
  REQUIRE(smallest > 1e-3);  // every slope jump of the functions below exceeds atol (2e-4) at scale 1
  const Tensor zeros(Array(xt::zeros<float>(shape)), true);
  GradcheckOptions skip;
  skip.skip_kinks = true;
  auto abs_of = [](const Tensor& x) { return add(relu(x), relu(neg(x))); };
  // clamp(x, -1, 2) = -1 + relu(x + 1) - relu(x - 2)
  auto clamp_of = [](const Tensor& x) { return sub(add(relu(add(x, 1.f)), -1.f), relu(sub(x, 2.f))); };
  for (const float scale : {1.f, 0.5f, 100.f}) {
    INFO("scale " << scale);
    const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> kinked = {
        {"relu", [&](const Tensor& x) { return mul(relu(x), scale); }},
        {"abs", [&](const Tensor& x) { return mul(abs_of(x), scale); }},
    };
    for (const auto& [name, op] : kinked) {
      INFO(name);
      const GradcheckResult res = gradcheck([&](const Ins& in) { return op(in[0]); }, {zeros}, skip);
      INFO(res.report);
      REQUIRE(res.ok);
      REQUIRE(res.skipped == shape[0]);
      REQUIRE(res.checked == 0);
      // Without skipping, the central difference (the mean of the slopes) disagrees with the gradient at 0.
      if (name == "relu") REQUIRE_FALSE(gradcheck([&](const Ins& in) { return op(in[0]); }, {zeros}).ok);
    }
  }
  // clamp at both corners, and a tie of max along an axis (x, x): kinks; the elements between are checked.
  Tensor corners(Array(xt::zeros<float>(shape)), true);
  for (std::size_t i = 0; i < shape[0]; ++i) corners.mutable_value()(i) = i % 4 == 0 ? -1.f : i % 4 == 1 ? 2.f : 0.5f;
  const GradcheckResult clamp_res = gradcheck([&](const Ins& in) { return clamp_of(in[0]); }, {corners}, skip);
  INFO(clamp_res.report);
  REQUIRE(clamp_res.ok);
  REQUIRE(clamp_res.skipped == shape[0] / 2);
  REQUIRE(clamp_res.checked == shape[0] / 2);
  Tensor ties(Array(xt::zeros<float>({16, 2})), true);
  for (std::size_t i = 0; i < 16; ++i)
    ties.mutable_value()(i, 0) = ties.mutable_value()(i, 1) = 0.1f * static_cast<float>(i);
  const GradcheckResult max_res = gradcheck([](const Ins& in) { return max(in[0], 1); }, {ties}, skip);
  INFO(max_res.report);
  REQUIRE(max_res.ok);
  REQUIRE(max_res.skipped == 32);
}

TEST_CASE("gradcheck skip_kinks leaves smooth points alone and still catches a wrong gradient",
          "[gradcheck][checker]") {
  const Shape shape{32};
  GradcheckOptions skip;
  skip.skip_kinks = true;
  // x * x at 0: slope 0 on both sides at the point, one-sided slopes of opposite sign: curvature, not a kink.
  const Tensor zeros(Array(xt::zeros<float>(shape)), true);
  const GradcheckResult square = gradcheck([](const Ins& in) { return mul(in[0], in[0]); }, {zeros}, skip);
  INFO(square.report);
  REQUIRE(square.ok);
  REQUIRE(square.skipped == 0);
  REQUIRE(square.checked == shape[0]);
  const Tensor x = randn(shape, 7);
  const GradcheckResult smooth = gradcheck([](const Ins& in) { return mul(tanh(in[0]), exp(in[0])); }, {x}, skip);
  REQUIRE(smooth.ok);
  REQUIRE(smooth.skipped == 0);

  // relu with kinks at some elements and a gradient 10% off at element 5 (away from 0): the kinks are
  // skipped, the wrong element is reported.
  Tensor mixed(x.value(), true);
  for (float& v : mixed.mutable_value()) v = v < 0 ? v - 0.2f : v + 0.2f;
  mixed.mutable_value()(5) = 0.7f;
  for (std::size_t k : {0, 9, 20}) mixed.mutable_value()(k) = 0.f;
  auto wrong = [](const Ins& in) {
    Tensor y = relu(in[0]);
    if (y.requires_grad()) y.register_hook([](Array& g) { g(5) *= 1.1f; });
    return y;
  };
  const GradcheckResult caught = gradcheck(wrong, {mixed}, skip);
  REQUIRE_FALSE(caught.ok);
  REQUIRE_THAT(caught.report, Contains("input 0 element (5)"));
  REQUIRE(caught.skipped == 3);
  // x * x at 0 with a gradient of 1 instead of 0 (a hook on the input): a smooth point, so not
  // skipped, so caught.
  auto wrong_at_zero = [](const Ins& in) {
    Tensor y = mul(in[0], in[0]);
    if (y.requires_grad()) Tensor(in[0]).register_hook([](Array& g) { g(3) += 1.f; });
    return y;
  };
  const GradcheckResult caught_at_zero = gradcheck(wrong_at_zero, {zeros}, skip);
  REQUIRE_FALSE(caught_at_zero.ok);
  REQUIRE(caught_at_zero.skipped == 0);
  REQUIRE_THAT(caught_at_zero.report, Contains("input 0 element (3)"));
}

TEST_CASE("gradcheck refuses tolerances, steps and thresholds that are negative, NaN or infinite, naming the option",
          "[gradcheck][checker]") {
  auto fn = [](const Ins& in) { return mul(in[0], in[0]); };
  const Tensor x = randn({3}, 53);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const double bad : {-1.0, -1e-12, nan, inf, -inf}) {
    INFO(bad);
    for (const char* name : {"atol", "rtol", "kink_threshold"}) {
      GradcheckOptions o;
      (std::string(name) == "atol" ? o.atol : std::string(name) == "rtol" ? o.rtol : o.kink_threshold) = bad;
      std::ostringstream value;
      value << bad;
      REQUIRE_THROWS_WITH(gradcheck(fn, {x}, o), Contains(std::string("gradcheck: GradcheckOptions::") + name +
                                                          " must be finite and >= 0, got " + value.str()));
    }
    GradcheckOptions o;
    o.eps = bad;
    REQUIRE_THROWS_WITH(gradcheck(fn, {x}, o), Contains("gradcheck: GradcheckOptions::eps must be finite and > 0"));
  }
  GradcheckOptions zero_eps;
  zero_eps.eps = 0;
  REQUIRE_THROWS_WITH(gradcheck(fn, {x}, zero_eps), Contains("GradcheckOptions::eps must be finite and > 0, got 0"));
  // A step below float32's resolution at the value, or past its range: refused naming the element.
  Tensor one(Array{1.f, 2.f}, true);
  GradcheckOptions tiny;
  tiny.eps = 1e-9;
  REQUIRE_THROWS_WITH(gradcheck(fn, {one}, tiny),
                      Contains("gradcheck: eps 1e-09 is no float32 step at input 0 element (0) (value 1)"));
  GradcheckOptions huge;
  huge.eps = 1e300;
  REQUIRE_THROWS_WITH(gradcheck(fn, {one}, huge), Contains("eps 1e+300 is no float32 step at input 0 element (0)"));
  // Zero tolerances and threshold are allowed (an exact comparison).
  GradcheckOptions exact;
  exact.atol = exact.rtol = exact.kink_threshold = 0;
  REQUIRE_NOTHROW(gradcheck(fn, {x}, exact));
}

// ---------------------------------------------------------------------------------------------
// (e) misuse

TEST_CASE("gradcheck throws xgrad::Error when no input requires grad", "[gradcheck][checker]") {
  auto fn = [](const Ins& in) { return mul(in[0], in[0]); };
  const Tensor constant(Generator(51).normal({2, 2}, 0.f, 1.f), false);
  REQUIRE_THROWS_AS(gradcheck(fn, {constant}), Error);
  REQUIRE_THROWS_WITH(gradcheck(fn, {constant}), Contains("no input requires grad"));
  REQUIRE_THROWS_AS(gradcheck([](const Ins&) { return Tensor::ones({2}); }, {}), Error);
}

TEST_CASE("gradcheck throws xgrad::Error on a non-positive eps", "[gradcheck][checker]") {
  GradcheckOptions opt;
  opt.eps = 0;
  REQUIRE_THROWS_AS(gradcheck([](const Ins& in) { return mul(in[0], 2.f); }, {randn({2}, 52)}, opt), Error);
}

// ---------------------------------------------------------------------------------------------
// Layer 1: backward against closed forms, computed in double in the test

namespace {

// d<op(x), w>/dx through one backward pass.
Array grad_of(const std::function<Tensor(const Tensor&)>& op, const Array& x, const Array& w) {
  Tensor leaf(x, true);
  op(leaf).backward(w);
  return leaf.grad();
}

// want[i] = w[i] * dfdx(x[i]), in double
std::vector<double> chain(const Array& x, const Array& w, const std::function<double(double)>& dfdx) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = w.data()[i] * dfdx(x.data()[i]);
  return out;
}

constexpr double kPi = 3.14159265358979323846;

}  // namespace

TEST_CASE("closed forms: d tanh, d sigmoid, d exp, d log, d sqrt", "[closed_form]") {
  const Shape shape{4, 5};
  const Array x = Generator(61).uniform(shape, -4.f, 4.f);
  const Array pos = Generator(62).uniform(shape, 0.1f, 5.f);
  const Array w = Generator(63).uniform(shape, -2.f, 2.f);

  // d tanh = 1 - y^2
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return tanh(t); }, x, w),
                  chain(x, w, [](double v) { return 1 - std::tanh(v) * std::tanh(v); }), 1e-5, 1e-6);
  // d sigmoid = y (1 - y)
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return sigmoid(t); }, x, w),
                  chain(
                      x, w,
                      [](double v) {
    const double y = 1 / (1 + std::exp(-v));
    return y * (1 - y);
                      }),
                  1e-5, 1e-6);
  // d exp = exp
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return exp(t); }, x, w),
                  chain(x, w, [](double v) { return std::exp(v); }), 1e-5, 1e-6);
  // d log = 1 / x
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return log(t); }, pos, w),
                  chain(pos, w, [](double v) { return 1 / v; }), 1e-5, 1e-6);
  // d sqrt = 1 / (2 sqrt x)
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return sqrt(t); }, pos, w),
                  chain(pos, w, [](double v) { return 0.5 / std::sqrt(v); }), 1e-5, 1e-6);
  // d pow(x, p) = p x^(p-1)
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return pow(t, 1.5f); }, pos, w),
                  chain(pos, w, [](double v) { return 1.5 * std::sqrt(v); }), 1e-5, 1e-6);
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return pow(t, 3.f); }, x, w),
                  chain(x, w, [](double v) { return 3 * v * v; }), 1e-5, 1e-6);
  // d (s / x) = -s / x^2
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return rdiv(2.f, t); }, pos, w),
                  chain(pos, w, [](double v) { return -2 / (v * v); }), 1e-5, 1e-6);
}

TEST_CASE("closed forms: d relu is the step function, 0 at the kink", "[closed_form]") {
  const Array x = {-2.f, -0.001f, 0.f, 0.001f, 3.f};
  const Array w = {1.f, 2.f, 3.f, 4.f, 5.f};
  const Array g = grad_of([](const Tensor& t) { return relu(t); }, x, w);
  const Array want = {0.f, 0.f, 0.f, 4.f, 5.f};
  REQUIRE(g == want);
}

TEST_CASE("closed forms: d gelu against the erf and tanh formulas in double", "[closed_form]") {
  const Shape shape{50};
  const Array x = Generator(71).uniform(shape, -5.f, 5.f);
  const Array w = Generator(72).uniform(shape, -2.f, 2.f);
  // exact: d/dx x Phi(x) = Phi(x) + x phi(x)
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return gelu(t, GeluApprox::exact); }, x, w),
                  chain(
                      x, w,
                      [](double v) {
    const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * kPi);
    return cdf + v * pdf;
                      }),
                  1e-5, 1e-6);
  // tanh: d/dx x (1 + tanh u) / 2, u = sqrt(2/pi) (x + 0.044715 x^3)
  REQUIRE_MATCHES(grad_of([](const Tensor& t) { return gelu(t, GeluApprox::tanh); }, x, w),
                  chain(
                      x, w,
                      [](double v) {
    const double c = std::sqrt(2 / kPi);
    const double t = std::tanh(c * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
                      }),
                  1e-5, 1e-6);
}

TEST_CASE("closed forms: d sum is ones, d mean is 1/n", "[closed_form]") {
  const Shape shape{2, 3, 4};
  const Array x = Generator(81).normal(shape, 0.f, 1.f);

  Tensor leaf(x, true);
  sum(leaf).backward();
  REQUIRE(leaf.grad() == Array(xt::ones<float>(shape)));

  Tensor leaf2(x, true);
  mean(leaf2).backward();
  REQUIRE_MATCHES(leaf2.grad(), std::vector<double>(24, 1.0 / 24), 1e-6, 0);

  // over axis 1 (n = 3) with a seed w (2, 4): dx[i, j, k] = w[i, k] / 3
  const Array w = Generator(82).uniform({2, 4}, -1.f, 1.f);
  Tensor leaf3(x, true);
  mean(leaf3, {1}).backward(w);
  Tensor leaf4(x, true);
  Array w_kept = w;
  w_kept.reshape({2, 1, 4});
  sum(leaf4, {-2}, true).backward(w_kept);
  std::vector<double> want_mean, want_sum;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 4; ++k) {
        want_mean.push_back(w(i, k) / 3.0);
        want_sum.push_back(w(i, k));
      }
  REQUIRE_MATCHES(leaf3.grad(), want_mean, 1e-6, 0);
  REQUIRE_MATCHES(leaf4.grad(), want_sum, 0, 0);
}

TEST_CASE("closed forms: d sum(softmax(x) * w) = y (w - sum(w y))", "[closed_form]") {
  const std::size_t N = 3, C = 6;
  const Array x = Generator(91).normal({N, C}, 0.f, 2.f);
  const Array w = Generator(92).normal({N, C}, 0.f, 1.f);
  Tensor leaf(x, true);
  sum(mul(softmax(leaf, -1), Tensor(w))).backward();

  std::vector<double> want;
  for (std::size_t n = 0; n < N; ++n) {
    std::vector<double> y(C);
    double z = 0, wy = 0;
    for (std::size_t c = 0; c < C; ++c) z += y[c] = std::exp(static_cast<double>(x(n, c)));
    for (std::size_t c = 0; c < C; ++c) wy += w(n, c) * (y[c] /= z);
    for (std::size_t c = 0; c < C; ++c) want.push_back(y[c] * (w(n, c) - wy));
  }
  REQUIRE_MATCHES(leaf.grad(), want, 1e-4, 1e-6);
}

TEST_CASE("closed forms: d cross_entropy = (softmax - onehot) / count", "[closed_form]") {
  const std::size_t N = 5, C = 4;
  const Array x = Generator(101).normal({N, C}, 0.f, 2.f);
  const IndexArray targets = {3, -100, 0, 2, 0};
  const double count = 4;  // rows not ignored
  Tensor leaf(x, true);
  cross_entropy(leaf, targets).backward();

  std::vector<double> want;
  for (std::size_t n = 0; n < N; ++n) {
    double z = 0;
    for (std::size_t c = 0; c < C; ++c) z += std::exp(static_cast<double>(x(n, c)));
    for (std::size_t c = 0; c < C; ++c) {
      if (targets(n) == -100) {
        want.push_back(0);
        continue;
      }
      const double onehot = static_cast<std::int64_t>(c) == targets(n) ? 1 : 0;
      want.push_back((std::exp(static_cast<double>(x(n, c))) / z - onehot) / count);
    }
  }
  REQUIRE_MATCHES(leaf.grad(), want, 1e-4, 1e-6);
}

TEST_CASE("closed forms: d(a / b) and d(a * b) with broadcasting sum over the broadcast axis", "[closed_form]") {
  // a (2, 3), b (3,): da = 1 / b, db[j] = -sum_i a[i, j] / b[j]^2; for mul db[j] = sum_i a[i, j]
  const Array a = Generator(111).normal({2, 3}, 0.f, 1.f);
  const Array b = Generator(112).uniform({3}, 0.5f, 2.f);
  Tensor ta(a, true), tb(b, true);
  sum(div(ta, tb)).backward();
  Tensor ma(a, true), mb(b, true);
  sum(mul(ma, mb)).backward();
  std::vector<double> want_da, want_db(3, 0.0), want_mdb(3, 0.0), want_mda;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      want_da.push_back(1.0 / b(j));
      want_mda.push_back(b(j));
      want_db[j] -= a(i, j) / (static_cast<double>(b(j)) * b(j));
      want_mdb[j] += a(i, j);
    }
  REQUIRE_MATCHES(ta.grad(), want_da, 1e-5, 1e-6);
  REQUIRE_MATCHES(tb.grad(), want_db, 1e-5, 1e-6);
  REQUIRE_MATCHES(ma.grad(), want_mda, 1e-6, 0);
  REQUIRE_MATCHES(mb.grad(), want_mdb, 1e-5, 1e-6);
}

TEST_CASE("gradcheck checks parameters read by the function and leaves their values and gradients as they were",
          "[gemm]") {
  Tensor w(Array{{0.5f, -1.f}, {2.f, 0.25f}}, true);
  w.set_name("w");
  sum(w * w).backward();  // an earlier gradient that must survive the check
  const Array value = w.value(), grad = w.grad();
  const Tensor x(Array{{1.f, 2.f}, {-1.f, 0.5f}}, true);
  const GradcheckResult ok =
      gradcheck([&](const std::vector<Tensor>& in) { return tanh(matmul(in[0], w)); }, {x}, {{"w", w}});
  INFO(ok.report);
  REQUIRE(ok.ok);
  REQUIRE(ok.tensors == 2);
  REQUIRE(ok.checked == 8);
  REQUIRE(w.value() == value);
  REQUIRE(w.grad() == grad);
  // A wrong gradient for the parameter only is caught and named.
  const GradcheckResult bad = gradcheck(
      [&](const std::vector<Tensor>& in) {
    Tensor y = matmul(in[0], w);
    if (grad_enabled()) {
      w.register_hook([](Array& g) { g(0, 1) *= 1.05f; });
    }
    return tanh(y);
      },
      {x}, {{"w", w}});
  REQUIRE_FALSE(bad.ok);
  REQUIRE_THAT(bad.report, Catch::Contains("parameter 'w' element (0, 1)"));
}

// A kink within eps of x but not at it: the two-scale jump vanishes for a kink h/3 away (and is
// below kink_threshold past 0.9 h), where relu's central difference is still off; such elements
// failed with a right gradient (relu at 0.0033 or 0.0093 with eps 0.01: numeric 0.086 for 0.098).
TEST_CASE("gradcheck skip_kinks skips kinks anywhere within eps of x and still checks the rest",
          "[gradcheck][checker][bug]") {
  GradcheckOptions skip;
  skip.skip_kinks = true;
  const double h = skip.eps;
  // Distances from the kink, in units of eps, on both sides, through the whole window.
  std::vector<float> at;
  for (int k = 0; k < 100; ++k) {
    const float d = static_cast<float>(h * k / 100.0);
    at.push_back(d);
    at.push_back(-d);
  }
  const Shape shape{at.size()};
  Array values = Array::from_shape(shape);
  std::copy(at.begin(), at.end(), values.begin());
  Tensor x(values, true);
  auto abs_of = [](const Tensor& v) { return add(relu(v), relu(neg(v))); };
  for (const float scale : {1.f, 0.03f, 50.f}) {
    INFO("scale " << scale);
    const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> kinked = {
        {"relu", [&](const Tensor& v) { return mul(relu(v), scale); }},
        {"abs", [&](const Tensor& v) { return mul(abs_of(v), scale); }},
        {"clamp at 0.5", [&](const Tensor& v) { return mul(sub(add(v, 0.5f), relu(v)), scale); }},  // min(x, 0) + 0.5
    };
    for (const auto& [name, op] : kinked) {
      INFO(name);
      const GradcheckResult res = gradcheck([&](const Ins& in) { return op(in[0]); }, {x}, skip);
      INFO(res.report);
      REQUIRE(res.ok);
      REQUIRE(res.checked + res.skipped == shape[0]);
      // Only the elements near the window's edge, whose kink moves the estimate by less than the
      // tolerance, may be checked.
      REQUIRE(res.skipped >= shape[0] * 9 / 10);
    }
  }
  // A max tie broken by less than eps: the kink of max(a, b) at a = b.
  Tensor near_ties(Array(xt::zeros<float>(Shape{at.size(), 2})), true);
  for (std::size_t i = 0; i < at.size(); ++i) near_ties.mutable_value()(i, 1) = at[i];
  const GradcheckResult ties = gradcheck([](const Ins& in) { return max(in[0], 1); }, {near_ties}, skip);
  INFO(ties.report);
  REQUIRE(ties.ok);

  // Away from every kink nothing more is skipped, and a gradient 10% off near (not within eps of)
  // a kink is caught.
  Tensor mixed(Array{0.0033f, -0.0093f, 0.2f, 0.015f, -0.7f}, true);
  auto wrong = [](const Ins& in) {
    Tensor y = relu(in[0]);
    if (y.requires_grad()) y.register_hook([](Array& g) { g(3) *= 1.1f; });
    return y;
  };
  const GradcheckResult caught = gradcheck(wrong, {mixed}, skip);
  INFO(caught.report);
  REQUIRE_FALSE(caught.ok);
  REQUIRE_THAT(caught.report, Contains("input 0 element (3)"));
  REQUIRE(caught.skipped == 2);
  const GradcheckResult right = gradcheck([](const Ins& in) { return relu(in[0]); }, {mixed}, skip);
  REQUIRE(right.ok);
  REQUIRE(right.skipped == 2);
  REQUIRE(right.checked == 3);
}

// Under a bf16 guard the products are flat between roundings: a correct gradient would be reported
// wrong (analytic -1.26, numeric 0), so gradcheck refuses and names the guard.
TEST_CASE("gradcheck refuses to run inside a bf16 autocast guard and names it", "[gradcheck][bad_input][gemm]") {
  Generator gen(3);
  const Tensor x(gen.normal({3, 4}, 0.f, 1.f), true), w(gen.normal({5, 4}, 0.f, 1.f), true);
  const GradcheckFn fn = [](const std::vector<Tensor>& in) { return sum(linear(in[0], in[1])); };
  {
    AutocastGuard bf16(Precision::bf16);
    CHECK_THROWS_WITH(gradcheck(fn, {x, w}), Catch::StartsWith("gradcheck: an AutocastGuard(Precision::bf16) is open "
                                                               "on this thread") &&
                                                 Catch::Contains("check in fp32"));
    AutocastGuard fp32(Precision::fp32);
    CHECK(gradcheck(fn, {x, w}).ok);
  }
  CHECK(gradcheck(fn, {x, w}).ok);
}
