// linear_activation (core/autograd/ops_fused.cpp): values and gradients against the unfused
// act(linear()) on both GEMM engines, with and without bias, 2-D and 3-D inputs; gradchecks; the
// GELU's two backward choices against each other; bad input; FeedForward with and without a hook
// on its pre-activation point.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "random_tensors.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/core/autograd/detail/linear_activation.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"

using namespace xgrad;

namespace {

using Ins = std::vector<Tensor>;

using testing::randn;

Tensor unfused(const Tensor& x, const Tensor& w, const Tensor& b, LinearActivation a) {
  const Tensor z = linear(x, w, b);
  return a == LinearActivation::relu ? relu(z) : a == LinearActivation::gelu ? gelu(z) : gelu(z, GeluApprox::tanh);
}

const char* name_of(LinearActivation a) {
  return a == LinearActivation::relu ? "relu" : a == LinearActivation::gelu ? "gelu" : "gelu_tanh";
}

// max |a - b| <= tol * (1 + max |b|): products of this size round to a few ulps of their largest terms.
void require_close(const Array& a, const Array& b, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a.data()[i] - b.data()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.data()[i])));
  }
  INFO("max |difference| " << worst << ", max |reference| " << scale);
  REQUIRE(worst <= tol * (1 + scale));
}

// Restores the GEMM engine choice when it leaves scope.
struct EngineScope {
  blas::Engine saved = blas::engine();
  ~EngineScope() { blas::set_engine(saved); }
};

std::vector<blas::Engine> engines() {
  std::vector<blas::Engine> e = {blas::Engine::openblas, blas::Engine::automatic};
  if (blas::has_engine(blas::Engine::onednn)) e.push_back(blas::Engine::onednn);
  return e;
}

struct Case {
  Shape x;
  std::size_t out;
};

}  // namespace

TEST_CASE(
    "linear_activation agrees with act(linear()) forward and backward: each activation, bias or none, 2-D "
    "and 3-D, every engine",
    "[fused][gemm]") {
  const EngineScope restore;
  // 3 x 5 -> 4 is below oneDNN's size; 4 x 8 x 32 -> 48 above it; 256 x 128 -> 96 is split into
  // row ranges across the kernel threads
  const std::vector<Case> cases = {{{3, 5}, 4}, {{4, 8, 32}, 48}, {{256, 128}, 96}, {{2, 3, 40, 16}, 24}};
  for (const blas::Engine e : engines()) {
    blas::set_engine(e);
    for (const Case& c : cases) {
      for (const LinearActivation a : {LinearActivation::relu, LinearActivation::gelu, LinearActivation::gelu_tanh}) {
        for (const bool with_bias : {true, false}) {
          const std::string what = blas::engine_name(e) + " " + shape_str(c.x) + " -> " + std::to_string(c.out) + " " +
                                   name_of(a) + (with_bias ? " with bias" : " without bias");
          const std::size_t in = c.x.back();
          const Tensor x1 = randn(c.x, 1), w1 = randn({c.out, in}, 2, 1.f / std::sqrt(float(in)));
          const Tensor b1 = with_bias ? randn({c.out}, 3, 0.5f) : Tensor();
          const Tensor x2 = randn(c.x, 1), w2 = randn({c.out, in}, 2, 1.f / std::sqrt(float(in)));
          const Tensor b2 = with_bias ? randn({c.out}, 3, 0.5f) : Tensor();
          Shape ys = c.x;
          ys.back() = c.out;
          Generator g(4);
          const Array seed = g.normal(ys, 0.f, 1.f);
          const Tensor fused = linear_activation(x1, w1, b1, a), plain = unfused(x2, w2, b2, a);
          require_close(fused.value(), plain.value(), 2e-6, what + ": y");
          fused.backward(seed);
          plain.backward(seed);
          require_close(x1.grad(), x2.grad(), 2e-6, what + ": dx");
          require_close(w1.grad(), w2.grad(), 2e-6, what + ": dW");
          if (with_bias) require_close(b1.grad(), b2.grad(), 2e-6, what + ": db");
          // without grad mode the GELUs take their one-product path (the activation fused too)
          const NoGradGuard off;
          require_close(linear_activation(x1, w1, b1, a).value(), plain.value(), 2e-6, what + ": y, no grad");
        }
      }
    }
  }
}

TEST_CASE("linear_activation gradchecks: each activation, bias or none, 2-D and 3-D", "[fused][gradcheck][gemm]") {
  for (const LinearActivation a : {LinearActivation::relu, LinearActivation::gelu, LinearActivation::gelu_tanh}) {
    INFO(name_of(a));
    GradcheckOptions opt;
    // ReLU: z within eps of 0 is a kink, skipped (the rest compared), as test_ops_gradcheck.cpp does
    opt.skip_kinks = a == LinearActivation::relu;
    REQUIRE_GRADCHECK([a](const Ins& in) { return linear_activation(in[0], in[1], in[2], a); },
                      {randn({4, 5}, 11), randn({3, 5}, 12, 0.5f), randn({3}, 13, 0.5f)}, opt);
    REQUIRE_GRADCHECK([a](const Ins& in) { return linear_activation(in[0], in[1], Tensor(), a); },
                      {randn({2, 3, 4}, 14), randn({6, 4}, 15, 0.5f)}, opt);
  }
}

TEST_CASE("linear_activation: GELU's backward from kept z and from z computed again agree", "[fused][gemm]") {
  for (const LinearActivation a : {LinearActivation::gelu, LinearActivation::gelu_tanh}) {
    INFO(name_of(a));
    const Tensor x1 = randn({64, 32}, 21), w1 = randn({40, 32}, 22, 0.2f), b1 = randn({40}, 23);
    const Tensor x2 = randn({64, 32}, 21), w2 = randn({40, 32}, 22, 0.2f), b2 = randn({40}, 23);
    const Tensor kept = detail::linear_activation(x1, w1, b1, a, detail::GeluKeeps::pre_activation);
    const Tensor again = detail::linear_activation(x2, w2, b2, a, detail::GeluKeeps::recompute);
    require_close(kept.value(), again.value(), 2e-6, "y");
    sum(kept).backward();
    sum(again).backward();
    require_close(x1.grad(), x2.grad(), 2e-6, "dx");
    require_close(w1.grad(), w2.grad(), 2e-6, "dW");
    require_close(b1.grad(), b2.grad(), 2e-6, "db");
  }
}

TEST_CASE("linear_activation: ReLU's gradient is 0 at z = 0, as relu's", "[fused][gemm]") {
  // x W^T + b = 0 exactly in column 0 (weights and bias 0 there)
  const Tensor x(Array{{1.f, 2.f}, {-1.f, 3.f}}, true);
  const Tensor w(Array{{0.f, 0.f}, {1.f, 1.f}}, true), b(Array{0.f, 0.5f}, true);
  const Tensor y = linear_activation(x, w, b, LinearActivation::relu);
  REQUIRE(y.value() == Array{{0.f, 3.5f}, {0.f, 2.5f}});
  sum(y).backward();
  REQUIRE(b.grad() == Array{0.f, 2.f});
  REQUIRE(x.grad() == Array{{1.f, 1.f}, {1.f, 1.f}});
}

TEST_CASE("linear_activation: NaN in x gives the unfused ops' NaN (GELU) or 0 (ReLU, as relu) on every engine",
          "[fused][bad_input][gemm]") {
  const EngineScope restore;
  for (const blas::Engine e : engines()) {
    blas::set_engine(e);
    Generator g(7);
    Array xa = g.normal({64, 32}, 0.f, 1.f);
    xa(3, 5) = std::nanf("");
    const Tensor x(xa), w(g.normal({48, 32}, 0.f, 0.2f)), b(g.normal({48}, 0.f, 1.f));
    for (const LinearActivation a : {LinearActivation::relu, LinearActivation::gelu, LinearActivation::gelu_tanh}) {
      INFO(blas::engine_name(e) << " " << name_of(a));
      const Array f = linear_activation(x, w, b, a).value(), u = unfused(x, w, b, a).value();
      for (std::size_t i = 0; i < f.size(); ++i) REQUIRE(std::isnan(f.data()[i]) == std::isnan(u.data()[i]));
      // row 3 is all NaN before the activation
      REQUIRE(std::isnan(f(3, 0)) == (a != LinearActivation::relu));
    }
  }
}

TEST_CASE("linear_activation with in_features 0 gives act(bias), and with no rows an empty result", "[fused][gemm]") {
  const Tensor x(Array::from_shape({2, 0}), true), w(Array::from_shape({3, 0}), true);
  const Tensor b(Array{-1.f, 2.f, 3.f}, true);
  const Tensor y = linear_activation(x, w, b, LinearActivation::relu);
  REQUIRE(y.value() == Array{{0.f, 2.f, 3.f}, {0.f, 2.f, 3.f}});
  sum(y).backward();
  REQUIRE(b.grad() == Array{0.f, 2.f, 2.f});
  const Tensor none(Array::from_shape({0, 2}), true), w2 = Tensor::ones({3, 2}, true), b2 = Tensor::ones({3}, true);
  const Tensor e = linear_activation(none, w2, b2, LinearActivation::gelu);
  REQUIRE(e.shape() == Shape{0, 3});
  sum(e).backward();
  REQUIRE(w2.grad() == xt::zeros<float>({3, 2}));
  REQUIRE(b2.grad() == xt::zeros<float>({3}));
}

TEST_CASE("linear_activation names the function and the shapes it cannot combine", "[fused][bad_input]") {
  const Tensor x = Tensor::ones({2, 3}), w = Tensor::ones({4, 3}), b = Tensor::ones({4});
  const auto r = LinearActivation::relu;
  CHECK_THROWS_WITH(linear_activation(x, Tensor::ones({4, 3, 1}), b, r),
                    Catch::Contains("linear_activation: weight must be (out, in), got (4, 3, 1)"));
  CHECK_THROWS_WITH(
      linear_activation(Tensor::ones({2, 5}), w, b, r),
      Catch::Contains("linear_activation: input of shape (2, 5) does not end in the weight's in_features 3"));
  CHECK_THROWS_WITH(linear_activation(Tensor::ones(Shape{}), w, b, r),
                    Catch::Contains("linear_activation: input of shape () does not end"));
  CHECK_THROWS_WITH(linear_activation(x, w, Tensor::ones({3}), r),
                    Catch::Contains("linear_activation: bias of shape (3) is not (out,) = (4,)"));
  CHECK_THROWS_WITH(linear_activation(Tensor(), w, b, r),
                    Catch::Contains("linear_activation: input is an undefined tensor"));
  CHECK_THROWS_WITH(linear_activation(x, w, b, static_cast<LinearActivation>(7)),
                    Catch::Contains("linear_activation: unknown activation 7"));
}

TEST_CASE("linear_activation: writing the saved output or input in place before backward is an Error naming the op",
          "[fused][bad_input][gemm]") {
  SECTION("ReLU keeps its output") {
    const Tensor x = randn({3, 4}, 31), w = randn({5, 4}, 32), b = randn({5}, 33);
    const Tensor y = linear_activation(x, w, b, LinearActivation::relu);
    y.detach().mutable_value()(0, 0) = 1.f;
    REQUIRE_THROWS_WITH(sum(y).backward(), Catch::Contains("linear_relu"));
  }
  SECTION("the GELU keeps the weight") {
    const Tensor x = randn({3, 4}, 31), w = randn({5, 4}, 32), b = randn({5}, 33);
    const Tensor y = linear_activation(x, w, b, LinearActivation::gelu);
    w.detach().mutable_value()(0, 0) = 1.f;
    REQUIRE_THROWS_WITH(sum(y).backward(), Catch::Contains("linear_gelu"));
  }
}

TEST_CASE("FeedForward gives the same values and gradients with and without a hook on its pre-activation point",
          "[fused][hooks][gemm]") {
  for (const nn::Activation act : {nn::Activation::relu, nn::Activation::gelu, nn::Activation::gelu_tanh}) {
    INFO("activation " << static_cast<int>(act));
    Generator g1(5), g2(5);
    nn::FeedForward plain(nn::FeedForwardOptions(16, 48).activation(act).dropout(0.1f), g1);
    nn::FeedForward hooked(nn::FeedForwardOptions(16, 48).activation(act).dropout(0.1f), g2);
    Tensor seen;
    const nn::HookHandle h = hooked.add_forward_hook("pre", [&](const Tensor& t) {
      seen = t;
      return Tensor();
    });
    const Tensor x1 = randn({2, 7, 16}, 41), x2 = randn({2, 7, 16}, 41);
    const Tensor y1 = plain.forward(x1), y2 = hooked.forward(x2);
    // the hook saw linear1's output, the pre-activation
    REQUIRE(seen.defined());
    require_close(seen.value(), linear(x2, hooked.linear1->weight, hooked.linear1->bias).value(), 2e-6, "pre");
    require_close(y1.value(), y2.value(), 2e-6, "y");
    sum(y1).backward();
    sum(y2).backward();
    require_close(x1.grad(), x2.grad(), 2e-6, "dx");
    require_close(plain.linear1->weight.grad(), hooked.linear1->weight.grad(), 2e-6, "linear1.weight");
    require_close(plain.linear1->bias.grad(), hooked.linear1->bias.grad(), 2e-6, "linear1.bias");
    // evaluation without grad mode (where the tanh GELU is fused too)
    plain.eval();
    hooked.eval();
    const NoGradGuard off;
    require_close(plain.forward(x1).value(), hooked.forward(x2).value(), 2e-6, "y in evaluation");
  }
}

TEST_CASE("a ReLU TransformerBlock gives the same output with a hook on ffn.pre, attached by its full name",
          "[fused][hooks][gemm]") {
  // the hook attached from the block, by the point's full name
  Generator g(6);
  nn::TransformerBlock block(nn::TransformerBlockOptions(16, 2).activation(nn::Activation::relu).dropout(0.f), g);
  const Tensor x = randn({2, 5, 16}, 51);
  const Array free_y = block.forward(x).output.value();
  int calls = 0;
  const nn::HookHandle h = block.add_forward_hook("ffn.pre", [&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  const Array hooked_y = block.forward(x).output.value();
  REQUIRE(calls == 1);
  require_close(free_y, hooked_y, 2e-6, "block output");
}
