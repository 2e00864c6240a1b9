// Semantics of the autograd engine: backward and seeds, gradient accumulation, graph release
// and retain_graph, NoGradGuard, detach, retain_grad, hooks, tape pruning, Tensor basics.
// Per-op gradients are checked elsewhere (gradcheck tests); bad inputs in test_errors.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

// Same shape, and every element within tol of the expected one.
void require_close(const Array& got, const Array& want, float tol = 1e-5f) {
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("flat index " << i);
    CHECK(got.data()[i] == Approx(want.data()[i]).margin(tol));
  }
}

// Records throwaway ops whose results die at once until the tape prunes itself (its size drops),
// so that a test leaves at most one dead entry behind; returns false if no prune happened.
bool drain_tape(const Tensor& x) {
  for (int i = 0; i < 20000; ++i) {
    const std::size_t s = tape_size();
    { Tensor t = x * 2.f; }
    if (tape_size() <= s) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("backward on a scalar gives the analytic leaf gradients", "[tape]") {
  Tensor a(Array{1.f, 2.f, 3.f}, true);
  Tensor b(Array{4.f, -5.f, 6.f}, true);
  // L = sum(a * b + a^2): dL/da = b + 2a, dL/db = a
  Tensor loss = sum(a * b + a * a);
  REQUIRE(loss.ndim() == 0);
  REQUIRE(loss.item() == Approx(4.f - 10.f + 18.f + 1.f + 4.f + 9.f));
  loss.backward();
  require_close(a.grad(), Array{6.f, -1.f, 12.f});
  require_close(b.grad(), Array{1.f, 2.f, 3.f});
}

TEST_CASE("backward with an explicit seed on a non-scalar output", "[tape]") {
  Tensor x(Array{{1.f, 2.f}, {3.f, 4.f}}, true);
  Tensor bias(Array{10.f, 20.f}, true);
  // y = 3x + bias (bias broadcast over rows): dx = 3 seed, dbias = column sums of seed
  Tensor y = x * 3.f + bias;
  const Array seed{{1.f, 2.f}, {3.f, 4.f}};
  y.backward(seed);
  require_close(x.grad(), Array{{3.f, 6.f}, {9.f, 12.f}});
  require_close(bias.grad(), Array{4.f, 6.f});
}

TEST_CASE("gradients accumulate across backward calls until zero_grad", "[tape]") {
  Tensor x(Array{1.f, -2.f, 3.f}, true);
  // L = sum(x^3): dL/dx = 3x^2 = (3, 12, 27)
  auto round = [&] { sum(x * x * x).backward(); };
  round();
  require_close(x.grad(), Array{3.f, 12.f, 27.f});
  round();
  require_close(x.grad(), Array{6.f, 24.f, 54.f});
  REQUIRE(x.has_grad());
  x.zero_grad();
  REQUIRE_FALSE(x.has_grad());
  REQUIRE_THROWS_AS(x.grad(), Error);
  round();
  require_close(x.grad(), Array{3.f, 12.f, 27.f});
}

TEST_CASE("backward releases the tape entries it ran unless retain_graph is set", "[tape]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  const std::size_t before = tape_size();

  SECTION("released by default; a second backward throws naming retain_graph") {
    Tensor loss = sum(x * x);  // 2 entries: mul, sum
    REQUIRE(tape_size() == before + 2);
    loss.backward();
    REQUIRE(tape_size() == before);
    require_close(x.grad(), Array{2.f, 4.f, 6.f});
    REQUIRE_THROWS_AS(loss.backward(), Error);
    REQUIRE_THROWS_WITH(loss.backward(), Catch::Contains("retain_graph"));
    // the failed backward did not touch the leaf gradient
    require_close(x.grad(), Array{2.f, 4.f, 6.f});
  }

  SECTION("kept with retain_graph; a second backward doubles the leaf gradient") {
    Tensor loss = sum(x * x);
    loss.backward(/*retain_graph=*/true);
    REQUIRE(tape_size() == before + 2);
    require_close(x.grad(), Array{2.f, 4.f, 6.f});
    loss.backward();  // allowed, and releases the graph this time
    require_close(x.grad(), Array{4.f, 8.f, 12.f});
    REQUIRE(tape_size() == before);
    REQUIRE_THROWS_WITH(loss.backward(), Catch::Contains("retain_graph"));
  }
}

TEST_CASE("a graph shared by two losses needs retain_graph on the first backward", "[tape]") {
  Tensor x(Array{1.f, 2.f}, true);
  // h = 2x; L1 = sum(h) -> dL1/dx = 2; L2 = sum(h^2) -> dL2/dx = 2h * 2 = 8x
  Tensor h = x * 2.f;
  Tensor l1 = sum(h);
  Tensor l2 = sum(h * h);

  SECTION("without retain_graph the second loss finds the shared part released") {
    l1.backward();
    require_close(x.grad(), Array{2.f, 2.f});
    REQUIRE_THROWS_AS(l2.backward(), Error);
    // the leaf gradient holds only the first loss's contribution
    require_close(x.grad(), Array{2.f, 2.f});
  }

  SECTION("with retain_graph both backward calls work and their gradients add up") {
    l1.backward(/*retain_graph=*/true);
    l2.backward();
    require_close(x.grad(), Array{2.f + 8.f, 2.f + 16.f});
  }
}

TEST_CASE("NoGradGuard stops recording and restores the previous mode", "[tape][no_grad]") {
  Tensor x(Array{1.f, 2.f}, true);
  REQUIRE(grad_enabled());

  SECTION("ops inside the guard are not recorded") {
    const std::size_t before = tape_size();
    {
      NoGradGuard guard;
      REQUIRE_FALSE(grad_enabled());
      Tensor y = exp(x * x) + x;
      REQUIRE_FALSE(y.requires_grad());
      REQUIRE(y.is_leaf());
      REQUIRE(tape_size() == before);
      require_close(y.value(), Array{std::exp(1.f) + 1.f, std::exp(4.f) + 2.f});
    }
    REQUIRE(grad_enabled());
    Tensor z = x * x;  // recorded again after the scope
    REQUIRE(z.requires_grad());
    REQUIRE(tape_size() == before + 1);
  }

  SECTION("nested guards restore the mode of the enclosing scope") {
    {
      NoGradGuard outer;
      {
        NoGradGuard inner;
        REQUIRE_FALSE(grad_enabled());
      }
      REQUIRE_FALSE(grad_enabled());  // still inside outer
    }
    REQUIRE(grad_enabled());
    // a guard opened while grad mode is already off leaves it off on exit
    set_grad_enabled(false);
    { NoGradGuard g; }
    const bool still_off = !grad_enabled();
    set_grad_enabled(true);
    REQUIRE(still_off);
  }

  SECTION("an exception leaving the guard's scope restores grad mode") {
    Tensor bad(Array{1.f, 2.f, 3.f});
    auto throwing = [&] {
      NoGradGuard guard;
      Tensor y = x + bad;  // (2) + (3) does not broadcast
    };
    REQUIRE_THROWS_AS(throwing(), Error);
    REQUIRE(grad_enabled());
    auto throwing_user = [&] {
      NoGradGuard guard;
      throw std::runtime_error("user code");
    };
    REQUIRE_THROWS_AS(throwing_user(), std::runtime_error);
    REQUIRE(grad_enabled());
  }
}

TEST_CASE("detach shares storage, is a leaf without grad, and blocks the gradient", "[tape][detach]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  Tensor d = x.detach();
  REQUIRE(d.is_leaf());
  REQUIRE_FALSE(d.requires_grad());
  REQUIRE_FALSE(d.is_same(x));

  SECTION("writes through either handle are seen by the other") {
    d.mutable_value()(0) = 10.f;
    REQUIRE(x.value()(0) == 10.f);
    x.mutable_value()(2) = -7.f;
    REQUIRE(d.value()(2) == -7.f);
  }

  SECTION("detaching an intermediate also shares storage and cuts it from the graph") {
    Tensor h = x * 2.f;
    Tensor hd = h.detach();
    REQUIRE(hd.is_leaf());
    REQUIRE_FALSE(hd.requires_grad());
    hd.mutable_value()(1) = 100.f;
    REQUIRE(h.value()(1) == 100.f);
  }

  SECTION("gradient does not flow through the detached operand") {
    // L = sum(x * stop(x)): dL/dx = stop(x) = x, not 2x
    sum(x * d).backward();
    require_close(x.grad(), Array{1.f, 2.f, 3.f});
    REQUIRE_FALSE(d.has_grad());
    // an expression only of detached values does not require grad
    Tensor only_detached = sum(d * 3.f);
    REQUIRE_FALSE(only_detached.requires_grad());
  }
}

TEST_CASE("retain_grad keeps an intermediate's gradient, without it grad() throws", "[tape]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  // h = 3x, L = sum(h^2): dL/dh = 2h = 6x, dL/dx = 18x
  Tensor h = x * 3.f;
  Tensor other = x + 1.f;  // an intermediate without retain_grad
  h.retain_grad();
  REQUIRE(h.retains_grad());
  REQUIRE_FALSE(other.retains_grad());
  sum(h * h + other).backward();
  REQUIRE(h.has_grad());
  require_close(h.grad(), Array{6.f, 12.f, 18.f});
  require_close(x.grad(), Array{18.f + 1.f, 36.f + 1.f, 54.f + 1.f});
  REQUIRE_FALSE(other.has_grad());
  REQUIRE_THROWS_AS(other.grad(), Error);
  REQUIRE_THROWS_WITH(other.grad(), Catch::Contains("retain_grad"));
}

TEST_CASE("a hook on an intermediate sees the gradient arriving there", "[tape][hooks]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  // h = x^2, L = sum(h^2): dL/dh = 2h = 2x^2, dL/dx = 2h * 2x = 4x^3
  Tensor h = x * x;
  Array seen;
  int calls = 0;
  h.register_hook([&](Array& g) {
    seen = g;
    ++calls;
  });
  sum(h * h).backward();
  REQUIRE(calls == 1);
  require_close(seen, Array{2.f, 8.f, 18.f});
  require_close(x.grad(), Array{4.f, 32.f, 108.f});
  REQUIRE_FALSE(h.has_grad());  // a hook does not make the tensor keep its gradient
}

TEST_CASE("ops that write their input's gradient over the arriving one leave a kept copy intact", "[tape][hooks]") {
  // Elementwise backwards compute dx in the buffer of the gradient arriving at their output; what
  // retain_grad keeps and what a hook saw of that gradient must stay the arriving values.
  Generator gen(3);
  const Mask masked = {false, true, false, false};
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"gelu", [](const Tensor& t) { return gelu(t); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, GeluApprox::tanh); }},
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"tanh", [](const Tensor& t) { return tanh(t); }},
      {"gelu_dropout", [&](const Tensor& t) { return gelu_dropout(t, 0.25f, true, gen); }},
      {"dropout", [&](const Tensor& t) { return dropout(t, 0.25f, true, gen); }},
      {"masked_fill", [&](const Tensor& t) { return masked_fill(t, masked, 0.f); }},
  };
  for (const auto& [name, op] : ops) {
    DYNAMIC_SECTION(name) {
      Tensor x(Array{0.5f, -1.f, 2.f, 0.25f}, true);
      Tensor h = op(x);
      h.retain_grad();
      Array seen;
      h.register_hook([&](Array& g) { seen = g; });
      // L = sum(h * c): the gradient arriving at h is c
      const Array c{1.f, -2.f, 3.f, 0.5f};
      sum(h * Tensor(c)).backward();
      require_close(h.grad(), c);
      require_close(seen, c);
      REQUIRE(x.has_grad());
    }
  }
}

TEST_CASE("a hook that scales the gradient in place changes the leaf gradient, remove_hook stops it", "[tape][hooks]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  Tensor h = x * x;
  const int id = h.register_hook([](Array& g) { g *= 10.f; });
  sum(h * h).backward(/*retain_graph=*/true);
  require_close(x.grad(), Array{40.f, 320.f, 1080.f}, 1e-3f);

  x.zero_grad();
  h.remove_hook(id);
  sum(h * h).backward();  // h's part of the graph was retained above
  require_close(x.grad(), Array{4.f, 32.f, 108.f});
  REQUIRE_THROWS_AS(h.remove_hook(id), Error);  // already removed
}

TEST_CASE("hooks on a leaf run before its gradient is accumulated", "[tape][hooks]") {
  Tensor x(Array{1.f, 2.f}, true);
  std::weak_ptr<Node> node = x.node();  // not a Tensor copy: the hook must not own its tensor
  std::vector<Array> seen;
  std::vector<bool> had_grad;
  x.register_hook([&](Array& g) {
    seen.push_back(g);
    had_grad.push_back(node.lock()->has_grad);
    g *= 2.f;
  });
  // L = sum(3x): dL/dx = 3 per pass; the hook doubles it before accumulation
  sum(x * 3.f).backward();
  sum(x * 3.f).backward();
  REQUIRE(seen.size() == 2);
  // each call sees this pass's gradient, not the accumulated one
  require_close(seen[0], Array{3.f, 3.f});
  require_close(seen[1], Array{3.f, 3.f});
  REQUIRE(had_grad == std::vector<bool>{false, true});
  require_close(x.grad(), Array{12.f, 12.f});
}

TEST_CASE("a hook that changes the gradient's shape raises an error and the engine recovers", "[tape][hooks]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  Tensor h = (x * 2.f).set_name("h");
  h.register_hook([](Array& g) { g = xt::zeros<float>({5}); });
  Tensor loss = sum(h * h);
  REQUIRE_THROWS_AS(loss.backward(), Error);
  REQUIRE_FALSE(x.has_grad());
  // a fresh graph from the same leaf still backpropagates correctly
  sum(x * x).backward();
  require_close(x.grad(), Array{2.f, 4.f, 6.f});

  Tensor y = x * 2.f;
  y.register_hook([](Array& g) { g = xt::zeros<float>({3, 1}); });
  REQUIRE_THROWS_WITH(sum(y).backward(),
                      Catch::Contains("hook") && Catch::Contains("(3)") && Catch::Contains("(3, 1)"));
}

TEST_CASE("a tensor used twice accumulates the gradient of both paths", "[tape]") {
  Tensor x(Array{-1.f, 0.5f, 2.f}, true);
  // y = x*x + x: dy/dx = 2x + 1
  sum(x * x + x).backward();
  require_close(x.grad(), Array{-1.f, 2.f, 5.f});
}

TEST_CASE("diamond graph: two branches from one intermediate meet again", "[tape]") {
  Tensor x(Array{1.f, -2.f}, true);
  // h = 2x; a = h^2; b = 3h; L = sum(a + b): dL/dh = 2h + 3, dL/dx = 2 (2h + 3) = 8x + 6
  Tensor h = x * 2.f;
  h.retain_grad();
  Tensor a = h * h;
  Tensor b = h * 3.f;
  sum(a + b).backward();
  require_close(h.grad(), Array{7.f, -5.f});
  require_close(x.grad(), Array{14.f, -10.f});
}

TEST_CASE("requires_grad propagates, ops on tensors without it are not recorded", "[tape]") {
  Tensor c(Array{1.f, 2.f});        // a constant
  Tensor w(Array{3.f, 4.f}, true);  // a parameter
  const std::size_t before = tape_size();

  Tensor constant_only = exp(c * c) + c;
  REQUIRE_FALSE(constant_only.requires_grad());
  REQUIRE(constant_only.is_leaf());
  REQUIRE(tape_size() == before);

  Tensor mixed = c * w;
  REQUIRE(mixed.requires_grad());
  REQUIRE_FALSE(mixed.is_leaf());
  REQUIRE(tape_size() == before + 1);
  Tensor further = tanh(mixed) + constant_only;  // requires grad through `mixed`
  REQUIRE(further.requires_grad());

  sum(mixed).backward();
  require_close(w.grad(), Array{1.f, 2.f});
  REQUIRE_FALSE(c.has_grad());
}

TEST_CASE("the tape prunes entries whose outputs died without a backward", "[tape][memory]") {
  Tensor x(Array{1.f, 2.f, 3.f}, true);
  // a live graph recorded before the loop: h's handle dies but `keep` still needs it
  Tensor keep;
  {
    Tensor h = x * 3.f;
    keep = h * h;
  }
  const std::size_t before = tape_size();
  std::size_t peak = before;
  for (int i = 0; i < 20000; ++i) {
    Tensor t = exp(x * 0.5f);  // two entries per iteration, dropped at once
    peak = std::max(peak, tape_size());
  }
  // 40000 entries were recorded; an unpruned tape would hold all of them
  REQUIRE(peak - before < 10000);
  REQUIRE(tape_size() - before < 10000);

  // the live graph survived the pruning: L = sum((3x)^2), dL/dx = 18x
  sum(keep).backward();
  require_close(x.grad(), Array{18.f, 36.f, 54.f});
  REQUIRE(drain_tape(x));  // leave the tape nearly empty for the tests that follow
}

namespace {

// twice(h) = 2 h, whose backward reads nothing of h; `reads` is what it declares to the tape.
Tensor twice(const Tensor& h, BackwardReads reads, bool reads_input_anyway = false) {
  return record("twice", Array(h.value() * 2.f), {h}, reads, [reads_input_anyway](GradContext& ctx) {
    if (reads_input_anyway) (void)ctx.input(0);
    ctx.accumulate(0, Array(ctx.grad_out() * 2.f));
  });
}

// Whether input i of the op that made `out` had its value freed.
bool input_freed(const Tensor& out, std::size_t i) {
  return out.node()->creator.lock()->inputs.at(i).node->storage->freed;
}

}  // namespace

TEST_CASE("a value no backward reads is freed with its last handle, its shape and gradient path intact",
          "[tape][memory]") {
  Tensor x(Array{1.f, -2.f, 3.f}, true);
  Tensor y, kept;
  Array expected = {4.f, 4.f, 4.f};  // d(2 (x + x))/dx
  SECTION("freed: the op that made it and the op that reads it both declared they do not read it") {
    {
      const Tensor h = x + x;  // add's backward reads neither its inputs nor its output
      y = twice(h, BackwardReads{false, 1u});
      CHECK_FALSE(input_freed(y, 0));  // h's handle is still here
    }
    CHECK(input_freed(y, 0));
    CHECK(y.node()->creator.lock()->inputs[0].node->shape() == Shape{3});
  }
  SECTION("kept: another handle holds it") {
    {
      const Tensor h = x + x;
      y = twice(h, BackwardReads{false, 1u});
      kept = h;
    }
    CHECK_FALSE(input_freed(y, 0));
  }
  SECTION("kept: a detach()ed handle shares its storage") {
    {
      const Tensor h = x + x;
      y = twice(h, BackwardReads{false, 1u});
      kept = h.detach();
    }
    CHECK_FALSE(input_freed(y, 0));
    CHECK(kept.value() == Array{2.f, -4.f, 6.f});
  }
  SECTION("kept: the reading op did not declare") {
    {
      const Tensor h = x + x;
      y = twice(h, BackwardReads{});
    }
    CHECK_FALSE(input_freed(y, 0));
  }
  SECTION("kept: the op that made it reads its output") {
    {
      const Tensor h = exp(x);  // exp's backward reads its output
      y = twice(h, BackwardReads{false, 1u});
      expected = 2.f * h.value();  // d(2 e^x)/dx = 2 e^x
    }
    CHECK_FALSE(input_freed(y, 0));
  }
  // the gradient reaches x through h's node whether or not h's value was freed
  sum(y).backward();
  CHECK(x.grad() == expected);
  REQUIRE(drain_tape(x));
}

TEST_CASE("a backward that reads a value its op declared unread is an Error naming the freed tensor",
          "[tape][memory][bad_input]") {
  Tensor x(Array{1.f, 2.f}, true);
  Tensor y;
  {
    Tensor h = x + x;
    h.set_name("h");
    y = twice(h, BackwardReads{false, 1u}, true);
  }
  REQUIRE(input_freed(y, 0));
  REQUIRE_THROWS_WITH(sum(y).backward(), Catch::Contains("'h' (shape (2)) was freed when its last handle went"));
  REQUIRE(drain_tape(x));
}

TEST_CASE("each op's BackwardReads holds: a value it declares unread is freed, and backward is bit for bit the same",
          "[tape][memory][gemm]") {
  // h = x + x feeds the op, whose output z feeds twice() (which reads nothing of z). With no
  // handle left, z is freed when the op declares its output unread and h when it declares its
  // input unread; a backward that read a freed value would be an Error, and every gradient must
  // equal the one of a run that keeps both.
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    bool output_freed, input_freed;
    Precision precision = Precision::fp32;
  };
  const auto leaf = [](const Shape& shape, std::uint64_t seed, float lo = -1.f, float hi = 1.f) {
    Generator g(seed);
    return Tensor(g.uniform(shape, lo, hi), true);
  };
  const std::vector<Case> cases =
      {
          {"h + 1", [](const Tensor& h) { return h + 1.f; }, true, true},
          {"h * 3", [](const Tensor& h) { return h * 3.f; }, true, true},
          {"neg", [](const Tensor& h) { return neg(h); }, true, true},
          {"log", [](const Tensor& h) { return log(h); }, true, false},
          {"pow", [](const Tensor& h) { return pow(h, 3.f); }, true, false},
          {"relu", [](const Tensor& h) { return relu(h - 1.f); }, true, false},
          {"gelu", [](const Tensor& h) { return gelu(h); }, true, false},
          {"gelu tanh", [](const Tensor& h) { return gelu(h, GeluApprox::tanh); }, true, false},
          {"exp", [](const Tensor& h) { return exp(h); }, false, true},
          {"sqrt", [](const Tensor& h) { return sqrt(h); }, false, true},
          {"tanh", [](const Tensor& h) { return tanh(h); }, false, true},
          {"sigmoid", [](const Tensor& h) { return sigmoid(h); }, false, true},
          {"add", [](const Tensor& h) { return h + h; }, true, true},
          {"sub", [](const Tensor& h) { return h - h * 0.5f; }, true, true},
          {"mul", [](const Tensor& h) { return h * h; }, false, false},
          {"layer_norm", [&](const Tensor& h) { return layer_norm(h, leaf({8}, 3), leaf({8}, 4)); }, true, false},
          {"rms_norm", [&](const Tensor& h) { return rms_norm(h, leaf({8}, 3)); }, true, false},
          {"dropout",
           [](const Tensor& h) {
    Generator g(5);
    return dropout(h, 0.5f, true, g);
           },
           true, true},
          {"gelu_dropout",
           [](const Tensor& h) {
    Generator g(5);
    return gelu_dropout(h, 0.5f, true, g);
           },
           true, false},
                          {"gated_unit", [](const Tensor& h) { return gated_unit(h, h * 0.5f, GatedActivation::silu); },
                           true, false},
                          {"linear",
                           [&](const Tensor& h) {
    return linear(h, leaf({6, 8}, 6));
                           },
                           true, false},
      {"linear in bf16",
       [&](const Tensor& h) {
    return linear(h, leaf({6, 8}, 6));
       },
       true, true, Precision::bf16},
      {"attend",
       [&](const Tensor& h) {
    return attend(leaf({2, 2, 4, 4}, 7, 0.f, 1.f), h, 2);
       },
       true, false},
      {"linear_cross_entropy",
       [&](const Tensor& h) {
    return linear_cross_entropy(h, leaf({5, 8}, 8), Tensor(), IndexArray{{0, 1, 2, 3}, {4, 3, 2, 1}});
       },
       true, true},
      };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto run = [&](bool keep, bool& output_freed, bool& input_freed) {
      Tensor x = leaf({2, 4, 8}, 1, 0.5f, 1.5f);  // positive, for log and sqrt
      AutocastGuard guard(c.precision);
      Tensor y, kept_h, kept_z;
      {
        const Tensor h = x + x;
        const Tensor z = c.op(h);
        y = twice(z, BackwardReads{false, 1u});
        if (keep) {
          kept_h = h;
          kept_z = z;
        }
      }
      const Node& z = *y.node()->creator.lock()->inputs[0].node;
      output_freed = z.storage->freed;
      input_freed = z.creator.lock()->inputs[0].node->storage->freed;
      sum(y).backward();
      return x.grad();
    };
    bool output_freed = false, input_freed = false, kept_output = true, kept_input = true;
    const Array freed = run(false, output_freed, input_freed);
    const Array kept = run(true, kept_output, kept_input);
    CHECK(output_freed == c.output_freed);
    CHECK(input_freed == c.input_freed);
    CHECK_FALSE(kept_output);
    CHECK_FALSE(kept_input);
    CHECK(freed == kept);
  }
}

TEST_CASE("set_requires_grad works on leaves and throws on computed tensors", "[tensor]") {
  Tensor x(Array{1.f, 2.f});
  REQUIRE_FALSE(x.requires_grad());
  x.set_requires_grad(true);
  REQUIRE(x.requires_grad());
  Tensor y = x * 2.f;
  REQUIRE_THROWS_AS(y.set_requires_grad(false), Error);
  REQUIRE_THROWS_AS(y.set_requires_grad(true), Error);
  REQUIRE(y.requires_grad());  // unchanged by the failed call
  x.set_requires_grad(false);
  REQUIRE_FALSE(x.requires_grad());
}

TEST_CASE("item() returns the only element and throws for other sizes", "[tensor]") {
  REQUIRE(Tensor::scalar(2.5f).item() == 2.5f);
  REQUIRE(Tensor::full({1, 1}, -4.f).item() == -4.f);
  REQUIRE_THROWS_AS(Tensor(Array{1.f, 2.f}).item(), Error);
  REQUIRE_THROWS_AS(Tensor::zeros({0}).item(), Error);
}

TEST_CASE("Tensor::zeros/ones/full/scalar have the requested shape and values", "[tensor]") {
  Tensor z = Tensor::zeros({2, 3});
  REQUIRE(shape_str(z.shape()) == "(2, 3)");
  REQUIRE(z.size() == 6);
  for (float v : z.value()) REQUIRE(v == 0.f);
  REQUIRE_FALSE(z.requires_grad());

  Tensor o = Tensor::ones({4}, true);
  REQUIRE(shape_str(o.shape()) == "(4)");
  for (float v : o.value()) REQUIRE(v == 1.f);
  REQUIRE(o.requires_grad());
  REQUIRE(o.is_leaf());

  Tensor f = Tensor::full({2, 1, 2}, -1.5f);
  REQUIRE(shape_str(f.shape()) == "(2, 1, 2)");
  REQUIRE(f.ndim() == 3);
  REQUIRE(f.dim(-1) == 2);
  REQUIRE(f.dim(1) == 1);
  for (float v : f.value()) REQUIRE(v == -1.5f);

  Tensor s = Tensor::scalar(3.f, true);
  REQUIRE(s.ndim() == 0);
  REQUIRE(s.size() == 1);
  REQUIRE(s.item() == 3.f);
  REQUIRE(s.requires_grad());
}

TEST_CASE("operator<< prints the values, the shape and the tensor's name", "[tensor]") {
  Tensor w = Tensor::full({2}, 0.25f, true);
  w.set_name("encoder.weight");
  REQUIRE(w.name() == "encoder.weight");
  std::ostringstream os;
  os << w;
  const std::string s = os.str();
  CHECK_THAT(s, Catch::Contains("encoder.weight"));
  CHECK_THAT(s, Catch::Contains("0.25"));
  CHECK_THAT(s, Catch::Contains("(2)"));
  CHECK_THAT(s, Catch::Contains("requires_grad"));

  std::ostringstream undefined;
  undefined << Tensor();
  REQUIRE(undefined.str() == "Tensor(undefined)");
}

TEST_CASE("a leaf with hooks gets its gradient as soon as it is final, before the sweep ends", "[tape]") {
  Tensor w0(Array{1.f, 2.f}, true), w1(Array{3.f, 4.f}, true);
  std::vector<std::string> order;
  Tensor h = w0 * 2.f;  // early in forward: its gradient arrives late in backward
  h.register_hook([&](Array&) { order.push_back("h"); });
  w1.register_hook([&](Array&) { order.push_back("w1"); });
  w0.register_hook([&](Array&) { order.push_back("w0"); });
  sum(h * w1).backward();
  // w1 is read only by the last op, so its gradient is final first; w0 only after h's.
  REQUIRE(order == std::vector<std::string>{"w1", "h", "w0"});
  REQUIRE(w1.grad() == Array{2.f, 4.f});
  REQUIRE(w0.grad() == Array{6.f, 8.f});
}

TEST_CASE("queue_backward_callback runs once at the end of the pass, after every gradient", "[tape][bad_input]") {
  REQUIRE_THROWS_WITH(queue_backward_callback([] {}),
                      Catch::Contains("queue_backward_callback: no backward pass is running"));
  Tensor a(Array{1.f, 2.f}, true), b(Array{3.f}, true);
  int calls = 0;
  bool b_ready = false;
  a.register_hook([&](Array&) {
    REQUIRE_THROWS_WITH(queue_backward_callback(nullptr), Catch::Contains("empty callback"));
    queue_backward_callback([&] {
      ++calls;
      b_ready = b.has_grad();  // b has no hook: delivered at the end, before the callbacks
    });
  });
  sum(a * b).backward();
  REQUIRE(calls == 1);
  REQUIRE(b_ready);
  sum(a).backward();
  REQUIRE(calls == 2);
}

TEST_CASE("set_grad hands a gradient to a leaf, checking the shape", "[tape][bad_input]") {
  Tensor w(Array{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}}, true);
  REQUIRE_THROWS_WITH(w.set_grad(Array{1.f, 2.f, 3.f}),
                      "Tensor::set_grad: gradient of shape (3) for a tensor of shape (2, 3)");
  w.set_grad(xt::ones<float>({2, 3}));
  REQUIRE(w.grad() == Array(xt::ones<float>({2, 3})));
  Tensor c(Array{1.f});
  REQUIRE_THROWS_WITH(c.set_grad(Array{1.f}), Catch::Contains("does not require grad"));
  const Tensor y = w * 2.f;
  REQUIRE_THROWS_WITH(Tensor(y).set_grad(xt::ones<float>({2, 3})),
                      Catch::Contains("only a leaf or a retain_grad() tensor"));
}
