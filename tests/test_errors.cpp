// Bad inputs: every one raises xgrad::Error whose message names the op and the offending
// shapes or values; afterwards the engine keeps working. (Engine semantics: test_tape.cpp.)
//
// Bad input                                         | Error message contains
// --------------------------------------------------+---------------------------------------------
// add/sub/mul/div of (2, 3) and (4, 3)              | "<op>: shapes (2, 3) and (4, 3) cannot be broadcast"
// div by the scalar 0                               | "div: ... by the scalar 0"
// matmul (2, 3) @ (4, 5)                            | "matmul: inner dimensions differ: (2, 3) @ (4, 5)"
// matmul (3) @ (3, 2)  (1-D operand)                | "matmul: operands need at least 2 axes"
// matmul (2, 3, 4) @ (5, 4, 6)  (batch 2 vs 5)      | "matmul: shapes (2) and (5) cannot be broadcast"
// backward() on (2, 3) without a seed               | "backward: called without a seed ... (2, 3)"
// backward(seed (3)) on (2, 3)                      | "backward: seed gradient of shape (3) ... (2, 3)"
// backward() twice                                  | "backward: ... already released ... retain_graph=true"
// backward() on a tensor that does not require grad | "backward: the tensor does not require grad"
// axis 2 / -3 of a rank-2 tensor: sum, mean, max,   | "<op>: axis 2 is out of range for a tensor of rank 2"
//   softmax, log_softmax, slice, concat, split,     |
//   transpose, permute                              |
// sum axes {1, 1} or {2, -1} of a rank-3 tensor    | "sum: axis -1 is listed twice"
// permute (0, 0, 1) / (1, 0) of a rank-3 tensor     | "permute: axis 0 repeats" / "permute: 2 axes given"
// reshape (2, 3) -> (4, 2)                          | "reshape: cannot reshape (2, 3) (6 elements) into (4, 2)"
// reshape (2, 3) -> (-1, -1)                        | "reshape: more than one -1 in (-1, -1)"
// slice [1, 5) / [2, 1) of an axis of length 3      | "slice: range [1, 5) is outside axis 1 of length 3"
// concat (2, 3) with (3, 3) on axis 1; concat {}    | "concat: shape (3, 3) does not match (2, 3)" / "no tensors"
// split (3, 2) into sizes (1, 1) on axis 0          | "split: sizes (1, 1) add up to 2 ... has length 3"
// embedding index -1 or 4 in a table of 4 rows      | "embedding: index 4 ... outside the table of 4 rows"
// embedding weight of shape (4)                     | "embedding: weight must be (V, C), got (4)"
// cross_entropy target 3 (or -1) with 3 classes     | "cross_entropy: target 3 ... outside [0, 3)"
// cross_entropy targets (3) for logits (2, 3)       | "cross_entropy: targets of shape (3) do not match"
// dropout p = -0.1, 1.0, 1.5, NaN                   | "dropout: probability 1.5 is outside [0, 1)"
// layer_norm gamma (3) / beta (4, 1) for C = 4      | "layer_norm: gamma of shape (3) does not match"
// layer_norm eps = 0                                | "layer_norm: eps must be positive"
// masked_fill mask (3) or (2, 2, 4) on (2, 4)       | "masked_fill: ... (3) ... (2, 4)"
// masked_fill values (4, 2) on (2, 4)               | "masked_fill: values of shape (4, 2) ... (2, 4)"
// an undefined Tensor() passed to an op             | "<op>: input is an undefined tensor"
// Tensor().value() / Tensor().backward()           | "Tensor::value: the tensor is undefined" / "Tensor::node: ..."
// Tensor::grad() before any backward                | "Tensor::grad: no gradient for 'w'"
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"

using namespace xgrad;
using Catch::Contains;

namespace {

Tensor filled(const Shape& shape, bool requires_grad = false) {
  Array a = Array::from_shape(shape);
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = 0.1f * static_cast<float>(i + 1);
  return Tensor(std::move(a), requires_grad);
}

}  // namespace

TEST_CASE("binary ops reject shapes that do not broadcast, naming the op and both shapes", "[errors]") {
  Tensor a = filled({2, 3}, true);
  Tensor b = filled({4, 3});
  REQUIRE_THROWS_AS(add(a, b), Error);
  REQUIRE_THROWS_WITH(add(a, b), Contains("add") && Contains("(2, 3)") && Contains("(4, 3)"));
  REQUIRE_THROWS_WITH(sub(a, b), Contains("sub") && Contains("(2, 3)") && Contains("(4, 3)"));
  REQUIRE_THROWS_WITH(mul(a, b), Contains("mul") && Contains("(2, 3)") && Contains("(4, 3)"));
  REQUIRE_THROWS_WITH(div(a, b), Contains("div") && Contains("(2, 3)") && Contains("(4, 3)"));
  // trailing axes compared first: (2, 3) and (2) do not broadcast either
  Tensor c = filled({2});
  REQUIRE_THROWS_WITH(a + c, Contains("add") && Contains("(2, 3)") && Contains("(2)"));
  REQUIRE_THROWS_AS(c * a, Error);
  REQUIRE_THROWS_WITH(div(a, 0.f), Contains("div") && Contains("(2, 3)") && Contains("0"));
}

TEST_CASE("matmul rejects mismatched inner dimensions, 1-D operands and batch axes that do not broadcast",
          "[errors][matmul][gemm]") {
  SECTION("inner dimensions") {
    Tensor a = filled({2, 3});
    Tensor b = filled({4, 5});
    REQUIRE_THROWS_AS(matmul(a, b), Error);
    REQUIRE_THROWS_WITH(matmul(a, b), Contains("matmul") && Contains("(2, 3)") && Contains("(4, 5)"));
    // with transpose flags the message marks the transposed operand
    Tensor c = filled({3, 2});
    REQUIRE_THROWS_WITH(matmul(a, c, false, true), Contains("matmul") && Contains("(2, 3)") && Contains("(3, 2)^T"));
  }
  SECTION("1-D operands") {
    Tensor v = filled({3});
    Tensor m = filled({3, 2});
    REQUIRE_THROWS_AS(matmul(v, m), Error);
    REQUIRE_THROWS_WITH(matmul(v, m), Contains("matmul") && Contains("(3)") && Contains("(3, 2)"));
    REQUIRE_THROWS_WITH(matmul(m, v), Contains("matmul") && Contains("2 axes"));
    REQUIRE_THROWS_AS(matmul(v, v), Error);
  }
  SECTION("batch axes that do not broadcast") {
    Tensor a = filled({2, 3, 4});
    Tensor b = filled({5, 4, 6});
    REQUIRE_THROWS_AS(matmul(a, b), Error);
    REQUIRE_THROWS_WITH(matmul(a, b), Contains("matmul") && Contains("(2)") && Contains("(5)"));
    // broadcastable batch axes are fine: (2, 1) with (3) -> (2, 3)
    Tensor c = filled({2, 1, 3, 4});
    Tensor d = filled({3, 4, 6});
    REQUIRE(shape_str(matmul(c, d).shape()) == "(2, 3, 3, 6)");
  }
}

TEST_CASE("backward rejects a missing seed, a seed of the wrong shape, a second pass and no-grad roots",
          "[errors][backward]") {
  Tensor x = filled({2, 3}, true);
  Tensor y = x * 2.f;

  SECTION("non-scalar without a seed") {
    REQUIRE_THROWS_AS(y.backward(), Error);
    REQUIRE_THROWS_WITH(y.backward(), Contains("backward") && Contains("seed") && Contains("(2, 3)"));
    REQUIRE_FALSE(x.has_grad());
  }
  SECTION("seed of the wrong shape") {
    const Array seed = xt::ones<float>({3});
    REQUIRE_THROWS_AS(y.backward(seed), Error);
    REQUIRE_THROWS_WITH(y.backward(seed), Contains("backward") && Contains("(3)") && Contains("(2, 3)"));
    const Array transposed = xt::ones<float>({3, 2});
    REQUIRE_THROWS_WITH(y.backward(transposed), Contains("(3, 2)") && Contains("(2, 3)"));
    REQUIRE_FALSE(x.has_grad());
    // the graph was not consumed by the failed calls
    y.backward(Array(xt::ones<float>({2, 3})));
    REQUIRE(x.grad()(1, 2) == 2.f);
  }
  SECTION("backward twice") {
    Tensor loss = sum(y);
    loss.backward();
    REQUIRE_THROWS_AS(loss.backward(), Error);
    REQUIRE_THROWS_WITH(loss.backward(), Contains("backward") && Contains("retain_graph"));
  }
  SECTION("a root that does not require grad") {
    Tensor z;
    {
      NoGradGuard guard;
      z = sum(x * x);
    }
    REQUIRE_THROWS_AS(z.backward(), Error);
    REQUIRE_THROWS_WITH(z.backward(), Contains("backward") && Contains("does not require grad"));
    Tensor constant = filled({1});
    REQUIRE_THROWS_WITH(constant.backward(), Contains("does not require grad"));
  }
}

TEST_CASE("ops taking an axis reject out-of-range axes, positive and negative", "[errors][axis]") {
  Tensor a = filled({2, 3}, true);
  for (int bad : {2, -3, 7}) {
    INFO("axis " << bad);
    const std::string axis_text = "axis " + std::to_string(bad);
    REQUIRE_THROWS_AS(sum(a, {bad}), Error);
    REQUIRE_THROWS_WITH(sum(a, {bad}), Contains("sum") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(mean(a, {bad}), Contains("mean") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(max(a, bad), Contains("max") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(softmax(a, bad), Contains("softmax") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(log_softmax(a, bad), Contains("log_softmax") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(slice(a, bad, 0, 1), Contains("slice") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(concat({a, a}, bad), Contains("concat") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(split(a, {1, 1}, bad), Contains("split") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(transpose(a, 0, bad), Contains("transpose") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(transpose(a, bad, 1), Contains("transpose") && Contains(axis_text) && Contains("rank 2"));
    REQUIRE_THROWS_WITH(permute(a, {0, bad}), Contains("permute") && Contains(axis_text) && Contains("rank 2"));
  }
  // the in-range negative axes are accepted
  REQUIRE(shape_str(sum(a, {-1}).shape()) == "(2)");
  REQUIRE(shape_str(transpose(a, -1, -2).shape()) == "(3, 2)");
}

TEST_CASE("sum and permute reject a repeated axis, permute rejects the wrong number of axes", "[errors][axis]") {
  Tensor a = filled({2, 3, 4});
  REQUIRE_THROWS_AS(sum(a, {1, 1}), Error);
  REQUIRE_THROWS_WITH(sum(a, {1, 1}), Contains("sum") && Contains("axis 1") && Contains("twice"));
  // the same axis spelled two ways
  REQUIRE_THROWS_WITH(sum(a, {2, -1}), Contains("sum") && Contains("axis -1") && Contains("twice"));
  REQUIRE_THROWS_WITH(mean(a, {0, -3}), Contains("mean") && Contains("twice"));
  REQUIRE_THROWS_WITH(permute(a, {0, 0, 1}), Contains("permute") && Contains("repeats"));
  REQUIRE_THROWS_WITH(permute(a, {1, 0}), Contains("permute") && Contains("2 axes") && Contains("rank 3"));
}

TEST_CASE("reshape rejects a wrong element count and more than one -1", "[errors][shape]") {
  Tensor a = filled({2, 3});
  REQUIRE_THROWS_AS(reshape(a, {4, 2}), Error);
  REQUIRE_THROWS_WITH(reshape(a, {4, 2}),
                      Contains("reshape") && Contains("(2, 3)") && Contains("6 elements") && Contains("(4, 2)"));
  REQUIRE_THROWS_WITH(reshape(a, {-1, 4}), Contains("reshape") && Contains("(2, 3)") && Contains("(-1, 4)"));
  REQUIRE_THROWS_AS(reshape(a, {-1, -1}), Error);
  REQUIRE_THROWS_WITH(reshape(a, {-1, -1}), Contains("reshape") && Contains("-1") && Contains("(-1, -1)"));
  REQUIRE_THROWS_WITH(reshape(a, {-2, -3}), Contains("reshape") && Contains("negative"));
  REQUIRE(shape_str(reshape(a, {3, -1}).shape()) == "(3, 2)");
}

TEST_CASE("slice rejects a range outside the axis", "[errors][shape]") {
  Tensor a = filled({2, 3});
  REQUIRE_THROWS_AS(slice(a, 1, 1, 5), Error);
  REQUIRE_THROWS_WITH(slice(a, 1, 1, 5),
                      Contains("slice") && Contains("[1, 5)") && Contains("length 3") && Contains("(2, 3)"));
  REQUIRE_THROWS_WITH(slice(a, -1, 2, 1), Contains("slice") && Contains("[2, 1)"));  // start > stop
  REQUIRE_THROWS_WITH(slice(a, 0, 0, 3), Contains("slice") && Contains("length 2"));
  REQUIRE(shape_str(slice(a, 1, 3, 3).shape()) == "(2, 0)");  // empty range at the end is valid
}

TEST_CASE("concat rejects mismatched shapes and an empty list, split rejects sizes that do not add up",
          "[errors][shape]") {
  Tensor a = filled({2, 3});
  Tensor b = filled({3, 3});
  REQUIRE_THROWS_AS(concat({a, b}, 1), Error);
  REQUIRE_THROWS_WITH(concat({a, b}, 1), Contains("concat") && Contains("(3, 3)") && Contains("(2, 3)"));
  REQUIRE(shape_str(concat({a, b}, 0).shape()) == "(5, 3)");  // they do match outside axis 0
  Tensor c = filled({2, 3, 1});
  REQUIRE_THROWS_WITH(concat({a, c}, 0), Contains("concat") && Contains("(2, 3, 1)") && Contains("(2, 3)"));
  REQUIRE_THROWS_AS(concat({}, 0), Error);
  REQUIRE_THROWS_WITH(concat({}, 0), Contains("concat") && Contains("no tensors"));

  Tensor s = filled({3, 2});
  REQUIRE_THROWS_AS(split(s, {1, 1}, 0), Error);
  REQUIRE_THROWS_WITH(split(s, {1, 1}, 0), Contains("split") && Contains("(1, 1)") && Contains("add up to 2") &&
                                               Contains("(3, 2)") && Contains("length 3"));
  REQUIRE_THROWS_WITH(split(s, {2, 2}, 0), Contains("split") && Contains("add up to 4"));
}

TEST_CASE("embedding rejects indices outside the table and a weight that is not 2-D", "[errors][nn]") {
  Tensor w = filled({4, 2}, true);
  REQUIRE_THROWS_AS(embedding(w, IndexArray{0, -1}), Error);
  REQUIRE_THROWS_WITH(embedding(w, IndexArray{0, -1}),
                      Contains("embedding") && Contains("index -1") && Contains("4 rows"));
  REQUIRE_THROWS_WITH(embedding(w, IndexArray{{1, 2}, {4, 0}}),
                      Contains("embedding") && Contains("index 4") && Contains("4 rows"));
  REQUIRE(shape_str(embedding(w, IndexArray{3, 0}).shape()) == "(2, 2)");  // V - 1 is the last valid id
  REQUIRE_THROWS_WITH(embedding(filled({4}), IndexArray{0}), Contains("embedding") && Contains("(4)"));
  REQUIRE_THROWS_WITH(embedding(filled({4, 2, 1}), IndexArray{0}), Contains("embedding") && Contains("(4, 2, 1)"));
}

TEST_CASE("cross_entropy rejects targets out of range and targets of the wrong shape", "[errors][nn]") {
  Tensor logits = filled({2, 3}, true);
  REQUIRE_THROWS_AS(cross_entropy(logits, IndexArray{0, 3}), Error);
  REQUIRE_THROWS_WITH(cross_entropy(logits, IndexArray{0, 3}),
                      Contains("cross_entropy") && Contains("target 3") && Contains("[0, 3)"));
  // a negative target that is not ignore_index is out of range too
  REQUIRE_THROWS_WITH(cross_entropy(logits, IndexArray{-1, 0}), Contains("cross_entropy") && Contains("target -1"));
  REQUIRE_NOTHROW(cross_entropy(logits, IndexArray{-1, 0}, /*ignore_index=*/-1));
  REQUIRE_THROWS_AS(cross_entropy(logits, IndexArray{0, 1, 2}), Error);
  REQUIRE_THROWS_WITH(cross_entropy(logits, IndexArray{0, 1, 2}),
                      Contains("cross_entropy") && Contains("(3)") && Contains("(2, 3)") && Contains("(2)"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, IndexArray(xt::zeros<std::int64_t>({2, 1}))),
                      Contains("cross_entropy") && Contains("(2, 1)"));
}

TEST_CASE("dropout rejects a probability p unless 0 <= p < 1", "[errors][nn]") {
  Tensor a = filled({4}, true);
  REQUIRE_THROWS_AS(dropout(a, -0.1f), Error);
  REQUIRE_THROWS_WITH(dropout(a, -0.1f), Contains("dropout") && Contains("-0.1") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(dropout(a, 1.0f), Contains("dropout") && Contains("probability 1 ") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(dropout(a, 1.5f), Contains("dropout") && Contains("1.5") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(dropout(a, std::numeric_limits<float>::quiet_NaN()),
                      Contains("dropout") && Contains("nan", Catch::CaseSensitive::No));
  // checked even when dropout would be the identity (evaluation mode)
  REQUIRE_THROWS_AS(dropout(a, 1.5f, /*training=*/false), Error);
  REQUIRE_NOTHROW(dropout(a, 0.f));
  REQUIRE_NOTHROW(dropout(a, 0.999f));
  REQUIRE_THROWS_WITH(gelu_dropout(a, 1.5f), Contains("gelu_dropout") && Contains("1.5") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(gelu_dropout(a, -0.1f, /*training=*/false), Contains("gelu_dropout") && Contains("-0.1"));
}

TEST_CASE("layer_norm rejects gamma or beta of the wrong shape", "[errors][nn]") {
  Tensor x = filled({2, 4}, true);
  Tensor gamma = Tensor::ones({3});
  REQUIRE_THROWS_AS(layer_norm(x, gamma, Tensor()), Error);
  REQUIRE_THROWS_WITH(layer_norm(x, gamma, Tensor()),
                      Contains("layer_norm") && Contains("gamma") && Contains("(3)") && Contains("(2, 4)"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor::ones({4}), Tensor::zeros({4, 1})),
                      Contains("layer_norm") && Contains("beta") && Contains("(4, 1)"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor::ones({4}), Tensor(), 0.f), Contains("layer_norm") && Contains("eps"));
  REQUIRE_NOTHROW(layer_norm(x, Tensor::ones({4}), Tensor::zeros({4})));
}

TEST_CASE("masked_fill rejects a mask that does not broadcast to the input", "[errors][nn]") {
  Tensor a = filled({2, 4}, true);
  const Mask bad_tail = xt::zeros<bool>({3});
  REQUIRE_THROWS_AS(masked_fill(a, bad_tail, 0.f), Error);
  REQUIRE_THROWS_WITH(masked_fill(a, bad_tail, 0.f), Contains("masked_fill") && Contains("(3)") && Contains("(2, 4)"));
  // broadcastable with the input, but to a larger shape than the input's
  const Mask too_big = xt::zeros<bool>({2, 2, 4});
  REQUIRE_THROWS_WITH(masked_fill(a, too_big, 0.f),
                      Contains("masked_fill") && Contains("(2, 2, 4)") && Contains("(2, 4)"));
  const Mask row = xt::zeros<bool>({1, 4});
  REQUIRE_NOTHROW(masked_fill(a, row, 0.f));
  const Array wrong_values = xt::zeros<float>(Shape{4, 2});
  REQUIRE_THROWS_WITH(masked_fill(a, row, wrong_values),
                      Contains("masked_fill: values of shape (4, 2)") && Contains("(2, 4)"));
}

TEST_CASE("an undefined Tensor() passed to an op raises an error naming the op", "[errors]") {
  Tensor u;
  Tensor a = filled({2, 2}, true);
  REQUIRE_FALSE(u.defined());
  REQUIRE_THROWS_AS(add(a, u), Error);
  REQUIRE_THROWS_WITH(add(a, u), Contains("add") && Contains("undefined"));
  REQUIRE_THROWS_WITH(mul(u, a), Contains("mul") && Contains("undefined"));
  REQUIRE_THROWS_WITH(exp(u), Contains("exp") && Contains("undefined"));
  REQUIRE_THROWS_WITH(matmul(a, u), Contains("matmul") && Contains("undefined"));
  REQUIRE_THROWS_WITH(sum(u), Contains("sum") && Contains("undefined"));
  REQUIRE_THROWS_WITH(mean(u), Contains("mean") && Contains("undefined"));
  REQUIRE_THROWS_WITH(softmax(u), Contains("softmax") && Contains("undefined"));
  REQUIRE_THROWS_WITH(reshape(u, {4}), Contains("reshape") && Contains("undefined"));
  REQUIRE_THROWS_WITH(concat({a, u}, 0), Contains("concat") && Contains("undefined"));
  REQUIRE_THROWS_WITH(layer_norm(u, Tensor(), Tensor()), Contains("layer_norm") && Contains("undefined"));
  REQUIRE_THROWS_WITH(embedding(u, IndexArray{0}), Contains("embedding") && Contains("undefined"));
  REQUIRE_THROWS_WITH(u.backward(), Contains("undefined"));
  REQUIRE_THROWS_WITH(u.value(), Contains("Tensor::value") && Contains("undefined"));
}

TEST_CASE("Tensor::grad() before any backward raises an error naming the tensor", "[errors][backward]") {
  Tensor w = filled({3}, true);
  w.set_name("w");
  REQUIRE_FALSE(w.has_grad());
  REQUIRE_THROWS_AS(w.grad(), Error);
  REQUIRE_THROWS_WITH(w.grad(), Contains("Tensor::grad") && Contains("'w'"));
  REQUIRE_THROWS_AS(w.mutable_grad(), Error);
}

TEST_CASE("after an exception inside an op the engine still records and backpropagates correctly",
          "[errors][recovery][gemm]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  Tensor w(Array{{1.f, 0.f, -1.f}, {2.f, 1.f, 0.f}}, true);  // (2, 3)
  const std::size_t before = tape_size();

  // a partial expression whose last op fails: h is recorded, the failing ops record nothing
  Tensor h = x * x;
  REQUIRE_THROWS_AS(matmul(reshape(h, {1, 3}), w), Error);  // (1, 3) @ (2, 3)
  REQUIRE_THROWS_AS(h + Tensor::ones({4}), Error);
  REQUIRE_THROWS_AS(softmax(h, 3), Error);
  REQUIRE(grad_enabled());

  // L = sum(w @ x^2): dL/dx_j = 2 x_j * sum_i w_ij, dL/dw_ij = x_j^2
  Tensor loss = sum(matmul(w, reshape(h, {3, 1})));
  REQUIRE(loss.item() == Approx(1.f - 9.f + 2.f + 4.f));
  loss.backward();
  const Array want_x{2.f * 1.f * 3.f, 2.f * 2.f * 1.f, 2.f * 3.f * -1.f};
  const Array want_w{{1.f, 4.f, 9.f}, {1.f, 4.f, 9.f}};
  for (std::size_t i = 0; i < 3; ++i) CHECK(x.grad()(i) == Approx(want_x(i)));
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) CHECK(w.grad()(i, j) == Approx(want_w(i, j)));
  // the dangling reshape from the failed matmul (its output died) may stay until a prune,
  // but no more than that
  REQUIRE(tape_size() <= before + 1);
}
