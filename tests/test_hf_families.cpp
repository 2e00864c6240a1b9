// weights/hf_import's families beside Llama (qwen2, qwen3, mistral, phi3, gpt_neox, gpt2) against
// tests/fixtures/hf_families/ (make_hf_family_fixtures.py: tiny Hugging Face folders with a float64 torch mirror's
// logits, loss and gradients), the cached forward against the full one, and what each family refuses. Shapes: B batch,
// T length, V vocabulary, C hidden_size, H heads, KV key/value heads, D head_dim.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>

#include "hf_families.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/residual_decomposition.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

using testing::as_ids;
using testing::check_agreement;
using testing::expected;
using testing::folder;
using testing::kLogitTol;
using Broken = testing::BrokenFolder;

TEST_CASE(
    "Qwen 2, Qwen 3, Mistral, Phi-3 and GPT-NeoX folders load with the logits, loss and gradients of the "
    "PyTorch mirror",
    "[hf_families][gemm]") {
  struct Case {
    const char* name;
    bool neox, qkv_bias, out_bias, qk_norm, tied, parallel;
    std::size_t head_dim, rotary_dim, window = 0;
  };
  const Case cases[] = {{"qwen2", false, true, false, false, false, false, 0, 0},
                        {"qwen2_tied", false, true, false, false, true, false, 0, 0},
                        {"qwen3", false, false, false, true, true, false, 8, 0},
                        {"phi3", false, false, false, false, false, false, 0, 2},
                        {"phi3_window", false, false, false, false, true, false, 0, 2, 4},
                        {"mistral", false, false, false, false, false, false, 0, 0, 3},
                        {"llama_rope_llama3", false, false, false, false, false, false, 8, 0},
                        {"llama_rope_linear", false, false, false, false, false, false, 8, 0},
                        {"llama_rope_dynamic", false, false, false, false, false, false, 8, 0},
                        {"gpt_neox", true, true, true, false, false, true, 0, 2},
                        {"gpt_neox_sequential", true, true, true, false, false, false, 0, 2}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      const char* name = c.name;
      const std::shared_ptr<nn::LanguageModel> model = weights::load_hf_model(folder(name));
      const nn::LanguageModelOptions& o = model->options();
      CHECK(weights::to_json(weights::hf_model_options(folder(name))) == weights::to_json(o));
      CHECK(o.norm_kind() == (c.neox ? nn::NormKind::layer_norm : nn::NormKind::rms_norm));
      CHECK(o.norm_bias() == c.neox);
      CHECK(o.activation() == (c.neox ? nn::Activation::gelu : nn::Activation::swiglu));
      CHECK(o.qkv_bias() == c.qkv_bias);
      CHECK(o.out_bias() == c.out_bias);
      CHECK(o.ffn_bias() == c.neox);
      CHECK(o.qk_norm() == c.qk_norm);
      CHECK(o.head_dim() == c.head_dim);
      CHECK(o.rotary_dim() == c.rotary_dim);
      CHECK(o.tie_embeddings() == c.tied);
      CHECK(o.parallel_residual() == c.parallel);
      CHECK(o.sliding_window() == c.window);
      CHECK(o.dropout() == 0.f);
      check_agreement(name, *model);
    }
  }
}

TEST_CASE(
    "GPT-2 folders, with and without the transformer. prefix, load with the logits, loss and gradients of the "
    "PyTorch mirror",
    "[hf_families][gemm]") {
  for (const char* name : {"gpt2", "gpt2_bare"}) {
    SECTION(name) {
      const bool bare = std::string(name) == "gpt2_bare";
      const std::shared_ptr<nn::LanguageModel> model = weights::load_hf_model(folder(name));
      const nn::LanguageModelOptions& o = model->options();
      CHECK(weights::to_json(weights::hf_model_options(folder(name))) == weights::to_json(o));
      CHECK(o.positional() == nn::Positional::learned);
      CHECK(o.activation() == (bare ? nn::Activation::gelu : nn::Activation::gelu_tanh));
      CHECK(o.d_ff() == (bare ? 24 : 64));
      CHECK(o.tie_embeddings() == !bare);
      CHECK(o.max_len() == 64);
      CHECK(o.dropout() == 0.f);  // the published 0.1s act in training only
      check_agreement(name, *model);
    }
  }
}

TEST_CASE("hf families: the cached forward, in chunks and token by token, equals the full one", "[hf_families][gemm]") {
  for (const char* name : {"qwen2", "qwen3", "phi3", "gpt_neox", "mistral", "phi3_window", "llama_rope_llama3",
                           "llama_rope_linear", "gpt2", "gemma2", "gemma3", "gemma3_scaled", "qwen2_window"}) {
    SECTION(name) {
      const auto model = weights::load_hf_model(folder(name));
      const IndexArray ids = as_ids(expected(name).at("ids"));
      const std::size_t B = ids.shape()[0], T = ids.shape()[1];
      NoGradGuard no_grad;
      const Array full = model->forward(ids).logits.value();
      for (const std::size_t chunk : {std::size_t{1}, std::size_t{3}}) {
        nn::LanguageModelCache cache;
        Array cached = Array::from_shape(full.shape());
        for (std::size_t first = 0; first < T; first += chunk) {
          const std::size_t n = std::min(chunk, T - first);
          IndexArray part = IndexArray::from_shape({B, n});
          for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < n; ++t) part(b, t) = ids(b, first + t);
          const Array logits = model->forward_cached(part, cache, nn::Attentions::none, nn::Logits::all).logits.value();
          for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < n; ++t)
              for (std::size_t v = 0; v < full.shape()[2]; ++v) cached(b, first + t, v) = logits(b, t, v);
        }
        INFO("chunk " << chunk);
        CHECK(testing::rel_error(cached, full) <= kLogitTol);
        // a windowed block keeps only its last positions, a full one every position
        CHECK(cache.length() == T);
        for (std::size_t l = 0; l < cache.blocks.size(); ++l) {
          const std::size_t window = model->blocks[l]->attn->options().sliding_window();
          CHECK(cache.blocks[l].held() == (window ? window : T));
        }
      }
    }
  }
}

TEST_CASE("hf families: rope_scaling of types linear, dynamic and llama3 is read into the options", "[hf_families]") {
  using Type = RopeScaling::Type;
  const nn::LanguageModelOptions llama3 = weights::hf_model_options(folder("llama_rope_llama3"));
  CHECK(llama3.rope_scaling() == Type::llama3);
  CHECK(llama3.rope_factor() == 8.f);
  CHECK(llama3.rope_low_freq_factor() == 1.f);
  CHECK(llama3.rope_high_freq_factor() == 4.f);
  CHECK(llama3.rope_original_max_len() == 128);
  CHECK(llama3.max_len() == 1024);
  const nn::LanguageModelOptions linear = weights::hf_model_options(folder("llama_rope_linear"));
  CHECK(linear.rope_scaling() == Type::linear);
  CHECK(linear.rope_factor() == 2.f);
  // dynamic: the trained context is max_position_embeddings (4), and max_len reaches factor times it
  const nn::LanguageModelOptions dynamic = weights::hf_model_options(folder("llama_rope_dynamic"));
  CHECK(dynamic.rope_scaling() == Type::dynamic);
  CHECK(dynamic.rope_original_max_len() == 4);
  CHECK(dynamic.max_len() == 8);
  // transformers 5 spells it as rope_parameters, with RoPE's base inside
  Broken b("llama_rope_llama3");
  json j = json::parse(testing::read_bytes(b.dir.file("config.json")));
  json p = j["rope_scaling"];
  p["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = p;
  testing::write_bytes(b.dir.file("config.json"), j.dump());
  CHECK(weights::to_json(weights::hf_model_options(b.dir.path)) == weights::to_json(llama3));
}

TEST_CASE(
    "hf families: dynamic rope scaling turns a cached step's query and keys by the frequencies of the sequence so "
    "far",
    "[hf_families][gemm]") {
  // One block: the step's logits are one forward's over the positions so far (with more blocks, the
  // keys of later blocks hold what earlier steps computed at their own frequencies, as in Hugging
  // Face's cache). Trained context 6, max_len 12.
  const auto o = nn::LanguageModelOptions::llama_style(23, 16, 4, 1, 2)
                     .max_len(12)
                     .rope_scaling_options({RopeScaling::Type::dynamic, 2.f, 1.f, 4.f, 6});
  Generator gen(3);
  nn::LanguageModel model(o, gen);
  model.eval();
  NoGradGuard no_grad;
  nn::LanguageModelCache cache;
  std::vector<std::int64_t> ids;
  double past = 0;  // how far the scaled steps are from the unscaled frequencies' logits
  for (std::size_t t = 0; t < 12; ++t) {
    ids.push_back(static_cast<std::int64_t>((t * 7 + 3) % 23));
    IndexArray one = IndexArray::from_shape({1, 1}), prefix = IndexArray::from_shape({1, t + 1});
    one(0, 0) = ids.back();
    std::copy(ids.begin(), ids.end(), prefix.begin());
    const Array step = model.forward_cached(one, cache, nn::Attentions::none).logits.value();
    const Array whole = model.forward(prefix, nn::Attentions::none).logits.value();
    INFO("position " << t);
    double worst = 0;
    for (std::size_t v = 0; v < 23; ++v) worst = std::max(worst, double(std::abs(step(0, 0, v) - whole(0, t, v))));
    CHECK(worst <= 1e-4);
    if (t < 6) continue;
    Generator same(3);
    nn::LanguageModel plain(nn::LanguageModelOptions::llama_style(23, 16, 4, 1, 2).max_len(12), same);
    const Array unscaled = plain.forward(prefix, nn::Attentions::none).logits.value();
    for (std::size_t v = 0; v < 23; ++v) past = std::max(past, double(std::abs(unscaled(0, t, v) - whole(0, t, v))));
  }
  CHECK(past > 1e-3);  // the scaling acted
  // The two-block fixture: within the trained context (4 positions), cached steps are the forward's.
  const auto loaded = weights::load_hf_model(folder("llama_rope_dynamic"));
  const IndexArray fixture_ids = as_ids(expected("llama_rope_dynamic").at("ids"));
  IndexArray four = IndexArray::from_shape({1, 4});
  for (std::size_t t = 0; t < 4; ++t) four(0, t) = fixture_ids(0, t);
  nn::LanguageModelCache steps;
  const Array full = loaded->forward(four, nn::Attentions::none).logits.value();
  const Array cached = loaded->forward_cached(four, steps, nn::Attentions::none, nn::Logits::all).logits.value();
  CHECK(testing::rel_error(cached, full) <= 1e-5);
}

TEST_CASE(
    "hf families: generation with a sliding window gives the same tokens and attention rows with and without the "
    "cache",
    "[hf_families][gemm]") {
  const auto model = weights::load_hf_model(folder("mistral"));
  nn::GenerateOptions cached, uncached;
  uncached.use_cache = false;
  Generator g1(5), g2(5);  // sampled, the same draws
  const nn::Generation a = model->generate_with_attention({3, 5, 7, 11}, 12, cached, g1);
  const nn::Generation b = model->generate_with_attention({3, 5, 7, 11}, 12, uncached, g2);
  CHECK(a.tokens == b.tokens);
  REQUIRE(a.attention.size() == b.attention.size());
  for (std::size_t l = 0; l < a.attention.size(); ++l) {
    CHECK(testing::rel_error(a.attention[l], b.attention[l]) <= 1e-5);
    // query p's row is zero outside keys p - 2 .. p (sliding_window 3)
    const Array& w = a.attention[l];
    for (std::size_t p = 0; p < w.shape()[1]; ++p)
      for (std::size_t s = 0; s < w.shape()[2]; ++s)
        if (s > p || s + 3 <= p) CHECK(w(0, p, s) == 0.f);
  }
}

TEST_CASE("hf families: what each family does not implement is refused by name", "[hf_families][bad_input]") {
  const std::string families =
      "(this xgrad loads \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"phi3\", \"gpt_neox\", \"gpt2\", "
      "\"gemma2\", \"gemma3_text\")";
  {
    Broken b("qwen2");
    b.edit("model_type", "gemma");
    CHECK_THAT(b.error(), Contains("config.json': model_type \"gemma\" is not implemented " + families));
    b.edit("model_type", "gemma3");  // the image-and-text model; its text model is gemma3_text
    CHECK_THAT(b.error(), Contains("config.json': model_type \"gemma3\" is not implemented " + families));
  }
  {
    Broken b("qwen2");
    CHECK_THROWS_WITH(weights::load_llama(b.dir.path),
                      Contains("load_llama: '" + b.dir.file("config.json") +
                               "': model_type \"qwen2\" is not \"llama\"; load_hf_model and hf_model_options read "
                               "every family"));
  }
  {
    Broken b("qwen2");
    b.edit("use_mrope", true);
    CHECK_THAT(b.error(), Contains("field \"use_mrope\" is true; multimodal rotary embeddings (use_mrope) is not "
                                   "implemented"));
  }
  {
    Broken b("qwen3");
    b.edit("layer_types", json::array({"full_attention", "chunked_attention"}));
    CHECK_THAT(b.error(), Contains("field \"layer_types\" holds \"chunked_attention\" at index 1; "
                                   "\"sliding_attention\" and \"full_attention\" are implemented"));
    b.edit("layer_types", json::array({"full_attention"}));
    CHECK_THAT(b.error(), Contains("field \"layer_types\" must be an array of num_hidden_layers 2 entries, got "
                                   "[\"full_attention\"]"));
  }
  {
    Broken b("qwen3");
    b.edit("head_dim", 5);
    CHECK_THAT(b.error(), Contains("field \"head_dim\" is 5 is odd; rotary embeddings need it even"));
    // A vast head_dim is checked in O(1) (RoPE's top frequency was a loop over the head once), then
    // against the files' shapes.
    b.edit("head_dim", 1000000000);
    CHECK_THAT(b.error(), Contains("xgrad's blocks.0.attn.w_q.weight needs (4000000000, 16)"));
  }
  {
    Broken b("phi3");
    b.edit("partial_rotary_factor", 0.3);
    CHECK_THAT(b.error(), Contains("partial_rotary_factor 0.3 turns 1 of the 4 channels of each head; it must be "
                                   "a positive even number"));
    b.edit("partial_rotary_factor", 1.5);
    CHECK_THAT(b.error(), Contains("field \"partial_rotary_factor\" must be a number in [0, 1], got 1.5"));
  }
  {
    Broken b("mistral");
    b.edit("sliding_window", 0);
    CHECK_THAT(b.error(), Contains("field \"sliding_window\" must be a positive integer, got 0"));
    b.edit("sliding_window", "4096");
    CHECK_THAT(b.error(), Contains("field \"sliding_window\" must be a positive integer, got \"4096\""));
    // a window of max_position_embeddings (64) or more covers every position: none
    b.edit("sliding_window", 1000000000000);
    CHECK(weights::hf_model_options(b.dir.path).sliding_window() == 0);
    b.edit("sliding_window", nullptr);
    CHECK(weights::hf_model_options(b.dir.path).sliding_window() == 0);
    b.edit("attention_bias", true);
    CHECK_THAT(b.error(), Contains("attention_bias"));
  }
  {
    Broken b("phi3");
    b.edit("resid_pdrop", 0.1);
    CHECK_THAT(b.error(),
               Contains("field \"resid_pdrop\" is 0.1; dropout on the sublayers' outputs is not implemented"));
  }
  {
    Broken b("phi3");
    b.edit("rope_scaling", json{{"type", "longrope"}});
    CHECK_THAT(b.error(), Contains("field \"rope_scaling\" has rope_type \"longrope\"; only \"default\", \"linear\", "
                                   "\"dynamic\" and \"llama3\" scaled rotary embeddings are implemented"));
  }
  {
    Broken b("llama_rope_llama3");
    json s = json::parse(testing::read_bytes(b.dir.file("config.json")))["rope_scaling"];
    s["attention_factor"] = 1.5;
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(), Contains("field \"rope_scaling\" has \"attention_factor\" (1.5), which rope_type \"llama3\" "
                                   "does not read; it is not implemented"));
    s.erase("attention_factor");
    s["type"] = "linear";
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(), Contains("has rope_type \"llama3\" and type \"linear\", which differ"));
    s.erase("type");
    s["low_freq_factor"] = 4.0;
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(), Contains("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got 4 and 4"));
    s["low_freq_factor"] = 1.0;
    s["factor"] = 0.5;
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(), Contains("rope scaling factor 0.5 must be >= 1"));
    s["factor"] = 8.0;
    s["original_max_position_embeddings"] = 12.5;
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(),
               Contains("has original_max_position_embeddings 12.5, which is not a whole number up to 2^32"));
    s.erase("original_max_position_embeddings");
    b.edit("rope_scaling", s);
    CHECK_THAT(b.error(), Contains("field \"rope_scaling\" of rope_type \"llama3\" lacks "
                                   "\"original_max_position_embeddings\""));
    b.edit("rope_parameters", json{{"rope_type", "default"}});
    CHECK_THAT(b.error(), Contains("fields \"rope_scaling\" and \"rope_parameters\" are both given"));
  }
  {
    Broken b("llama_rope_dynamic");
    b.edit("rope_scaling", json{{"type", "dynamic"}, {"factor", 1e30}});
    CHECK_THAT(b.error(), Contains("times max_position_embeddings 4 is past 2^32 positions"));
  }
  {
    Broken b("gpt_neox");
    b.edit("rotary_pct", 0.3);
    CHECK_THAT(b.error(), Contains("rotary_pct 0.3 turns 1 of the 4 channels of each head; it must be a positive even "
                                   "number"));
    b.edit("rotary_pct", 0.5);
    b.edit("rope_theta", 20000);
    CHECK_THAT(b.error(), Contains("rotary_emb_base 10000 and rope_theta 20000 differ"));
    b.edit("rope_theta", 10000.0);
    CHECK_THAT(b.error(), Contains("(loaded)"));
    b.edit("hidden_act", "gelu_new");
    CHECK_THAT(b.error(),
               Contains("field \"hidden_act\" is \"gelu_new\"; only \"gelu\" (the exact GELU) is supported"));
    b.edit("hidden_act", "gelu");
    b.edit("hidden_dropout", 0.1);
    CHECK_THAT(b.error(), Contains("field \"hidden_dropout\" is 0.1; dropout on the sublayers' outputs is not "
                                   "implemented"));
  }
  {
    Broken b("gpt2");
    b.edit("scale_attn_by_inverse_layer_idx", true);
    CHECK_THAT(b.error(), Contains("field \"scale_attn_by_inverse_layer_idx\" is true; scaling each layer's attention "
                                   "by 1 / (layer + 1) is not implemented"));
    b.edit("scale_attn_by_inverse_layer_idx", false);
    b.edit("activation_function", "swish");
    CHECK_THAT(b.error(), Contains("field \"activation_function\" is \"swish\"; only \"gelu_new\""));
    b.edit("activation_function", "gelu_new");
    b.edit("resid_pdrop", 1.5);
    CHECK_THAT(b.error(), Contains("field \"resid_pdrop\" must be a number in [0, 1], got 1.5"));
    b.edit("resid_pdrop", 0.1);
    b.edit("n_head", 3);
    CHECK_THAT(b.error(), Contains("n_head 3 does not divide n_embd 16"));
  }
  {
    Broken b("qwen2");
    b.edit("num_key_value_heads", 3);
    CHECK_THAT(b.error(), Contains("num_key_value_heads 3 does not divide num_attention_heads 4"));
  }
}

TEST_CASE("hf families: a fused tensor of the wrong shape, or missing, is named with its xgrad parts",
          "[hf_families][bad_input]") {
  Broken b("phi3");
  const std::string path = b.dir.file("model.safetensors");
  NamedArrays state = load_safetensors(path).tensors;
  for (auto& [n, a] : state) {
    if (n == "model.layers.1.self_attn.qkv_proj.weight") a = Array::from_shape({24, 15});
  }
  save_safetensors(path, state);
  CHECK_THAT(b.error(), Contains("tensor 'model.layers.1.self_attn.qkv_proj.weight' in '" + path +
                                 "' has shape (24, 15); xgrad's blocks.1.attn.w_q.weight needs (32, 16)"));
  state.erase(std::remove_if(state.begin(), state.end(),
                             [](const auto& t) { return t.first == "model.layers.0.mlp.gate_up_proj.weight"; }),
              state.end());
  save_safetensors(path, state);
  CHECK_THAT(b.error(), Contains("lacks tensor 'model.layers.0.mlp.gate_up_proj.weight' (48, 16) (xgrad's "
                                 "blocks.0.ffn.gate.weight)"));
}

TEST_CASE(
    "hf families: the residual stream of a parallel block, of wide heads, of sliding windows and of GPT-2 "
    "decomposes into its parts, head by head, and the logits attribute to them",
    "[hf_families][gemm]") {
  for (const char* name : {"gpt_neox", "qwen3", "mistral", "gpt2"}) {
    SECTION(name) {
      const auto model = weights::load_hf_model(folder(name));
      const IndexArray ids = as_ids(expected(name).at("ids"));
      NoGradGuard no_grad;
      const inspect::ActivationCache cache = inspect::cache_activations(
          *model, [&] { model->forward(ids); }, inspect::residual_points());
      const Array& out = cache.at("blocks.1.stream_out");
      for (const bool by_head : {false, true}) {
        const inspect::ResidualStack s = inspect::decompose_residual(*model, cache, by_head);
        const Array sum = xt::sum(s.stack, {0});
        INFO("by_head " << by_head);
        CHECK(testing::rel_error(sum, out) <= 1e-5);
        const bool gpt2 = std::string(name) == "gpt2";
        const std::size_t embeds = gpt2 ? 2 : 1;  // learned positions are a part of their own
        const std::size_t w_o_bias = gpt2 || std::string(name) == "gpt_neox" ? 1 : 0;  // "blocks.L.attn.bias"
        const std::size_t per_layer = by_head ? 4 + w_o_bias + 1 : 2;                  // heads (or attn), ffn
        CHECK(s.labels.size() == embeds + 2 * per_layer);
      }
      // the attributions of the decomposition sum to the logit of each next token
      const inspect::ResidualStack s = inspect::decompose_residual(*model, cache, true);
      const inspect::LogitAttribution a = inspect::direct_logit_attribution(*model, cache, s, ids);
      const Array logits = model->forward(ids).logits.value();
      const Array total = xt::sum(a.values, {0});
      for (std::size_t b = 0; b < ids.shape()[0]; ++b)
        for (std::size_t t = 0; t < ids.shape()[1]; ++t)
          CHECK(total(b, t) == Approx(logits(b, t, static_cast<std::size_t>(ids(b, t)))).margin(1e-4));
    }
  }
}
