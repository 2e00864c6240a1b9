// gather, index_select, where, argmax, topk, stack and chunk: hand-computed values and gradients,
// gradcheck, agreement with PyTorch on tests/fixtures/index_ops.json (make_index_fixtures.py
// writes it), and the Errors bad input gets.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;
using Catch::Contains;
using nlohmann::json;

namespace {

Tensor leaf(Array a) { return Tensor(std::move(a), true); }

Tensor randn(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, 1.f), true);
}

// Distinct values at least 0.1 apart in a shuffled order, so no finite-difference step changes
// which elements topk picks.
Tensor distinct_values(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  Array a = g.uniform(shape, 0.f, 1.f);
  std::vector<float> v(a.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
  for (std::size_t i = 0; i < v.size(); ++i) a.data()[i] = 0.1f * v[i] - 0.05f * static_cast<float>(v.size());
  return Tensor(std::move(a), true);
}

const Array kA = {{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}};

// The values as one column, shape (n, 1) (a braced {{x}, {y}} is ambiguous to xtensor).
template <class A>
A column(A a) {
  a.reshape({a.size(), 1});
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values and gradients computed by hand

TEST_CASE("gather picks along the axis and scatter-adds the gradient back", "[index][gather]") {
  const Tensor a = leaf(kA);
  const Tensor y = gather(a, 1, IndexArray{{2, 0}, {1, 1}});
  REQUIRE((y.value() == Array{{3.f, 1.f}, {5.f, 5.f}}));
  sum(y).backward();
  REQUIRE((a.grad() == Array{{1.f, 0.f, 1.f}, {0.f, 2.f, 0.f}}));

  REQUIRE((gather(Tensor(kA), 0, IndexArray{{1, 0, 1}}).value() == Array{{4.f, 2.f, 6.f}}));
  REQUIRE((gather(Tensor(kA), -2, IndexArray{{1, 1}, {0, 1}}).value() == Array{{4.f, 5.f}, {1.f, 5.f}}));
  REQUIRE(gather(Tensor(kA), 1, IndexArray::from_shape({2, 0})).shape() == Shape{2, 0});
}

TEST_CASE("index_select takes whole slices in the order of the ids", "[index][index_select]") {
  const Tensor a = leaf(kA);
  const Tensor y = index_select(a, 0, IndexArray{1, 1, 0});
  REQUIRE((y.value() == Array{{4.f, 5.f, 6.f}, {4.f, 5.f, 6.f}, {1.f, 2.f, 3.f}}));
  sum(y * Tensor(column(Array{1.f, 2.f, 10.f}))).backward();
  REQUIRE((a.grad() == Array{{10.f, 10.f, 10.f}, {3.f, 3.f, 3.f}}));

  REQUIRE((index_select(Tensor(kA), -1, IndexArray{2, 0}).value() == Array{{3.f, 1.f}, {6.f, 4.f}}));
  REQUIRE(index_select(Tensor(kA), 1, IndexArray::from_shape({0})).shape() == Shape{2, 0});
}

TEST_CASE("where takes a where the mask is true and b elsewhere, broadcasting all three", "[index][where]") {
  const Tensor a = leaf(kA);
  const Tensor b = leaf(Array(10.f));
  const Tensor y = xgrad::where(Mask{{true, false, false}, {false, true, true}}, a, b);
  REQUIRE((y.value() == Array{{1.f, 10.f, 10.f}, {10.f, 5.f, 6.f}}));
  sum(y).backward();
  REQUIRE((a.grad() == Array{{1.f, 0.f, 0.f}, {0.f, 1.f, 1.f}}));
  REQUIRE((b.grad() == Array(3.f)));

  // mask (2, 1), a (3), b (2, 1) -> (2, 3)
  const Tensor c = leaf(Array{1.f, 2.f, 3.f});
  const Tensor d = leaf(column(Array{-1.f, -2.f}));
  const Tensor z = xgrad::where(column(Mask{true, false}), c, d);
  REQUIRE((z.value() == Array{{1.f, 2.f, 3.f}, {-2.f, -2.f, -2.f}}));
  sum(z).backward();
  REQUIRE((c.grad() == Array{1.f, 1.f, 1.f}));
  REQUIRE((d.grad() == column(Array{0.f, 3.f})));
}

TEST_CASE("argmax gives the first largest position, NaN counting as the largest", "[index][argmax]") {
  const Tensor a(Array{{1.f, 3.f, 3.f}, {7.f, 0.f, 7.f}});
  REQUIRE((argmax(a, 1) == IndexArray{1, 0}));
  REQUIRE((argmax(a, 0) == IndexArray{1, 0, 1}));
  REQUIRE((argmax(a, -1, true) == column(IndexArray{1, 0})));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  REQUIRE((argmax(Tensor(Array{1.f, nan, 5.f, nan}), 0) == IndexArray(1)));
}

TEST_CASE("topk gives the largest first, equal values by position, the gradient to those chosen", "[index][topk]") {
  const Tensor a = leaf(Array{{1.f, 3.f, 3.f, 2.f, 3.f}, {0.f, -1.f, 4.f, 5.f, -2.f}});
  const TopK t = topk(a, 3, -1);
  REQUIRE((t.values.value() == Array{{3.f, 3.f, 3.f}, {5.f, 4.f, 0.f}}));
  REQUIRE((t.indices == IndexArray{{1, 2, 4}, {3, 2, 0}}));
  sum(t.values * Tensor(Array{1.f, 10.f, 100.f})).backward();
  REQUIRE((a.grad() == Array{{0.f, 1.f, 10.f, 0.f, 100.f}, {100.f, 0.f, 10.f, 1.f, 0.f}}));

  const TopK col = topk(Tensor(Array{{1.f, 9.f}, {8.f, 2.f}, {5.f, 5.f}}), 2, 0);
  REQUIRE((col.values.value() == Array{{8.f, 9.f}, {5.f, 5.f}}));
  REQUIRE((col.indices == IndexArray{{1, 0}, {2, 2}}));
  REQUIRE(topk(Tensor(kA), 0, 1).values.shape() == Shape{2, 0});
}

TEST_CASE("stack joins along a new axis, chunk cuts into ceil(length / n) pieces", "[index][stack][chunk]") {
  const Tensor p = leaf(Array{1.f, 2.f});
  const Tensor q = leaf(Array{3.f, 4.f});
  REQUIRE((stack({p, q}, 0).value() == Array{{1.f, 2.f}, {3.f, 4.f}}));
  REQUIRE((stack({p, q}, -1).value() == Array{{1.f, 3.f}, {2.f, 4.f}}));
  sum(stack({p, q}, 1) * Tensor(Array{1.f, 5.f})).backward();
  REQUIRE((p.grad() == Array{1.f, 1.f}));
  REQUIRE((q.grad() == Array{5.f, 5.f}));

  auto lengths = [](const std::vector<Tensor>& pieces) {
    std::vector<std::size_t> out;
    for (const Tensor& t : pieces) out.push_back(t.shape()[0]);
    return out;
  };
  const Tensor r(Array{0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  const std::vector<Tensor> three = chunk(r, 3, 0);
  REQUIRE((lengths(three) == std::vector<std::size_t>{3, 3, 1}));
  REQUIRE((three[1].value() == Array{3.f, 4.f, 5.f}));
  REQUIRE((three[2].value() == Array{6.f}));
  REQUIRE((lengths(chunk(Tensor(Array{0.f, 1.f, 2.f, 3.f, 4.f, 5.f}), 4, -1)) == std::vector<std::size_t>{2, 2, 2}));
  REQUIRE((lengths(chunk(r, 1, 0)) == std::vector<std::size_t>{7}));
  REQUIRE((lengths(chunk(r, 9, 0)) == std::vector<std::size_t>{1, 1, 1, 1, 1, 1, 1}));
  const std::vector<Tensor> empty = chunk(Tensor(Array::from_shape({0})), 3, 0);
  INFO("the pieces of an empty axis: " << empty.size());
  REQUIRE((lengths(empty) == std::vector<std::size_t>{0, 0, 0}));
}

// ---------------------------------------------------------------------------------------------
// gradcheck

TEST_CASE("gradcheck: gather and index_select, repeated indices included", "[index][gradcheck]") {
  const IndexArray index = {{{3, 0, 3}, {1, 1, 2}}, {{0, 0, 0}, {2, 3, 1}}};
  for (int axis : {2, -1}) {
    REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return gather(in[0], axis, index); }, {randn({2, 3, 4}, 1)});
  }
  REQUIRE_GRADCHECK(
      [](const std::vector<Tensor>& in) {
    return gather(in[0], 0, IndexArray{{1, 0}, {1, 1}, {0, 1}});
      },
      {randn({2, 3}, 2)});
  REQUIRE_GRADCHECK(
      [](const std::vector<Tensor>& in) {
    return index_select(in[0], 1, IndexArray{2, 0, 2, 1});
      },
      {randn({2, 3, 2}, 3)});
}

TEST_CASE("gradcheck: where with broadcast operands", "[index][gradcheck]") {
  const Mask mask = {{true, false, true, false}, {false, false, true, true}, {true, true, false, false}};
  REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return xgrad::where(mask, in[0], in[1]); },
                    {randn({3, 4}, 4), randn({3, 4}, 5)});
  REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return xgrad::where(mask, in[0], in[1]); },
                    {randn({3, 1}, 6), randn({4}, 7)});
  REQUIRE_GRADCHECK(
      [](const std::vector<Tensor>& in) {
    return xgrad::where(column(Mask{true, false}), in[0], in[1]);
      },
      {randn({2, 3}, 8), randn({}, 9)});
}

TEST_CASE("gradcheck: topk, stack and chunk", "[index][gradcheck]") {
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return topk(in[0], 3, -1).values; },
                    {distinct_values({2, 3, 5}, 10)});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return topk(in[0], 2, 1).values; },
                    {distinct_values({2, 3, 5}, 11)});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return stack(in, 1); },
                    {randn({2, 3}, 12), randn({2, 3}, 13), randn({2, 3}, 14)});
  REQUIRE_GRADCHECK(
      [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> pieces = chunk(in[0], 3, 1);
    return concat({pieces[0] * 1.f, pieces[1] * 2.f, pieces[2] * 3.f}, 1);
      },
      {randn({2, 7}, 15)});
}

// ---------------------------------------------------------------------------------------------
// Agreement with PyTorch

namespace {

const json& cases() {
  static const json j = testing::load_fixture("index_ops.json");
  return j.at("cases");
}

using Inputs = std::map<std::string, Tensor>;

// Runs op on the case's leaves, compares the output and, after backward(grad_out), every gradient.
void agree(const std::string& name, const std::function<Tensor(const Inputs&, const json&)>& op) {
  INFO("case " << name);
  REQUIRE(cases().contains(name));
  const json& c = cases().at(name);
  Inputs in;
  for (const auto& [k, v] : c.at("inputs").items()) in.emplace(k, Tensor(testing::to_array(v), true));
  const Tensor out = op(in, c);
  const Array want = testing::to_array(c.at("output"));
  REQUIRE(out.shape() == want.shape());
  CHECK(testing::rel_error(out.value(), want) <= 1e-6);
  out.backward(testing::to_array(c.at("grad_out")));
  for (const auto& [k, g] : c.at("grads").items()) {
    INFO("gradient of " << k);
    REQUIRE(in.at(k).has_grad());
    CHECK(testing::rel_error(in.at(k).grad(), testing::to_array(g)) <= 1e-6);
  }
}

Mask to_mask(const json& j) {
  const IndexArray flags = testing::to_index_array(j);
  Mask m = Mask::from_shape(flags.shape());
  for (std::size_t i = 0; i < flags.size(); ++i) m.data()[i] = flags.data()[i] != 0;
  return m;
}

}  // namespace

TEST_CASE("torch agreement: gather and index_select", "[index][torch]") {
  for (const char* name : {"gather_axis1", "gather_axis0_long_index", "gather_3d_last_axis"}) {
    agree(name, [](const Inputs& in, const json& c) {
      return gather(in.at("a"), c.at("axis").get<int>(), testing::to_index_array(c.at("index")));
    });
  }
  for (const char* name : {"index_select_axis0", "index_select_middle_axis"}) {
    agree(name, [](const Inputs& in, const json& c) {
      return index_select(in.at("a"), c.at("axis").get<int>(), testing::to_index_array(c.at("ids")));
    });
  }
}

TEST_CASE("torch agreement: where", "[index][torch]") {
  for (const char* name : {"where_same_shape", "where_broadcast", "where_scalar_b"}) {
    agree(name,
          [](const Inputs& in, const json& c) { return xgrad::where(to_mask(c.at("mask")), in.at("a"), in.at("b")); });
  }
}

TEST_CASE("torch agreement: topk and argmax", "[index][torch]") {
  for (const char* name : {"topk_last_axis", "topk_axis0"}) {
    agree(name, [name](const Inputs& in, const json& c) {
      const TopK t = topk(in.at("a"), c.at("k").get<std::size_t>(), c.at("axis").get<int>());
      INFO("indices of " << name);
      CHECK((t.indices == testing::to_index_array(c.at("indices"))));
      return t.values;
    });
  }
  for (const char* name : {"argmax_ties_axis1", "argmax_ties_axis0"}) {
    INFO("case " << name);
    const json& c = cases().at(name);
    const Tensor a(testing::to_array(c.at("inputs").at("a")));
    CHECK((argmax(a, c.at("axis").get<int>()) == testing::to_index_array(c.at("indices"))));
  }
}

TEST_CASE("torch agreement: stack and chunk", "[index][torch]") {
  for (const char* name : {"stack_axis1", "stack_last_axis"}) {
    agree(name, [](const Inputs& in, const json& c) {
      return stack({in.at("p0"), in.at("p1"), in.at("p2")}, c.at("axis").get<int>());
    });
  }
  for (const char* name : {"chunk_uneven_axis0", "chunk_fewer_pieces"}) {
    agree(name, [](const Inputs& in, const json& c) {
      const int axis = c.at("axis").get<int>();
      const std::vector<Tensor> pieces = chunk(in.at("a"), c.at("n").get<std::size_t>(), axis);
      REQUIRE(pieces.size() == c.at("pieces").size());
      std::vector<Tensor> weighted;
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        const auto want = c.at("pieces").at(i).get<std::vector<std::size_t>>();
        CHECK(std::vector<std::size_t>(pieces[i].shape().begin(), pieces[i].shape().end()) == want);
        weighted.push_back(pieces[i] * static_cast<float>(i + 1));
      }
      return concat(weighted, axis);
    });
  }
}

TEST_CASE("torch agreement: every index_ops.json case has a test", "[index][torch]") {
  const std::vector<std::string> tested = {"gather_axis1",       "gather_axis0_long_index",  "gather_3d_last_axis",
                                           "index_select_axis0", "index_select_middle_axis", "where_same_shape",
                                           "where_broadcast",    "where_scalar_b",           "topk_last_axis",
                                           "topk_axis0",         "argmax_ties_axis1",        "argmax_ties_axis0",
                                           "stack_axis1",        "stack_last_axis",          "chunk_uneven_axis0",
                                           "chunk_fewer_pieces"};
  REQUIRE(cases().size() == tested.size());
  for (const std::string& name : tested) CHECK(cases().contains(name));
}

// ---------------------------------------------------------------------------------------------
// Bad input (the rows of tests/BAD_INPUT.md, "Indexing and selection ops")

TEST_CASE("bad input: gather and index_select name the op, the position and the value", "[index][bad_input]") {
  const Tensor a(kA);
  REQUIRE_THROWS_WITH(gather(a, 2, column(IndexArray{0})), "gather: axis 2 is out of range for a tensor of rank 2");
  REQUIRE_THROWS_WITH(gather(a, 1, IndexArray{0, 1}),
                      "gather: index of shape (2) has rank 1 but the input (2, 3) has rank 2");
  REQUIRE_THROWS_WITH(gather(a, 1, column(IndexArray{0, 1, 2})),
                      "gather: index of shape (3, 1) is longer than the input (2, 3) along axis 0");
  REQUIRE_THROWS_WITH(gather(a, 1, IndexArray{{0, 1}, {3, 1}}),
                      "gather: index 3 at position (1, 0) is outside [0, 3) along axis 1 of (2, 3)");
  REQUIRE_THROWS_WITH(gather(a, -1, IndexArray{{0, -1}}),
                      "gather: index -1 at position (0, 1) is outside [0, 3) along axis -1 of (2, 3)");
  REQUIRE_THROWS_WITH(gather(Tensor(), 0, IndexArray{0}), Contains("gather"));

  REQUIRE_THROWS_WITH(index_select(a, -3, IndexArray{0}),
                      "index_select: axis -3 is out of range for a tensor of rank 2");
  REQUIRE_THROWS_WITH(index_select(a, 0, IndexArray{{0, 1}}), "index_select: ids must be 1-D, got shape (1, 2)");
  REQUIRE_THROWS_WITH(index_select(a, 0, IndexArray{1, 5}),
                      "index_select: id 5 at position 1 is outside [0, 2) along axis 0 of (2, 3)");
  REQUIRE_THROWS_WITH(index_select(a, 1, IndexArray{-1}),
                      "index_select: id -1 at position 0 is outside [0, 3) along axis 1 of (2, 3)");
}

TEST_CASE("bad input: where refuses shapes that do not broadcast", "[index][bad_input]") {
  const Tensor a(kA);
  REQUIRE_THROWS_WITH(
      xgrad::where(Mask{{true, false, true}, {true, true, false}}, a, Tensor(Array{1.f, 2.f, 3.f, 4.f})),
      "where: shapes (2, 3) and (4) cannot be broadcast together");
  REQUIRE_THROWS_WITH(xgrad::where(Mask{true, false}, a, a),
                      "where: shapes (2) and (2, 3) cannot be broadcast together");
  REQUIRE_THROWS_WITH(xgrad::where(Mask{true}, a, Tensor()), Contains("where"));
}

TEST_CASE("bad input: argmax, topk, stack and chunk name the op and the value", "[index][bad_input]") {
  const Tensor a(kA);
  REQUIRE_THROWS_WITH(argmax(a, 2), "argmax: axis 2 is out of range for a tensor of rank 2");
  REQUIRE_THROWS_WITH(argmax(Tensor(Array::from_shape({2, 0})), 1), "argmax: axis 1 of shape (2, 0) is empty");
  REQUIRE_THROWS_WITH(topk(a, 4, -1), "topk: k = 4 is larger than axis -1 of length 3 in shape (2, 3)");
  REQUIRE_THROWS_WITH(topk(a, 1, -3), "topk: axis -3 is out of range for a tensor of rank 2");
  REQUIRE_THROWS_WITH(stack({}, 0), "stack: no tensors given");
  REQUIRE_THROWS_WITH(stack({Tensor(Array{1.f, 2.f}), Tensor(Array{1.f, 2.f, 3.f})}, 0),
                      "stack: part 1 has shape (3) but part 0 has (2)");
  REQUIRE_THROWS_WITH(stack({Tensor(Array{1.f, 2.f})}, 2),
                      "stack: axis 2 is out of range for stacking tensors of rank 1 (from -2 to 1)");
  REQUIRE_THROWS_WITH(stack({Tensor(Array{1.f, 2.f})}, -3),
                      "stack: axis -3 is out of range for stacking tensors of rank 1 (from -2 to 1)");
  REQUIRE_THROWS_WITH(chunk(a, 0, 0), "chunk: n must be at least 1, got 0");
  REQUIRE_THROWS_WITH(chunk(a, 2, 2), "chunk: axis 2 is out of range for a tensor of rank 2");
}

// ---------------------------------------------------------------------------------------------
// Sizes at the edge of size_t (the rows of tests/BAD_INPUT.md, "New ops, hostile review")

TEST_CASE("chunk with n past the length gives one piece per element, even for n near SIZE_MAX",
          "[index][chunk][bad_input][bug]") {
  const Tensor r(Array{0.f, 1.f, 2.f, 3.f, 4.f, 5.f});
  for (std::size_t n : {std::size_t{7}, std::numeric_limits<std::size_t>::max() / 2 + 1,
                        std::numeric_limits<std::size_t>::max() - 4, std::numeric_limits<std::size_t>::max()}) {
    INFO("n = " << n);
    const std::vector<Tensor> pieces = chunk(r, n, 0);
    REQUIRE(pieces.size() == 6);
    for (std::size_t i = 0; i < 6; ++i) REQUIRE((pieces[i].value() == Array{static_cast<float>(i)}));
  }
}

TEST_CASE("bad input: where refuses a broadcast shape whose element count overflows size_t",
          "[index][bad_input][bug]") {
  // 2^21 * 2^21 * 2^22 = 2^64 elements from operands of 2 Mi, 2 Mi and 4 Mi elements
  Mask mask = Mask::from_shape({std::size_t{1} << 21, 1, 1});
  std::fill(mask.begin(), mask.end(), false);
  const Tensor a(Array::from_shape({1, std::size_t{1} << 21, 1}));
  const Tensor b(Array::from_shape({1, 1, std::size_t{1} << 22}));
  REQUIRE_THROWS_WITH(xgrad::where(mask, a, b),
                      "where: the broadcast shape (2097152, 2097152, 4194304) of mask (2097152, 1, 1), a "
                      "(1, 2097152, 1) and b (1, 1, 4194304) has more elements than size_t can count");
}

TEST_CASE("chunk of an empty axis into more pieces than memory holds is an Error naming chunk, not bad_alloc",
          "[index][chunk][bad_input][bug]") {
  const Tensor empty = Tensor::zeros({0, 3});
  REQUIRE(chunk(empty, 5, 0).size() == 5);  // n empty pieces, as torch.chunk
  REQUIRE_THROWS_WITH(chunk(empty, std::numeric_limits<std::size_t>::max(), 0),
                      Catch::Contains("chunk: 18446744073709551615 empty pieces of an empty axis needs"));
}
