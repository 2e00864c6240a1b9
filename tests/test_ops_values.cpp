// Forward values of the ops against independent computations: xtensor expressions and
// reducers, or plain double-precision loops written here (never against xgrad itself).
// Gradients are tested in test_ops_gradcheck.cpp and test_gradcheck.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xsort.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

Array normal(const Shape& shape, std::uint64_t seed, float scale = 1.f) {
  return Generator(seed).normal(shape, 0.f, scale);
}

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + ")";
}

// "" when got and want have the same shape and |got - want| <= atol + rtol |want| everywhere;
// otherwise a description of the first difference.
std::string difference_text(const Array& got, const Array& want, double rtol, double atol) {
  if (got.shape() != want.shape()) return "shape " + shape_text(got.shape()) + " != " + shape_text(want.shape());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w))) {
      return "flat element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
    }
  }
  return "";
}

#define REQUIRE_CLOSE(got, want, rtol, atol)                       \
  do {                                                             \
    const std::string m_ = difference_text(got, want, rtol, atol); \
    INFO(m_);                                                      \
    REQUIRE(m_.empty());                                           \
  } while (0)

bool all_finite(const Array& a) {
  return std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); });
}

std::vector<std::size_t> positive_axes(const std::vector<int>& axes, std::size_t ndim) {
  std::vector<std::size_t> out;
  for (int a : axes) out.push_back(static_cast<std::size_t>(a < 0 ? a + static_cast<int>(ndim) : a));
  return out;
}

// The reduced shape with reduced axes kept as 1.
Shape kept_shape(const Shape& s, const std::vector<std::size_t>& axes) {
  Shape out = s;
  for (std::size_t a : axes) out[a] = 1;
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Elementwise

TEST_CASE("values: broadcasting add, sub, mul, div match xtensor", "[values][elementwise]") {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{2, 3, 4}, {3, 1}}, {{4}, {2, 3, 4}}, {{1, 3, 1}, {2, 3, 4}}, {{2, 1, 4}, {3, 1}}, {{2, 3, 4}, {}}};
  std::uint64_t seed = 1;
  for (const auto& [sa, sb] : pairs) {
    INFO(shape_text(sa) << " with " << shape_text(sb));
    const Array a = normal(sa, ++seed), b = normal(sb, ++seed);
    const Array bpos = Generator(++seed).uniform(sb, 0.5f, 2.f);
    const Tensor ta(a), tb(b), tbpos(bpos);
    REQUIRE_CLOSE(add(ta, tb).value(), Array(a + b), 0, 0);
    REQUIRE_CLOSE(sub(ta, tb).value(), Array(a - b), 0, 0);
    REQUIRE_CLOSE(mul(ta, tb).value(), Array(a * b), 0, 0);
    REQUIRE_CLOSE(div(ta, tbpos).value(), Array(a / bpos), 1e-7, 0);
  }
  // the broadcast result shape, independently of the values
  REQUIRE(add(Tensor::ones({2, 1, 4}), Tensor::ones({3, 1})).shape() == Shape{2, 3, 4});
}

TEST_CASE("values: scalar variants and unary functions", "[values][elementwise]") {
  const Array x = Generator(11).uniform({3, 4}, -3.f, 3.f);
  const Array p = Generator(12).uniform({3, 4}, 0.2f, 4.f);
  const Tensor tx(x), tp(p);
  struct Case {
    const char* name;
    Tensor got;
    double (*want)(double);
    const Array& in;
  };
  const std::vector<Case> cases =
      {
          {"add 1.5", add(tx, 1.5f), [](double v) { return v + 1.5; }, x},
          {"sub 1.5", sub(tx, 1.5f), [](double v) { return v - 1.5; }, x},
          {"rsub 2", rsub(2.f, tx), [](double v) { return 2 - v; }, x},
          {"mul -3", mul(tx, -3.f), [](double v) { return -3 * v; }, x},
          {"div 4", div(tx, 4.f), [](double v) { return v / 4; }, x},
          {"rdiv 2", rdiv(2.f, tp), [](double v) { return 2 / v; }, p},
          {"neg", neg(tx), [](double v) { return -v; }, x},
          {"exp", exp(tx), [](double v) { return std::exp(v); }, x},
          {"log", log(tp), [](double v) { return std::log(v); }, p},
          {"sqrt", sqrt(tp), [](double v) { return std::sqrt(v); }, p},
          {"pow 1.5", pow(tp, 1.5f), [](double v) { return std::pow(v, 1.5); }, p},
          {"pow 3", pow(tx, 3.f), [](double v) { return v * v * v; }, x},
          {"tanh", tanh(tx), [](double v) { return std::tanh(v); }, x},
          {"sigmoid", sigmoid(tx), [](double v) { return 1 / (1 + std::exp(-v)); }, x},
          {"relu", relu(tx), [](double v) { return v > 0 ? v : 0; }, x},
          {"gelu exact", gelu(tx, GeluApprox::exact),
           [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, x},
          {"gelu tanh", gelu(tx, GeluApprox::tanh),
           [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
           },
           x},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Array want = Array::from_shape(c.in.shape());
    for (std::size_t i = 0; i < want.size(); ++i) want.data()[i] = static_cast<float>(c.want(c.in.data()[i]));
    REQUIRE_CLOSE(c.got.value(), want, 2e-6, 1e-6);
  }
  // sigmoid stays finite and saturates for large |x|
  const Array big = {-100.f, -30.f, 30.f, 100.f};
  const Array s = sigmoid(Tensor(big)).value();
  REQUIRE(all_finite(s));
  CHECK(s(0) == Approx(0).margin(1e-12));
  CHECK(s(3) == 1.f);
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST_CASE("values: sum and mean over axes match xt::sum / xt::mean", "[values][reduce]") {
  const Shape shape{2, 3, 4};
  const Array x = normal(shape, 21);
  const std::vector<std::vector<int>> axis_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {-3, -1}, {0, 1, 2}};
  for (const auto& axes : axis_sets) {
    const std::vector<std::size_t> pos = positive_axes(axes, 3);
    const Array want_sum = xt::sum(x, pos, xt::evaluation_strategy::immediate);
    const Array want_mean = xt::mean(x, pos, xt::evaluation_strategy::immediate);
    for (bool keepdims : {false, true}) {
      INFO("axes starting " << axes[0] << " (" << axes.size() << " axes), keepdims " << keepdims);
      Array ws = want_sum, wm = want_mean;
      if (keepdims) {
        ws.reshape(kept_shape(shape, pos));
        wm.reshape(kept_shape(shape, pos));
      }
      REQUIRE_CLOSE(sum(Tensor(x), axes, keepdims).value(), ws, 1e-6, 1e-6);
      REQUIRE_CLOSE(mean(Tensor(x), axes, keepdims).value(), wm, 1e-6, 1e-6);
    }
  }
  const double total = std::accumulate(x.begin(), x.end(), 0.0);
  REQUIRE(sum(Tensor(x)).shape() == Shape{});
  REQUIRE(sum(Tensor(x)).item() == Approx(total).epsilon(1e-6));
  REQUIRE(mean(Tensor(x)).item() == Approx(total / 24).epsilon(1e-6));
}

TEST_CASE("values: max along an axis matches xt::amax", "[values][reduce]") {
  const Shape shape{3, 4, 5};
  const Array x = normal(shape, 31);
  for (int axis : {0, 1, 2, -1, -3}) {
    const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
    Array want = xt::amax(x, std::vector<std::size_t>{ax}, xt::evaluation_strategy::immediate);
    INFO("axis " << axis);
    REQUIRE_CLOSE(max(Tensor(x), axis).value(), want, 0, 0);
    want.reshape(kept_shape(shape, {ax}));
    REQUIRE_CLOSE(max(Tensor(x), axis, true).value(), want, 0, 0);
  }
  // -inf and ties
  const Array y = {{-std::numeric_limits<float>::infinity(), -1.f, -1.f}, {2.f, 2.f, 0.f}};
  REQUIRE(max(Tensor(y), 1).value() == Array{-1.f, 2.f});
}

// ---------------------------------------------------------------------------------------------
// Shape ops

TEST_CASE("values: reshape keeps row-major order and infers -1", "[values][shape]") {
  const Array x = normal({2, 3, 4}, 41);
  const Tensor r = reshape(Tensor(x), {4, -1});
  REQUIRE(r.shape() == Shape{4, 6});
  REQUIRE(std::equal(x.begin(), x.end(), r.value().begin()));
  REQUIRE(reshape(Tensor(x), {-1}).shape() == Shape{24});
  REQUIRE(reshape(Tensor(x), {2, 1, 12}).value()(1, 0, 5) == x(1, 1, 1));
}

TEST_CASE("values: permute and transpose match xt::transpose", "[values][shape]") {
  const Array x = normal({2, 3, 4}, 51);
  const std::vector<std::vector<std::size_t>> perms = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0},
                                                       {2, 1, 0}, {0, 2, 1}, {1, 0, 2}};
  for (const auto& p : perms) {
    INFO("permutation " << p[0] << p[1] << p[2]);
    const Array want = xt::transpose(x, p);
    REQUIRE_CLOSE(permute(Tensor(x), {static_cast<int>(p[0]), static_cast<int>(p[1]), static_cast<int>(p[2])}).value(),
                  want, 0, 0);
  }
  REQUIRE_CLOSE(transpose(Tensor(x), 0, 2).value(), Array(xt::transpose(x, {2, 1, 0})), 0, 0);
  REQUIRE_CLOSE(transpose(Tensor(x), -1, -2).value(), Array(xt::transpose(x, {0, 2, 1})), 0, 0);
  const Array x4 = normal({2, 3, 2, 5}, 52);
  REQUIRE_CLOSE(permute(Tensor(x4), {0, 2, 1, 3}).value(), Array(xt::transpose(x4, {0, 2, 1, 3})), 0, 0);
  REQUIRE_CLOSE(permute(Tensor(x4), {3, -2, 0, 1}).value(), Array(xt::transpose(x4, {3, 2, 0, 1})), 0, 0);
}

TEST_CASE("values: slice, concat and split round trips", "[values][shape]") {
  const Array x = normal({2, 6, 3}, 61);
  const Tensor t(x);
  REQUIRE_CLOSE(slice(t, 1, 1, 4).value(), Array(xt::view(x, xt::all(), xt::range(1, 4), xt::all())), 0, 0);
  REQUIRE_CLOSE(slice(t, -1, 2, 3).value(), Array(xt::view(x, xt::all(), xt::all(), xt::range(2, 3))), 0, 0);
  REQUIRE_CLOSE(slice(t, 0, 1, 2).value(), Array(xt::view(x, xt::range(1, 2), xt::all(), xt::all())), 0, 0);
  REQUIRE(slice(t, 1, 3, 3).shape() == Shape{2, 0, 3});

  for (int axis : {0, 1, 2, -2}) {
    INFO("axis " << axis);
    const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + 3 : axis);
    const std::size_t n = x.shape()[ax];
    const std::vector<std::size_t> sizes =
        n == 2 ? std::vector<std::size_t>{1, 1} : std::vector<std::size_t>{1, n - 3, 2};
    const std::vector<Tensor> parts = split(t, sizes, axis);
    REQUIRE(parts.size() == sizes.size());
    std::size_t at = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      xt::xstrided_slice_vector sv(3, xt::all());
      sv[ax] = xt::range(at, at + sizes[i]);
      REQUIRE_CLOSE(parts[i].value(), Array(xt::strided_view(x, sv)), 0, 0);
      at += sizes[i];
    }
    REQUIRE_CLOSE(concat(parts, axis).value(), x, 0, 0);
  }
  // concat of three unequal parts along a middle axis matches xt::concatenate
  const Array a = normal({2, 1, 3}, 62), b = normal({2, 4, 3}, 63), c = normal({2, 2, 3}, 64);
  REQUIRE_CLOSE(concat({Tensor(a), Tensor(b), Tensor(c)}, 1).value(), Array(xt::concatenate(xt::xtuple(a, b, c), 1)), 0,
                0);
}

// ---------------------------------------------------------------------------------------------
// Matmul against a naive triple loop

namespace {

// op(A) op(B) in double with numpy batch broadcasting, written as the definition.
Array naive_matmul(const Array& A, const Array& B, bool ta, bool tb) {
  const Shape& sa = A.shape();
  const Shape& sb = B.shape();
  const std::size_t ra = sa[sa.size() - 2], ca = sa.back(), rb = sb[sb.size() - 2], cb = sb.back();
  const std::size_t M = ta ? ca : ra, K = ta ? ra : ca, N = tb ? rb : cb;
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const std::size_t nd = std::max(ba.size(), bb.size());
  Shape batch(nd);
  auto dim = [nd](const Shape& s, std::size_t k) { return k + s.size() < nd ? std::size_t{1} : s[k + s.size() - nd]; };
  for (std::size_t k = 0; k < nd; ++k) batch[k] = std::max(dim(ba, k), dim(bb, k));
  Shape os = batch;
  os.push_back(M);
  os.push_back(N);
  Array C = Array::from_shape(os);
  std::size_t count = 1;
  for (std::size_t d : batch) count *= d;
  for (std::size_t q = 0; q < count; ++q) {
    // batch multi-index of output batch q, then each operand's own (broadcast) batch offset
    std::size_t rest = q, offa = 0, offb = 0, stra = 1, strb = 1;
    for (std::size_t k = nd; k-- > 0;) {
      const std::size_t i = rest % batch[k];
      rest /= batch[k];
      offa += (dim(ba, k) == 1 ? 0 : i) * stra;
      offb += (dim(bb, k) == 1 ? 0 : i) * strb;
      stra *= dim(ba, k);
      strb *= dim(bb, k);
    }
    const float* a = A.data() + offa * ra * ca;
    const float* b = B.data() + offb * rb * cb;
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double acc = 0;
        for (std::size_t k = 0; k < K; ++k) {
          const double av = ta ? a[k * ca + i] : a[i * ca + k];
          const double bv = tb ? b[j * cb + k] : b[k * cb + j];
          acc += av * bv;
        }
        C.data()[(q * M + i) * N + j] = static_cast<float>(acc);
      }
  }
  return C;
}

Shape operand_shape(Shape batch, std::size_t rows, std::size_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

}  // namespace

TEST_CASE("values: matmul matches a naive loop for batches, broadcasting and transposes", "[values][matmul][gemm]") {
  struct Case {
    Shape batch_a, batch_b;
    std::size_t m, k, n;
  };
  const std::vector<Case> cases = {{{}, {}, 3, 4, 5},         {{}, {}, 1, 7, 1},   {{2}, {2}, 3, 4, 2},
                                   {{2, 3}, {2, 3}, 2, 5, 3}, {{2}, {}, 3, 4, 5},  {{2, 2}, {}, 4, 3, 2},
                                   {{1}, {2}, 3, 4, 2},       {{}, {2}, 3, 4, 5},  {{2, 1}, {3}, 2, 3, 4},
                                   {{3}, {2, 1}, 2, 3, 4},    {{}, {}, 33, 17, 29}};
  std::uint64_t seed = 70;
  for (const Case& c : cases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Array a = normal(operand_shape(c.batch_a, c.m, c.k, ta), ++seed);
        const Array b = normal(operand_shape(c.batch_b, c.k, c.n, tb), ++seed);
        INFO(shape_text(a.shape()) << (ta ? "^T" : "") << " @ " << shape_text(b.shape()) << (tb ? "^T" : ""));
        REQUIRE_CLOSE(matmul(Tensor(a), Tensor(b), ta, tb).value(), naive_matmul(a, b, ta, tb), 1e-5, 1e-5);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Neural-network functions

TEST_CASE("values: softmax rows sum to 1 and stay finite for |x| up to 1e4", "[values][nn]") {
  // moderate logits against the formula in double
  const Array x = normal({3, 7}, 81, 2.f);
  Array want = Array::from_shape(x.shape());
  for (std::size_t r = 0; r < 3; ++r) {
    double z = 0;
    for (std::size_t c = 0; c < 7; ++c) z += std::exp(static_cast<double>(x(r, c)));
    for (std::size_t c = 0; c < 7; ++c) want(r, c) = static_cast<float>(std::exp(static_cast<double>(x(r, c))) / z);
  }
  REQUIRE_CLOSE(softmax(Tensor(x)).value(), want, 1e-5, 1e-7);

  // huge logits: finite, nonnegative, rows sum to 1; the row maximum dominates
  const Array big = Generator(82).uniform({5, 9}, -1e4f, 1e4f);
  const Array y = softmax(Tensor(big), -1).value();
  REQUIRE(all_finite(y));
  for (std::size_t r = 0; r < 5; ++r) {
    double s = 0;
    std::size_t arg = 0;
    for (std::size_t c = 0; c < 9; ++c) {
      REQUIRE(y(r, c) >= 0.f);
      s += y(r, c);
      if (big(r, c) > big(r, arg)) arg = c;
    }
    REQUIRE(s == Approx(1).epsilon(1e-6));
    REQUIRE(y(r, arg) == Approx(1).epsilon(1e-6));
  }

  // along a middle axis: every (i, :, k) slice sums to 1
  const Array x3 = normal({2, 4, 3}, 83, 3.f);
  const Array y3 = softmax(Tensor(x3), 1).value();
  const Array sums = xt::sum(y3, {1}, xt::evaluation_strategy::immediate);
  REQUIRE_CLOSE(sums, Array(xt::ones<float>(Shape{2, 3})), 0, 1e-6);
}

TEST_CASE("values: log_softmax is finite for large logits and matches the formula", "[values][nn]") {
  const Array big = Generator(91).uniform({4, 6}, -1e4f, 1e4f);
  const Array y = log_softmax(Tensor(big), -1).value();
  REQUIRE(all_finite(y));
  Array want = Array::from_shape(big.shape());
  for (std::size_t r = 0; r < 4; ++r) {
    double m = -1e300, z = 0;
    for (std::size_t c = 0; c < 6; ++c) m = std::max(m, static_cast<double>(big(r, c)));
    for (std::size_t c = 0; c < 6; ++c) z += std::exp(big(r, c) - m);
    for (std::size_t c = 0; c < 6; ++c) want(r, c) = static_cast<float>(big(r, c) - m - std::log(z));
  }
  REQUIRE_CLOSE(y, want, 1e-6, 1e-5);
  // along a middle axis, exp(log_softmax) sums to 1
  const Array x3 = normal({2, 5, 3}, 92, 50.f);
  const Array e = xt::exp(log_softmax(Tensor(x3), -2).value());
  REQUIRE_CLOSE(Array(xt::sum(e, {1}, xt::evaluation_strategy::immediate)), Array(xt::ones<float>(Shape{2, 3})), 0,
                1e-5);
}

TEST_CASE("values: cross_entropy equals -mean log softmax at the kept targets", "[values][nn]") {
  const Array logits = normal({2, 3, 5}, 101, 2.f);
  // -log softmax(x)_t in double, averaged over the rows whose target is not ignored
  auto reference = [&](const IndexArray& targets, std::int64_t ignore) {
    double total = 0;
    int count = 0;
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 3; ++j) {
        const std::int64_t t = targets(i, j);
        if (t == ignore) continue;
        double z = 0;
        for (std::size_t c = 0; c < 5; ++c) z += std::exp(static_cast<double>(logits(i, j, c)));
        total += std::log(z) - logits(i, j, static_cast<std::size_t>(t));
        ++count;
      }
    return total / count;
  };
  const IndexArray t1 = {{1, -100, 4}, {0, 3, -100}};
  REQUIRE(cross_entropy(Tensor(logits), t1).item() == Approx(reference(t1, -100)).epsilon(1e-5));
  const IndexArray t2 = {{2, 0, 2}, {4, 2, 1}};
  REQUIRE(cross_entropy(Tensor(logits), t2, 2).item() == Approx(reference(t2, 2)).epsilon(1e-5));
  REQUIRE(cross_entropy(Tensor(logits), t2).item() == Approx(reference(t2, -100)).epsilon(1e-5));
  // every target ignored: the loss is 0
  const IndexArray none = {{-100, -100, -100}, {-100, -100, -100}};
  REQUIRE(cross_entropy(Tensor(logits), none).item() == 0.f);
  // huge logits stay finite
  const Array big = Generator(102).uniform({3, 4}, -1e4f, 1e4f);
  REQUIRE(std::isfinite(cross_entropy(Tensor(big), IndexArray{0, 1, 3}).item()));
}

TEST_CASE("values: masked_fill with a mask broadcast over leading axes", "[values][nn]") {
  const Array x = normal({2, 3, 4}, 111);
  Mask mask = xt::zeros<bool>(Shape{3, 4});
  mask(0, 1) = mask(1, 3) = mask(2, 0) = true;
  const Array y = masked_fill(Tensor(x), mask, -7.5f).value();
  REQUIRE(y.shape() == x.shape());
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        INFO("element (" << b << ", " << i << ", " << j << ")");
        REQUIRE(y(b, i, j) == (mask(i, j) ? -7.5f : x(b, i, j)));
      }
  // a (1, 3, 1) mask blanks whole rows; the input is left alone
  Mask rows = xt::zeros<bool>(Shape{1, 3, 1});
  rows(0, 2, 0) = true;
  const Tensor t(x);
  const Array z = masked_fill(t, rows, -std::numeric_limits<float>::infinity()).value();
  REQUIRE(std::isinf(z(1, 2, 3)));
  REQUIRE(z(1, 1, 3) == x(1, 1, 3));
  REQUIRE(t.value() == x);
}

TEST_CASE("values: masked_fill with per-element values copies them bit for bit", "[values][nn]") {
  Array x = normal({2, 3, 4}, 112);
  Array values = normal({2, 3, 4}, 113);
  values(1, 2, 0) = -0.f;  // the sign of a zero is kept too
  x(0, 0, 1) = -0.f;
  Mask mask = xt::zeros<bool>(Shape{2, 1, 4});
  mask(1, 0, 0) = mask(0, 0, 3) = true;
  const Array y = masked_fill(Tensor(x), mask, values).value();
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        INFO("element (" << b << ", " << i << ", " << j << ")");
        const float want = mask(b, 0, j) ? values(b, i, j) : x(b, i, j);
        REQUIRE(std::memcmp(&y(b, i, j), &want, sizeof want) == 0);
      }
}

TEST_CASE("values: embedding picks rows of the table", "[values][nn]") {
  const Array w = normal({5, 3}, 121);
  const IndexArray ids = {{1, 3, 1}, {0, 4, 4}};
  const Array y = embedding(Tensor(w), ids).value();
  REQUIRE(y.shape() == Shape{2, 3, 3});
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t c = 0; c < 3; ++c) REQUIRE(y(i, j, c) == w(static_cast<std::size_t>(ids(i, j)), c));
}

TEST_CASE("values: dropout zeroes about p of 100k elements and rescales the rest", "[values][nn]") {
  const std::size_t n = 100000;
  const float p = 0.3f;
  Generator g(3);
  const Array y = dropout(Tensor::ones({n}), p, true, g).value();
  std::size_t zeros = 0;
  double total = 0;
  bool kept_scaled = true;
  for (float v : y) {
    if (v == 0.f) {
      ++zeros;
    } else {
      kept_scaled = kept_scaled && std::abs(v - 1.0 / (1.0 - p)) < 1e-6;
    }
    total += v;
  }
  // the zero fraction has standard deviation sqrt(p (1-p) / n) ~ 0.0015: 0.01 is ~7 sigma
  CHECK(static_cast<double>(zeros) / n == Approx(p).margin(0.01));
  CHECK(kept_scaled);
  CHECK(total / n == Approx(1.0).margin(0.02));  // the mean is preserved

  // with random inputs the kept elements are x / (1 - p)
  const Array x = normal({1000}, 131);
  Generator g2(4);
  const Array yx = dropout(Tensor(x), 0.5f, true, g2).value();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (yx(i) != 0.f) REQUIRE(yx(i) == Approx(2.0 * x(i)).epsilon(1e-6));
  }
}

TEST_CASE("values: dropout is the identity in eval mode or with p = 0, and seeded", "[values][nn]") {
  const Array x = normal({4, 50}, 141);
  Generator g(5);
  REQUIRE(dropout(Tensor(x), 0.5f, false, g).value() == x);
  REQUIRE(dropout(Tensor(x), 0.f, true, g).value() == x);

  Generator g1(9), g2(9), g3(10);
  const Array a = dropout(Tensor(x), 0.5f, true, g1).value();
  const Array b = dropout(Tensor(x), 0.5f, true, g2).value();
  const Array c = dropout(Tensor(x), 0.5f, true, g3).value();
  REQUIRE(a == b);        // same seed, same mask
  REQUIRE_FALSE(a == c);  // another seed, another mask
  // the generator advances: a second call draws a new mask
  REQUIRE_FALSE(dropout(Tensor(x), 0.5f, true, g1).value() == a);
  // the default generator is reproducible through manual_seed
  manual_seed(21);
  const Array d1 = dropout(Tensor(x), 0.5f).value();
  manual_seed(21);
  REQUIRE(dropout(Tensor(x), 0.5f).value() == d1);
}

TEST_CASE("values: gelu_dropout is dropout(gelu) bit for bit, forward and backward, and uses one draw",
          "[values][nn]") {
  const Array x = normal({8, 300}, 143);  // 2400 elements: split across kernel threads when there are some
  const Array g = normal({8, 300}, 144);
  for (float p : {0.f, 0.1f, 0.5f}) {
    for (bool training : {true, false}) {
      INFO("p " << p << ", training " << training);
      Generator g1(3), g2(3);
      Tensor a(x, true), b(x, true);
      const Tensor fused = gelu_dropout(a, p, training, g1);
      const Tensor apart = dropout(gelu(b), p, training, g2);
      REQUIRE(fused.value() == apart.value());
      fused.backward(g);
      apart.backward(g);
      REQUIRE(a.grad() == b.grad());
      REQUIRE(g1.next_u64() == g2.next_u64());  // both drew the same amount
    }
  }
}

TEST_CASE("values: layer_norm rows have mean 0 and variance 1 without affine", "[values][nn]") {
  const std::size_t rows = 6, C = 64;
  Array x = normal({2, 3, C}, 151, 3.f);
  x += 5.f;  // an offset the normalization must remove
  const Array y = layer_norm(Tensor(x), Tensor(), Tensor()).value();
  REQUIRE(y.shape() == x.shape());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::size_t c = 0; c < C; ++c) m += y.data()[r * C + c];
    m /= C;
    for (std::size_t c = 0; c < C; ++c) v += (y.data()[r * C + c] - m) * (y.data()[r * C + c] - m);
    v /= C;
    INFO("row " << r);
    REQUIRE(std::abs(m) < 1e-5);
    REQUIRE(v == Approx(1).epsilon(1e-4));
  }
}

TEST_CASE("values: layer_norm with gamma and beta matches the formula in double", "[values][nn]") {
  const std::size_t rows = 4, C = 5;
  const Array x = normal({rows, C}, 161, 2.f);
  const Array gamma = normal({C}, 162), beta = normal({C}, 163);
  const float eps = 1e-3f;  // large enough to matter in the variance
  const Array y = layer_norm(Tensor(x), Tensor(gamma), Tensor(beta), eps).value();
  Array want = Array::from_shape(x.shape());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::size_t c = 0; c < C; ++c) m += x(r, c);
    m /= C;
    for (std::size_t c = 0; c < C; ++c) v += (x(r, c) - m) * (x(r, c) - m);
    v /= C;  // biased
    for (std::size_t c = 0; c < C; ++c) {
      want(r, c) = static_cast<float>((x(r, c) - m) / std::sqrt(v + eps) * gamma(c) + beta(c));
    }
  }
  REQUIRE_CLOSE(y, want, 1e-5, 1e-5);
}

TEST_CASE("values: rms_norm and its gradients on a case computed by hand", "[values][nn][rms_norm]") {
  // eps 24 makes mean(x^2) + eps a square: row 0 has mean(x^2) 1 (rstd 1/5), row 1 has 12 (1/6).
  const Array x = {{1.f, -1.f, 1.f, -1.f}, {2.f, 2.f, 2.f, 6.f}};
  const Array gamma = {1.f, 2.f, -1.f, 0.5f};
  Tensor tx(x, true), tg(gamma, true);
  const Tensor y = rms_norm(tx, tg, 24.f);
  REQUIRE_CLOSE(y.value(), Array({{0.2f, -0.4f, -0.2f, -0.1f}, {1.f / 3, 2.f / 3, -1.f / 3, 0.5f}}), 1e-6, 0);
  sum(y).backward();
  // dx = rstd (g gamma - xhat mean(g gamma xhat)): mean(...) is -1/8 in row 0 and 7/24 in row 1
  REQUIRE_CLOSE(tx.grad(),
                Array({{0.205f, 0.395f, -0.195f, 0.095f}, {65.f / 432, 137.f / 432, -79.f / 432, 15.f / 432}}), 1e-6,
                1e-7);
  // dgamma = the column sums of xhat
  REQUIRE_CLOSE(tg.grad(), Array({8.f / 15, 2.f / 15, 8.f / 15, 0.8f}), 1e-6, 0);
  // without gamma: xhat itself, and a row of zeros stays zero (rstd 1 / sqrt(eps))
  const Array z = rms_norm(Tensor(Array({{3.f, -4.f}, {0.f, 0.f}})), Tensor(), 3.5f).value();
  REQUIRE_CLOSE(z, Array({{0.75f, -1.f}, {0.f, 0.f}}), 1e-6, 0);
}

TEST_CASE("values: rms_norm rows have mean square 1 without a weight, whatever their scale", "[values][nn][rms_norm]") {
  const std::size_t rows = 6, C = 100;
  Array x = normal({2, 3, C}, 171, 3.f);
  x += 2.f;                                                // a mean rms_norm keeps
  for (std::size_t c = 0; c < C; ++c) x(1, 2, c) *= 1e4f;  // one row far larger: rows are normalized apart
  const Array y = rms_norm(Tensor(x), Tensor()).value();
  REQUIRE(y.shape() == x.shape());
  for (std::size_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    double ms_x = 0, ms_y = 0;
    for (std::size_t c = 0; c < C; ++c) {
      ms_x += double(x.data()[r * C + c]) * x.data()[r * C + c];
      ms_y += double(y.data()[r * C + c]) * y.data()[r * C + c];
    }
    REQUIRE(ms_y / C == Approx(1).epsilon(1e-5));
    const double rstd = 1 / std::sqrt(ms_x / C + 1e-6);
    for (std::size_t c = 0; c < C; ++c)
      REQUIRE(y.data()[r * C + c] == Approx(x.data()[r * C + c] * rstd).epsilon(1e-5));
  }
}

TEST_CASE("values: attention_weights and attend equal the heads split out with reshape and permute",
          "[values][attention][gemm]") {
  // B H = 64 heads of T = S = 24: enough for the heads to be split across threads.
  constexpr std::int64_t B = 16, T = 24, H = 4, D = 8, C = H * D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Mask padding = xt::zeros<bool>(Shape{B, 1, 1, T});
  for (std::int64_t s = 20; s < T; ++s) padding(3, 0, 0, s) = true;
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    Tensor q(normal({B, T, C}, 61), true), k(normal({B, T, C}, 62), true), v(normal({B, T, C}, 63), true);
    const Tensor w = attention_weights(q, k, H, scale, causal, &padding);
    const Tensor out = attend(w, v, H);

    Tensor q2(q.value(), true), k2(k.value(), true), v2(v.value(), true);
    auto heads = [&](const Tensor& x) { return permute(reshape(x, {B, T, H, D}), {0, 2, 1, 3}); };
    Mask blocked = xt::zeros<bool>(Shape{B, H, T, T});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t s = 0; s < T; ++s) blocked(b, h, t, s) = (causal && s > t) || padding(b, 0, 0, s);
    const Tensor w2 = masked_softmax(matmul(heads(q2), heads(k2), false, true) * scale, blocked);
    const Tensor out2 = reshape(permute(matmul(w2, heads(v2)), {0, 2, 1, 3}), {B, T, C});

    REQUIRE(difference_text(w.value(), w2.value(), 1e-5, 1e-6) == "");
    REQUIRE(difference_text(out.value(), out2.value(), 1e-5, 1e-6) == "");
    const Array g = normal({B, T, C}, 64);
    out.backward(g);
    out2.backward(g);
    REQUIRE(difference_text(q.grad(), q2.grad(), 1e-4, 1e-5) == "");
    REQUIRE(difference_text(k.grad(), k2.grad(), 1e-4, 1e-5) == "");
    REQUIRE(difference_text(v.grad(), v2.grad(), 1e-4, 1e-5) == "");
  }
}

TEST_CASE("values: attention_scores then masked_softmax give attention_weights' bits, forward and backward",
          "[values][attention][gemm]") {
  // The two forms of the attention weights share one softmax kernel and one product per head
  // block; the hook point "scores" relies on it (patching nothing there changes nothing).
  constexpr std::int64_t B = 16, T = 24, S = 20, H = 4, D = 8, C = H * D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  Mask padding = xt::zeros<bool>(Shape{B, 1, 1, S});
  for (std::int64_t s = 12; s < S; ++s) padding(3, 0, 0, s) = true;
  for (std::int64_t s = 0; s < S; ++s) padding(5, 0, 0, s) = true;  // entry 5 sees no key
  for (const bool causal : {false, true}) {
    for (const bool padded : {false, true}) {
      INFO("causal " << causal << ", padded " << padded);
      Tensor q(normal({B, T, C}, 71), true), k(normal({B, S, C}, 72), true);
      const Tensor w = attention_weights(q, k, H, scale, causal, padded ? &padding : nullptr);
      Tensor q2(q.value(), true), k2(k.value(), true);
      const Tensor scores = attention_scores(q2, k2, H, scale);
      Mask blocked = xt::zeros<bool>(Shape{B, H, T, S});
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t s = 0; s < S; ++s)
              blocked(b, h, t, s) = (causal && s > t) || (padded && padding(b, 0, 0, s));
      const Tensor w2 = masked_softmax(scores, blocked);
      REQUIRE(w.value() == w2.value());
      const Array g = normal({B, H, T, S}, 73);
      w.backward(g);
      w2.backward(g);
      REQUIRE(q.grad() == q2.grad());
      REQUIRE(k.grad() == k2.grad());
    }
  }
}

TEST_CASE("values: attention_scores equal scale q_h k_h^T with the heads split out", "[values][attention][gemm]") {
  constexpr std::int64_t B = 3, T = 5, S = 7, H = 2, D = 3, C = H * D;
  const Array q = normal({B, T, C}, 74), k = normal({B, S, C}, 75);
  const Array scores = attention_scores(Tensor(q), Tensor(k), H, 0.3f).value();
  REQUIRE(scores.shape() == Shape{B, H, T, S});
  Array want = Array::from_shape({B, H, T, S});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (std::int64_t j = 0; j < D; ++j) dot += static_cast<double>(q(b, t, h * D + j)) * k(b, s, h * D + j);
          want(b, h, t, s) = static_cast<float>(0.3 * dot);
        }
  REQUIRE_CLOSE(scores, want, 1e-5, 1e-6);
}
