// Gemma 2 and Gemma 3 folders (and Qwen 2's per-layer windows) against the float64 mirror of
// tests/fixtures/make_hf_family_fixtures.py: logits, loss and gradients; each Gemma feature
// switched off moves the logits; generation with and without the cache (the cached forward is in
// test_hf_families.cpp); the inspection tools; the
// checkpoint round trip of the new options; and what the Gemma readers refuse.
// Shapes: B 2, T 7, V 23, C 16, H 4, KV 2, D 8, three layers (Qwen 2: two).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "hf_families.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/logit_lens.hpp"
#include "xgrad/inspect/residual_decomposition.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;
using testing::as_ids;
using testing::expected;
using testing::folder;
using testing::kLogitTol;
using Broken = testing::BrokenFolder;

namespace {

using Layers = std::vector<std::size_t>;

// The fixture's logits under `options`, with the folder's weights.
Array logits_with(const std::string& name, const nn::LanguageModelOptions& options) {
  const auto loaded = weights::load_hf_model(folder(name));
  Generator gen(1);
  nn::LanguageModel model(options, gen);
  weights::load_state_dict(model, weights::state_dict(*loaded));
  model.eval();
  NoGradGuard no_grad;
  return model.forward(as_ids(expected(name).at("ids"))).logits.value();
}

double max_abs_diff(const Array& a, const Array& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::abs(a.data()[i] - b.data()[i])));
  return m;
}

}  // namespace

TEST_CASE("Gemma 2, Gemma 3 and windowed Qwen 2 folders load with the logits, loss and gradients of the PyTorch mirror",
          "[hf_families][gemm]") {
  struct Case {
    const char* name;
    Layers full;
    float attn_cap, final_cap, local_theta;
    bool qk_norm, tied;
    std::size_t window;
  };
  const Case cases[] = {{"gemma2", {1}, 1.5f, 2.f, 0.f, false, true, 3},
                        {"gemma3", {2}, 0.f, 0.f, 1e4f, true, true, 4},
                        {"gemma3_scaled", {0}, 2.5f, 3.f, 1e4f, true, false, 4},
                        {"qwen2_window", {0}, 0.f, 0.f, 0.f, false, false, 3}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      const auto model = weights::load_hf_model(folder(c.name));
      const nn::LanguageModelOptions& o = model->options();
      CHECK(weights::to_json(weights::hf_model_options(folder(c.name))) == weights::to_json(o));
      const bool gemma = std::string(c.name) != "qwen2_window";
      CHECK(o.norm() == (gemma ? nn::Norm::sandwich : nn::Norm::pre));
      CHECK(o.norm_unit_offset() == gemma);
      CHECK(o.activation() == (gemma ? nn::Activation::geglu_tanh : nn::Activation::swiglu));
      CHECK(o.embed_scale() == (gemma ? 4.f : 1.f));  // sqrt(16)
      CHECK(o.attn_scale() == (gemma ? 1.f / std::sqrt(6.f) : 0.f));
      CHECK(o.head_dim() == (gemma ? 8 : 0));
      CHECK(o.attn_softcap() == c.attn_cap);
      CHECK(o.final_softcap() == c.final_cap);
      CHECK(o.rope_local_theta() == c.local_theta);
      CHECK(o.qk_norm() == c.qk_norm);
      CHECK(o.tie_embeddings() == c.tied);
      CHECK(o.sliding_window() == c.window);
      CHECK(o.full_attention_layers() == c.full);
      for (std::size_t l = 0; l < o.num_layers(); ++l) {
        const bool full = std::count(c.full.begin(), c.full.end(), l) > 0;
        const nn::MultiHeadAttentionOptions a = o.block(l).attention();
        CHECK(a.sliding_window() == (full ? 0 : c.window));
        CHECK(a.rope_theta() == (full || c.local_theta == 0.f ? o.rope_theta() : c.local_theta));
        CHECK(model->blocks[l]->attn->options().sliding_window() == a.sliding_window());
      }
      if (gemma) CHECK(model->blocks[0]->attn->post_norm);
      testing::check_agreement(c.name, *model);
    }
  }
}

TEST_CASE("Gemma: each of its features, switched off alone, moves the fixture's logits", "[hf_families][gemm]") {
  // So the agreement above cannot hold with a feature ignored.
  for (const char* name : {"gemma2", "gemma3_scaled"}) {
    const nn::LanguageModelOptions o = weights::hf_model_options(folder(name));
    const Array reference = logits_with(name, o);
    CHECK(testing::rel_error(reference, expected(name).at("logits")) <= kLogitTol);
    struct Off {
      const char* what;
      nn::LanguageModelOptions options;
    };
    std::vector<Off> offs = {
        {"attn_softcap", nn::LanguageModelOptions(o).attn_softcap(0.f)},
        {"final_softcap", nn::LanguageModelOptions(o).final_softcap(0.f)},
        {"embed_scale", nn::LanguageModelOptions(o).embed_scale(1.f)},
        {"attn_scale", nn::LanguageModelOptions(o).attn_scale(0.f)},
        {"norm_unit_offset", nn::LanguageModelOptions(o).norm_unit_offset(false)},
        {"full_attention_layers", nn::LanguageModelOptions(o).full_attention_layers({})},
        {"sliding_window", nn::LanguageModelOptions(o).sliding_window(0).full_attention_layers({}).rope_local_theta(0)},
    };
    if (o.rope_local_theta() > 0.f)
      offs.push_back({"rope_local_theta", nn::LanguageModelOptions(o).rope_local_theta(0)});
    for (const Off& off : offs) {
      INFO(name << " without " << off.what);
      CHECK(max_abs_diff(logits_with(name, off.options), reference) > 1e-3);
    }
  }
}

TEST_CASE("Gemma: sampled generation gives the same tokens and attention rows with and without the cache",
          "[hf_families][gemm]") {
  const auto model = weights::load_hf_model(folder("gemma2"));
  nn::GenerateOptions cached, uncached;
  uncached.use_cache = false;
  Generator g1(5), g2(5);
  const nn::Generation a = model->generate_with_attention({3, 5, 7, 11}, 12, cached, g1);
  const nn::Generation b = model->generate_with_attention({3, 5, 7, 11}, 12, uncached, g2);
  CHECK(a.tokens == b.tokens);
  REQUIRE(a.attention.size() == 3);
  for (std::size_t l = 0; l < 3; ++l) {
    CHECK(testing::rel_error(a.attention[l], b.attention[l]) <= 1e-5);
    // blocks 0 and 2 see keys p - 2 .. p; block 1 every earlier key
    const Array& w = a.attention[l];
    std::size_t outside = 0;
    for (std::size_t p = 0; p < w.shape()[1]; ++p)
      for (std::size_t s = 0; s + 3 <= p; ++s) outside += w(0, p, s) != 0.f;
    CHECK((outside == 0) == (l != 1));
  }
}

TEST_CASE("Gemma: the logit lens reads the capped logits, and decomposition and attribution are refused by name",
          "[hf_families][gemm]") {
  const auto model = weights::load_hf_model(folder("gemma2"));
  const IndexArray ids = as_ids(expected("gemma2").at("ids")), targets = as_ids(expected("gemma2").at("targets"));
  const std::vector<inspect::LensLayer> lens = inspect::logit_lens(*model, ids, targets, 1);
  REQUIRE(lens.size() == 4);  // embed and three blocks
  CHECK(lens.back().loss == Approx(expected("gemma2").at("loss")()).epsilon(1e-5));
  NoGradGuard no_grad;
  const inspect::ActivationCache cache = inspect::cache_activations(
      *model, [&] { model->forward(ids); }, inspect::residual_points());
  CHECK_THROWS_WITH(inspect::decompose_residual(*model, cache),
                    Contains("decompose_residual: a sandwich-norm model (Gemma) normalizes each sublayer's output"));
  // A Pre-Norm model with (1 + w) norms and a final cap: decomposition holds, attribution is refused.
  nn::LanguageModelOptions pre = nn::LanguageModelOptions(model->options()).norm(nn::Norm::pre);
  Generator gen(2);
  nn::LanguageModel pre_model(pre, gen);
  const inspect::ActivationCache pre_cache = inspect::cache_activations(
      pre_model, [&] { pre_model.forward(ids); }, inspect::residual_points());
  const inspect::ResidualStack s = inspect::decompose_residual(pre_model, pre_cache);
  CHECK(testing::rel_error(xt::sum(s.stack, {0}), pre_cache.at("blocks.2.stream_out")) <= 1e-5);
  CHECK_THROWS_WITH(inspect::direct_logit_attribution(pre_model, pre_cache, s, ids),
                    Contains("direct_logit_attribution: the logits pass final_softcap 2 (a tanh)"));
  // Without the cap the attributions sum to the logits, through the final norm's 1 + w.
  pre.final_softcap(0.f);
  Generator gen2(2);
  nn::LanguageModel uncapped(pre, gen2);
  for (auto& [n, p] : uncapped.named_parameters()) {  // weights of the norms away from 0
    if (n.find("norm") != std::string::npos) p.mutable_value() += 0.3f;
  }
  const inspect::ActivationCache u_cache = inspect::cache_activations(
      uncapped, [&] { uncapped.forward(ids); }, inspect::residual_points());
  const inspect::LogitAttribution a =
      inspect::direct_logit_attribution(uncapped, u_cache, inspect::decompose_residual(uncapped, u_cache), ids);
  const Array logits = uncapped.forward(ids).logits.value();
  const Array total = xt::sum(a.values, {0});
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 7; ++t)
      CHECK(total(b, t) == Approx(logits(b, t, static_cast<std::size_t>(ids(b, t)))).margin(1e-4));
}

TEST_CASE("Gemma: a checkpoint stores the new options and loads back to the same logits", "[hf_families][gemm]") {
  const auto model = weights::load_hf_model(folder("gemma3_scaled"));
  testing::TempDir dir("xgrad_gemma_checkpoint");
  weights::save_checkpoint(dir.file("m.safetensors"), *model);
  const weights::LoadedLanguageModel back = weights::load_language_model(dir.file("m.safetensors"));
  CHECK(weights::to_json(back.model->options()) == weights::to_json(model->options()));
  CHECK(back.model->options().full_attention_layers() == Layers{0});
  back.model->eval();
  NoGradGuard no_grad;
  const IndexArray ids = as_ids(expected("gemma3_scaled").at("ids"));
  CHECK(testing::rel_error(back.model->forward(ids).logits.value(), model->forward(ids).logits.value()) == 0.0);
  // A list that is not block indexes in order is refused by name.
  std::string text = weights::to_json(model->options());
  json j = json::parse(text);
  j["full_attention_layers"] = json::array({2, 1});
  CHECK_THROWS_WITH(weights::language_model_options_from_json(j.dump(), "test"),
                    Contains("full_attention_layers[1] = 1 is not a block index in increasing order below "
                             "num_layers 3"));
  j["full_attention_layers"] = json::array({"1"});
  CHECK_THROWS_WITH(
      weights::language_model_options_from_json(j.dump(), "test"),
      Contains("model option full_attention_layers = [\"1\"] is not a list of at most 2^20 whole numbers"));
}

TEST_CASE("Gemma: what the readers do not implement, or cannot read, is refused by name", "[hf_families][bad_input]") {
  {
    Broken b("gemma2");
    b.edit("hidden_activation", "gelu");
    CHECK_THAT(b.error(), Contains("field \"hidden_activation\" is \"gelu\"; only \"gelu_pytorch_tanh\""));
  }
  {
    Broken b("gemma2");
    b.edit("attn_logit_softcapping", "50");
    CHECK_THAT(b.error(), Contains("field \"attn_logit_softcapping\""));
    b.edit("attn_logit_softcapping", -1);
    CHECK_THAT(b.error(), Contains("field \"attn_logit_softcapping\""));
    b.edit("attn_logit_softcapping", 50);
    b.edit("final_logit_softcapping", 0);  // off is null, not 0
    CHECK_THAT(b.error(), Contains("field \"final_logit_softcapping\""));
    b.edit("final_logit_softcapping", nullptr);
    b.edit("sliding_window", 0);
    CHECK_THAT(b.error(), Contains("field \"sliding_window\" must be a positive integer, got 0"));
  }
  {
    Broken b("gemma2");
    b.edit("layer_types", json::array({"sliding_attention", "full_attention"}));
    CHECK_THAT(b.error(), Contains("field \"layer_types\" must be an array of num_hidden_layers 3 entries"));
    b.edit("query_pre_attn_scalar", 0);
    CHECK_THAT(b.error(), Contains("query_pre_attn_scalar"));
  }
  {
    Broken b("gemma3");
    b.edit("use_bidirectional_attention", true);
    CHECK_THAT(b.error(), Contains("field \"use_bidirectional_attention\" is true; bidirectional attention "
                                   "(EmbeddingGemma) is not implemented"));
  }
  {
    Broken b("gemma3");
    b.edit("rope_local_base_freq", -10000);
    CHECK_THAT(b.error(), Contains("rope_local_base_freq"));
  }
  {
    Broken b("gemma3");
    b.edit("altup_num_inputs", 4);  // Gemma 3n's
    CHECK_THAT(b.error(), Contains("field \"altup_num_inputs\" (4) is not implemented"));
  }
  {
    // The config classes' defaults: 4 key/value heads, a window of 4096 (here past max_len 64).
    Broken b("gemma2");
    b.edit("num_key_value_heads", nullptr);
    b.edit("sliding_window", nullptr);
    nn::LanguageModelOptions o = weights::hf_model_options(b.dir.path);
    CHECK(o.num_kv_heads() == 4);
    CHECK(o.sliding_window() == 64);
    // A vast layer count is refused before any per-layer work.
    b.edit("num_hidden_layers", 1000000000000);
    CHECK_THAT(b.error(), Contains("num_hidden_layers 1000000000000 is more than 2^20 layers"));
  }
  {
    // Qwen 2: max_window_layers 0 slides every layer; without use_sliding_window the fields change nothing.
    Broken b("qwen2");
    b.edit("max_window_layers", 0);
    b.edit("sliding_window", 0);
    CHECK(b.error() == "(loaded)");
    b.edit("use_sliding_window", true);
    b.edit("sliding_window", 3);
    nn::LanguageModelOptions o = weights::hf_model_options(b.dir.path);
    CHECK(o.sliding_window() == 3);
    CHECK(o.full_attention_layers().empty());
    b.edit("max_window_layers", "1");
    CHECK_THAT(b.error(), Contains("field \"max_window_layers\" must be a whole number, got \"1\""));
  }
  {
    Broken b("qwen2_window");
    b.edit("layer_types", json::array({"full_attention", "sliding_attention"}));
    CHECK(b.error() == "(loaded)");
    b.edit("layer_types", json::array({"sliding_attention", 3}));
    CHECK_THAT(b.error(), Contains("field \"layer_types\" holds 3 at index 1"));
  }
}
