// xgrad::gradcheck (central differences vs backward) run on every op in core/autograd/ops.hpp, with
// broadcasting, negative axes, keepdims, batched/transposed matmul and a tiny attention block.
// Forward values are tested in test_ops_values.cpp; the checker itself in test_gradcheck.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "random_tensors.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

using Ins = std::vector<Tensor>;

using testing::randn;

// U(low, high) values from a fixed seed, as a leaf that requires grad.
Tensor randu(const Shape& shape, std::uint64_t seed, float low, float high) {
  Generator g(seed);
  return Tensor(g.uniform(shape, low, high), true);
}

// Magnitudes in [0.5, 2) with random signs: safe denominators, and far from ReLU's kink.
Tensor away_from_zero(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  Array a = g.uniform(shape, 0.5f, 2.f);
  for (float& v : a) v = g.uniform() < 0.5f ? -v : v;
  return Tensor(std::move(a), true);
}

// A shuffled arange(n) * 0.1 (+ offset): every value distinct and at least 0.1 apart, so no
// finite-difference step (eps = 1e-2) can change which element of a slice is the maximum.
Tensor distinct_values(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  Array a = g.uniform(shape, 0.f, 1.f);  // only for the shape: every value is overwritten below
  std::vector<float> v(a.size());
  std::iota(v.begin(), v.end(), 0.f);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
  for (std::size_t i = 0; i < v.size(); ++i) a.data()[i] = 0.1f * v[i] - 0.05f * static_cast<float>(v.size());
  return Tensor(std::move(a), true);
}

std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + ")";
}

std::string axes_text(const std::vector<int>& axes) {
  std::string out = "{";
  for (std::size_t k = 0; k < axes.size(); ++k) out += (k ? ", " : "") + std::to_string(axes[k]);
  return out + "}";
}

// Stored shape of a matmul operand whose logical last two axes are (rows, cols).
Shape operand_shape(Shape batch, std::size_t rows, std::size_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return batch;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Elementwise binary ops with numpy broadcasting

TEST_CASE("gradcheck: add/sub/mul/div broadcast in both directions", "[gradcheck][elementwise]") {
  const std::vector<std::pair<Shape, Shape>> pairs = {{{2, 3, 4}, {2, 3, 4}},
                                                      {{2, 3, 4}, {3, 1}},
                                                      {{3, 1}, {2, 3, 4}},
                                                      {{2, 3, 4}, {4}},
                                                      {{4}, {2, 3, 4}},
                                                      {{1, 3, 1}, {2, 3, 4}},
                                                      {{2, 3, 4}, {1, 3, 1}},
                                                      {{2, 1, 4}, {3, 1}},
                                                      {{2, 3, 4}, {}},
                                                      {{}, {2, 3, 4}},
                                                      {{}, {}}};
  std::uint64_t seed = 100;
  for (const auto& [sa, sb] : pairs) {
    INFO("a " << shape_text(sa) << ", b " << shape_text(sb));
    const Tensor a = randn(sa, ++seed);
    const Tensor b = randn(sb, ++seed);
    const Tensor denom = away_from_zero(sb, ++seed);
    REQUIRE_GRADCHECK([](const Ins& in) { return add(in[0], in[1]); }, {a, b});
    REQUIRE_GRADCHECK([](const Ins& in) { return sub(in[0], in[1]); }, {a, b});
    REQUIRE_GRADCHECK([](const Ins& in) { return mul(in[0], in[1]); }, {a, b});
    REQUIRE_GRADCHECK([](const Ins& in) { return div(in[0], in[1]); }, {a, denom});
    // the same input on both sides: both gradient contributions must accumulate
    REQUIRE_GRADCHECK([](const Ins& in) { return mul(in[0], in[0]); }, {a});
  }
}

TEST_CASE("gradcheck: only one operand requires grad", "[gradcheck][elementwise]") {
  const Tensor a = randn({2, 3, 4}, 1);
  const Tensor b(randn({3, 1}, 2).value(), false);
  REQUIRE_GRADCHECK([](const Ins& in) { return mul(in[0], in[1]); }, {a, b});
  REQUIRE_GRADCHECK([](const Ins& in) { return mul(in[1], in[0]); }, {a, b});
}

TEST_CASE("gradcheck: scalar variants add/sub/rsub/mul/div/rdiv and neg", "[gradcheck][elementwise]") {
  const Tensor x = randn({3, 4}, 11);
  const Tensor d = away_from_zero({3, 4}, 12);
  REQUIRE_GRADCHECK([](const Ins& in) { return add(in[0], 1.5f); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return sub(in[0], 0.7f); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return rsub(2.f, in[0]); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return mul(in[0], -3.f); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return div(in[0], 4.f); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return rdiv(1.5f, in[0]); }, {d});
  REQUIRE_GRADCHECK([](const Ins& in) { return neg(in[0]); }, {x});
  // the operator spellings route to the same ops
  REQUIRE_GRADCHECK([](const Ins& in) { return 2.f - in[0] * 0.5f + 1.f / in[1] - (-in[0]) / 3.f; }, {x, d});
}

// ---------------------------------------------------------------------------------------------
// Elementwise unary functions

TEST_CASE("gradcheck: exp, log, sqrt", "[gradcheck][elementwise]") {
  REQUIRE_GRADCHECK([](const Ins& in) { return exp(in[0]); }, {randn({2, 3, 4}, 21)});
  REQUIRE_GRADCHECK([](const Ins& in) { return log(in[0]); }, {randu({2, 3, 4}, 22, 0.3f, 3.f)});
  REQUIRE_GRADCHECK([](const Ins& in) { return sqrt(in[0]); }, {randu({2, 3, 4}, 23, 0.3f, 3.f)});
}

TEST_CASE("gradcheck: pow with fractional, negative and integer exponents", "[gradcheck][elementwise]") {
  const Tensor positive = randu({3, 4}, 31, 0.4f, 2.5f);
  for (float p : {0.5f, 1.5f, 2.5f, -0.5f, -1.f, -2.f, 1.f / 3.f, 0.f, 1.f}) {
    INFO("exponent " << p << " on positive inputs");
    REQUIRE_GRADCHECK([p](const Ins& in) { return pow(in[0], p); }, {positive});
  }
  const Tensor any_sign = randn({3, 4}, 32);
  for (float p : {2.f, 3.f}) {
    INFO("exponent " << p << " on inputs of any sign");
    REQUIRE_GRADCHECK([p](const Ins& in) { return pow(in[0], p); }, {any_sign});
  }
}

TEST_CASE("gradcheck: tanh and sigmoid", "[gradcheck][elementwise]") {
  const Tensor x = randn({2, 3, 4}, 41, 2.f);
  REQUIRE_GRADCHECK([](const Ins& in) { return tanh(in[0]); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return sigmoid(in[0]); }, {x});
  // sigmoid's two branches (x >= 0 and x < 0) both at large magnitude
  REQUIRE_GRADCHECK([](const Ins& in) { return sigmoid(in[0]); }, {randu({10}, 42, -8.f, 8.f)});
}

TEST_CASE("gradcheck: relu away from the kink and with skip_kinks", "[gradcheck][elementwise]") {
  // every |x| >= 0.5 > eps: no finite-difference step crosses 0
  REQUIRE_GRADCHECK([](const Ins& in) { return relu(in[0]); }, {away_from_zero({3, 5}, 51)});
  // normal draws, some possibly within eps of 0: those are skipped, the rest compared
  GradcheckOptions opt;
  opt.skip_kinks = true;
  REQUIRE_GRADCHECK([](const Ins& in) { return relu(in[0]); }, {randn({4, 6}, 52)}, opt);
}

TEST_CASE("gradcheck: gelu, exact and tanh approximations", "[gradcheck][elementwise]") {
  const Tensor x = randn({3, 7}, 61, 2.f);
  REQUIRE_GRADCHECK([](const Ins& in) { return gelu(in[0], GeluApprox::exact); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return gelu(in[0], GeluApprox::tanh); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return gelu(in[0]); }, {x});
}

TEST_CASE("gradcheck: gated_unit with SiLU, exact GELU and tanh GELU, both inputs", "[gradcheck][elementwise]") {
  const Tensor gate = randn({3, 7}, 62, 2.f), up = randn({3, 7}, 63);
  for (GatedActivation act : {GatedActivation::silu, GatedActivation::gelu, GatedActivation::gelu_tanh}) {
    INFO("activation " << static_cast<int>(act));
    REQUIRE_GRADCHECK([act](const Ins& in) { return gated_unit(in[0], in[1], act); }, {gate, up});
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST_CASE("gradcheck: sum and mean over all elements and over axis sets", "[gradcheck][reduce]") {
  const Tensor x = randn({2, 3, 4}, 71);
  REQUIRE_GRADCHECK([](const Ins& in) { return sum(in[0]); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return mean(in[0]); }, {x});
  const std::vector<std::vector<int>> axis_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {-3, -1}, {1, -1}, {0, 1, 2}, {}};
  for (const auto& axes : axis_sets) {
    for (bool keepdims : {false, true}) {
      INFO("axes " << axes_text(axes) << ", keepdims " << keepdims);
      REQUIRE_GRADCHECK([axes, keepdims](const Ins& in) { return sum(in[0], axes, keepdims); }, {x});
      REQUIRE_GRADCHECK([axes, keepdims](const Ins& in) { return mean(in[0], axes, keepdims); }, {x});
    }
  }
  // a scalar-shaped input
  REQUIRE_GRADCHECK([](const Ins& in) { return sum(in[0]); }, {randn({}, 72)});
}

TEST_CASE("gradcheck: max along each axis without ties", "[gradcheck][reduce]") {
  const Tensor x = distinct_values({2, 3, 4}, 81);
  for (int axis : {0, 1, 2, -1, -2}) {
    for (bool keepdims : {false, true}) {
      INFO("axis " << axis << ", keepdims " << keepdims);
      REQUIRE_GRADCHECK([axis, keepdims](const Ins& in) { return max(in[0], axis, keepdims); }, {x});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Shape ops

TEST_CASE("gradcheck: reshape, including an inferred -1", "[gradcheck][shape]") {
  const Tensor x = randn({2, 3, 4}, 91);
  const std::vector<std::vector<std::int64_t>> shapes = {{4, -1}, {-1}, {2, 12}, {3, 2, -1, 1}, {24}};
  for (const auto& s : shapes) {
    // multiplied by a position-dependent weight so a scrambled gradient would not pass
    const Tensor w(Generator(92).normal({24}, 0.f, 1.f));
    REQUIRE_GRADCHECK([s, w](const Ins& in) { return mul(reshape(reshape(in[0], s), {-1}), w); }, {x});
  }
}

TEST_CASE("gradcheck: transpose and permute", "[gradcheck][shape]") {
  const Tensor x = randn({2, 3, 4}, 101);
  REQUIRE_GRADCHECK([](const Ins& in) { return transpose(in[0], 0, 2); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return transpose(in[0], -1, -2); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return permute(in[0], {2, 0, 1}); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return permute(in[0], {1, 2, 0}); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return permute(in[0], {0, -2, 1, 3}); }, {randn({2, 3, 2, 4}, 102)});
}

TEST_CASE("gradcheck: slice along several axes", "[gradcheck][shape]") {
  const Tensor x = randn({3, 4, 5}, 111);
  REQUIRE_GRADCHECK([](const Ins& in) { return slice(in[0], 1, 1, 3); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return slice(in[0], -1, 0, 2); }, {x});
  REQUIRE_GRADCHECK([](const Ins& in) { return slice(in[0], 0, 2, 3); }, {x});
  // two overlapping slices of the same input: gradients accumulate where they overlap
  REQUIRE_GRADCHECK([](const Ins& in) { return mul(slice(in[0], 2, 0, 3), slice(in[0], 2, 2, 5)); }, {x});
}

TEST_CASE("gradcheck: concat of three parts along a middle axis", "[gradcheck][shape]") {
  const Tensor a = randn({2, 1, 4}, 121);
  const Tensor b = randn({2, 3, 4}, 122);
  const Tensor c = randn({2, 2, 4}, 123);
  REQUIRE_GRADCHECK([](const Ins& in) { return concat({in[0], in[1], in[2]}, 1); }, {a, b, c});
  REQUIRE_GRADCHECK([](const Ins& in) { return concat({in[0], in[1], in[2]}, -2); }, {a, b, c});
  // a part used twice, and a part that does not require grad
  const Tensor fixed(randn({2, 2, 4}, 124).value(), false);
  REQUIRE_GRADCHECK([](const Ins& in) { return concat({in[0], in[1], in[0], in[2]}, 1); }, {a, b, fixed});
}

TEST_CASE("gradcheck: split into unequal pieces", "[gradcheck][shape]") {
  const Tensor x = randn({2, 6, 3}, 131);
  // pieces recombined out of order and scaled differently
  REQUIRE_GRADCHECK(
      [](const Ins& in) {
    const std::vector<Tensor> p = split(in[0], {1, 2, 3}, 1);
    return concat({p[2], mul(p[0], 3.f), mul(p[1], p[1])}, 1);
      },
      {x});
  // only the middle piece is used: the others get a zero gradient
  REQUIRE_GRADCHECK([](const Ins& in) { return split(in[0], {2, 1}, -1)[1]; }, {x});
}

// ---------------------------------------------------------------------------------------------
// Matmul

namespace {

// gradcheck of matmul for logical shapes (batch_a..., M, K) @ (batch_b..., K, N) under every
// combination of transpose flags (the stored operands are transposed to match).
void check_matmul_all_flags(const Shape& batch_a, const Shape& batch_b, std::size_t m, std::size_t k, std::size_t n,
                            std::uint64_t seed) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Shape sa = operand_shape(batch_a, m, k, ta);
      const Shape sb = operand_shape(batch_b, k, n, tb);
      INFO("stored a " << shape_text(sa) << (ta ? "^T" : "") << " @ stored b " << shape_text(sb) << (tb ? "^T" : ""));
      const Tensor a = randn(sa, seed++);
      const Tensor b = randn(sb, seed++);
      REQUIRE_GRADCHECK([ta, tb](const Ins& in) { return matmul(in[0], in[1], ta, tb); }, {a, b});
    }
  }
}

}  // namespace

TEST_CASE("gradcheck: matmul 2-D with every transpose combination", "[gradcheck][matmul][gemm]") {
  check_matmul_all_flags({}, {}, 3, 4, 5, 141);
  check_matmul_all_flags({}, {}, 1, 3, 1, 142);
}

TEST_CASE("gradcheck: batched matmul 3-D and 4-D", "[gradcheck][matmul][gemm]") {
  check_matmul_all_flags({2}, {2}, 3, 4, 2, 151);
  check_matmul_all_flags({2, 2}, {2, 2}, 2, 3, 2, 152);
}

TEST_CASE("gradcheck: matmul with a 2-D right operand shared by the batch", "[gradcheck][matmul][gemm]") {
  check_matmul_all_flags({2}, {}, 3, 4, 5, 161);
  check_matmul_all_flags({2, 2}, {}, 2, 3, 2, 162);
}

TEST_CASE("gradcheck: matmul with broadcast batch axes", "[gradcheck][matmul][gemm]") {
  check_matmul_all_flags({1}, {2}, 3, 4, 2, 171);     // (1,3,4) @ (2,4,2)
  check_matmul_all_flags({}, {2}, 3, 4, 5, 172);      // (3,4) @ (2,4,5)
  check_matmul_all_flags({2, 1}, {3}, 2, 3, 2, 173);  // (2,1,2,3) @ (3,3,2) -> batch (2,3)
  check_matmul_all_flags({3}, {2, 1}, 2, 3, 2, 174);  // (3,2,3) @ (2,1,3,2) -> batch (2,3)
}

TEST_CASE("gradcheck: matmul with one operand used twice", "[gradcheck][matmul][gemm]") {
  // x @ x^T: both matmul gradients land on the same input
  REQUIRE_GRADCHECK([](const Ins& in) { return matmul(in[0], in[0], false, true); }, {randn({2, 3, 4}, 181)});
}

TEST_CASE("gradcheck: linear with and without bias, on 1-D, 2-D and 3-D inputs", "[gradcheck][matmul][linear][gemm]") {
  const Tensor w = randn({5, 4}, 185), b = randn({5}, 186);
  for (const Shape& xs : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}}) {
    INFO("x " << shape_text(xs));
    const Tensor x = randn(xs, 187);
    REQUIRE_GRADCHECK([](const Ins& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
    REQUIRE_GRADCHECK([](const Ins& in) { return linear(in[0], in[1]); }, {x, w});
  }
}

TEST_CASE("gradcheck: attention_weights self and cross, causal, masked, with a fully masked row",
          "[gradcheck][attention][gemm]") {
  const Tensor q = randn({2, 3, 4}, 188), k = randn({2, 3, 4}, 189), k_long = randn({2, 5, 4}, 190);
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_weights(in[0], in[1], 2, 0.7f); }, {q, k});
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_weights(in[0], in[1], 2, 0.7f); }, {q, k_long});
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_weights(in[0], in[1], 1, 0.5f, true); }, {q, k});
  Mask mask = xt::zeros<bool>(Shape{2, 1, 3, 5});
  mask(0, 0, 1, 3) = mask(1, 0, 0, 0) = true;
  for (std::size_t s = 0; s < 5; ++s) mask(1, 0, 2, s) = true;  // query 2 of batch 1 sees no key
  REQUIRE_GRADCHECK([&](const Ins& in) { return attention_weights(in[0], in[1], 2, 0.7f, false, &mask); }, {q, k_long});
  // q and k the same tensor: both gradients land on it
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_weights(in[0], in[0], 2, 0.7f, true); }, {q});
}

TEST_CASE("gradcheck: attention_scores self, cross and with q and k one tensor", "[gradcheck][attention][gemm]") {
  const Tensor q = randn({2, 3, 4}, 195), k = randn({2, 5, 4}, 196);
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_scores(in[0], in[1], 2, 0.7f); }, {q, k});
  REQUIRE_GRADCHECK([](const Ins& in) { return attention_scores(in[0], in[0], 1, 0.5f); }, {q});
}

TEST_CASE("gradcheck: attend, and attention_weights followed by attend", "[gradcheck][attention][gemm]") {
  const Tensor w = softmax(randn({2, 2, 3, 5}, 191)), v = randn({2, 5, 4}, 192);
  REQUIRE_GRADCHECK([](const Ins& in) { return attend(in[0], in[1], 2); }, {w, v});
  const Tensor q = randn({2, 3, 4}, 193), k = randn({2, 5, 4}, 194);
  REQUIRE_GRADCHECK([](const Ins& in) { return attend(attention_weights(in[0], in[1], 2, 0.7f), in[2], 2); },
                    {q, k, v});
}

// ---------------------------------------------------------------------------------------------
// Neural-network functions

TEST_CASE("gradcheck: softmax and log_softmax on the last and a middle axis", "[gradcheck][nn]") {
  const Tensor x = randn({2, 3, 5}, 191, 2.f);
  for (int axis : {-1, 2, 1, 0}) {
    INFO("axis " << axis);
    REQUIRE_GRADCHECK([axis](const Ins& in) { return softmax(in[0], axis); }, {x});
    REQUIRE_GRADCHECK([axis](const Ins& in) { return log_softmax(in[0], axis); }, {x});
  }
}

TEST_CASE("gradcheck: masked_fill with per-element values", "[gradcheck][nn]") {
  const Tensor x = randn({2, 3, 4}, 203);
  const Array values = randn({2, 3, 4}, 204).value();
  Mask mask = xt::zeros<bool>(Shape{1, 3, 1});
  mask(0, 1, 0) = true;
  REQUIRE_GRADCHECK([mask, values](const Ins& in) { return mul(masked_fill(in[0], mask, values), in[0]); }, {x});
}

TEST_CASE("gradcheck: masked_fill with a mask broadcast over leading axes", "[gradcheck][nn]") {
  const Tensor x = randn({2, 3, 4}, 201);
  Mask mask = xt::zeros<bool>(Shape{3, 4});
  mask(0, 1) = mask(1, 3) = mask(2, 0) = mask(2, 2) = true;
  REQUIRE_GRADCHECK([mask](const Ins& in) { return masked_fill(in[0], mask, -5.f); }, {x});
  Mask row_mask = xt::zeros<bool>(Shape{1, 3, 1});
  row_mask(0, 1, 0) = true;
  REQUIRE_GRADCHECK([row_mask](const Ins& in) { return mul(masked_fill(in[0], row_mask, 0.f), in[0]); }, {x});

  SECTION("masked positions receive exactly zero gradient") {
    Tensor leaf(x.value(), true);
    Tensor y = masked_fill(leaf, mask, -5.f);
    const Array seed = Generator(202).uniform(y.shape(), 0.5f, 1.5f);  // nonzero everywhere
    y.backward(seed);
    const Array& g = leaf.grad();
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 4; ++j) {
          INFO("element (" << b << ", " << i << ", " << j << ")");
          REQUIRE(g(b, i, j) == (mask(i, j) ? 0.f : seed(b, i, j)));
        }
      }
    }
  }
}

TEST_CASE("gradcheck: cross_entropy with ignored targets", "[gradcheck][nn]") {
  const Tensor logits = randn({2, 3, 5}, 211, 1.5f);
  SECTION("default ignore_index -100") {
    const IndexArray targets = {{1, -100, 4}, {0, 3, -100}};
    REQUIRE_GRADCHECK([targets](const Ins& in) { return cross_entropy(in[0], targets); }, {logits});
  }
  SECTION("custom ignore_index that is also a valid class") {
    const IndexArray targets = {{2, 0, 2}, {4, 2, 1}};
    REQUIRE_GRADCHECK([targets](const Ins& in) { return cross_entropy(in[0], targets, 2); }, {logits});
  }
  SECTION("custom negative ignore_index, 2-D logits") {
    const Tensor l2 = randn({4, 3}, 212);
    const IndexArray targets = {0, -1, 2, 2};
    REQUIRE_GRADCHECK([targets](const Ins& in) { return cross_entropy(in[0], targets, -1); }, {l2});
  }
}

TEST_CASE("gradcheck: embedding with repeated ids accumulates", "[gradcheck][nn]") {
  const Tensor weight = randn({5, 3}, 221);
  const IndexArray ids = {{1, 3, 1}, {0, 3, 3}};  // rows 1 and 3 are picked several times; 2, 4 never
  REQUIRE_GRADCHECK([ids](const Ins& in) { return embedding(in[0], ids); }, {weight});
}

TEST_CASE("gradcheck: dropout with a fixed generator seed", "[gradcheck][nn]") {
  const Tensor x = randn({4, 6}, 231);
  // a fresh Generator(7) on every call gives the same mask, so the function is deterministic
  auto fn = [](const Ins& in) {
    Generator g(7);
    return dropout(in[0], 0.4f, true, g);
  };
  REQUIRE_GRADCHECK(fn, {x});
  {  // the check is not vacuous: the mask drops some elements and keeps others
    const Tensor y = fn({x});
    const auto zeros = std::count(y.value().begin(), y.value().end(), 0.f);
    CHECK(zeros > 0);
    CHECK(zeros < static_cast<long>(y.size()));
  }
  REQUIRE_GRADCHECK([](const Ins& in) { return dropout(in[0], 0.4f, false); }, {x});  // eval: identity
}

TEST_CASE("gradcheck: gelu_dropout with a fixed generator seed", "[gradcheck][nn]") {
  const Tensor x = randn({4, 6}, 233, 2.f);
  auto fn = [](const Ins& in) {
    Generator g(7);
    return gelu_dropout(in[0], 0.4f, true, g);
  };
  REQUIRE_GRADCHECK(fn, {x});
  {  // the mask drops some elements and keeps others
    const Tensor y = fn({x});
    const auto zeros = std::count(y.value().begin(), y.value().end(), 0.f);
    CHECK(zeros > 0);
    CHECK(zeros < static_cast<long>(y.size()));
  }
  REQUIRE_GRADCHECK([](const Ins& in) { return gelu_dropout(in[0], 0.4f, false); }, {x});  // eval: GELU
}

TEST_CASE("gradcheck: layer_norm with and without gamma/beta", "[gradcheck][nn]") {
  const Tensor x = randn({2, 3, 6}, 241, 2.f);
  const Tensor gamma = randn({6}, 242);
  const Tensor beta = randn({6}, 243);
  auto fn = [](const Ins& in) { return layer_norm(in[0], in[1], in[2]); };
  SECTION("affine: gradients of x, gamma and beta") { REQUIRE_GRADCHECK(fn, {x, gamma, beta}); }
  SECTION("affine, only gamma and beta require grad") {
    REQUIRE_GRADCHECK(fn, {Tensor(x.value(), false), gamma, beta});
  }
  SECTION("undefined gamma and beta") { REQUIRE_GRADCHECK(fn, {x, Tensor(), Tensor()}); }
  SECTION("2-D input, gamma only") { REQUIRE_GRADCHECK(fn, {randn({3, 4}, 244), randn({4}, 245), Tensor()}); }
}

TEST_CASE("gradcheck: rms_norm with and without gamma", "[gradcheck][nn][rms_norm]") {
  const Tensor x = randn({2, 3, 6}, 246, 2.f);
  const Tensor gamma = randn({6}, 247);
  auto fn = [](const Ins& in) { return rms_norm(in[0], in[1]); };
  SECTION("gradients of x and gamma") { REQUIRE_GRADCHECK(fn, {x, gamma}); }
  SECTION("only gamma requires grad") { REQUIRE_GRADCHECK(fn, {Tensor(x.value(), false), gamma}); }
  SECTION("undefined gamma") { REQUIRE_GRADCHECK(fn, {x, Tensor()}); }
  SECTION("an eps that matters, rows of 37 (a block of 32 and a tail)") {
    REQUIRE_GRADCHECK([](const Ins& in) { return rms_norm(in[0], in[1], 0.5f); },
                      {randn({3, 37}, 248, 0.5f), randn({37}, 249)});
  }
}

// ---------------------------------------------------------------------------------------------
// Compositions

TEST_CASE("gradcheck: tiny causal attention softmax(q k^T / sqrt(D)) v", "[gradcheck][composition][gemm]") {
  // Shapes: B batch 2, H heads 2, T length 4, D head size 3.
  const std::size_t T = 4, D = 3;
  Mask causal = xt::zeros<bool>(Shape{T, T});
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = i + 1; j < T; ++j) causal(i, j) = true;
  auto attention = [causal, D](const Ins& in) {
    Tensor scores = div(matmul(in[0], in[1], false, true), std::sqrt(static_cast<float>(D)));  // (B, H, T, T)
    Tensor probs = softmax(masked_fill(scores, causal, -1e9f), -1);
    return matmul(probs, in[2]);  // (B, H, T, D)
  };
  REQUIRE_GRADCHECK(attention, {randn({2, 2, T, D}, 251), randn({2, 2, T, D}, 252), randn({2, 2, T, D}, 253)});
}

TEST_CASE("gradcheck: a small MLP block with layer norm, GELU and a residual", "[gradcheck][composition][gemm]") {
  // x (N, C) -> x + gelu(LN(x) @ W1 + b1) @ W2, reduced to a scalar by a mean
  auto block = [](const Ins& in) {
    Tensor h = layer_norm(in[0], in[1], Tensor());
    h = gelu(add(matmul(h, in[2]), in[3]), GeluApprox::tanh);
    return mean(pow(add(in[0], matmul(h, in[4])), 2.f));
  };
  REQUIRE_GRADCHECK(block, {randn({3, 4}, 261), randn({4}, 262), randn({4, 5}, 263, 0.5f), randn({5}, 264),
                            randn({5, 4}, 265, 0.5f)});
}

TEST_CASE("gradcheck: a language-model loss over embeddings", "[gradcheck][composition][gemm]") {
  // ids (B, T) -> embedding (B, T, C) -> logits (B, T, V) by the tied table -> cross-entropy
  const IndexArray ids = {{0, 2, 2}, {4, 1, 0}};
  const IndexArray targets = {{2, 2, -100}, {1, 0, 3}};
  REQUIRE_GRADCHECK(
      [ids, targets](const Ins& in) {
    Tensor h = tanh(embedding(in[0], ids));
    return cross_entropy(matmul(h, in[0], false, true), targets);
      },
      {randn({5, 3}, 271)});
}
