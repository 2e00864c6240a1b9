// Gradient checks of every nn layer: the gradient of the input AND of every named parameter
// against central finite differences, through the public gradcheck with the module's named
// parameters (check_module_grads).
// Module semantics, shapes and forward formulas are tested in test_nn_modules.cpp.
//
// Shapes: B batch, T query length, S key length, C d_model, H heads, V vocabulary, F FFN width.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "module_gradcheck.hpp"
#include "small_models.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;

namespace {

using namespace testing;

using ForwardFn = std::function<Tensor(const Ins&)>;

// ---------------------------------------------------------------------------------------------
// Helpers (check_module_grads, randn and randomize_norms: module_gradcheck.hpp)

using CheckOptions = GradcheckOptions;
using CheckResult = GradcheckResult;

bool all_finite(const Array& a) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a.data()[i])) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Inputs and parameter values

std::size_t total_elements(const nn::Module& m, const Ins& inputs) {
  std::size_t n = m.num_parameters();
  for (const Tensor& t : inputs) n += t.defined() && t.requires_grad() ? t.size() : 0;
  return n;
}

// A module with one parameter "w" that multiplies its input.
struct Scale : nn::Module {
  explicit Scale(const Shape& shape) { w = register_parameter("w", randn(shape, 5)); }
  Tensor forward(const Tensor& x) const { return x * w; }
  Tensor w;
};

// out = inner(x) + bias: parameters "bias" and "inner.w".
struct Outer : nn::Module {
  Outer() {
    bias = register_parameter("bias", randn({3}, 6));
    inner = register_module("inner", std::make_shared<Scale>(Shape{3}));
  }
  Tensor forward(const Tensor& x) const { return inner->forward(x) + bias; }
  Tensor bias;
  std::shared_ptr<Scale> inner;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The helper itself: it must be able to fail, and say where

TEST_CASE("check_module_grads passes a correct module and checks every parameter and input",
          "[nn][gradcheck][checker]") {
  Outer m;
  const Tensor x = randn({2, 3}, 7);
  const CheckResult res = check_module_grads(m, [&](const Ins& in) { return m.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 3);
  REQUIRE(res.checked == 3 + 3 + 6);
  REQUIRE(res.report.find("agree") != std::string::npos);
}

TEST_CASE("check_module_grads catches a 1% error in one parameter element and names it by its dotted path",
          "[nn][gradcheck][checker]") {
  Outer m;
  const Tensor x = randn({2, 3}, 7, 10.f);  // large inputs: a large gradient of w, so 1% of it is well above atol
  // d<x * w + b, r>/dw_j = sum_i x_ij r_ij: make element 1 of inner.w's gradient 1% wrong
  const int id = m.inner->w.register_hook([](Array& g) { g.data()[1] *= 1.01f; });
  const CheckResult res = check_module_grads(m, [&](const Ins& in) { return m.forward(in[0]); }, {x});
  m.inner->w.remove_hook(id);
  INFO(res.report);
  REQUIRE_FALSE(res.ok);
  REQUIRE_THAT(res.report, Contains("parameter 'inner.w' element (1)"));
  // the parameters are restored exactly and the module's gradients cleared
  REQUIRE(m.inner->w.value() == randn({3}, 5).value());
  REQUIRE_FALSE(m.inner->w.has_grad());
}

TEST_CASE("check_module_grads catches a wrong input gradient and a NaN gradient", "[nn][gradcheck][checker]") {
  Outer m;
  const Tensor x = randn({2, 3}, 7);
  SECTION("input") {
    const CheckResult res = check_module_grads(
        m,
        [&](const Ins& in) {
      if (grad_enabled()) {
        Tensor leaf = in[0];
        leaf.register_hook([](Array& g) { g.data()[4] += 0.01f; });
      }
      return m.forward(in[0]);
        },
        {x});
    INFO(res.report);
    REQUIRE_FALSE(res.ok);
    REQUIRE_THAT(res.report, Contains("input 0 element (1, 1)"));
  }
  SECTION("NaN") {
    const int id = m.bias.register_hook([](Array& g) { g.data()[2] = std::nanf(""); });
    const CheckResult res = check_module_grads(m, [&](const Ins& in) { return m.forward(in[0]); }, {x});
    m.bias.remove_hook(id);
    INFO(res.report);
    REQUIRE_FALSE(res.ok);
    REQUIRE_THAT(res.report, Contains("parameter 'bias' is not finite"));
  }
}

// ---------------------------------------------------------------------------------------------
// Linear

TEST_CASE("Linear gradients with bias, 2-D input", "[nn][gradcheck][linear][gemm]") {
  Generator gen(1);
  nn::Linear lin(4, 5, true, gen);
  const Tensor x = randn({3, 4}, 2);
  const CheckResult res = check_module_grads(lin, [&](const Ins& in) { return lin.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 3);
  REQUIRE(res.checked == total_elements(lin, {x}));
  // the library's gradcheck agrees on the input gradient
  const GradcheckResult g = gradcheck([&](const Ins& in) { return lin.forward(in[0]); }, {x});
  INFO(g.report);
  REQUIRE(g.ok);
}

TEST_CASE("Linear gradients without bias, 3-D input", "[nn][gradcheck][linear][gemm]") {
  Generator gen(3);
  nn::Linear lin(4, 3, false, gen);
  REQUIRE(lin.named_parameters().size() == 1);
  const Tensor x = randn({2, 3, 4}, 4);
  const CheckResult res = check_module_grads(lin, [&](const Ins& in) { return lin.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 2);
  REQUIRE(res.checked == total_elements(lin, {x}));
}

TEST_CASE("Linear gradients with bias, 3-D input", "[nn][gradcheck][linear][gemm]") {
  Generator gen(5);
  nn::Linear lin(3, 2, true, gen);
  const Tensor x = randn({2, 4, 3}, 6);
  REQUIRE_GRADS_OK(check_module_grads(lin, [&](const Ins& in) { return lin.forward(in[0]); }, {x}));
}

TEST_CASE("Linear gradients with a 1-D input", "[nn][gradcheck][linear][gemm]") {
  Generator gen(7);
  for (bool bias : {true, false}) {
    INFO("bias " << bias);
    nn::Linear lin(4, 3, bias, gen);
    const Tensor x = randn({4}, 8);
    REQUIRE(lin.forward(x).shape() == Shape{3});
    const CheckResult res = check_module_grads(lin, [&](const Ins& in) { return lin.forward(in[0]); }, {x});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked == total_elements(lin, {x}));
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm, RMSNorm, Embedding, Dropout, positional encodings

TEST_CASE("LayerNorm gradients, affine", "[nn][gradcheck][layernorm]") {
  nn::LayerNorm ln(6);
  randomize_norms(ln, 9);
  const Tensor x = randn({2, 3, 6}, 10);
  const CheckResult res = check_module_grads(ln, [&](const Ins& in) { return ln.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 3);
}

TEST_CASE("LayerNorm gradients, not affine", "[nn][gradcheck][layernorm]") {
  nn::LayerNorm ln(5, 1e-5f, false);
  REQUIRE(ln.named_parameters().empty());
  const Tensor x = randn({4, 5}, 11, 2.f);
  const CheckResult res = check_module_grads(ln, [&](const Ins& in) { return ln.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == x.size());
}

TEST_CASE("RMSNorm gradients, with a weight", "[nn][gradcheck][rms_norm]") {
  nn::RMSNorm norm(6);
  REQUIRE(norm.weight.value() == Array(xt::ones<float>({6})));
  norm.weight.mutable_value() = Generator(13).uniform({6}, 0.5f, 1.5f);  // a gradient ignoring the weight shows
  const Tensor x = randn({2, 3, 6}, 14);
  const CheckResult res = check_module_grads(norm, [&](const Ins& in) { return norm.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 2);
  REQUIRE(res.checked == x.size() + 6);
}

TEST_CASE("RMSNorm gradients, without a weight", "[nn][gradcheck][rms_norm]") {
  nn::RMSNorm norm(5, 1e-5f, false);
  REQUIRE(norm.named_parameters().empty());
  const Tensor x = randn({4, 5}, 15, 2.f);
  const CheckResult res = check_module_grads(norm, [&](const Ins& in) { return norm.forward(in[0]); }, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == x.size());
}

TEST_CASE("Embedding gradient of the table, with repeated and unused ids", "[nn][gradcheck][embedding]") {
  Generator gen(12);
  nn::Embedding emb(6, 3, gen);
  IndexArray ids = {{0, 2, 2, 5}, {5, 1, 2, 0}};  // 2 three times, 3 and 4 never
  const CheckResult res = check_module_grads(emb, [&](const Ins&) { return emb.forward(ids); }, {});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == 18);
}

TEST_CASE("Dropout gradient in training with a fixed mask", "[nn][gradcheck][dropout]") {
  Generator gen(13);
  nn::Dropout drop(0.3f, gen);
  REQUIRE(drop.is_training());
  const Tensor x = randn({4, 8}, 14);
  // the same mask on every call: the generator is re-seeded before each forward
  auto fn = [&](const Ins& in) {
    gen.manual_seed(99);
    return drop.forward(in[0]);
  };
  // the mask is real: some elements dropped, the rest scaled by 1 / (1 - p)
  const Array y = fn({x}).value();
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y.data()[i] == 0.f) {
      ++dropped;
    } else {
      REQUIRE(y.data()[i] == Approx(x.value().data()[i] / 0.7f).epsilon(1e-6));
    }
  }
  REQUIRE(dropped > 0);
  REQUIRE(dropped < y.size());

  const CheckResult res = check_module_grads(drop, fn, {x});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == x.size());
  const GradcheckResult g = gradcheck(fn, {x});
  INFO(g.report);
  REQUIRE(g.ok);

  drop.eval();  // identity, gradient 1
  REQUIRE(drop.forward(x).value() == x.value());
  REQUIRE_GRADS_OK(check_module_grads(drop, [&](const Ins& in) { return drop.forward(in[0]); }, {x}));
}

TEST_CASE("LearnedPositionalEncoding gradient of the table", "[nn][gradcheck][positional]") {
  Generator gen(15);
  nn::LearnedPositionalEncoding pos(5, 3, gen);
  // rows 4 and beyond are not used: their gradient must be 0
  const CheckResult res = check_module_grads(pos, [&](const Ins&) { return pos.forward(4); }, {});
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == 15);
  const Tensor y = pos.forward(4);
  y.backward(Array(xt::ones<float>(y.shape())));
  for (std::size_t j = 0; j < 3; ++j) {
    REQUIRE(pos.weight.grad()(4, j) == 0.f);
    REQUIRE(pos.weight.grad()(0, j) == 1.f);
  }
  pos.zero_grad();
}

TEST_CASE("SinusoidalPositionalEncoding matches its formula and has no parameters", "[nn][positional]") {
  const std::size_t max_len = 9, C = 6;
  nn::SinusoidalPositionalEncoding pe(max_len, C);
  REQUIRE(pe.named_parameters().empty());
  REQUIRE(pe.num_parameters() == 0);
  const Tensor y = pe.forward(7);
  REQUIRE(y.shape() == Shape{7, C});
  REQUIRE_FALSE(y.requires_grad());
  // PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C))
  for (std::size_t t = 0; t < 7; ++t) {
    for (std::size_t i = 0; 2 * i < C; ++i) {
      const double angle = static_cast<double>(t) / std::pow(10000.0, static_cast<double>(2 * i) / C);
      INFO("t " << t << " i " << i);
      REQUIRE(y.value()(t, 2 * i) == Approx(std::sin(angle)).margin(1e-6));
      REQUIRE(y.value()(t, 2 * i + 1) == Approx(std::cos(angle)).margin(1e-6));
    }
  }
  REQUIRE(pe.forward(max_len).shape() == Shape{max_len, C});
  REQUIRE_THROWS_AS(pe.forward(max_len + 1), Error);
}

// ---------------------------------------------------------------------------------------------
// FeedForward

TEST_CASE("FeedForward gradients, exact and tanh-approximated GELU", "[nn][gradcheck][ffn][gemm]") {
  for (nn::Activation act : {nn::Activation::gelu, nn::Activation::gelu_tanh}) {
    INFO((act == nn::Activation::gelu ? "exact" : "tanh"));
    Generator gen(16);
    nn::FeedForward ffn(nn::FeedForwardOptions(4, 6).activation(act).dropout(0.f), gen);
    const Tensor x = randn({2, 3, 4}, 17);
    const CheckResult res = check_module_grads(ffn, [&](const Ins& in) { return ffn.forward(in[0]); }, {x});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.tensors == 5);
    REQUIRE(res.checked == total_elements(ffn, {x}));
  }
  // the two are different functions: the same weights give other outputs
  Generator gen(16);
  nn::FeedForward exact(nn::FeedForwardOptions(4, 6).activation(nn::Activation::gelu).dropout(0.f), gen);
  nn::FeedForward tanh(nn::FeedForwardOptions(4, 6).activation(nn::Activation::gelu_tanh).dropout(0.f), gen);
  weights::load_state_dict(tanh, weights::state_dict(exact));
  const Tensor x = randn({2, 3, 4}, 17);
  REQUIRE(xt::amax(xt::abs(exact.forward(x).value() - tanh.forward(x).value()))() > 1e-5f);
}

TEST_CASE("FeedForward gradients, ReLU", "[nn][gradcheck][ffn][gemm]") {
  Generator gen(18);
  nn::FeedForward ffn(nn::FeedForwardOptions(4, 6).activation(nn::Activation::relu).dropout(0.f), gen);
  const Tensor x = randn({2, 3, 4}, 19);
  // a perturbation can push a hidden unit across ReLU's kink: skip those elements (as
  // gradcheck's skip_kinks does), but most elements must still be compared
  CheckOptions opt;
  opt.skip_kinks = true;
  const CheckResult res = check_module_grads(
      ffn, [&](const Ins& in) { return ffn.forward(in[0]); }, {x}, opt);
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked + res.skipped == total_elements(ffn, {x}));
  REQUIRE(res.skipped * 10 < res.checked);
}

// ---------------------------------------------------------------------------------------------
// MultiHeadAttention: every norm placement with every kind of mask

namespace {

const char* norm_name(nn::Norm n) { return n == nn::Norm::pre ? "pre" : n == nn::Norm::post ? "post" : "none"; }

// B = 2, T = S = 3, C = 8, H = 2; dropout 0.
constexpr std::size_t kB = 2, kT = 3, kC = 8, kH = 2;

// Elements of the (B, H, T, S) weights that break the mask: a blocked key with non-zero weight,
// or a row with some key allowed that does not sum to 1. A fully blocked row must be all zeros.
std::size_t mask_violations(const nn::AttentionMask& m, const Array& w) {
  std::size_t bad = 0;
  const Shape& sh = w.shape();
  for (std::size_t b = 0; b < sh[0]; ++b)
    for (std::size_t h = 0; h < sh[1]; ++h)
      for (std::size_t t = 0; t < sh[2]; ++t) {
        double sum = 0;
        bool any_allowed = false;
        for (std::size_t s = 0; s < sh[3]; ++s) {
          sum += w(b, h, t, s);
          if (testing::blocked_at(m, b, h, t, s)) {
            bad += w(b, h, t, s) != 0.f;
          } else {
            any_allowed = true;
          }
        }
        if (any_allowed && std::abs(sum - 1.0) > 1e-5) ++bad;
      }
  return bad;
}

void check_attention(const nn::AttentionMask& mask, std::uint64_t seed) {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post, nn::Norm::none}) {
    INFO("norm " << norm_name(norm));
    Generator gen(seed);
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(kC, kH).dropout(0.f).norm(norm), gen);
    randomize_norms(mha, seed + 1);
    const Tensor x = randn({kB, kT, kC}, seed + 2);
    const CheckResult res =
        check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).output; }, {x});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked == total_elements(mha, {x}));
    REQUIRE(res.tensors == (norm == nn::Norm::none ? 9u : 11u));
    // the gradients agree with whatever mask was applied: check that it is the requested one
    const Array w = mha.forward(x, mask).weights.value();
    CHECK(mask_violations(mask, w) == 0);
  }
}

}  // namespace

TEST_CASE("MultiHeadAttention gradients without a mask", "[nn][gradcheck][attention][gemm]") {
  check_attention({}, 20);
}

TEST_CASE("MultiHeadAttention gradients with a causal mask", "[nn][gradcheck][attention][gemm]") {
  nn::AttentionMask mask;
  mask.causal = true;
  check_attention(mask, 21);
}

TEST_CASE("MultiHeadAttention gradients with a key padding mask", "[nn][gradcheck][attention][gemm]") {
  nn::AttentionMask mask;
  mask.key_padding_mask = Mask{{false, false, true}, {false, true, false}};  // (B, S)
  check_attention(mask, 22);
  mask.causal = true;
  check_attention(mask, 23);
}

TEST_CASE("MultiHeadAttention gradients with an attn_mask", "[nn][gradcheck][attention][gemm]") {
  nn::AttentionMask mask;
  mask.attn_mask = Mask{{false, true, false}, {false, false, true}, {true, false, false}};  // (T, S)
  check_attention(mask, 24);
  // a per-batch, per-head mask (B, H, T, S) together with causality
  Mask full = xt::zeros<bool>(Shape{kB, kH, kT, kT});
  full(0, 1, 2, 0) = true;
  full(1, 0, 1, 1) = true;
  full(1, 1, 2, 2) = true;
  mask.attn_mask = full;
  mask.causal = true;
  check_attention(mask, 25);
}

TEST_CASE("MultiHeadAttention gradients with a sliding window, alone and with a key padding mask",
          "[nn][gradcheck][attention][gemm]") {
  const std::size_t T = 5, window = 2;
  nn::AttentionMask mask;
  mask.causal = true;
  for (const bool padded : {false, true}) {
    if (padded) mask.key_padding_mask = Mask{{false, false, false, true, false}, {true, false, false, false, false}};
    INFO("padded " << padded);
    Generator gen(29);
    nn::MultiHeadAttention mha(
        nn::MultiHeadAttentionOptions(8, 4).num_kv_heads(2).rotary(true).dropout(0.f).sliding_window(window), gen);
    randomize_norms(mha, 30);
    const Tensor x = randn({2, T, 8}, 31);
    REQUIRE_GRADS_OK(check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).output; }, {x}));
    const Array w = mha.forward(x, mask).weights.value();
    std::size_t outside = 0, inside = 0;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t t = 0; t < T; ++t)
          for (std::size_t s = 0; s < T; ++s) {
            const bool seen = s <= t && s + window > t && !testing::blocked_at(mask, b, h, t, s);
            (seen ? inside : outside) += w(b, h, t, s) != 0.f;
          }
    CHECK(outside == 0);
    CHECK(inside > 0);
  }
}

TEST_CASE("MultiHeadAttention gradient of the returned attention weights", "[nn][gradcheck][attention][gemm]") {
  nn::AttentionMask mask;
  mask.causal = true;
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post, nn::Norm::none}) {
    INFO("norm " << norm_name(norm));
    Generator gen(26);
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(kC, kH).dropout(0.f).norm(norm), gen);
    randomize_norms(mha, 27);
    const Tensor x = randn({kB, kT, kC}, 28);
    REQUIRE_GRADS_OK(check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).weights; }, {x}));
  }
}

TEST_CASE("MultiHeadAttention with a query whose keys are all masked gives zeros, no NaN, and correct gradients",
          "[nn][gradcheck][attention][gemm]") {
  // causal + key 0 of batch 1 padded: query 0 of batch 1 may attend to nothing.
  // attn_mask row 1 all true: query 1 of every batch may attend to nothing.
  for (int variant = 0; variant < 2; ++variant) {
    nn::AttentionMask mask;
    std::vector<std::pair<std::size_t, std::size_t>> empty_rows;  // (b, t)
    if (variant == 0) {
      mask.causal = true;
      mask.key_padding_mask = Mask{{false, false, false}, {true, false, false}};
      empty_rows = {{1, 0}};
    } else {
      mask.attn_mask = Mask{{false, true, false}, {true, true, true}, {false, false, true}};
      empty_rows = {{0, 1}, {1, 1}};
    }
    for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post, nn::Norm::none}) {
      for (bool bias : {true, false}) {
        INFO("variant " << variant << ", norm " << norm_name(norm) << ", bias " << bias);
        Generator gen(30 + variant);
        nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(kC, kH).dropout(0.f).norm(norm).bias(bias), gen);
        randomize_norms(mha, 32);
        const Tensor x = randn({kB, kT, kC}, 33);
        const nn::AttentionOutput o = mha.forward(x, mask);
        REQUIRE(all_finite(o.output.value()));
        REQUIRE(all_finite(o.weights.value()));
        const Array& w = o.weights.value();
        // CHECK, not REQUIRE: the NaN and gradient checks below still run when a value is off
        std::size_t nonzero_weights = 0, wrong_outputs = 0;
        for (auto [b, t] : empty_rows) {
          for (std::size_t hh = 0; hh < kH; ++hh)
            for (std::size_t s = 0; s < kT; ++s) nonzero_weights += w(b, hh, t, s) != 0.f;
          for (std::size_t c = 0; c < kC; ++c) {
            const float bo = bias ? mha.w_o->bias.value()(c) : 0.f;
            if (norm == nn::Norm::none) {
              // output = w_o(context): a zero context row gives exactly the bias (or exactly 0)
              wrong_outputs += o.output.value()(b, t, c) != bo;
            } else if (norm == nn::Norm::pre) {
              // output = x + w_o(0) = x + bias, in float32 like the module
              wrong_outputs += o.output.value()(b, t, c) != x.value()(b, t, c) + bo;
            }
          }
        }
        CHECK(nonzero_weights == 0);
        CHECK(wrong_outputs == 0);
        // every other row follows the mask and sums to 1
        CHECK(mask_violations(mask, w) == 0);
        // no NaN in any gradient (the helper fails on one) and the gradients are right
        const CheckResult res =
            check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).output; }, {x});
        INFO(res.report);
        REQUIRE(res.ok);
        REQUIRE(res.checked == total_elements(mha, {x}));
        const CheckResult rw =
            check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).weights; }, {x});
        INFO(rw.report);
        REQUIRE(rw.ok);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TransformerBlock and LanguageModel

TEST_CASE("TransformerBlock gradients, Pre-Norm and Post-Norm, causal", "[nn][gradcheck][transformer][gemm]") {
  nn::AttentionMask mask;
  mask.causal = true;
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    for (nn::Activation act : {nn::Activation::gelu, nn::Activation::relu}) {
      INFO("norm " << norm_name(norm) << ", activation " << (act == nn::Activation::gelu ? "gelu" : "relu"));
      Generator gen(40);
      nn::TransformerBlock block(nn::TransformerBlockOptions(kC, kH).d_ff(12).dropout(0.f).norm(norm).activation(act),
                                 gen);
      randomize_norms(block, 41);
      const Tensor x = randn({kB, kT, kC}, 42);
      CheckOptions opt;
      opt.skip_kinks = act == nn::Activation::relu;  // ReLU's kink, as in the FeedForward test
      const CheckResult res = check_module_grads(
          block, [&](const Ins& in) { return block.forward(in[0], mask).output; }, {x}, opt);
      INFO(res.report);
      REQUIRE(res.ok);
      REQUIRE(res.checked + res.skipped == total_elements(block, {x}));
      REQUIRE(res.tensors == 17);  // input, attn (8 + norm 2), ffn.norm 2, ffn 4
      REQUIRE(res.skipped * 10 < res.checked);
    }
  }
}

TEST_CASE("TransformerBlock gradients with a parallel residual and heads wider than d_model / H",
          "[nn][gradcheck][transformer][gemm]") {
  // parallel: y = x + attn(norm1(x)) + ffn(norm2(x)) (GPT-NeoX); head_dim 6 with C 8 and 2 heads:
  // w_q (12, 8), w_o (8, 12) (Qwen 3).
  nn::AttentionMask mask;
  mask.causal = true;
  for (const bool parallel : {true, false}) {
    for (const std::size_t head_dim : {std::size_t{0}, std::size_t{6}}) {
      INFO("parallel " << parallel << ", head_dim " << head_dim);
      Generator gen(43);
      nn::TransformerBlockOptions o =
          nn::TransformerBlockOptions(kC, kH).d_ff(12).dropout(0.f).parallel_residual(parallel);
      o.attention(nn::MultiHeadAttentionOptions(o.attention()).head_dim(head_dim).qk_norm(head_dim != 0));
      nn::TransformerBlock block(o, gen);
      REQUIRE(block.attn->w_q->weight.shape() == Shape{head_dim ? kH * head_dim : kC, kC});
      randomize_norms(block, 44);
      const Tensor x = randn({kB, kT, kC}, 45);
      const CheckResult res =
          check_module_grads(block, [&](const Ins& in) { return block.forward(in[0], mask).output; }, {x});
      INFO(res.report);
      REQUIRE(res.ok);
      REQUIRE(res.checked + res.skipped == total_elements(block, {x}));
      REQUIRE(res.skipped * 10 < res.checked);
    }
  }
  // The parallel block is the sum of its parts: x + attn(norm1(x)) + ffn(norm2(x)).
  Generator gen(46);
  nn::TransformerBlock block(nn::TransformerBlockOptions(kC, kH).d_ff(12).dropout(0.f).parallel_residual(true), gen);
  randomize_norms(block, 47);
  const Tensor x = randn({kB, kT, kC}, 48);
  NoGradGuard no_grad;
  const Array y = block.forward(x, mask).output.value();
  const Tensor a = block.attn->sublayer().forward(block.attn->norm->forward(x), mask).output;
  const Tensor f = block.ffn->sublayer().forward(block.ffn->norm->forward(x));
  const Array want = (x + a + f).value();
  REQUIRE(xt::allclose(y, want, 1e-6, 1e-6));
  REQUIRE_THROWS_WITH(
      nn::TransformerBlock(nn::TransformerBlockOptions(kC, kH).norm(nn::Norm::post).parallel_residual(true)),
      "TransformerBlock: parallel_residual needs Norm::pre");
}

TEST_CASE("LanguageModel loss gradient of every parameter", "[nn][gradcheck][transformer][gemm][long]") {
  // vocab 7, d_model 8, 2 heads, 2 layers, max_len 6, dropout 0
  const IndexArray ids = {{0, 3, 6, 1, 1, 5}, {2, 4, 4, 0, 6, 3}};
  const IndexArray targets = {{3, 6, 1, 1, 5, -100}, {-100, 4, 0, 6, 3, 2}};
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    INFO("norm " << norm_name(norm));
    Generator gen(50);
    nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.f).norm(norm), gen);
    randomize_norms(lm, 51);
    const NamedTensors named = lm.named_parameters();
    REQUIRE(named.size() == (norm == nn::Norm::pre ? 2 + 2 * 16 + 2 + 2u : 2 + 2 * 16 + 2u));
    const CheckResult res = check_module_grads(lm, [&](const Ins&) { return lm.loss(ids, targets); }, {});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.tensors == named.size());
    REQUIRE(res.checked == lm.num_parameters());
  }
}
