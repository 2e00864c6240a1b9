// Values changed in place between forward and backward: every storage counts its in-place writes,
// and backward refuses to run an op on a value it saved that was written since (as PyTorch's
// version counters do), naming the op and the tensor. Values an op does not save may change.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/optim/sgd.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using Catch::Contains;

namespace {

void require_equal(const Array& got, const Array& want) {
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("flat index " << i);
    CHECK(got.data()[i] == Approx(want.data()[i]).margin(1e-6));
  }
}

// A (n, 1) column.
Array column(std::initializer_list<float> v) {
  Array a(v);
  a.reshape({v.size(), std::size_t{1}});
  return a;
}

// The message backward raises when `op`'s input (or output, input < 0) was written.
std::string changed(const std::string& op, int input, const std::string& tensor) {
  const std::string which = input < 0 ? "output" : "input " + std::to_string(input);
  return "backward: " + op + "'s " + which + " (" + tensor +
         ") was changed in place after the op saved it for backward";
}

}  // namespace

TEST_CASE("every in-place write bumps the storage's version, seen through detach()ed handles", "[versions]") {
  Tensor w(Array{1.f, 2.f, 3.f}, true);
  REQUIRE(w.version() == 0);
  w.mutable_value()(0) = 5.f;
  REQUIRE(w.version() == 1);
  Tensor d = w.detach();
  Tensor copy = w;
  REQUIRE(d.version() == 1);
  d.mutable_value()(1) = 6.f;
  REQUIRE(w.version() == 2);
  REQUIRE(copy.version() == 2);
  REQUIRE(w.value()(1) == 6.f);
  // reading does not count, and a computed tensor starts at 0
  (void)w.value();
  REQUIRE(w.version() == 2);
  REQUIRE((w * 2.f).version() == 0);
}

TEST_CASE("a mutable_value write between forward and backward is refused, naming the op and the tensor",
          "[versions][bug]") {
  // y = sum(w * w): dy/dw = 2 w = (2, 4, 6) from the recorded w = (1, 2, 3)
  Tensor w(Array{1.f, 2.f, 3.f}, true);
  w.set_name("w");
  Tensor y = sum(w * w);
  w.mutable_value() *= 10.f;  // backward would have given (20, 40, 60)
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("mul", 1, "'w', shape (3)")) && Contains("(version 0 -> 1)"));
  REQUIRE_FALSE(w.has_grad());  // nothing half-computed was delivered

  // a forward after the write records the new values
  Tensor y2 = sum(w * w);
  y2.backward();
  require_equal(w.grad(), Array{20.f, 40.f, 60.f});
}

TEST_CASE("matmul names which input changed and its shape, an unnamed tensor by its shape only", "[versions][gemm]") {
  Tensor x(Array{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}}, true);
  Tensor w(column({1.f, 2.f, 3.f}), true);
  w.set_name("w");
  SECTION("the named weight") {
    Tensor y = sum(matmul(x, w));
    w.mutable_value()(2, 0) = 0.f;
    REQUIRE_THROWS_WITH(y.backward(), Contains(changed("matmul", 1, "'w', shape (3, 1)") + " (version 0 -> 1)") &&
                                          Contains("run the forward again"));
  }
  SECTION("the unnamed input, written twice") {
    Tensor y = sum(matmul(x, w));
    x.mutable_value() += 1.f;
    x.mutable_value() += 1.f;
    REQUIRE_THROWS_WITH(y.backward(), Contains(changed("matmul", 0, "shape (2, 3)") + " (version 0 -> 2)"));
  }
  SECTION("as PyTorch's mm: an operand is saved only when the other one needs its gradient") {
    // dy/dw = x^T 1 reads x, never w; dy/dx would read w, but x takes no gradient
    Tensor c(Array{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
    Tensor y = sum(matmul(c, w));
    w.mutable_value() *= 7.f;
    y.backward();
    require_equal(w.grad(), column({5.f, 7.f, 9.f}));

    w.zero_grad();
    Tensor y2 = sum(matmul(c, w));
    c.mutable_value() *= 2.f;
    REQUIRE_THROWS_WITH(y2.backward(), Contains(changed("matmul", 0, "shape (2, 3)")));
  }
}

TEST_CASE("an optimizer step between forward and backward is refused", "[versions][bug]") {
  Tensor w(Array{1.f, 2.f, 3.f}, true);
  w.set_name("w");
  optim::SGD opt({w}, optim::SGDOptions(0.25f));
  sum(w * w).backward();
  require_equal(w.grad(), Array{2.f, 4.f, 6.f});

  Tensor y = sum(w * w);  // recorded with w = (1, 2, 3)
  opt.step();             // w = (1, 2, 3) - 0.25 (2, 4, 6) = (0.5, 1, 1.5)
  require_equal(w.value(), Array{0.5f, 1.f, 1.5f});
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("mul", 1, "'w', shape (3)") + " (version 0 -> 1)"));
  require_equal(w.grad(), Array{2.f, 4.f, 6.f});  // the earlier gradient, untouched

  SECTION("the step after backward (the usual order) is fine, and so is the next forward") {
    opt.zero_grad();
    Tensor y2 = sum(w * w);
    y2.backward();
    require_equal(w.grad(), Array{1.f, 2.f, 3.f});
    opt.step();
    require_equal(w.value(), Array{0.25f, 0.5f, 0.75f});
  }
}

TEST_CASE("an optimizer step on a layer's weight between forward and backward is refused", "[versions][bug][gemm]") {
  Generator gen(3);
  nn::Linear first(2, 3, false, gen), second(3, 1, false, gen);
  optim::SGD opt(second.named_parameters(), optim::SGDOptions(0.1f));
  Tensor x(Array{{0.5f, -1.f}});
  sum(second.forward(tanh(first.forward(x)))).backward();
  Tensor y = sum(second.forward(tanh(first.forward(x))));
  opt.step();
  // second's dX = G W reads the weight
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("linear", 1, "'weight', shape (1, 3)") + " (version 0 -> 1)"));
}

TEST_CASE("load_state_dict between forward and backward is refused", "[versions][bug][gemm]") {
  nn::Linear lin(3, 1, false);
  lin.weight.mutable_value() = Array{{1.f, 2.f, 3.f}};
  Tensor x(Array{{1.f, 1.f, 1.f}}, true);  // as the activation of an earlier layer
  x.set_name("h");
  Tensor y = sum(lin.forward(x));
  const std::uint64_t before = lin.weight.version();
  weights::load_state_dict(lin, {{"weight", Array{{10.f, 20.f, 30.f}}}});
  REQUIRE(lin.weight.version() == before + 1);
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("linear", 1, "'weight', shape (1, 3)")));
  REQUIRE_FALSE(x.has_grad());

  Tensor y2 = sum(lin.forward(x));
  y2.backward();
  require_equal(x.grad(), Array{{10.f, 20.f, 30.f}});
  require_equal(lin.weight.grad(), Array{{1.f, 1.f, 1.f}});
}

TEST_CASE("a write through a detach()ed handle is caught, and the message names the recorded tensor", "[versions]") {
  Tensor w(Array{1.f, 2.f, 3.f}, true);
  w.set_name("w");
  Tensor y = sum(w * w);
  Tensor d = w.detach();
  d.mutable_value()(0) = 7.f;
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("mul", 1, "'w', shape (3)")));
}

TEST_CASE("a write to a saved output is caught", "[versions]") {
  Tensor x(Array{0.f, 1.f}, true);
  Tensor e = exp(x);  // backward reads e
  e.set_name("e");
  Tensor y = sum(e);
  e.mutable_value() *= 2.f;
  REQUIRE_THROWS_WITH(y.backward(), Contains(changed("exp", -1, "'e', shape (2)") + " (version 0 -> 1)"));
}

TEST_CASE("writes that backward does not depend on are fine, as in PyTorch", "[versions]") {
  Tensor a(Array{1.f, 2.f, 3.f}, true);
  Tensor b(Array{4.f, 5.f, 6.f}, true);
  SECTION("an input of add") {
    Tensor y = sum((a + b) * 2.f);
    a.mutable_value() *= 100.f;
    b.mutable_value() *= 100.f;
    y.backward();
    require_equal(a.grad(), Array{2.f, 2.f, 2.f});
    require_equal(b.grad(), Array{2.f, 2.f, 2.f});
  }
  SECTION("a write after backward leaves the gradient as computed") {
    Tensor y = sum(a * a);
    y.backward();
    a.mutable_value() *= 10.f;
    require_equal(a.grad(), Array{2.f, 4.f, 6.f});
  }
  SECTION("retain_graph: a second backward on unchanged values works, after a write it is refused") {
    Tensor y = sum(a * b);
    y.backward(true);
    y.backward(true);
    require_equal(a.grad(), Array{8.f, 10.f, 12.f});
    b.mutable_value()(0) = 0.f;
    REQUIRE_THROWS_WITH(y.backward(), Contains(changed("mul", 1, "shape (3)")));
    require_equal(a.grad(), Array{8.f, 10.f, 12.f});
  }
  SECTION("a forward under NoGradGuard records nothing, so writes around it are free") {
    Tensor y;
    {
      NoGradGuard no_grad;
      y = sum(a * a);
    }
    a.mutable_value() *= 2.f;
    REQUIRE(y.item() == 14.f);
  }
}

namespace {

// One op under test: leaves -> output, and which leaves (and whether the output) its backward
// reads.
struct OpCase {
  std::string op;
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<int> saved;  // leaf indices whose write must be refused
  bool saves_output;
};

Generator& dropout_gen() {
  static Generator gen(9);
  return gen;
}

std::vector<OpCase> op_cases() {
  using V = const std::vector<Tensor>&;
  const Mask mask{{false, true, false}, {true, false, false}};
  return {
      {"add", {{2, 3}, {3}}, [](V t) { return add(t[0], t[1]); }, {}, false},
      {"sub", {{2, 3}, {2, 3}}, [](V t) { return sub(t[0], t[1]); }, {}, false},
      {"mul", {{2, 3}, {2, 3}}, [](V t) { return mul(t[0], t[1]); }, {0, 1}, false},
      {"div", {{2, 3}, {2, 3}}, [](V t) { return div(t[0], t[1]); }, {1}, true},
      {"add_scalar", {{2, 3}}, [](V t) { return t[0] + 2.f; }, {}, false},
      {"rsub_scalar", {{2, 3}}, [](V t) { return 2.f - t[0]; }, {}, false},
      {"mul_scalar", {{2, 3}}, [](V t) { return t[0] * 2.f; }, {}, false},
      {"div_scalar", {{2, 3}}, [](V t) { return t[0] / 2.f; }, {}, false},
      {"rdiv_scalar", {{2, 3}}, [](V t) { return 2.f / t[0]; }, {0}, true},
      {"neg", {{2, 3}}, [](V t) { return -t[0]; }, {}, false},
      {"exp", {{2, 3}}, [](V t) { return exp(t[0]); }, {}, true},
      {"log", {{2, 3}}, [](V t) { return log(t[0]); }, {0}, false},
      {"sqrt", {{2, 3}}, [](V t) { return sqrt(t[0]); }, {}, true},
      {"pow", {{2, 3}}, [](V t) { return pow(t[0], 3.f); }, {0}, false},
      {"tanh", {{2, 3}}, [](V t) { return tanh(t[0]); }, {}, true},
      {"sigmoid", {{2, 3}}, [](V t) { return sigmoid(t[0]); }, {}, true},
      {"relu", {{2, 3}}, [](V t) { return relu(t[0]); }, {0}, false},
      {"gelu", {{2, 3}}, [](V t) { return gelu(t[0]); }, {0}, false},
      {"gelu_tanh", {{2, 3}}, [](V t) { return gelu(t[0], GeluApprox::tanh); }, {0}, false},
      {"sum", {{2, 3}}, [](V t) { return sum(t[0], {1}); }, {}, false},
      {"mean", {{2, 3}}, [](V t) { return mean(t[0]); }, {}, false},
      {"max", {{2, 3}}, [](V t) { return max(t[0], 1); }, {}, false},
      {"identity", {{2, 3}}, [](V t) { return identity(t[0]); }, {}, false},
      {"reshape",
       {{2, 3}},
       [](V t) {
    return reshape(t[0], {3, 2});
       },
       {},
       false},
      {"permute", {{2, 3}}, [](V t) { return transpose(t[0], 0, 1); }, {}, false},
      {"slice", {{2, 3}}, [](V t) { return slice(t[0], 1, 1, 3); }, {}, false},
      {"concat",
       {{2, 3}, {2, 1}},
       [](V t) {
    return concat({t[0], t[1]}, 1);
       },
       {},
       false},
      {"matmul", {{2, 3}, {3, 2}}, [](V t) { return matmul(t[0], t[1]); }, {0, 1}, false},
      {"linear", {{2, 3}, {4, 3}, {4}}, [](V t) { return linear(t[0], t[1], t[2]); }, {0, 1}, false},
      {"attention_scores",
       {{1, 2, 4}, {1, 3, 4}},
       [](V t) { return attention_scores(t[0], t[1], 2, 0.5f); },
       {0, 1},
       false},
      {"attention_weights",
       {{1, 2, 4}, {1, 3, 4}},
       [](V t) { return attention_weights(t[0], t[1], 2, 0.5f); },
       {0, 1},
       true},
      {"attend", {{1, 2, 2, 3}, {1, 3, 4}}, [](V t) { return attend(t[0], t[1], 2); }, {0, 1}, false},
      {"softmax", {{2, 3}}, [](V t) { return softmax(t[0]); }, {}, true},
      {"masked_softmax", {{2, 3}}, [mask](V t) { return masked_softmax(t[0], mask); }, {}, true},
      {"log_softmax", {{2, 3}}, [](V t) { return log_softmax(t[0]); }, {}, true},
      {"masked_fill", {{2, 3}}, [mask](V t) { return masked_fill(t[0], mask, -1.f); }, {}, false},
      {"cross_entropy",
       {{2, 3}},
       [](V t) {
    return cross_entropy(t[0], IndexArray{2, 0});
       },
       {0},
       false},
      {"embedding",
       {{4, 3}},
       [](V t) {
    return embedding(t[0], IndexArray{1, 3, 1});
       },
       {},
       false},
      {"dropout", {{2, 3}}, [](V t) { return dropout(t[0], 0.5f, true, dropout_gen()); }, {}, false},
      {"gelu_dropout", {{2, 3}}, [](V t) { return gelu_dropout(t[0], 0.5f, true, dropout_gen()); }, {0}, false},
      {"layer_norm", {{2, 3}, {3}, {3}}, [](V t) { return layer_norm(t[0], t[1], t[2]); }, {0, 1}, false},
      {"rms_norm", {{2, 3}, {3}}, [](V t) { return rms_norm(t[0], t[1]); }, {0, 1}, false},
      {"gather",
       {{2, 3}},
       [](V t) {
    return gather(t[0], 1, IndexArray{{2, 2}, {0, 1}});
       },
       {},
       false},
      {"index_select",
       {{2, 3}},
       [](V t) {
    return index_select(t[0], 1, IndexArray{2, 0, 2});
       },
       {},
       false},
      {"where", {{2, 3}, {3}}, [mask](V t) { return xgrad::where(mask, t[0], t[1]); }, {}, false},
      {"topk", {{2, 3}}, [](V t) { return topk(t[0], 2, 1).values; }, {}, false},
      {"rotary_embedding",
       {{1, 2, 4}},
       [](V t) {
    return rotary_embedding(t[0], 1, IndexArray{3, 7});
       },
       {},
       false},
      };
}

}  // namespace

TEST_CASE("each op refuses a write to exactly the values its backward reads", "[versions][gemm]") {
  for (const OpCase& c : op_cases()) {
    DYNAMIC_SECTION(c.op) {
      Generator gen(17);
      std::vector<Tensor> leaves;
      for (const Shape& s : c.shapes) leaves.emplace_back(gen.uniform(s, 0.5f, 1.5f), true);
      // The gradients from the recorded values (dropout: the same generator state each time).
      const Generator start = dropout_gen();
      auto run = [&](int write_leaf, bool write_output) {
        dropout_gen() = start;
        for (Tensor& t : leaves) t.zero_grad();
        Tensor out = c.fn(leaves);
        const Array seed = Generator(5).uniform(out.shape(), -1.f, 1.f);
        if (write_leaf >= 0) leaves[static_cast<std::size_t>(write_leaf)].mutable_value() += 0.25f;
        if (write_output) out.mutable_value() += 0.25f;
        out.backward(seed);
        std::vector<Array> grads;
        for (const Tensor& t : leaves) grads.push_back(t.has_grad() ? t.grad() : Array());
        return grads;
      };
      std::vector<Array> values;
      for (const Tensor& t : leaves) values.push_back(t.value());
      const std::vector<Array> want = run(-1, false);
      for (int k = -1; k < static_cast<int>(leaves.size()); ++k) {
        const bool saved = k < 0 ? c.saves_output : std::find(c.saved.begin(), c.saved.end(), k) != c.saved.end();
        INFO(c.op << (k < 0 ? " output" : " input " + std::to_string(k)) << (saved ? " (saved)" : " (not saved)"));
        for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i].mutable_value() = values[i];
        if (saved) {
          REQUIRE_THROWS_WITH(run(k, k < 0), Contains("backward: " + c.op + "'s " +
                                                      (k < 0 ? std::string("output") : "input " + std::to_string(k))) &&
                                                 Contains("was changed in place"));
        } else {
          const std::vector<Array> got = run(k, k < 0);
          for (std::size_t i = 0; i < got.size(); ++i) {
            INFO("gradient of input " << i);
            REQUIRE(got[i].size() == want[i].size());
            for (std::size_t j = 0; j < got[i].size(); ++j) REQUIRE(got[i].data()[j] == want[i].data()[j]);
          }
        }
      }
    }
  }
}
