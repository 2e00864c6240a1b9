// Tensor's op methods against the ops.hpp functions they call: the same bits of every output and
// of every input's gradient on random inputs, with each argument away from its default, and the
// same Error, naming the op, on bad input and on an undefined handle.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

#include "error_of.hpp"

using namespace xgrad;
using Catch::Matchers::StartsWith;
using xgrad::testing::error_of;

namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<std::vector<Tensor>(const Inputs&)>;

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The outputs' values and each input's gradient (has_grad false when none reached it).
struct Run {
  std::vector<Array> values;
  std::vector<Array> grads;
  std::vector<bool> has_grad;
};

// f on fresh leaves holding `values`, then backward from sum_i sum(out_i * seed_i), the seeds
// drawn from Generator(seed): the same seeds for both forms, so their gradients can be compared.
Run run(const Fn& f, const std::vector<Array>& values, std::uint64_t seed) {
  Inputs in;
  for (const Array& v : values) in.emplace_back(v, true);
  const std::vector<Tensor> out = f(in);
  Generator g(seed);
  Run r;
  Tensor loss;
  for (const Tensor& o : out) {
    r.values.push_back(o.value());
    if (!o.requires_grad()) continue;
    const Tensor term = xgrad::sum(o * Tensor(g.normal(o.shape(), 0.f, 1.f)));
    loss = loss.defined() ? loss + term : term;
  }
  if (loss.defined()) loss.backward();
  for (const Tensor& t : in) {
    r.has_grad.push_back(t.has_grad());
    r.grads.push_back(t.has_grad() ? t.grad() : Array());
  }
  return r;
}

// "" when both runs give the same bits, else the first difference.
std::string difference(const Run& a, const Run& b) {
  if (a.values.size() != b.values.size()) return "the output counts differ";
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    if (!same_bits(a.values[i], b.values[i])) return "output " + std::to_string(i) + " differs";
  }
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    if (a.has_grad[i] != b.has_grad[i]) return "only one form gives input " + std::to_string(i) + " a gradient";
    if (!same_bits(a.grads[i], b.grads[i])) return "the gradient of input " + std::to_string(i) + " differs";
  }
  return "";
}

std::string difference(const Fn& method, const Fn& free_form, const std::vector<Array>& values) {
  return difference(run(method, values, 7), run(free_form, values, 7));
}

Array normal(const Shape& shape, std::uint64_t seed) { return Generator(seed).normal(shape, 0.f, 1.f); }
Array positive(const Shape& shape, std::uint64_t seed) { return Generator(seed).uniform(shape, 0.1f, 3.f); }

IndexArray random_ids(const Shape& shape, std::uint64_t below, std::uint64_t seed) {
  Generator g(seed);
  IndexArray ids(shape);
  for (std::int64_t& id : ids) id = static_cast<std::int64_t>(g.below(below));
  return ids;
}

Mask random_mask(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  Mask m(shape);
  for (auto&& b : m) b = g.uniform() < 0.5f;
  return m;
}

}  // namespace

// The method form and the free form of one call, on inputs x[0], x[1], ...
#define FN(...) [&](const Inputs& x) { return std::vector<Tensor>{__VA_ARGS__}; }
#define REQUIRE_SAME(method, free_form, ...) REQUIRE(difference(method, free_form, __VA_ARGS__) == "")
#define REQUIRE_DIFFERENT(a, b, ...) REQUIRE(difference(a, b, __VA_ARGS__) != "")

TEST_CASE("the comparison catches a method that drops or changes an argument", "[methods][gemm]") {
  // On random inputs like those below, a changed argument changes the bits of a value or of a
  // gradient, so the comparison fails for a method that forwards a default, another axis, another
  // op or swapped operands.
  const Array a = normal({3, 4, 5}, 1), p = positive({3, 4, 5}, 2), sq = normal({2, 4, 4}, 3);
  const Array y = normal({4, 4}, 4), other = normal({4, 5}, 5);
  const Mask m = random_mask({3, 4, 5}, 6);
  REQUIRE_DIFFERENT(FN(x[0].exp()), FN(xgrad::log(x[0])), {p});
  REQUIRE_DIFFERENT(FN(x[0].pow(2.5f)), FN(xgrad::pow(x[0], 2.f)), {p});
  REQUIRE_DIFFERENT(FN(x[0].gelu(GeluApprox::tanh)), FN(xgrad::gelu(x[0])), {a});
  REQUIRE_DIFFERENT(FN(x[0].sum({0}, true)), FN(xgrad::sum(x[0], {0})), {a});
  REQUIRE_DIFFERENT(FN(x[0].mean({1})), FN(xgrad::mean(x[0], {2})), {a});
  REQUIRE_DIFFERENT(FN(x[0].max(1)), FN(xgrad::max(x[0], -1)), {a});
  REQUIRE_DIFFERENT(FN(x[0].transpose(0, 2)), FN(xgrad::transpose(x[0], 0, 1)), {a});
  REQUIRE_DIFFERENT(FN(x[0].slice(2, 1, 3)), FN(xgrad::slice(x[0], 2, 0, 2)), {a});
  REQUIRE_DIFFERENT(FN(x[0].softmax(0)), FN(xgrad::softmax(x[0])), {a});
  REQUIRE_DIFFERENT(FN(x[0].matmul(x[1], true, false)), FN(xgrad::matmul(x[0], x[1])), {sq, y});
  REQUIRE_DIFFERENT(FN(x[0].matmul(x[1], false, true)), FN(xgrad::matmul(x[0], x[1])), {sq, y});
  REQUIRE_DIFFERENT(FN(x[0].where(m, x[1])), FN(xgrad::where(m, x[1], x[0])), {a, other});
  REQUIRE_DIFFERENT(FN(x[0].topk(2, 1).values), FN(xgrad::topk(x[0], 2).values), {sq});
  REQUIRE_DIFFERENT(FN(x[0].masked_fill(m, 1.f)), FN(xgrad::masked_fill(x[0], m, 0.f)), {a});
  // Equal values are not enough: an exp of a detached input gives no gradient.
  REQUIRE_DIFFERENT(FN(x[0].detach().exp()), FN(xgrad::exp(x[0])), {a});
}

TEST_CASE("elementwise methods give the free ops' bits, forward and backward", "[methods]") {
  const Array a = normal({3, 4, 5}, 11), p = positive({3, 4, 5}, 12);
  REQUIRE_SAME(FN(x[0].neg()), FN(xgrad::neg(x[0])), {a});
  REQUIRE_SAME(FN(x[0].exp()), FN(xgrad::exp(x[0])), {a});
  REQUIRE_SAME(FN(x[0].log()), FN(xgrad::log(x[0])), {p});
  REQUIRE_SAME(FN(x[0].sqrt()), FN(xgrad::sqrt(x[0])), {p});
  REQUIRE_SAME(FN(x[0].pow(2.5f)), FN(xgrad::pow(x[0], 2.5f)), {p});
  REQUIRE_SAME(FN(x[0].pow(3.f)), FN(xgrad::pow(x[0], 3.f)), {a});
  REQUIRE_SAME(FN(x[0].tanh()), FN(xgrad::tanh(x[0])), {a});
  REQUIRE_SAME(FN(x[0].sigmoid()), FN(xgrad::sigmoid(x[0])), {a});
  REQUIRE_SAME(FN(x[0].relu()), FN(xgrad::relu(x[0])), {a});
  REQUIRE_SAME(FN(x[0].gelu()), FN(xgrad::gelu(x[0])), {a});
  REQUIRE_SAME(FN(x[0].gelu(GeluApprox::exact)), FN(xgrad::gelu(x[0], GeluApprox::exact)), {a});
  REQUIRE_SAME(FN(x[0].gelu(GeluApprox::tanh)), FN(xgrad::gelu(x[0], GeluApprox::tanh)), {a});
}

TEST_CASE("reduction methods give the free ops' bits, forward and backward", "[methods]") {
  const Array a = normal({3, 4, 5}, 21);
  REQUIRE_SAME(FN(x[0].sum()), FN(xgrad::sum(x[0])), {a});
  REQUIRE_SAME(FN(x[0].sum({0, 2})), FN(xgrad::sum(x[0], {0, 2})), {a});
  REQUIRE_SAME(FN(x[0].sum({-1}, true)), FN(xgrad::sum(x[0], {-1}, true)), {a});
  REQUIRE_SAME(FN(x[0].mean()), FN(xgrad::mean(x[0])), {a});
  REQUIRE_SAME(FN(x[0].mean({1})), FN(xgrad::mean(x[0], {1})), {a});
  REQUIRE_SAME(FN(x[0].mean({0, 1}, true)), FN(xgrad::mean(x[0], {0, 1}, true)), {a});
  REQUIRE_SAME(FN(x[0].max(1)), FN(xgrad::max(x[0], 1)), {a});
  REQUIRE_SAME(FN(x[0].max(-1, true)), FN(xgrad::max(x[0], -1, true)), {a});
  // Shapes, so the keepdims flags above are known to reach the ops.
  const Tensor t(a);
  REQUIRE(t.sum({-1}, true).shape() == Shape{3, 4, 1});
  REQUIRE(t.mean({0, 1}, true).shape() == Shape{1, 1, 5});
  REQUIRE(t.max(-1, true).shape() == Shape{3, 4, 1});
  REQUIRE(t.sum({0, 2}).shape() == Shape{4});
}

TEST_CASE("shape methods give the free ops' bits, forward and backward", "[methods]") {
  const Array a = normal({3, 4, 5}, 31);
  REQUIRE_SAME(FN(x[0].reshape({5, -1})), FN(xgrad::reshape(x[0], {5, -1})), {a});
  REQUIRE_SAME(FN(x[0].transpose(0, 2)), FN(xgrad::transpose(x[0], 0, 2)), {a});
  REQUIRE_SAME(FN(x[0].transpose(-1, 1)), FN(xgrad::transpose(x[0], -1, 1)), {a});
  REQUIRE_SAME(FN(x[0].permute({2, 0, 1})), FN(xgrad::permute(x[0], {2, 0, 1})), {a});
  REQUIRE_SAME(FN(x[0].slice(1, 1, 3)), FN(xgrad::slice(x[0], 1, 1, 3)), {a});
  REQUIRE_SAME(FN(x[0].slice(-1, 2, 5)), FN(xgrad::slice(x[0], -1, 2, 5)), {a});
  // split and chunk give several pieces; every piece's value and gradient is compared.
  const auto pieces = [](const std::function<std::vector<Tensor>(const Tensor&)>& f) {
    return [f](const Inputs& x) { return f(x[0]); };
  };
  REQUIRE_SAME(pieces([](const Tensor& t) {
                 return t.split({1, 3}, 1);
               }),
               pieces([](const Tensor& t) {
                 return xgrad::split(t, {1, 3}, 1);
               }),
               {a});
  REQUIRE_SAME(pieces([](const Tensor& t) {
                 return t.split({2, 3}, -1);
               }),
               pieces([](const Tensor& t) {
                 return xgrad::split(t, {2, 3}, -1);
               }),
               {a});
  REQUIRE_SAME(pieces([](const Tensor& t) { return t.chunk(3, -1); }),
               pieces([](const Tensor& t) { return xgrad::chunk(t, 3, -1); }), {a});
  REQUIRE_SAME(pieces([](const Tensor& t) { return t.chunk(2, 0); }),
               pieces([](const Tensor& t) { return xgrad::chunk(t, 2, 0); }), {a});
  const Tensor t(a);
  REQUIRE(t.chunk(3, -1).size() == 3);  // 5 in pieces of ceil(5 / 3) = 2: 2, 2, 1
  REQUIRE(t.chunk(3, -1)[2].shape() == Shape{3, 4, 1});
  REQUIRE(t.split({1, 3}, 1)[1].shape() == Shape{3, 3, 5});
  REQUIRE(t.reshape({5, -1}).shape() == Shape{5, 12});
}

TEST_CASE("indexing methods give the free ops' bits, forward and backward", "[methods]") {
  const Array a = normal({3, 4, 5}, 41), other = normal({4, 5}, 42);
  const IndexArray index = random_ids({3, 6, 4}, 4, 43);  // along axis 1, repeats included
  const IndexArray ids = {4, 0, 4, 1};
  const Mask m = random_mask({3, 4, 5}, 44);
  const IndexArray last = random_ids({2, 4, 7}, 5, 45), first = random_ids({5, 4, 5}, 3, 46);
  REQUIRE_SAME(FN(x[0].gather(1, index)), FN(xgrad::gather(x[0], 1, index)), {a});
  REQUIRE_SAME(FN(x[0].gather(-1, last)), FN(xgrad::gather(x[0], -1, last)), {a});
  REQUIRE_SAME(FN(x[0].gather(0, first)), FN(xgrad::gather(x[0], 0, first)), {a});
  REQUIRE_SAME(FN(x[0].index_select(2, ids)), FN(xgrad::index_select(x[0], 2, ids)), {a});
  REQUIRE_SAME(FN(x[0].index_select(-3, IndexArray{2, 2})), FN(xgrad::index_select(x[0], -3, IndexArray{2, 2})), {a});
  // other (4, 5) broadcasts against (3, 4, 5): its gradient is summed back over axis 0.
  REQUIRE_SAME(FN(x[0].where(m, x[1])), FN(xgrad::where(m, x[0], x[1])), {a, other});
  REQUIRE_SAME(FN(x[0].topk(2, 1).values), FN(xgrad::topk(x[0], 2, 1).values), {a});
  REQUIRE_SAME(FN(x[0].topk(3).values), FN(xgrad::topk(x[0], 3).values), {a});

  const Tensor t(a);
  REQUIRE((t.topk(2, 1).indices == xgrad::topk(t, 2, 1).indices));
  REQUIRE((t.topk(3).indices == xgrad::topk(t, 3).indices));
  REQUIRE(t.topk(2, 1).indices.shape() == Shape{3, 2, 5});
  REQUIRE((t.argmax(1) == xgrad::argmax(t, 1)));
  REQUIRE((t.argmax(-1, true) == xgrad::argmax(t, -1, true)));
  REQUIRE(t.argmax(-1, true).shape() == Shape{3, 4, 1});
  REQUIRE((t.argmax(0) != t.argmax(0, true)));  // shapes (4, 5) and (1, 4, 5)
}

TEST_CASE("matmul's method gives the free op's bits, with each transpose flag", "[methods][gemm]") {
  const Array a = normal({2, 3, 4}, 51), b = normal({4, 5}, 52), bt = normal({5, 4}, 53), c = normal({3, 5}, 54);
  REQUIRE_SAME(FN(x[0].matmul(x[1])), FN(xgrad::matmul(x[0], x[1])), {a, b});
  REQUIRE_SAME(FN(x[0].matmul(x[1], false, true)), FN(xgrad::matmul(x[0], x[1], false, true)), {a, bt});
  REQUIRE_SAME(FN(x[0].matmul(x[1], true, false)), FN(xgrad::matmul(x[0], x[1], true, false)), {a, c});
  REQUIRE_SAME(FN(x[0].matmul(x[1], true, true)), FN(xgrad::matmul(x[0], x[1], true, true)),
               {normal({2, 4, 3}, 55), bt});
}

TEST_CASE("softmax and masked_fill methods give the free ops' bits, forward and backward", "[methods]") {
  const Array a = normal({3, 4, 5}, 61), values = normal({3, 4, 5}, 62);
  const Mask m = random_mask({3, 4, 5}, 63), row = random_mask({5}, 64);
  REQUIRE_SAME(FN(x[0].softmax()), FN(xgrad::softmax(x[0])), {a});
  REQUIRE_SAME(FN(x[0].softmax(0)), FN(xgrad::softmax(x[0], 0)), {a});
  REQUIRE_SAME(FN(x[0].log_softmax()), FN(xgrad::log_softmax(x[0])), {a});
  REQUIRE_SAME(FN(x[0].log_softmax(1)), FN(xgrad::log_softmax(x[0], 1)), {a});
  REQUIRE_SAME(FN(x[0].masked_fill(m, -2.5f)), FN(xgrad::masked_fill(x[0], m, -2.5f)), {a});
  REQUIRE_SAME(FN(x[0].masked_fill(row, 7.f)), FN(xgrad::masked_fill(x[0], row, 7.f)), {a});
  REQUIRE_SAME(FN(x[0].masked_fill(m, values)), FN(xgrad::masked_fill(x[0], m, values)), {a});
}

TEST_CASE("methods chain as the free calls nest", "[methods][gemm]") {
  const Array a = normal({2, 3, 4}, 71), w = normal({4, 6}, 72);
  REQUIRE_SAME(
      FN(x[0].matmul(x[1]).relu().softmax(-1).log().mean({0, 1}).sum()),
      FN(xgrad::sum(xgrad::mean(xgrad::log(xgrad::softmax(xgrad::relu(xgrad::matmul(x[0], x[1])), -1)), {0, 1}))),
      {a, w});
}

TEST_CASE("bad input: a method throws the free op's Error, which names the op", "[methods]") {
  const Tensor a(normal({3, 4, 5}, 81)), b(normal({3, 4}, 82));
  const IndexArray index = random_ids({3, 2, 5}, 4, 83);
  struct Case {
    const char* op;
    std::function<void()> method, free_form;
  };
  const std::vector<Case> cases =
      {
          {"sum", [&] { a.sum({3}); },
           [&] {
    xgrad::sum(a, {3});
           }},
          {"sum",
           [&] {
    a.sum({1, -2});
           },
           [&] {
    xgrad::sum(a, {1, -2});
          }},
      {"mean", [&] { a.mean({-4}); }, [&] { xgrad::mean(a, {-4}); }},
      {"mean",
       [&] {
    Tensor::zeros({0, 3}).mean({0});
       },
       [&] {
    xgrad::mean(Tensor::zeros({0, 3}), {0});
      }},
      {"max", [&] { a.max(3); }, [&] { xgrad::max(a, 3); }},
      {"reshape",
       [&] {
    a.reshape({7, -1});
       },
       [&] {
    xgrad::reshape(a, {7, -1});
      }},
      {"reshape",
       [&] {
    a.reshape({-1, -1});
       },
       [&] {
    xgrad::reshape(a, {-1, -1});
      }},
      {"transpose", [&] { a.transpose(0, 3); }, [&] { xgrad::transpose(a, 0, 3); }},
      {"permute",
       [&] {
    a.permute({0, 0, 1});
       },
       [&] {
    xgrad::permute(a, {0, 0, 1});
      }},
      {"permute",
       [&] {
    a.permute({0, 1});
       },
       [&] {
    xgrad::permute(a, {0, 1});
      }},
      {"slice", [&] { a.slice(1, 2, 9); }, [&] { xgrad::slice(a, 1, 2, 9); }},
      {"split",
       [&] {
    a.split({1, 1}, 1);
       },
       [&] {
    xgrad::split(a, {1, 1}, 1);
      }},
      {"chunk", [&] { a.chunk(0, 1); }, [&] { xgrad::chunk(a, 0, 1); }},
      {"chunk", [&] { a.chunk(2, 3); }, [&] { xgrad::chunk(a, 2, 3); }},
      {"gather", [&] { a.gather(3, index); }, [&] { xgrad::gather(a, 3, index); }},
      {"gather", [&] { a.gather(1, IndexArray(index + 2)); }, [&] { xgrad::gather(a, 1, IndexArray(index + 2)); }},
      {"index_select", [&] { a.index_select(-4, IndexArray{0}); }, [&] { xgrad::index_select(a, -4, IndexArray{0}); }},
      {"index_select", [&] { a.index_select(0, IndexArray{3}); }, [&] { xgrad::index_select(a, 0, IndexArray{3}); }},
      {"where",
       [&] {
    a.where(Mask(xt::zeros<bool>({2, 5})), b);
       },
       [&] {
    xgrad::where(Mask(xt::zeros<bool>({2, 5})), a, b);
      }},
      {"argmax", [&] { a.argmax(5); }, [&] { xgrad::argmax(a, 5); }},
      {"topk", [&] { a.topk(5, 1); }, [&] { xgrad::topk(a, 5, 1); }},
      {"matmul", [&] { a.matmul(b); }, [&] { xgrad::matmul(a, b); }},
      {"softmax", [&] { a.softmax(3); }, [&] { xgrad::softmax(a, 3); }},
      {"log_softmax", [&] { a.log_softmax(-4); }, [&] { xgrad::log_softmax(a, -4); }},
      {"masked_fill", [&] { a.masked_fill(Mask(xt::zeros<bool>({2})), 1.f); },
       [&] { xgrad::masked_fill(a, Mask(xt::zeros<bool>({2})), 1.f); }},
      {"masked_fill",
       [&] {
    a.masked_fill(Mask(xt::zeros<bool>({3, 4, 5})), Array(xt::zeros<float>({3, 4})));
       },
       [&] {
    xgrad::masked_fill(a, Mask(xt::zeros<bool>({3, 4, 5})), Array(xt::zeros<float>({3, 4})));
      }},
      };
  for (const Case& c : cases) {
    const std::string method = error_of(c.method);
    INFO(c.op << ": " << method);
    REQUIRE_THAT(method, StartsWith(std::string(c.op) + ": "));
    REQUIRE(method == error_of(c.free_form));
  }
  // Two messages in full.
  REQUIRE(error_of([&] { a.gather(3, index); }) == "gather: axis 3 is out of range for a tensor of rank 3");
  REQUIRE(error_of([&] { a.topk(5, 1); }) == "topk: k = 5 is larger than axis 1 of length 4 in shape (3, 4, 5)");
}

TEST_CASE("bad input: a method on an undefined handle throws the free op's Error, which names the op", "[methods]") {
  const Tensor u, a(normal({3, 4}, 91));
  const IndexArray ids = {0};
  const Mask m = xt::zeros<bool>({3, 4});
  struct Case {
    const char* op;
    std::function<void()> method, free_form;
  };
  const std::vector<Case> cases =
      {
          {"neg", [&] { u.neg(); }, [&] { xgrad::neg(u); }},
          {"exp", [&] { u.exp(); }, [&] { xgrad::exp(u); }},
          {"log", [&] { u.log(); }, [&] { xgrad::log(u); }},
          {"sqrt", [&] { u.sqrt(); }, [&] { xgrad::sqrt(u); }},
          {"pow", [&] { u.pow(2.f); }, [&] { xgrad::pow(u, 2.f); }},
          {"tanh", [&] { u.tanh(); }, [&] { xgrad::tanh(u); }},
          {"sigmoid", [&] { u.sigmoid(); }, [&] { xgrad::sigmoid(u); }},
          {"relu", [&] { u.relu(); }, [&] { xgrad::relu(u); }},
          {"gelu", [&] { u.gelu(); }, [&] { xgrad::gelu(u); }},
          {"gelu_tanh", [&] { u.gelu(GeluApprox::tanh); }, [&] { xgrad::gelu(u, GeluApprox::tanh); }},
          {"sum", [&] { u.sum(); }, [&] { xgrad::sum(u); }},
          {"sum", [&] { u.sum({0}, true); }, [&] { xgrad::sum(u, {0}, true); }},
          {"mean", [&] { u.mean(); }, [&] { xgrad::mean(u); }},
          {"mean", [&] { u.mean({0}); }, [&] { xgrad::mean(u, {0}); }},
          {"max", [&] { u.max(0); }, [&] { xgrad::max(u, 0); }},
          {"reshape", [&] { u.reshape({-1}); }, [&] { xgrad::reshape(u, {-1}); }},
          {"transpose", [&] { u.transpose(0, 1); }, [&] { xgrad::transpose(u, 0, 1); }},
          {"permute",
           [&] {
    u.permute({1, 0});
           },
           [&] {
    xgrad::permute(u, {1, 0});
          }},
                          {"slice", [&] { u.slice(0, 0, 1); }, [&] { xgrad::slice(u, 0, 0, 1); }},
                          {"split", [&] { u.split({1}, 0); }, [&] { xgrad::split(u, {1}, 0); }},
                          {"chunk", [&] { u.chunk(2, 0); }, [&] { xgrad::chunk(u, 2, 0); }},
                          {"gather", [&] { u.gather(0, ids); }, [&] { xgrad::gather(u, 0, ids); }},
                          {"index_select", [&] { u.index_select(0, ids); }, [&] { xgrad::index_select(u, 0, ids); }},
                          {"where", [&] { u.where(m, a); }, [&] { xgrad::where(m, u, a); }},
                          {"where", [&] { a.where(m, u); }, [&] { xgrad::where(m, a, u); }},
                          {"argmax", [&] { u.argmax(0); }, [&] { xgrad::argmax(u, 0); }},
                          {"topk", [&] { u.topk(1); }, [&] { xgrad::topk(u, 1); }},
                          {"matmul", [&] { u.matmul(a); }, [&] { xgrad::matmul(u, a); }},
                          {"matmul", [&] { a.matmul(u, true); }, [&] { xgrad::matmul(a, u, true); }},
                          {"softmax", [&] { u.softmax(); }, [&] { xgrad::softmax(u); }},
                          {"log_softmax", [&] { u.log_softmax(); }, [&] { xgrad::log_softmax(u); }},
                          {"masked_fill", [&] { u.masked_fill(m, 0.f); }, [&] { xgrad::masked_fill(u, m, 0.f); }},
                          {"masked_fill", [&] { u.masked_fill(m, a.value()); },
                           [&] { xgrad::masked_fill(u, m, a.value()); }},
                          };
  for (const Case& c : cases) {
    const std::string method = error_of(c.method);
    INFO(c.op << ": " << method);
    REQUIRE_THAT(method, StartsWith(std::string(c.op) + ": "));
    REQUIRE_THAT(method, Catch::Matchers::Contains("undefined"));
    REQUIRE(method == error_of(c.free_form));
  }
}
