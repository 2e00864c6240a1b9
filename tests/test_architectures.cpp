// The architecture options of LanguageModel (docs/architectures.md): gradients of every variant
// by finite differences, the KV cache of grouped-query attention, cached against uncached
// forwards, padded batches with RoPE, tied embeddings, GPT-2 initialization, the presets, the
// options' JSON, the new hook points and the options' checks. Agreement with PyTorch is in
// test_arch_agreement.cpp.
//
// Shapes: B batch, T length, C d_model, H heads, KV key/value heads, D = C / H, V vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/nn/weight_decay.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"

#include "module_gradcheck.hpp"
#include "peak_memory.hpp"  // kAddressSanitizer

using namespace xgrad;
using Catch::Matchers::Contains;
using testing::check_module_grads;
using testing::Ins;
using testing::randn;
using testing::randomize_norms;

namespace {

// A named model variant: V 11, C 16, H 4, D 4, 2 layers.
struct Variant {
  const char* name;
  nn::LanguageModelOptions options;
};

nn::LanguageModelOptions base() { return nn::LanguageModelOptions(11, 16, 4, 2).d_ff(12).max_len(12).dropout(0.f); }

std::vector<Variant> variants() {
  return {
      {"llama (rms_norm, rotary, swiglu, gqa, no bias)",
       nn::LanguageModelOptions::llama_style(11, 16, 4, 2, 2).d_ff(12).max_len(12).dropout(0.f)},
      {"mqa, qk_norm, partial rotary, tied",
       base().positional(nn::Positional::rotary).rotary_dim(2).num_kv_heads(1).qk_norm(true).tie_embeddings(true)},
      {"post-norm rms_norm, geglu, sinusoidal", base()
                                                    .norm(nn::Norm::post)
                                                    .norm_kind(nn::NormKind::rms_norm)
                                                    .activation(nn::Activation::geglu)
                                                    .positional(nn::Positional::sinusoidal)},
      {"geglu_tanh, no positions, LayerNorm without bias, gpt2 init", base()
                                                                          .activation(nn::Activation::geglu_tanh)
                                                                          .positional(nn::Positional::none)
                                                                          .norm_bias(false)
                                                                          .init(nn::Init::gpt2)},
      {"gpt2 style", nn::LanguageModelOptions::gpt2_style(11, 16, 4, 2).max_len(12).dropout(0.f)},
      {"gemma (sandwich (1 + w) RMSNorms, caps, a windowed and a full block, local RoPE base, scaled embeddings)",
       base()
           .norm(nn::Norm::sandwich)
           .norm_kind(nn::NormKind::rms_norm)
           .norm_unit_offset(true)
           .activation(nn::Activation::geglu_tanh)
           .positional(nn::Positional::rotary)
           .qk_norm(true)
           .head_dim(8)
           .num_kv_heads(2)
           .sliding_window(3)
           .full_attention_layers({1})
           .rope_local_theta(100.f)
           .attn_scale(0.3f)
           .attn_softcap(1.5f)
           .final_softcap(2.f)
           .embed_scale(4.f)
           .tie_embeddings(true)},
  };
}

IndexArray row(const std::vector<std::int64_t>& v) {
  IndexArray ids = IndexArray::from_shape({1, v.size()});
  for (std::size_t i = 0; i < v.size(); ++i) ids(0, i) = v[i];
  return ids;
}

float max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.data()[i] - b.data()[i]));
  return m;
}

}  // namespace

// Every element of every parameter; under AddressSanitizer, where the same forwards and backwards
// run 20 times slower, 16 of each parameter (the Release passes compare them all).
TEST_CASE("architectures: the loss gradient of every parameter of every variant", "[nn][gradcheck][arch][gemm][long]") {
  const IndexArray ids = {{0, 3, 6, 1, 10, 5}, {2, 4, 4, 0, 6, 9}};
  const IndexArray targets = {{3, 6, 1, 10, 5, -100}, {-100, 4, 0, 6, 9, 2}};
  GradcheckOptions options;
  options.max_elements = testing::kAddressSanitizer ? 16 : 0;
  for (const Variant& v : variants()) {
    INFO(v.name);
    Generator gen(60);
    nn::LanguageModel lm(v.options, gen);
    randomize_norms(lm, 61);
    const GradcheckResult res = check_module_grads(
        lm, [&](const Ins&) { return lm.loss(ids, targets); }, {}, options);
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.tensors == lm.named_parameters().size());
    std::size_t expected = 0;
    for (const auto& [name, p] : lm.named_parameters())
      expected += options.max_elements ? std::min(p.size(), options.max_elements) : p.size();
    REQUIRE(res.checked == expected);
    if (options.max_elements == 0) REQUIRE(res.checked == lm.num_parameters());
  }
}

TEST_CASE("architectures: attention gradients with grouped-query heads, QK-norm and RoPE, input included",
          "[nn][gradcheck][arch][gemm]") {
  for (std::size_t kv : {4u, 2u, 1u}) {
    INFO("num_kv_heads " << kv);
    Generator gen(70);
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(16, 4)
                                   .num_kv_heads(kv)
                                   .dropout(0.f)
                                   .qk_norm(true)
                                   .rotary(true)
                                   .rotary_dim(2)
                                   .rope_theta(100.f)
                                   .norm_options(nn::NormOptions().kind(nn::NormKind::rms_norm)),
                               gen);
    randomize_norms(mha, 71);
    REQUIRE(mha.w_k->weight.shape() == Shape{kv * 4, 16});
    REQUIRE(mha.w_v->weight.shape() == Shape{kv * 4, 16});
    nn::AttentionMask mask;
    mask.causal = true;
    const Tensor x = randn({2, 5, 16}, 72);
    const GradcheckResult res =
        check_module_grads(mha, [&](const Ins& in) { return mha.forward(in[0], mask).output; }, {x});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.tensors == 1 + mha.named_parameters().size());
  }
}

TEST_CASE("architectures: gated feed-forward gradients, with and without biases", "[nn][gradcheck][arch][gemm]") {
  for (nn::Activation act : {nn::Activation::swiglu, nn::Activation::geglu, nn::Activation::geglu_tanh}) {
    for (bool bias : {true, false}) {
      INFO("activation " << static_cast<int>(act) << ", bias " << bias);
      Generator gen(80);
      nn::FeedForward ffn(nn::FeedForwardOptions(6, 10).activation(act).dropout(0.f).bias(bias), gen);
      REQUIRE(ffn.gate);
      REQUIRE(ffn.named_parameters().size() == (bias ? 6u : 3u));
      const Tensor x = randn({2, 3, 6}, 81);
      const GradcheckResult res = check_module_grads(ffn, [&](const Ins& in) { return ffn.forward(in[0]); }, {x});
      INFO(res.report);
      REQUIRE(res.ok);
    }
  }
}

TEST_CASE("architectures: a gated feed-forward computes linear2(act(gate(x)) * linear1(x))", "[nn][arch][gemm]") {
  Generator gen(82);
  nn::FeedForward ffn(nn::FeedForwardOptions(6, 10).activation(nn::Activation::swiglu).dropout(0.f), gen);
  const Tensor x = randn({2, 3, 6}, 83);
  NoGradGuard no_grad;
  const Tensor g = ffn.gate->forward(x);
  const Tensor want = ffn.linear2->forward(g * sigmoid(g) * ffn.linear1->forward(x));
  REQUIRE(max_abs_diff(ffn.forward(x).value(), want.value()) < 1e-5f);
}

TEST_CASE("architectures: the KV cache holds only the key/value heads and shrinks by the group size",
          "[nn][arch][cache][gemm]") {
  std::vector<std::size_t> bytes;
  for (std::size_t kv : {4u, 2u, 1u}) {
    Generator gen(90);
    nn::LanguageModel lm(base().positional(nn::Positional::rotary).num_kv_heads(kv), gen);
    nn::LanguageModelCache cache;
    NoGradGuard no_grad;
    lm.forward_cached(row({1, 2, 3, 4, 5}), cache);
    std::size_t total = 0;
    for (const nn::KVCache& c : cache.blocks) {
      REQUIRE(c.keys().shape() == Shape{1, 5, kv * 4});
      REQUIRE(c.values().shape() == Shape{1, 5, kv * 4});
      total += (c.keys().size() + c.values().size()) * sizeof(float);
    }
    bytes.push_back(total);
  }
  REQUIRE(bytes[0] == 2 * bytes[1]);
  REQUIRE(bytes[0] == 4 * bytes[2]);
}

TEST_CASE("architectures: cached forwards, one position at a time, give the uncached logits and weights",
          "[nn][arch][cache][gemm]") {
  const std::vector<std::int64_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  for (const Variant& v : variants()) {
    INFO(v.name);
    Generator gen(91);
    nn::LanguageModel lm(v.options, gen);
    NoGradGuard no_grad;
    const nn::LanguageModelOutput whole = lm.forward(row(tokens));
    nn::LanguageModelCache cache;
    lm.forward_cached(row({3, 1, 4}), cache);  // a prompt of 3, then one token at a time
    for (std::size_t t = 3; t < tokens.size(); ++t) {
      const nn::LanguageModelOutput step = lm.forward_cached(row({tokens[t]}), cache);
      const Array want = xt::view(whole.logits.value(), xt::all(), xt::range(t, t + 1), xt::all());
      REQUIRE(max_abs_diff(step.logits.value(), want) < 2e-5f);
      const Array attn =
          xt::view(whole.attentions[1].value(), xt::all(), xt::all(), xt::range(t, t + 1), xt::range(0, t + 1));
      REQUIRE(max_abs_diff(step.attentions[1].value(), attn) < 2e-6f);
    }
    // generate with and without the cache picks the same tokens
    Generator g1(5), g2(5);
    nn::GenerateOptions cached, uncached;
    uncached.use_cache = false;
    REQUIRE(lm.generate({1, 2}, 8, cached, g1) == lm.generate({1, 2}, 8, uncached, g2));
  }
}

TEST_CASE("architectures: in a padded batch each row gets the logits it gets alone, with RoPE too",
          "[nn][arch][padding][gemm]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    Generator gen(92);
    nn::LanguageModel lm(v.options, gen);
    NoGradGuard no_grad;
    // Row 0: two padding tokens on the left; row 1: one on the right.
    const IndexArray ids = {{0, 0, 5, 6, 7, 8}, {1, 2, 3, 4, 5, 0}};
    Mask pad = xt::zeros<bool>({2, 6});
    pad(0, 0) = pad(0, 1) = true;
    pad(1, 5) = true;
    const Array batch = lm.forward(ids, pad).logits.value();
    const Array alone0 = lm.forward(row({5, 6, 7, 8})).logits.value();
    const Array alone1 = lm.forward(row({1, 2, 3, 4, 5})).logits.value();
    REQUIRE(max_abs_diff(xt::view(batch, xt::range(0, 1), xt::range(2, 6), xt::all()), alone0) < 2e-5f);
    REQUIRE(max_abs_diff(xt::view(batch, xt::range(1, 2), xt::range(0, 5), xt::all()), alone1) < 2e-5f);
  }
}

TEST_CASE("architectures: tied embeddings are one parameter whose gradient sums both uses", "[nn][arch][tied][gemm]") {
  Generator gen(93);
  nn::LanguageModel tied(base().tie_embeddings(true), gen);
  REQUIRE(tied.head->weight.is_same(tied.tok_emb->weight));
  REQUIRE_FALSE(tied.head->bias.defined());
  std::size_t seen = 0;
  for (const auto& [name, p] : tied.named_parameters()) {
    REQUIRE(name.rfind("head.", 0) != 0);
    seen += p.is_same(tied.tok_emb->weight) ? 1 : 0;
  }
  REQUIRE(seen == 1);
  REQUIRE(weights::state_dict(tied).size() == tied.named_parameters().size());

  // The same weights untied, head.weight a copy: the tied gradient is the sum of the two.
  Generator gen2(93);
  nn::LanguageModel untied(base().head_bias(false), gen2);
  NamedArrays state = weights::state_dict(tied);
  state.emplace_back("head.weight", tied.tok_emb->weight.value());
  weights::load_state_dict(untied, state);
  const IndexArray ids = {{1, 2, 3, 4}}, targets = {{2, 3, 4, 5}};
  tied.loss(ids, targets).backward();
  untied.loss(ids, targets).backward();
  const Array sum = untied.tok_emb->weight.grad() + untied.head->weight.grad();
  REQUIRE(max_abs_diff(tied.tok_emb->weight.grad(), sum) < 1e-6f);

  // Saved and loaded, the tie holds.
  const std::string path = "test_architectures_tied.safetensors";
  weights::save_checkpoint(path, tied);
  weights::LoadedLanguageModel loaded = weights::load_language_model(path);
  REQUIRE(loaded.model->head->weight.is_same(loaded.model->tok_emb->weight));
  REQUIRE(max_abs_diff(loaded.model->tok_emb->weight.value(), tied.tok_emb->weight.value()) == 0.f);
  std::remove(path.c_str());
}

TEST_CASE("architectures: GPT-2 initialization draws N(0, 0.02), residual projections 0.02 / sqrt(2 L)",
          "[nn][arch][init]") {
  Generator gen(94);
  const std::size_t L = 4;
  nn::LanguageModel lm(nn::LanguageModelOptions(500, 64, 4, L).d_ff(256).init(nn::Init::gpt2), gen);
  auto stddev = [](const Array& a) {
    double s = 0, s2 = 0;
    for (float x : a) s += x, s2 += static_cast<double>(x) * x;
    const double n = static_cast<double>(a.size()), m = s / n;
    return std::sqrt(s2 / n - m * m);
  };
  REQUIRE(stddev(lm.tok_emb->weight.value()) == Approx(0.02).epsilon(0.03));
  REQUIRE(stddev(lm.pos_emb->weight.value()) == Approx(0.02).epsilon(0.05));
  REQUIRE(stddev(lm.head->weight.value()) == Approx(0.02).epsilon(0.03));
  const double residual = 0.02 / std::sqrt(2.0 * L);
  for (const auto& block : lm.blocks) {
    REQUIRE(stddev(block->attn->w_q->weight.value()) == Approx(0.02).epsilon(0.05));
    REQUIRE(stddev(block->attn->w_o->weight.value()) == Approx(residual).epsilon(0.05));
    REQUIRE(stddev(block->ffn->linear2->weight.value()) == Approx(residual).epsilon(0.05));
    REQUIRE(xt::amax(xt::abs(block->attn->w_q->bias.value()))() == 0.f);
    REQUIRE(xt::amin(block->attn->norm->weight.value())() == 1.f);
  }
  // Same seed, same weights; the default init is PyTorch's (Embedding N(0, 1)).
  Generator again(94);
  nn::LanguageModel twin(nn::LanguageModelOptions(500, 64, 4, L).d_ff(256).init(nn::Init::gpt2), again);
  REQUIRE(max_abs_diff(twin.blocks[3]->ffn->linear2->weight.value(), lm.blocks[3]->ffn->linear2->weight.value()) == 0);
  Generator other(94);
  nn::LanguageModel pytorch(nn::LanguageModelOptions(500, 64, 4, L).d_ff(256), other);
  REQUIRE(stddev(pytorch.tok_emb->weight.value()) == Approx(1.0).epsilon(0.03));
}

TEST_CASE("architectures: the presets, and parameter counts of equal size", "[nn][arch][presets]") {
  const auto gpt2 = nn::LanguageModelOptions::gpt2_style(256, 96, 4, 2);
  CHECK(gpt2.positional() == nn::Positional::learned);
  CHECK(gpt2.norm_kind() == nn::NormKind::layer_norm);
  CHECK(gpt2.activation() == nn::Activation::gelu_tanh);
  CHECK(gpt2.tie_embeddings());
  CHECK(gpt2.init() == nn::Init::gpt2);
  const auto llama = nn::LanguageModelOptions::llama_style(256, 96, 4, 2, 2);
  CHECK(llama.positional() == nn::Positional::rotary);
  CHECK(llama.norm_kind() == nn::NormKind::rms_norm);
  CHECK(llama.activation() == nn::Activation::swiglu);
  CHECK(llama.d_ff() == 256);  // 8 * 96 / 3
  CHECK(llama.num_kv_heads() == 2);
  CHECK_FALSE((llama.qkv_bias() || llama.out_bias() || llama.ffn_bias() || llama.head_bias()));
  Generator gen(95);
  nn::LanguageModel a(llama, gen);
  for (const auto& [name, p] : a.named_parameters()) {
    INFO(name);
    CHECK(name.find(".bias") == std::string::npos);
  }
  REQUIRE(a.blocks[0]->attn->w_k->weight.shape() == Shape{48, 96});
}

TEST_CASE("architectures: the options' JSON holds every field, and old files read as the classic model",
          "[nn][arch][options]") {
  const auto o = nn::LanguageModelOptions::llama_style(300, 32, 8, 3, 2)
                     .rotary_dim(2)
                     .rope_theta(5e5f)
                     .qk_norm(true)
                     .tie_embeddings(true)
                     .norm_eps(1e-6f)
                     .max_len(64);
  const std::string text = weights::to_json(o);
  const nlohmann::json j = nlohmann::json::parse(text);
  for (const char* field :
       {"num_kv_heads", "norm_kind", "norm_eps", "norm_affine", "norm_bias", "rope_theta", "rotary_dim", "qk_norm",
        "qkv_bias", "out_bias", "ffn_bias", "head_bias", "tie_embeddings", "init"}) {
    INFO(field);
    CHECK(j.contains(field));
  }
  CHECK(j.at("activation") == "swiglu");
  CHECK(j.at("positional") == "rotary");
  CHECK(j.at("norm_kind") == "rms_norm");
  const nn::LanguageModelOptions back = weights::language_model_options_from_json(text, "test");
  CHECK(weights::architecture_differences(o, back).empty());
  CHECK(weights::to_json(back) == text);

  // A file written before these options: layer_norm_eps, no new fields.
  const std::string old =
      R"({"vocab_size":7,"d_model":8,"num_heads":2,"num_layers":1,"d_ff":16,"max_len":6,"dropout":0.1,)"
      R"("norm":"post","activation":"relu","positional":"sinusoidal","layer_norm_eps":0.001})";
  const nn::LanguageModelOptions classic = weights::language_model_options_from_json(old, "test");
  CHECK(classic.norm_eps() == 1e-3f);
  CHECK(classic.norm_kind() == nn::NormKind::layer_norm);
  CHECK(classic.num_kv_heads() == 0);
  CHECK((classic.qkv_bias() && classic.out_bias() && classic.ffn_bias() && classic.head_bias()));
  CHECK_FALSE(classic.tie_embeddings());
  CHECK(classic.init() == nn::Init::pytorch);
  CHECK_THROWS_WITH(
      weights::language_model_options_from_json(old.substr(0, old.size() - 1) + R"(,"norm_eps":0.001})", "who"),
      Contains("who: the model options hold both \"norm_eps\" and its old name \"layer_norm_eps\""));
  nlohmann::json bad = j;
  bad["norm_kind"] = "batch_norm";
  CHECK_THROWS_WITH(weights::language_model_options_from_json(bad.dump(), "who"),
                    Contains("model option norm_kind = \"batch_norm\" is not one of layer_norm, rms_norm"));
  bad = j;
  bad["activation"] = "swish";
  CHECK_THROWS_WITH(weights::language_model_options_from_json(bad.dump(), "who"),
                    Contains("model option activation = \"swish\" is not one of gelu, gelu_tanh, relu, swiglu"));
  bad = j;
  bad["qk_norm"] = 1;
  CHECK_THROWS_WITH(weights::language_model_options_from_json(bad.dump(), "who"),
                    Contains("model option qk_norm = 1 is not true or false"));
  bad = j;
  bad["num_kv_heads"] = 3;
  CHECK_THROWS_WITH(weights::language_model_options_from_json(bad.dump(), "who"),
                    Contains("who: MultiHeadAttention: num_heads 8 is not divisible by num_kv_heads 3"));
  bad = j;
  bad["rotary_dim"] = 6;
  CHECK_THROWS_WITH(weights::language_model_options_from_json(bad.dump(), "who"),
                    Contains("rotary_dim 6 must be even and at most the head size 4"));
}

TEST_CASE("bad input: every architecture option is checked before anything is built, naming it",
          "[nn][arch][bad_input][gemm]") {
  using nn::LanguageModel;
  CHECK_THROWS_WITH(LanguageModel::check(base().num_kv_heads(3)),
                    Contains("MultiHeadAttention: num_heads 4 is not divisible by num_kv_heads 3"));
  CHECK_THROWS_WITH(LanguageModel::check(base().num_kv_heads(8)),
                    Contains("MultiHeadAttention: num_heads 4 is not divisible by num_kv_heads 8"));
  CHECK_THROWS_WITH(LanguageModel::check(base().positional(nn::Positional::rotary).rotary_dim(3)),
                    Contains("MultiHeadAttention: rotary_dim 3 must be even and at most the head size 4"));
  CHECK_THROWS_WITH(LanguageModel::check(base().positional(nn::Positional::rotary).rotary_dim(6)),
                    Contains("MultiHeadAttention: rotary_dim 6 must be even and at most the head size 4"));
  for (float theta : {0.f, -1.f, INFINITY, NAN}) {
    CHECK_THROWS_WITH(LanguageModel::check(base().positional(nn::Positional::rotary).rope_theta(theta)),
                      Contains("MultiHeadAttention: rope_theta ") && Contains(" must be finite and > 0"));
  }
  CHECK_THROWS_WITH(LanguageModel::check(base().norm_eps(0.f)), Contains("LanguageModel: norm_eps 0 must be finite"));
  CHECK_THROWS_WITH(LanguageModel::check(base().norm_kind(static_cast<nn::NormKind>(7))),
                    Contains("MultiHeadAttention: unknown norm kind 7"));
  CHECK_THROWS_WITH(LanguageModel::check(base().positional(static_cast<nn::Positional>(9))),
                    Contains("LanguageModel: unknown positional 9"));
  CHECK_THROWS_WITH(LanguageModel::check(base().init(static_cast<nn::Init>(5))),
                    Contains("LanguageModel: unknown init 5"));
  CHECK_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(4, 8).activation(static_cast<nn::Activation>(11))),
                    Contains("FeedForward: unknown activation 11"));
  CHECK_THROWS_WITH(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(8, 2).rotary(true))
                        .forward(randn({1, 2, 8}, 1), randn({1, 3, 8}, 2), randn({1, 3, 8}, 3)),
                    Contains("MultiHeadAttention: rotary positions apply to self-attention only"));
  // A KV cache of another number of key/value heads does not continue the input.
  Generator gen(96);
  nn::Attention gqa(nn::MultiHeadAttentionOptions(8, 2).num_kv_heads(1).dropout(0.f), gen);
  nn::Attention mha(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
  nn::KVCache cache;
  mha.forward(randn({1, 3, 8}, 5), {}, &cache);
  CHECK_THROWS_WITH(gqa.forward(randn({1, 1, 8}, 4), {}, &cache),
                    Contains("the KVCache holds keys (1, 3, 8)") && Contains("(keys (B, P, 4))"));
}

TEST_CASE("architectures: hook points rot_q, rot_k and pre_linear see what the layers compute",
          "[nn][arch][hooks][gemm]") {
  Generator gen(97);
  nn::LanguageModel lm(nn::LanguageModelOptions::llama_style(11, 16, 4, 1, 2).d_ff(12).max_len(12).dropout(0.f), gen);
  const std::vector<std::string> points = lm.hook_points();
  for (const char* p :
       {"blocks.0.attn.rot_q", "blocks.0.attn.rot_k", "blocks.0.ffn.pre_linear", "blocks.0.ffn.hidden"}) {
    INFO(p);
    CHECK(std::find(points.begin(), points.end(), p) != points.end());
  }
  Tensor q, rot_q, k, rot_k, up;
  auto keep = [](Tensor& into) {
    return [&into](const Tensor& t) {
      into = t;
      return t;
    };
  };
  auto h1 = lm.add_forward_hook("blocks.0.attn.q", keep(q));
  auto h2 = lm.add_forward_hook("blocks.0.attn.rot_q", keep(rot_q));
  auto h3 = lm.add_forward_hook("blocks.0.attn.k", keep(k));
  auto h4 = lm.add_forward_hook("blocks.0.attn.rot_k", keep(rot_k));
  auto h5 = lm.add_forward_hook("blocks.0.ffn.pre_linear", keep(up));
  NoGradGuard no_grad;
  lm.forward(row({1, 2, 3, 4}));
  const IndexArray positions = {0, 1, 2, 3};
  REQUIRE(k.shape() == Shape{1, 4, 8});
  REQUIRE(max_abs_diff(rot_q.value(), rotary_embedding(q, 4, positions).value()) == 0.f);
  REQUIRE(max_abs_diff(rot_k.value(), rotary_embedding(k, 2, positions).value()) == 0.f);
  REQUIRE(up.shape() == Shape{1, 4, 12});
}

TEST_CASE("architectures: the weight-decay split of a tied Llama-style model decays only the Linear weights",
          "[nn][arch][optim]") {
  Generator gen(98);
  nn::LanguageModel lm(nn::LanguageModelOptions::llama_style(11, 16, 4, 2, 2).tie_embeddings(true).max_len(12), gen);
  const auto [decay, no_decay] = nn::split_for_weight_decay(lm);
  std::vector<std::string> names;
  for (const auto& [name, p] : decay) {
    INFO(name);
    names.push_back(name);
    CHECK(p.ndim() == 2);
    CHECK(name.rfind("blocks.", 0) == 0);
  }
  CHECK(decay.size() == 2 * 7);  // per block: w_q, w_k, w_v, w_o, gate, linear1, linear2
  std::size_t embedding = 0;
  for (const auto& [name, p] : no_decay) {
    INFO(name);
    embedding += p.is_same(lm.tok_emb->weight) ? 1 : 0;
    CHECK((name == "tok_emb.weight" || name.find("norm") != std::string::npos));
  }
  CHECK(embedding == 1);
  CHECK(decay.size() + no_decay.size() == lm.named_parameters().size());
  optim::AdamW opt(optim::decay_groups(nn::split_for_weight_decay(lm), 0.1f), optim::AdamOptions(1e-3f));
  CHECK(opt.num_groups() == 2);
}

TEST_CASE("architectures: patching one key/value head of grouped-query attention replaces only its columns",
          "[nn][arch][inspect][gemm]") {
  Generator gen(99);
  nn::LanguageModel lm(nn::LanguageModelOptions::llama_style(11, 16, 4, 1, 2).d_ff(12).max_len(12).dropout(0.f), gen);
  NoGradGuard no_grad;
  const IndexArray clean = {{1, 2, 3, 4}}, corrupt = {{5, 6, 7, 8}};
  const auto k_only = inspect::points_ending_with({"attn.k"});
  const inspect::ActivationCache source = inspect::cache_activations(
      lm, [&] { lm.forward(clean); }, k_only);
  const inspect::ActivationCache plain = inspect::cache_activations(
      lm, [&] { lm.forward(corrupt); }, k_only);
  inspect::PatchSet patch(lm, source, {{"blocks.0.attn.k", 1, std::nullopt}});
  const inspect::ActivationCache patched = inspect::cache_activations(
      lm, [&] { lm.forward(corrupt); }, k_only);
  const Array &k = patched.at("blocks.0.attn.k"), &want = source.at("blocks.0.attn.k"),
              &own = plain.at("blocks.0.attn.k");
  REQUIRE(k.shape() == Shape{1, 4, 8});  // 2 key/value heads of D 4
  for (std::size_t t = 0; t < 4; ++t) {
    for (std::size_t c = 0; c < 8; ++c) REQUIRE(k(0, t, c) == (c >= 4 ? want(0, t, c) : own(0, t, c)));
  }
  REQUIRE(own(0, 1, 0) != want(0, 1, 0));
  CHECK_THROWS_WITH(inspect::PatchSet(lm, source, {{"blocks.0.attn.k", 2, std::nullopt}}),
                    Contains("PatchSet: head 2 at point 'blocks.0.attn.k', whose attention has 2 key/value heads"));
}

TEST_CASE("architectures: Gemma's options are checked by name before anything is built", "[nn][arch][bad_input]") {
  const nn::LanguageModelOptions ok = base().positional(nn::Positional::rotary).sliding_window(3);
  auto error = [](const nn::LanguageModelOptions& o) {
    try {
      nn::LanguageModel::check(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK(error(nn::LanguageModelOptions(ok).full_attention_layers({1}).rope_local_theta(100.f)) == "(accepted)");
  CHECK_THAT(error(base().full_attention_layers({1})),
             Contains("LanguageModel: full_attention_layers and rope_local_theta apply to windowed blocks; "
                      "sliding_window is 0"));
  CHECK_THAT(error(base().rope_local_theta(100.f)), Contains("sliding_window is 0"));
  CHECK_THAT(error(nn::LanguageModelOptions(ok).full_attention_layers({2})),
             Contains("full_attention_layers[0] = 2 is not a block index in increasing order below num_layers 2"));
  CHECK_THAT(error(nn::LanguageModelOptions(ok).full_attention_layers({1, 1})),
             Contains("full_attention_layers[1] = 1 is not a block index"));
  CHECK_THAT(error(nn::LanguageModelOptions(ok).rope_local_theta(-1.f)),
             Contains("LanguageModel: rope_local_theta -1 must be finite and >= 0 (0: rope_theta)"));
  CHECK_THAT(error(base().norm_unit_offset(true)),
             Contains("MultiHeadAttention: norm unit_offset (a scale of 1 + weight) needs an RMSNorm with a weight"));
  CHECK_THAT(error(base().norm_kind(nn::NormKind::rms_norm).norm_affine(false).norm_unit_offset(true)),
             Contains("needs an RMSNorm with a weight"));
  CHECK_THAT(error(base().attn_softcap(-1.f)),
             Contains("LanguageModel: attn_softcap -1 must be finite and >= 0 (0: none)"));
  CHECK_THAT(error(base().attn_scale(std::nanf(""))),
             Contains("LanguageModel: attn_scale nan must be finite and >= 0"));
  CHECK_THAT(error(base().final_softcap(INFINITY)),
             Contains("LanguageModel: final_softcap inf must be finite and >= 0"));
  CHECK_THAT(error(base().embed_scale(0.f)), Contains("LanguageModel: embed_scale 0 must be finite and > 0"));
  CHECK_THAT(error(base().norm(nn::Norm::none)),
             Contains("LanguageModel: norm must be Norm::pre, Norm::post or Norm::sandwich"));
  CHECK_THROWS_WITH(nn::RMSNorm(4, 1e-6f, false, true),
                    Contains("RMSNorm: unit_offset (a scale of 1 + weight) needs a weight"));
  // A (1 + w) norm starts at the identity scale: its weight is 0.
  const nn::RMSNorm gemma_norm(4, 1e-6f, true, true);
  CHECK(xt::amax(xt::abs(gemma_norm.weight.value()))() == 0.f);
}

TEST_CASE("architectures: attention with a scale and a soft cap, and sandwich norms, gradchecked with the input",
          "[nn][gradcheck][arch][gemm]") {
  for (const nn::Norm norm : {nn::Norm::pre, nn::Norm::sandwich}) {
    INFO("sandwich " << (norm == nn::Norm::sandwich));
    Generator gen(73);
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(16, 4)
                                   .num_kv_heads(2)
                                   .dropout(0.f)
                                   .norm(norm)
                                   .qk_norm(true)
                                   .rotary(true)
                                   .sliding_window(2)
                                   .scale(0.35f)
                                   .logit_softcap(1.f)
                                   .norm_options(nn::NormOptions().kind(nn::NormKind::rms_norm).unit_offset(true)),
                               gen);
    randomize_norms(mha, 74);
    for (auto& [name, p] : mha.named_parameters()) {  // (1 + w) scales near 1, as randomize_norms means
      if (name.find("norm.weight") != std::string::npos) p.mutable_value() -= 1.f;
    }
    REQUIRE(static_cast<bool>(mha.post_norm) == (norm == nn::Norm::sandwich));
    nn::AttentionMask mask;
    mask.causal = true;
    const Tensor x = randn({2, 5, 16}, 75);
    // A step of 2e-2: float32 rounding of the projected output limits the central differences more
    // than curvature here (largest |analytic - numeric| 1.3e-4 at 2e-2 against 3.1e-4 at 1e-2 in
    // the sanitizer build, measured; the tolerance is 2e-4 + 2e-3 |numeric|).
    GradcheckOptions step;
    step.eps = 2e-2;
    const GradcheckResult res = check_module_grads(
        mha, [&](const Ins& in) { return mha.forward(in[0], mask).output; }, {x}, step);
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.tensors == 1 + mha.named_parameters().size());
    // the cap bends the scores: without it the output differs
    Generator same(73);
    nn::MultiHeadAttention uncapped(nn::MultiHeadAttentionOptions(mha.options()).logit_softcap(0.f), same);
    weights::load_state_dict(uncapped, weights::state_dict(mha));
    NoGradGuard no_grad;
    const Array a = mha.forward(x, mask).output.value(), b = uncapped.forward(x, mask).output.value();
    CHECK(xt::amax(xt::abs(a - b))() > 1e-3);
  }
}
