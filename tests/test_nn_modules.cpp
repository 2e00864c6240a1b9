// Module semantics (dotted parameter names, buffers, train/eval, registration errors,
// initialization and its reproducibility) and the contracts of MultiHeadAttention, TransformerBlock and
// LanguageModel (errors, masks, the Pre-Norm / Post-Norm formulas, dropout, generate()).
// Gradients of the same modules are checked in test_nn_gradcheck.cpp.
//
// Shapes: B batch, T query length, S key length (= T), C d_model, H heads, D = C / H,
// V vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/random_stream.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using testing::blocked_at;
using testing::tiny_lm;

namespace {

// The message of the xgrad::Error that f throws, or a marker saying what happened instead.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an xgrad::Error: ") + e.what() + ">";
  }
  return "<no exception>";
}

Tensor randn(const Shape& shape, std::uint64_t seed, float scale = 1.f) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, scale), true);
}

double max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a.data()[i]) - b.data()[i]));
  return m;
}

// Gives every LayerNorm of m (paths containing "norm") non-trivial weight and bias, so a
// misplaced norm cannot hide behind gamma 1, beta 0.
void randomize_norms(nn::Module& m, std::uint64_t seed) {
  Generator g(seed);
  for (auto& [name, p] : m.named_parameters()) {
    if (name.find("norm") == std::string::npos) continue;
    Tensor t = p;
    const bool is_weight = name.compare(name.size() - 6, 6, "weight") == 0;
    t.mutable_value() = is_weight ? g.uniform(t.shape(), 0.5f, 1.5f) : g.normal(t.shape(), 0.f, 0.3f);
  }
}

// Exposes Module's protected registration for the error tests.
struct Probe : nn::Module {
  using nn::Module::register_buffer;
  using nn::Module::register_module;
  using nn::Module::register_parameter;
};

// Attn(in) = concat_h softmax(Q_h K_h^T / sqrt(D) [masked]) V_h, then W_o: written with the
// module's own sublayers (w_q, w_k, w_v, w_o) and core ops only. With p > 0 the weights go
// through dropout drawn from the default generator, as in the module.
Tensor attention_by_hand(const nn::MultiHeadAttention& m, const Tensor& in, const Mask* blocked = nullptr,
                         float p = 0.f) {
  const auto B = static_cast<std::int64_t>(in.shape()[0]), T = static_cast<std::int64_t>(in.shape()[1]);
  const auto C = static_cast<std::int64_t>(m.options().d_model()),
             H = static_cast<std::int64_t>(m.options().num_heads());
  const std::int64_t D = C / H;
  auto heads = [&](const nn::Linear& proj) { return permute(reshape(proj.forward(in), {B, T, H, D}), {0, 2, 1, 3}); };
  const Tensor q = heads(*m.w_q), k = heads(*m.w_k), v = heads(*m.w_v);                          // (B, H, T, D)
  const Tensor scores = mul(matmul(q, k, false, true), 1.f / std::sqrt(static_cast<float>(D)));  // (B, H, T, S)
  Tensor w = blocked ? masked_softmax(scores, *blocked, -1) : softmax(scores, -1);
  if (p > 0.f) w = dropout(w, p, true, m.generator());
  const Tensor context = reshape(permute(matmul(w, v), {0, 2, 1, 3}), {B, T, C});  // (B, T, C)
  return m.w_o->forward(context);
}

// The same attention (no mask, no norm) in plain double loops from the weight values, so the
// head split and the 1/sqrt(D) scale are checked independently of the core ops.
Array attention_reference(const nn::MultiHeadAttention& m, const Array& x) {
  const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], H = m.options().num_heads(), D = C / H;
  auto project = [&](const nn::Linear& lin, const Array& in) {
    std::vector<double> out(B * T * C);
    for (std::size_t bt = 0; bt < B * T; ++bt)
      for (std::size_t o = 0; o < C; ++o) {
        double acc = lin.bias.defined() ? lin.bias.value()(o) : 0.0;
        for (std::size_t i = 0; i < C; ++i)
          acc += static_cast<double>(in.data()[bt * C + i]) * lin.weight.value()(o, i);
        out[bt * C + o] = acc;
      }
    return out;
  };
  const std::vector<double> q = project(*m.w_q, x), k = project(*m.w_k, x), v = project(*m.w_v, x);
  Array context = Array::from_shape({B, T, C});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t) {
        std::vector<double> s(T);
        double mx = -1e300, sum = 0;
        for (std::size_t j = 0; j < T; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < D; ++d) dot += q[(b * T + t) * C + h * D + d] * k[(b * T + j) * C + h * D + d];
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += e = std::exp(e - mx);
        for (std::size_t d = 0; d < D; ++d) {
          double acc = 0;
          for (std::size_t j = 0; j < T; ++j) acc += s[j] / sum * v[(b * T + j) * C + h * D + d];
          context(b, t, h * D + d) = static_cast<float>(acc);
        }
      }
  const std::vector<double> out = project(*m.w_o, context);
  Array y = Array::from_shape({B, T, C});
  for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = static_cast<float>(out[i]);
  return y;
}

// (T, T), true above the diagonal: query t may not see keys after t.
Mask causal_mask(std::size_t T) {
  Mask m = xt::zeros<bool>(Shape{T, T});
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t s = t + 1; s < T; ++s) m(t, s) = true;
  return m;
}

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [n, p] : named) out.push_back(n);
  return out;
}

}  // namespace

// =============================================================================================
// Module: names, counts, summary, train/eval, registration

TEST_CASE("LanguageModel parameter names are dotted paths in registration order", "[nn][module]") {
  Generator gen(1);
  nn::LanguageModel lm(tiny_lm(), gen);
  // Order: a module's own parameters first, then its children depth first, in registration order.
  const std::vector<std::string> expected = {
      "tok_emb.weight",
      "pos_emb.weight",
      "blocks.0.attn.w_q.weight",
      "blocks.0.attn.w_q.bias",
      "blocks.0.attn.w_k.weight",
      "blocks.0.attn.w_k.bias",
      "blocks.0.attn.w_v.weight",
      "blocks.0.attn.w_v.bias",
      "blocks.0.attn.w_o.weight",
      "blocks.0.attn.w_o.bias",
      "blocks.0.attn.norm.weight",
      "blocks.0.attn.norm.bias",
      "blocks.0.ffn.linear1.weight",
      "blocks.0.ffn.linear1.bias",
      "blocks.0.ffn.linear2.weight",
      "blocks.0.ffn.linear2.bias",
      "blocks.0.ffn.norm.weight",
      "blocks.0.ffn.norm.bias",
      "final_norm.weight",
      "final_norm.bias",
      "head.weight",
      "head.bias",
  };
  const NamedTensors named = lm.named_parameters();
  REQUIRE(names_of(named) == expected);
  // stable: asking again gives the same names and the same tensors
  const NamedTensors again = lm.named_parameters();
  REQUIRE(names_of(again) == expected);
  for (std::size_t i = 0; i < named.size(); ++i) REQUIRE(named[i].second.is_same(again[i].second));

  // the names point at the members they say
  REQUIRE(lm.parameter("tok_emb.weight").is_same(lm.tok_emb->weight));
  REQUIRE(lm.parameter("blocks.0.attn.w_k.bias").is_same(lm.blocks[0]->attn->w_k->bias));
  REQUIRE(lm.parameter("blocks.0.attn.norm.weight").is_same(lm.blocks[0]->attn->norm->weight));
  REQUIRE(lm.parameter("blocks.0.ffn.linear2.weight").is_same(lm.blocks[0]->ffn->linear2->weight));
  REQUIRE(lm.parameter("head.bias").is_same(lm.head->bias));
  REQUIRE(lm.parameter("blocks.0.ffn.linear1.weight").shape() == Shape{32, 8});
  REQUIRE(lm.parameter("blocks.0.ffn.norm.bias").is_same(lm.blocks[0]->ffn->norm->bias));

  // a second layer appears as blocks.1 after blocks.0
  Generator gen2(1);
  nn::LanguageModel lm2(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.f), gen2);
  const std::vector<std::string> names2 = names_of(lm2.named_parameters());
  REQUIRE(names2.size() == expected.size() + 16);
  REQUIRE(names2[18] == "blocks.1.attn.w_q.weight");
  REQUIRE(names2[33] == "blocks.1.ffn.norm.bias");
  REQUIRE(names2[34] == "final_norm.weight");
}

TEST_CASE("LanguageModel variants: Post-Norm has no final_norm, sinusoidal positions have no parameters",
          "[nn][module]") {
  Generator gen(2);
  nn::LanguageModel post(tiny_lm(nn::Norm::post), gen);
  const std::vector<std::string> names = names_of(post.named_parameters());
  REQUIRE(names.size() == 20);
  REQUIRE(names[18] == "head.weight");
  REQUIRE(std::find(names.begin(), names.end(), "final_norm.weight") == names.end());
  REQUIRE(post.final_norm == nullptr);

  nn::LanguageModel sin(tiny_lm().positional(nn::Positional::sinusoidal), gen);
  const std::vector<std::string> sn = names_of(sin.named_parameters());
  REQUIRE(sn.size() == 21);
  REQUIRE(sn[0] == "tok_emb.weight");
  REQUIRE(sn[1] == "blocks.0.attn.w_q.weight");
  REQUIRE(sin.pos_emb == nullptr);
  REQUIRE(sin.pos_table != nullptr);
}

TEST_CASE("parameters() matches named_parameters() and parameter(path) throws on unknown paths", "[nn][module]") {
  Generator gen(3);
  nn::LanguageModel lm(tiny_lm(), gen);
  const NamedTensors named = lm.named_parameters();
  const std::vector<Tensor> params = lm.parameters();
  REQUIRE(params.size() == named.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(named[i].first);
    REQUIRE(params[i].is_same(named[i].second));
    REQUIRE(lm.parameter(named[i].first).is_same(params[i]));
    REQUIRE(params[i].is_leaf());
    REQUIRE(params[i].requires_grad());
  }
  for (const std::string bad : {"nope", "blocks.0.attn", "blocks.1.attn.w_q.weight", "head.weight.x", "", "tok_emb"}) {
    INFO("path '" << bad << "'");
    const std::string msg = error_of([&] { lm.parameter(bad); });
    REQUIRE_THAT(msg, Contains("Module::parameter") && Contains("'" + bad + "'"));
  }
}

TEST_CASE("num_parameters is the sum of sizes and the closed form for MultiHeadAttention", "[nn][module]") {
  Generator gen(4);
  for (std::size_t C : {8u, 12u, 16u}) {
    INFO("C " << C);
    // 4 projections of C*C weights and C biases, plus LayerNorm's 2C
    nn::MultiHeadAttention pre(nn::MultiHeadAttentionOptions(C, 4).norm(nn::Norm::pre), gen);
    REQUIRE(pre.num_parameters() == 4 * (C * C + C) + 2 * C);
    nn::MultiHeadAttention post(nn::MultiHeadAttentionOptions(C, 4).norm(nn::Norm::post), gen);
    REQUIRE(post.num_parameters() == 4 * (C * C + C) + 2 * C);
    nn::MultiHeadAttention none(nn::MultiHeadAttentionOptions(C, 4).norm(nn::Norm::none), gen);
    REQUIRE(none.num_parameters() == 4 * (C * C + C));
    nn::MultiHeadAttention nobias(nn::MultiHeadAttentionOptions(C, 4).bias(false), gen);
    REQUIRE(nobias.num_parameters() == 4 * C * C + 2 * C);
  }
  nn::LanguageModel lm(tiny_lm(), gen);
  std::size_t total = 0;
  for (const Tensor& p : lm.parameters()) total += p.size();
  REQUIRE(lm.num_parameters() == total);
  // V*C + max_len*C + block (attention 4(C^2+C)+2C, ffn.norm 2C, ffn C*4C+4C+4C*C+C) + 2C + C*V+V
  const std::size_t V = 7, C = 8, L = 6, F = 32;
  REQUIRE(total == V * C + L * C + (4 * (C * C + C) + 2 * C) + 2 * C + (C * F + F + F * C + C) + 2 * C + (C * V + V));
}

TEST_CASE("summary lists every parameter name, its shape and the total", "[nn][module]") {
  Generator gen(5);
  nn::LanguageModel lm(tiny_lm(), gen);
  const std::string s = lm.summary();
  for (const auto& [name, p] : lm.named_parameters()) REQUIRE_THAT(s, Contains(name));
  REQUIRE_THAT(s, Contains("(32, 8)"));
  // the last line is the total
  const std::size_t at = s.rfind("total");
  REQUIRE(at != std::string::npos);
  const std::string last = s.substr(at);
  REQUIRE_THAT(last, Contains(std::to_string(lm.num_parameters())));
  REQUIRE(s.find(std::to_string(lm.num_parameters()), at) != std::string::npos);
}

TEST_CASE("train and eval propagate to every submodule and never change requires_grad", "[nn][module]") {
  Generator gen(6);
  nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6), gen);
  // freeze one parameter: train/eval must leave that choice alone
  Tensor frozen = lm.parameter("blocks.1.ffn.linear1.bias");
  frozen.set_requires_grad(false);
  auto all_modules = [&]() {
    std::vector<const nn::Module*> ms = {&lm, lm.tok_emb.get(), lm.pos_emb.get(), lm.final_norm.get(), lm.head.get()};
    for (const auto& b : lm.blocks) {
      for (const nn::Module* m : std::initializer_list<const nn::Module*>{
               b.get(), b->attn.get(), b->attn->w_q.get(), b->attn->w_k.get(), b->attn->w_v.get(), b->attn->w_o.get(),
               b->attn->norm.get(), b->ffn->norm.get(), b->ffn.get(), b->ffn->linear1.get(), b->ffn->linear2.get()}) {
        ms.push_back(m);
      }
    }
    return ms;
  };
  auto requires_grad_flags = [&]() {
    std::vector<bool> out;
    for (const Tensor& p : lm.parameters()) out.push_back(p.requires_grad());
    return out;
  };
  const std::vector<bool> flags = requires_grad_flags();
  REQUIRE(std::count(flags.begin(), flags.end(), false) == 1);

  for (const nn::Module* m : all_modules()) REQUIRE(m->is_training());  // modules start in training mode
  lm.eval();
  for (const nn::Module* m : all_modules()) REQUIRE_FALSE(m->is_training());
  REQUIRE(requires_grad_flags() == flags);
  lm.train();
  for (const nn::Module* m : all_modules()) REQUIRE(m->is_training());
  REQUIRE(requires_grad_flags() == flags);
  lm.blocks[0]->eval();  // only that subtree
  REQUIRE(lm.is_training());
  REQUIRE_FALSE(lm.blocks[0]->attn->w_q->is_training());
  REQUIRE(lm.blocks[1]->attn->w_q->is_training());
  lm.train(false);
  for (const nn::Module* m : all_modules()) REQUIRE_FALSE(m->is_training());
  REQUIRE(requires_grad_flags() == flags);
}

TEST_CASE("registering a child copies the parent's training flag", "[nn][module]") {
  Probe parent;
  parent.eval();
  auto child = parent.register_module("child", std::make_shared<nn::Linear>(2, 2));
  REQUIRE_FALSE(child->is_training());
  parent.train();
  REQUIRE(child->is_training());
}

TEST_CASE("register errors: duplicate names, dotted or empty names, undefined or non-leaf tensors",
          "[nn][module][errors]") {
  Probe m;
  Tensor w = m.register_parameter("w", Tensor(Array{1.f, 2.f}));
  REQUIRE(w.requires_grad());  // registering makes it a trainable parameter
  REQUIRE(m.parameter("w").is_same(w));

  REQUIRE_THAT(error_of([&] { m.register_parameter("w", Tensor(Array{3.f})); }),
               Contains("register_parameter") && Contains("'w'") && Contains("already registered"));
  REQUIRE_THAT(error_of([&] { m.register_parameter("a.b", Tensor(Array{3.f})); }),
               Contains("register_parameter") && Contains("'a.b'"));
  REQUIRE_THAT(error_of([&] { m.register_parameter("", Tensor(Array{3.f})); }), Contains("register_parameter"));
  REQUIRE_THAT(error_of([&] { m.register_parameter("u", Tensor()); }),
               Contains("register_parameter") && Contains("'u'") && Contains("undefined"));
  const Tensor x = randn({2}, 1);
  REQUIRE_THAT(error_of([&] { m.register_parameter("y", x * 2.f); }),
               Contains("register_parameter") && Contains("'y'") && Contains("leaf"));

  m.register_module("sub", std::make_shared<nn::Linear>(2, 3));
  REQUIRE_THAT(error_of([&] { m.register_module("sub", std::make_shared<nn::Linear>(2, 3)); }),
               Contains("register_module") && Contains("'sub'") && Contains("already registered"));
  REQUIRE_THAT(error_of([&] { m.register_module("s.t", std::make_shared<nn::Linear>(2, 3)); }),
               Contains("register_module") && Contains("'s.t'"));
  REQUIRE_THAT(error_of([&] { m.register_module("null", std::shared_ptr<nn::Linear>()); }),
               Contains("register_module") && Contains("'null'"));
  // the failed registrations left nothing behind
  REQUIRE(names_of(m.named_parameters()) == std::vector<std::string>{"w", "sub.weight", "sub.bias"});
}

TEST_CASE("names that are not UTF-8 or hold ':' are refused where they are registered, naming the bytes",
          "[nn][module][errors]") {
  Probe m;
  const std::string bad = std::string("w") + '\xff';
  REQUIRE_THAT(error_of([&] { m.register_parameter(bad, Tensor(Array{1.f})); }),
               Contains("Module::register_parameter: name \"w\\xFF\" is not valid UTF-8 (byte 0xFF at offset 1)"));
  REQUIRE_THAT(error_of([&] { m.register_module("sub\xc3", std::make_shared<nn::Linear>(2, 3)); }),
               Contains("Module::register_module: name \"sub\\xC3\" is not valid UTF-8 (byte 0xC3 at offset 3)"));
  REQUIRE_THAT(
      error_of([&] { m.register_buffer("\xed\xa0\x80", Array{1.f}); }),  // a surrogate
      Contains("Module::register_buffer: name \"\\xED\\xA0\\x80\" is not valid UTF-8 (byte 0xED at offset 0)"));
  // ':' is the checkpoints' namespace separator ("optimizer:..."), so no module path holds one.
  REQUIRE_THAT(error_of([&] { m.register_parameter("a:b", Tensor(Array{1.f})); }),
               Contains("Module::register_parameter: name 'a:b' must be non-empty and contain no '.' or ':'"));
  REQUIRE_THAT(error_of([&] { m.register_module("optimizer:x", std::make_shared<nn::Linear>(2, 3)); }),
               Contains("Module::register_module") && Contains("'optimizer:x'"));
  REQUIRE_THAT(error_of([&] { m.register_buffer("", Array{1.f}); }),
               Contains("Module::register_buffer") && Contains("non-empty"));
  // UTF-8 beyond ASCII is a fine name.
  m.register_parameter("poids_\xc3\xa9", Tensor(Array{1.f}));
  m.register_module("optimizer", std::make_shared<nn::Linear>(2, 3));
  REQUIRE(names_of(m.named_parameters()) ==
          std::vector<std::string>{"poids_\xc3\xa9", "optimizer.weight", "optimizer.bias"});
}

TEST_CASE("buffers are saved state that is not trained: not parameters, no gradient, dotted paths", "[nn][module]") {
  Probe root;
  auto child = std::make_shared<Probe>();
  Tensor w = root.register_parameter("w", Tensor(Array{1.f, 2.f}));
  Tensor count = root.register_buffer("count", Array(3.f));
  child->register_parameter("v", Tensor(Array{4.f}));
  Tensor mask = child->register_buffer("mask", Tensor(Array{0.f, -INFINITY}));
  root.register_module("child", child);

  CHECK(names_of(root.named_parameters()) == std::vector<std::string>{"w", "child.v"});
  CHECK(names_of(root.named_buffers()) == std::vector<std::string>{"count", "child.mask"});
  // Module by module: parameters, then buffers, then children.
  CHECK(names_of(root.named_state()) == std::vector<std::string>{"w", "count", "child.v", "child.mask"});
  CHECK(root.parameters().size() == 2);
  CHECK(root.num_parameters() == 3);
  CHECK(!count.requires_grad());
  CHECK(root.named_buffers()[1].second.is_same(mask));

  // A loss through a buffer gives the parameter a gradient and the buffer none.
  sum(w * count).backward();
  CHECK(w.grad()(0) == 3.f);
  CHECK(!count.has_grad());

  // A buffer does not require grad and is a leaf; names are shared with parameters and children.
  REQUIRE_THAT(error_of([&] { root.register_buffer("g", Tensor(Array{1.f}, true)); }),
               Contains("Module::register_buffer: buffer 'g' must be a leaf that does not require grad"));
  REQUIRE_THAT(error_of([&] { root.register_buffer("u", Tensor()); }),
               Contains("register_buffer") && Contains("undefined"));
  REQUIRE_THAT(error_of([&] { root.register_buffer("w", Array{1.f}); }),
               Contains("Module::register_buffer: 'w' is already registered as a parameter"));
  REQUIRE_THAT(error_of([&] { root.register_parameter("count", Tensor(Array{1.f})); }),
               Contains("Module::register_parameter: 'count' is already registered as a buffer"));
  REQUIRE_THAT(error_of([&] { root.register_buffer("child", Array{1.f}); }),
               Contains("Module::register_buffer: 'child' is already registered as a module"));
  REQUIRE_THAT(error_of([&] { root.register_module("w", std::make_shared<nn::Linear>(2, 3)); }),
               Contains("Module::register_module: 'w' is already registered as a parameter"));
  CHECK(names_of(root.named_state()) == std::vector<std::string>{"w", "count", "child.v", "child.mask"});
}

// =============================================================================================
// Initialization: PyTorch's defaults, reproducible from a seed

namespace {

// Checks that `a` looks like U(-bound, bound): inside the range, filling it, flat histogram.
void require_uniform(const Array& a, double bound, double hist_tol) {
  const std::size_t n = a.size();
  double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
  constexpr std::size_t kBins = 8;
  std::vector<std::size_t> hist(kBins, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = a.data()[i];
    REQUIRE(v >= -bound);
    REQUIRE(v <= bound);
    sum += v;
    sq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    hist[std::min(kBins - 1, static_cast<std::size_t>((v + bound) / (2 * bound) * kBins))]++;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  INFO("n " << n << ", bound " << bound << ", mean " << mean << ", var " << var << ", min " << lo << ", max " << hi);
  REQUIRE(std::abs(mean) < 4 * bound / std::sqrt(3.0 * n));     // 4 standard errors
  REQUIRE(var == Approx(bound * bound / 3).epsilon(hist_tol));  // U(-b, b) has variance b^2 / 3
  REQUIRE(lo < -0.9 * bound);
  REQUIRE(hi > 0.9 * bound);
  for (std::size_t k = 0; k < kBins; ++k) {
    INFO("bin " << k << " holds " << hist[k]);
    REQUIRE(static_cast<double>(hist[k]) == Approx(static_cast<double>(n) / kBins).epsilon(hist_tol));
  }
}

void require_standard_normal(const Array& a) {
  const std::size_t n = a.size();
  double sum = 0, sq = 0;
  std::size_t within1 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = a.data()[i];
    sum += v;
    sq += v * v;
    within1 += std::abs(v) < 1.0;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  INFO("n " << n << ", mean " << mean << ", sd " << sd << ", within 1 sd " << static_cast<double>(within1) / n);
  REQUIRE(std::abs(mean) < 4 / std::sqrt(static_cast<double>(n)));
  REQUIRE(sd == Approx(1.0).margin(0.03));
  REQUIRE(static_cast<double>(within1) / n == Approx(0.6827).margin(0.02));  // a normal, not a uniform
}

}  // namespace

TEST_CASE("Linear initialization is U(-1/sqrt(in), 1/sqrt(in)) for weight and bias", "[nn][init]") {
  Generator gen(10);
  nn::Linear big(256, 512, true, gen);
  REQUIRE(big.weight.shape() == Shape{512, 256});
  REQUIRE(big.bias.shape() == Shape{512});
  require_uniform(big.weight.value(), 1.0 / 16, 0.05);  // 131072 values
  require_uniform(big.bias.value(), 1.0 / 16, 0.35);    // 512 values: a looser histogram
  nn::Linear narrow(3, 4000, true, gen);
  require_uniform(narrow.weight.value(), 1.0 / std::sqrt(3.0), 0.1);
  require_uniform(narrow.bias.value(), 1.0 / std::sqrt(3.0), 0.15);  // the bias bound uses in, not out
}

TEST_CASE("LayerNorm starts at weight 1 and bias 0, Embedding and learned positions at N(0, 1)", "[nn][init]") {
  nn::LayerNorm ln(16);
  REQUIRE(ln.weight.value() == Array(xt::ones<float>({16})));
  REQUIRE(ln.bias.value() == Array(xt::zeros<float>({16})));
  Generator gen(11);
  nn::Embedding emb(1000, 32, gen);
  REQUIRE(emb.weight.shape() == Shape{1000, 32});
  require_standard_normal(emb.weight.value());
  nn::LearnedPositionalEncoding pos(500, 32, gen);
  require_standard_normal(pos.weight.value());
}

TEST_CASE("initialization is reproducible from a seed and differs between seeds", "[nn][init]") {
  auto build = [](std::uint64_t seed) {
    Generator gen(seed);
    return std::make_unique<nn::LanguageModel>(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6), gen);
  };
  const auto a = build(42), b = build(42), c = build(43);
  const NamedTensors na = a->named_parameters(), nb = b->named_parameters(), nc = c->named_parameters();
  REQUIRE(na.size() == nc.size());
  for (std::size_t i = 0; i < na.size(); ++i) {
    INFO(na[i].first);
    REQUIRE(na[i].second.value() == nb[i].second.value());
    REQUIRE_FALSE(na[i].second.is_same(nb[i].second));
    if (na[i].first.find("norm") == std::string::npos) {  // LayerNorms are 1 and 0 for every seed
      REQUIRE(max_abs_diff(na[i].second.value(), nc[i].second.value()) > 0);
    }
  }
  // the default generator, re-seeded, gives the same weights too
  manual_seed(7);
  nn::Linear l1(5, 4);
  manual_seed(7);
  nn::Linear l2(5, 4);
  REQUIRE(l1.weight.value() == l2.weight.value());
  REQUIRE(l1.bias.value() == l2.bias.value());
}

// =============================================================================================
// MultiHeadAttention: errors

TEST_CASE("MultiHeadAttention rejects d_model not divisible by num_heads, naming both", "[nn][attention][errors]") {
  REQUIRE_THAT(error_of([] { nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(10, 4)); }),
               Contains("MultiHeadAttention") && Contains("10") && Contains("4") && Contains("divisible"));
  REQUIRE_THAT(error_of([] { nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(510, 8)); }),
               Contains("d_model 510") && Contains("num_heads 8"));
  REQUIRE_THAT(error_of([] { nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 0)); }),
               Contains("MultiHeadAttention"));
  REQUIRE_THAT(error_of([] { nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2).dropout(1.f)); }),
               Contains("MultiHeadAttention") && Contains("dropout"));
}

TEST_CASE("MultiHeadAttention rejects inputs of the wrong rank or width, naming the shapes",
          "[nn][attention][errors]") {
  Generator gen(12);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2), gen);
  REQUIRE_THAT(error_of([&] { m.forward(randn({3, 8}, 1)); }), Contains("MultiHeadAttention") && Contains("(3, 8)"));
  REQUIRE_THAT(error_of([&] {
                 m.forward(randn({1, 2, 3, 8}, 1));
               }),
               Contains("MultiHeadAttention") && Contains("(1, 2, 3, 8)"));
  REQUIRE_THAT(error_of([&] {
                 m.forward(randn({2, 3, 5}, 1));
               }),
               Contains("MultiHeadAttention") && Contains("(2, 3, 5)") && Contains("8"));
  REQUIRE_THAT(error_of([&] { m.forward(Tensor()); }), Contains("MultiHeadAttention"));
}

TEST_CASE("MultiHeadAttention rejects an attn_mask that does not broadcast to B H T S",
          "[nn][attention][errors][gemm]") {
  Generator gen(13);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2), gen);
  const Tensor x = randn({2, 3, 8}, 2);  // B 2, H 2, T = S = 3
  const std::vector<Shape> bad = {{3, 2}, {4, 3}, {3, 3, 3}, {4, 1, 3, 3}, {2, 3, 3, 3}, {1, 2, 3, 3, 3}, {2}};
  for (const Shape& s : bad) {
    INFO("attn_mask " << shape_str(s));
    nn::AttentionMask mask;
    mask.attn_mask = Mask(xt::zeros<bool>(s));
    REQUIRE_THAT(error_of([&] { m.forward(x, mask); }),
                 Contains("MultiHeadAttention") && Contains("attn_mask") && Contains(shape_str(s)));
  }
  // a mask of length-1 axes that broadcast to (B, H, T, S) is fine
  for (const Shape& s : std::vector<Shape>{{3, 3}, {1, 3}, {2, 1, 1, 3}, {1, 2, 3, 1}, {2, 2, 3, 3}}) {
    INFO("attn_mask " << shape_str(s));
    nn::AttentionMask mask;
    mask.attn_mask = Mask(xt::zeros<bool>(s));
    REQUIRE_NOTHROW(m.forward(x, mask));
  }
}

TEST_CASE("MultiHeadAttention rejects a key_padding_mask that is not B by S", "[nn][attention][errors][gemm]") {
  Generator gen(14);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2), gen);
  const Tensor x = randn({2, 3, 8}, 2);
  for (const Shape& s : std::vector<Shape>{{2, 4}, {3}, {1, 3}, {3, 2}, {2, 1, 3}}) {
    INFO("key_padding_mask " << shape_str(s));
    nn::AttentionMask mask;
    mask.key_padding_mask = Mask(xt::zeros<bool>(s));
    REQUIRE_THAT(error_of([&] { m.forward(x, mask); }), Contains("MultiHeadAttention") &&
                                                            Contains("key_padding_mask") && Contains(shape_str(s)) &&
                                                            Contains("(2, 3)"));
  }
}

// =============================================================================================
// MultiHeadAttention: the weights it returns

TEST_CASE("attention weights are B H T S, rows sum to 1, causal and padding keys get zero weight",
          "[nn][attention][gemm]") {
  Generator gen(15);
  const std::size_t B = 2, T = 5, C = 12, H = 3;
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(C, H).dropout(0.f), gen);
  const Tensor x = randn({B, T, C}, 3);

  const Array plain = m.forward(x).weights.value();
  REQUIRE(plain.shape() == Shape{B, H, T, T});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t) {
        double s = 0;
        for (std::size_t k = 0; k < T; ++k) {
          REQUIRE(plain(b, h, t, k) > 0.f);
          s += plain(b, h, t, k);
        }
        REQUIRE(s == Approx(1.0).margin(1e-5));
      }

  nn::AttentionMask causal;
  causal.causal = true;
  const Array cw = m.forward(x, causal).weights.value();
  REQUIRE(cw.shape() == Shape{B, H, T, T});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t) {
        double s = 0;
        for (std::size_t k = 0; k < T; ++k) {
          if (k > t) {
            REQUIRE(cw(b, h, t, k) == 0.f);
          } else {
            REQUIRE(cw(b, h, t, k) > 0.f);
          }
          s += cw(b, h, t, k);
        }
        REQUIRE(s == Approx(1.0).margin(1e-5));
      }
  // the first query can only see itself
  REQUIRE(cw(1, 2, 0, 0) == 1.f);

  nn::AttentionMask pad;
  pad.key_padding_mask = Mask{{false, false, false, true, true}, {true, false, false, false, false}};
  const Array pw = m.forward(x, pad).weights.value();
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t) {
        double s = 0;
        for (std::size_t k = 0; k < T; ++k) {
          if ((*pad.key_padding_mask)(b, k)) REQUIRE(pw(b, h, t, k) == 0.f);
          s += pw(b, h, t, k);
        }
        REQUIRE(s == Approx(1.0).margin(1e-5));
      }
}

TEST_CASE("attn_mask blocks exactly the marked keys for every broadcastable shape", "[nn][attention][gemm]") {
  Generator gen(16);
  const std::size_t B = 2, T = 4, C = 8, H = 2;
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(C, H).dropout(0.f), gen);
  const Tensor x = randn({B, T, C}, 4);
  Generator pick(17);
  for (const Shape& s : std::vector<Shape>{{T, T}, {1, 1, T, T}, {1, T}, {B, 1, 1, T}, {1, H, T, T}, {B, H, T, T}}) {
    for (bool causal : {false, true}) {
      INFO("attn_mask " << shape_str(s) << ", causal " << causal);
      nn::AttentionMask mask;
      mask.causal = causal;
      Mask a = xt::zeros<bool>(s);
      for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = pick.uniform() < 0.3f;
      mask.attn_mask = a;
      const Array w = m.forward(x, mask).weights.value();
      REQUIRE(w.shape() == Shape{B, H, T, T});
      std::size_t wrong = 0;
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t t = 0; t < T; ++t) {
            double sum = 0;
            bool any = false;
            for (std::size_t k = 0; k < T; ++k) {
              const bool blk = blocked_at(mask, b, h, t, k);
              any = any || !blk;
              wrong += blk ? w(b, h, t, k) != 0.f : !(w(b, h, t, k) > 0.f);
              sum += w(b, h, t, k);
            }
            wrong += any ? std::abs(sum - 1) > 1e-5 : sum != 0;
          }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("attention weights are returned before dropout and dropout 0 in training equals eval",
          "[nn][attention][gemm]") {
  Generator gen(18);
  nn::MultiHeadAttention drop(nn::MultiHeadAttentionOptions(8, 2).dropout(0.5f), gen);
  const Tensor x = randn({2, 3, 8}, 5);
  manual_seed(3);
  const Array w = drop.forward(x).weights.value();
  for (std::size_t i = 0; i < w.size(); i += 3) {
    double s = 0;
    for (std::size_t k = 0; k < 3; ++k) s += w.data()[i + k];
    REQUIRE(s == Approx(1.0).margin(1e-5));  // a dropped weight matrix would not sum to 1
  }

  Generator g2(19);
  nn::MultiHeadAttention nodrop(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), g2);
  REQUIRE(nodrop.is_training());
  const Array train_out = nodrop.forward(x).output.value();
  nodrop.eval();
  REQUIRE(nodrop.forward(x).output.value() == train_out);
}

// =============================================================================================
// MultiHeadAttention: the residual formulas, computed by hand from the module's own sublayers

TEST_CASE("Pre-Norm attention is x + w_o(attention(LN(x)))", "[nn][attention][prenorm][gemm]") {
  Generator gen(20);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f).norm(nn::Norm::pre), gen);
  randomize_norms(m, 21);
  const Tensor x = randn({2, 4, 8}, 6, 2.f);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    nn::AttentionMask mask;
    mask.causal = causal;
    const Mask cm = causal_mask(4);
    const Mask* blocked = causal ? &cm : nullptr;
    const Array got = m.forward(x, mask).output.value();
    const Array want = (x + attention_by_hand(m, m.norm->forward(x), blocked)).value();
    REQUIRE(max_abs_diff(got, want) < 1e-5);
    // the wrong "pre-LN" that normalizes the sublayer output is far from it
    const Array wrong = (x + m.norm->forward(attention_by_hand(m, x, blocked))).value();
    REQUIRE(max_abs_diff(got, wrong) > 0.1);
    // and so is Post-Norm
    const Array post = m.norm->forward(x + attention_by_hand(m, x, blocked)).value();
    REQUIRE(max_abs_diff(got, post) > 0.1);
  }
}

TEST_CASE("Post-Norm attention is LN(x + w_o(attention(x)))", "[nn][attention][postnorm][gemm]") {
  Generator gen(22);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f).norm(nn::Norm::post), gen);
  randomize_norms(m, 23);
  const Tensor x = randn({2, 4, 8}, 7, 2.f);
  nn::AttentionMask mask;
  mask.causal = true;
  const Mask cm = causal_mask(4);
  const Array got = m.forward(x, mask).output.value();
  const Array want = m.norm->forward(x + attention_by_hand(m, x, &cm)).value();
  REQUIRE(max_abs_diff(got, want) < 1e-5);
  const Array pre = (x + attention_by_hand(m, m.norm->forward(x), &cm)).value();
  REQUIRE(max_abs_diff(got, pre) > 0.1);
  // every output row is layer-normalized: undoing gamma and beta leaves mean 0, variance 1
  const Array& g = m.norm->weight.value();
  const Array& be = m.norm->bias.value();
  for (std::size_t row = 0; row < 8; ++row) {
    double mean = 0, sq = 0;
    for (std::size_t c = 0; c < 8; ++c) {
      const double z = (got.data()[row * 8 + c] - be(c)) / g(c);
      mean += z / 8;
      sq += z * z / 8;
    }
    REQUIRE(mean == Approx(0).margin(1e-4));
    REQUIRE(sq - mean * mean == Approx(1).margin(1e-3));
  }
}

TEST_CASE("Norm none attention has no residual and no norm parameters", "[nn][attention][gemm]") {
  Generator gen(24);
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f).norm(nn::Norm::none), gen);
  REQUIRE(m.norm == nullptr);
  for (const auto& [name, p] : m.named_parameters()) REQUIRE(name.find("norm") == std::string::npos);
  REQUIRE(m.named_parameters().size() == 8);
  const Tensor x = randn({2, 4, 8}, 8);
  const Array got = m.forward(x).output.value();
  REQUIRE(max_abs_diff(got, attention_by_hand(m, x).value()) < 1e-5);
  // an independent double-precision computation of the same attention
  REQUIRE(max_abs_diff(got, attention_reference(m, x.value())) < 1e-4);
  // no residual: it is not x + Attn(x)
  REQUIRE(max_abs_diff(got, (x + attention_by_hand(m, x)).value()) > 0.1);
}

TEST_CASE("attention dropout acts on the attention weights in training mode only", "[nn][attention][dropout][gemm]") {
  Generator gen(25);
  const float p = 0.3f;
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(8, 2).dropout(p).norm(nn::Norm::none), gen);
  const Tensor x = randn({2, 5, 8}, 9);
  REQUIRE(m.is_training());
  // the attention's dropout draws from the module's own stream, not the default generator
  m.generator().manual_seed(100);
  const Array a = m.forward(x).output.value();
  m.generator().manual_seed(101);
  const Array b = m.forward(x).output.value();
  REQUIRE(max_abs_diff(a, b) > 1e-3);
  m.generator().manual_seed(100);
  manual_seed(7);
  REQUIRE(m.forward(x).output.value() == a);  // same stream state, same mask, whatever the default
  // exactly w_o(dropout(softmax(QK^T / sqrt(D))) V): dropout on the weights, not elsewhere
  m.generator().manual_seed(100);
  const Array by_hand = attention_by_hand(m, x, nullptr, p).value();
  REQUIRE(max_abs_diff(a, by_hand) < 1e-5);

  m.eval();
  manual_seed(100);
  const Array e1 = m.forward(x).output.value();
  manual_seed(555);
  const Array e2 = m.forward(x).output.value();
  REQUIRE(e1 == e2);
  REQUIRE(max_abs_diff(e1, attention_by_hand(m, x).value()) < 1e-5);
  REQUIRE(max_abs_diff(e1, a) > 1e-3);
}

// =============================================================================================
// TransformerBlock

TEST_CASE("TransformerBlock rejects Norm none", "[nn][transformer][errors]") {
  REQUIRE_THAT(error_of([] { nn::TransformerBlock b(nn::TransformerBlockOptions(8, 2).norm(nn::Norm::none)); }),
               Contains("TransformerBlock") && Contains("norm"));
  REQUIRE_THAT(error_of([] { nn::LanguageModel lm(tiny_lm(nn::Norm::none)); }),
               Contains("LanguageModel") && Contains("norm"));
}

TEST_CASE("TransformerBlock places the FFN norm like the attention norm", "[nn][transformer][gemm]") {
  nn::AttentionMask mask;
  mask.causal = true;
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    INFO("norm " << (norm == nn::Norm::pre ? "pre" : "post"));
    Generator gen(26);
    nn::TransformerBlock block(nn::TransformerBlockOptions(8, 2).d_ff(16).dropout(0.f).norm(norm), gen);
    randomize_norms(block, 27);
    REQUIRE(block.attn->options().norm() == norm);
    const Tensor x = randn({2, 4, 8}, 10);
    const nn::BlockOutput out = block.forward(x, mask);
    REQUIRE(out.attention.shape() == Shape{2, 2, 4, 4});
    const Tensor h = block.attn->forward(x, mask).output;  // the attention sublayer with its residual
    // Pre: y = h + FFN(LN2(h))      Post: y = LN2(h + FFN(h))
    const nn::FeedForward& ffn = block.ffn->sublayer();
    const Tensor want = norm == nn::Norm::pre ? h + ffn.forward(block.ffn->norm->forward(h))
                                              : block.ffn->norm->forward(h + ffn.forward(h));
    REQUIRE(max_abs_diff(out.output.value(), want.value()) < 1e-5);
    const Tensor other = norm == nn::Norm::pre ? block.ffn->norm->forward(h + ffn.forward(h))
                                               : h + ffn.forward(block.ffn->norm->forward(h));
    REQUIRE(max_abs_diff(out.output.value(), other.value()) > 0.1);
  }
}

// =============================================================================================
// LanguageModel: input errors, causality, generate()

TEST_CASE("LanguageModel rejects bad token ids with clear errors", "[nn][transformer][errors][gemm]") {
  Generator gen(28);
  nn::LanguageModel lm(tiny_lm(), gen);
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray{{1, 2, 7}});
               }),
               Contains("LanguageModel") && Contains("token id 7") && Contains("vocabulary") && Contains("7)"));
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray{{1, -1, 2}});
               }),
               Contains("LanguageModel") && Contains("token id -1"));
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray{{0, 1, 2, 3, 4, 5, 6}});
               }),
               Contains("LanguageModel") && Contains("length 7") && Contains("max_len 6"));
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray(xt::zeros<std::int64_t>(Shape{2, 0})));
               }),
               Contains("LanguageModel") && Contains("T = 0"));
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray{1, 2, 3});
               }),
               Contains("LanguageModel") && Contains("(B, T)") && Contains("(3)"));
  REQUIRE_THAT(error_of([&] {
                 lm.forward(IndexArray(xt::zeros<std::int64_t>(Shape{1, 2, 3})));
               }),
               Contains("LanguageModel") && Contains("(1, 2, 3)"));
  REQUIRE_THAT(error_of([&] { lm.loss(IndexArray{{1, 2, 7}}, IndexArray{{1, 2, 3}}); }), Contains("token id 7"));
  // max_len tokens are fine
  REQUIRE(lm.forward(IndexArray{{0, 1, 2, 3, 4, 5}}).logits.shape() == Shape{1, 6, 7});
}

TEST_CASE("LanguageModel is causal: logits at t do not depend on later tokens", "[nn][transformer][gemm]") {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    Generator gen(29);
    nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.f).norm(norm), gen);
    const IndexArray a = {{1, 2, 3, 4, 5, 6}, {0, 0, 1, 1, 2, 2}};
    IndexArray b = a;
    b(0, 4) = 0;
    b(1, 4) = 6;
    const nn::LanguageModelOutput oa = lm.forward(a), ob = lm.forward(b);
    REQUIRE(oa.logits.shape() == Shape{2, 6, 7});
    REQUIRE(oa.attentions.size() == 2);
    for (const Tensor& w : oa.attentions) REQUIRE(w.shape() == Shape{2, 2, 6, 6});
    const Array& la = oa.logits.value();
    const Array& lb = ob.logits.value();
    for (std::size_t bb = 0; bb < 2; ++bb)
      for (std::size_t t = 0; t < 6; ++t) {
        double d = 0;
        for (std::size_t v = 0; v < 7; ++v) d = std::max(d, static_cast<double>(std::abs(la(bb, t, v) - lb(bb, t, v))));
        if (t < 4) {
          REQUIRE(d < 1e-5);
        } else {
          REQUIRE(d > 1e-4);
        }
      }
  }
}

TEST_CASE("generate keeps the prompt, appends count tokens and greedy is deterministic", "[nn][generate][gemm]") {
  Generator gen(30);
  nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.2f), gen);
  const std::vector<std::int64_t> prompt = {3, 1, 4};
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  Generator g1(1), g2(2);
  const std::vector<std::int64_t> a = lm.generate(prompt, 8, greedy, g1);
  const std::vector<std::int64_t> b = lm.generate(prompt, 8, greedy, g2);
  REQUIRE(a.size() == prompt.size() + 8);
  REQUIRE(std::equal(prompt.begin(), prompt.end(), a.begin()));
  REQUIRE(a == b);
  for (std::int64_t id : a) {
    REQUIRE(id >= 0);
    REQUIRE(id < 7);
  }
  // the first new token is the arg-max of the model's last logits (in eval mode)
  lm.eval();
  const Array logits = lm.forward(IndexArray{{3, 1, 4}}).logits.value();
  lm.train();
  std::int64_t best = 0;
  for (std::int64_t v = 1; v < 7; ++v) best = logits(0, 2, v) > logits(0, 2, best) ? v : best;
  REQUIRE(a[3] == best);

  // every greedy token is the arg-max of the logits of the model run on the tokens so far
  // (the last max_len of them, with a window that slides by one), for several prompts and many
  // steps, with and without the cache
  lm.eval();
  nn::GenerateOptions sliding = greedy;
  sliding.window_keep = 5;
  for (const std::vector<std::int64_t>& p : std::vector<std::vector<std::int64_t>>{{0}, {6, 6}, {2, 5, 1, 0}, {4}}) {
    sliding.use_cache = p.size() % 2 == 0;
    const std::vector<std::int64_t> g = lm.generate(p, 12, sliding);
    REQUIRE(g.size() == p.size() + 12);
    for (std::size_t n = p.size(); n < g.size(); ++n) {
      const std::size_t T = std::min<std::size_t>(n, 6);
      IndexArray ids = IndexArray::from_shape({1, T});
      std::copy(g.begin() + static_cast<std::ptrdiff_t>(n - T), g.begin() + static_cast<std::ptrdiff_t>(n),
                ids.begin());
      const Array l = lm.forward(ids).logits.value();
      std::int64_t arg = 0;
      for (std::int64_t v = 1; v < 7; ++v) arg = l(0, T - 1, v) > l(0, T - 1, arg) ? v : arg;
      INFO("prompt size " << p.size() << ", token " << n);
      CHECK(g[n] == arg);
    }
  }
  lm.train();

  // top_k 1 is greedy whatever the temperature and generator
  nn::GenerateOptions top1;
  top1.temperature = 1.5f;
  top1.top_k = 1;
  Generator g3(3);
  REQUIRE(lm.generate(prompt, 8, top1, g3) == a);

  // sampling: reproducible from the generator's seed, and within the vocabulary
  nn::GenerateOptions sample;
  Generator s1(9), s2(9);
  const std::vector<std::int64_t> x = lm.generate({5}, 10, sample, s1);
  REQUIRE(x == lm.generate({5}, 10, sample, s2));
  for (int rep = 0; rep < 5; ++rep) {
    Generator s3(9);
    CHECK(lm.generate({5}, 10, sample, s3) == x);
  }
  REQUIRE(x.size() == 11);
  REQUIRE(x[0] == 5);

  // a prompt longer than max_len is fine (the model sees the last max_len tokens)
  const std::vector<std::int64_t> longp = {1, 2, 3, 4, 5, 6, 0, 1, 2};
  const std::vector<std::int64_t> y = lm.generate(longp, 3, greedy);
  REQUIRE(y.size() == 12);
  REQUIRE(std::equal(longp.begin(), longp.end(), y.begin()));
  // count 0 returns the prompt
  REQUIRE(lm.generate(prompt, 0, greedy) == prompt);
}

TEST_CASE("generate restores the training flag and records nothing on the tape", "[nn][generate][gemm]") {
  Generator gen(31);
  nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 1).max_len(6), gen);
  REQUIRE(grad_enabled());
  lm.train();
  const std::size_t before = tape_size();
  lm.generate({1, 2}, 5);
  REQUIRE(tape_size() == before);
  REQUIRE(lm.is_training());
  REQUIRE(lm.blocks[0]->attn->is_training());
  REQUIRE(grad_enabled());
  lm.eval();
  lm.generate({1, 2}, 5);
  REQUIRE_FALSE(lm.is_training());
  REQUIRE_FALSE(lm.blocks[0]->attn->is_training());
  REQUIRE(tape_size() == before);
  // a failing generate (a token outside the vocabulary) restores it too
  lm.train();
  REQUIRE_THAT(error_of([&] { lm.generate({1, 9}, 3); }), Contains("token id 9"));
  REQUIRE(lm.is_training());
  REQUIRE(lm.head->is_training());
  REQUIRE(grad_enabled());
}

TEST_CASE("generate rejects an empty prompt and a negative temperature", "[nn][generate][errors]") {
  Generator gen(32);
  nn::LanguageModel lm(tiny_lm(), gen);
  REQUIRE_THAT(error_of([&] { lm.generate({}, 3); }), Contains("generate") && Contains("empty"));
  nn::GenerateOptions neg;
  neg.temperature = -0.5f;
  REQUIRE_THAT(error_of([&] { lm.generate({1}, 3, neg); }), Contains("generate") && Contains("-0.5"));
  nn::GenerateOptions nan;
  nan.temperature = std::nanf("");
  REQUIRE_THAT(error_of([&] { lm.generate({1}, 3, nan); }), Contains("generate") && Contains("temperature"));
  REQUIRE(lm.is_training());
}

TEST_CASE("ModuleList is indexable, typed and iterable, and says which index is out of range", "[nn][module]") {
  Generator gen(41);
  nn::ModuleList list;
  auto a = list.push_back(std::make_shared<nn::Linear>(2, 3, true, gen));
  auto b = list.push_back(std::make_shared<nn::LayerNorm>(3));
  REQUIRE(list.size() == 2);
  REQUIRE(list[0].get() == a.get());
  REQUIRE(list.at<nn::LayerNorm>(1).get() == b.get());
  std::vector<nn::Module*> seen;
  for (const auto& m : list) seen.push_back(m.get());
  REQUIRE(seen == std::vector<nn::Module*>{a.get(), b.get()});
  REQUIRE_THROWS_WITH(list[2],
                      Catch::Contains("ModuleList") && Catch::Contains("index 2") && Catch::Contains("2 modules"));
  REQUIRE_THROWS_WITH(list.at<nn::LayerNorm>(0), Catch::Contains("ModuleList") && Catch::Contains("module 0"));
  REQUIRE_THROWS_WITH(list.at<nn::Linear>(5), Catch::Contains("index 5"));
  // The language model's blocks are a ModuleList under "blocks".
  nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6), gen);
  REQUIRE(lm.named_modules()[3].first == "blocks");
}

TEST_CASE("attention and feed-forward draw dropout from their own streams, on any thread",
          "[nn][dropout][threads][gemm]") {
  Generator gen(61);
  nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.3f), gen);
  IndexArray ids = IndexArray::from_shape({2, 6});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>(i % 7);
  nn::seed_dropout(lm, 5);
  const Array here = lm.forward(ids).logits.value();
  // The same seed on a new thread (whose default generator starts at seed 0): the same masks.
  Array there;
  nn::seed_dropout(lm, 5);
  std::thread([&] { there = lm.forward(ids).logits.value(); }).join();
  REQUIRE(here == there);
  // Another seed, other masks; the default generator plays no part.
  nn::seed_dropout(lm, 6);
  manual_seed(5);
  REQUIRE(max_abs_diff(lm.forward(ids).logits.value(), here) > 1e-4);

  // Each module has its own stream unless given one to share.
  auto& a0 = *lm.blocks[0]->attn;
  auto& a1 = *lm.blocks[1]->attn;
  REQUIRE(&a0.generator() != &a1.generator());
  auto shared = std::make_shared<Generator>(9);
  a0.set_generator(shared);
  a1.set_generator(shared);
  REQUIRE(&a0.generator() == &a1.generator());
  REQUIRE_THROWS_WITH(a0.set_generator(nullptr), Catch::Contains("set_generator") && Catch::Contains("null"));
}

TEST_CASE("norm_eps reaches every LayerNorm of a block and a language model", "[nn][module]") {
  Generator gen(63);
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    nn::LanguageModel lm(tiny_lm(norm).num_layers(2).norm_eps(1e-3f), gen);
    std::size_t norms = 0;
    for (auto& [path, m] : lm.named_modules()) {
      if (auto* ln = dynamic_cast<nn::LayerNorm*>(m)) {
        INFO(path);
        REQUIRE(ln->eps() == 1e-3f);
        ++norms;
      }
    }
    REQUIRE(norms == (norm == nn::Norm::pre ? 5u : 4u));  // two per block, and the final norm
    nn::TransformerBlock block(nn::TransformerBlockOptions(8, 2).norm(norm).norm_eps(0.5f), gen);
    REQUIRE(block.attn->norm->eps() == 0.5f);
    REQUIRE(block.ffn->norm->eps() == 0.5f);
  }
}

TEST_CASE("a module cannot be registered inside its own tree", "[modules][bad_input][bug]") {
  // Itself, its parent or its grandparent as a child: every path would be endless (named_parameters
  // built "me.me.me..." until std::bad_alloc).
  auto top = std::make_shared<Probe>(), mid = std::make_shared<Probe>(), leaf = std::make_shared<Probe>();
  top->register_module("mid", mid);
  mid->register_module("leaf", leaf);
  REQUIRE_THROWS_WITH(
      top->register_module("me", top),
      "Module::register_module: module 'me' is this module or holds it: a module cannot be its own descendant");
  REQUIRE_THROWS_WITH(leaf->register_module("up", mid),
                      Catch::Matchers::Contains("module 'up' is this module or holds it"));
  REQUIRE_THROWS_WITH(leaf->register_module("top", top),
                      Catch::Matchers::Contains("module 'top' is this module or holds it"));
  // Nothing was registered; the tree is as it was, and a module shared by two parents is allowed.
  REQUIRE(top->named_modules().size() == 3);
  auto other = std::make_shared<Probe>();
  other->register_module("leaf", leaf);
  REQUIRE(other->named_modules().size() == 2);
}
