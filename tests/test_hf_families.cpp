// weights/hf_import's families beside Llama (qwen2, qwen3, mistral, phi3, gpt_neox) against tests/fixtures/hf_families/
// (make_hf_family_fixtures.py: tiny Hugging Face folders with a float64 torch mirror's logits, loss
// and gradients), the cached forward against the full one, and what each family refuses.
// Shapes: B batch, T length, V vocabulary, C hidden_size, H heads, KV key/value heads, D head_dim.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "test_files.hpp"
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

namespace {

constexpr double kLogitTol = 1e-5, kGradTol = 1e-4;  // max |got - want| / max |want|

std::string folder(const std::string& name) { return testing::fixture_path("hf_families/" + name); }

std::map<std::string, Array> expected(const std::string& name) {
  std::map<std::string, Array> out;
  for (auto& [n, a] : load_safetensors(folder(name) + "/expected.safetensors").tensors) out.emplace(n, a);
  return out;
}

IndexArray as_ids(const Array& a) {
  IndexArray out = IndexArray::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = static_cast<std::int64_t>(a.data()[i]);
  return out;
}

// A copy of a fixture folder to break.
struct Broken {
  explicit Broken(const std::string& name) : dir("xgrad_hf_family") {
    for (const auto& e : fs::directory_iterator(folder(name)))
      fs::copy(e.path(), dir.path + "/" + e.path().filename().string());
  }
  void edit(const std::string& field, const json& value) const {
    json j = json::parse(testing::read_bytes(dir.file("config.json")));
    j[field] = value;
    testing::write_bytes(dir.file("config.json"), j.dump(2));
  }
  std::string error() const {
    try {
      weights::load_hf_model(dir.path);
    } catch (const Error& e) {
      return e.what();
    }
    return "(loaded)";
  }
  testing::TempDir dir;
};

}  // namespace

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

      std::map<std::string, Array> e = expected(name);
      const IndexArray ids = as_ids(e.at("ids")), targets = as_ids(e.at("targets"));
      {
        NoGradGuard no_grad;
        const double err = testing::rel_error(model->forward(ids).logits.value(), e.at("logits"));
        CAPTURE(err);
        CHECK(err <= kLogitTol);
      }
      // One training step's gradients, parameter by parameter (fused tensors split as xgrad holds them).
      model->zero_grad();
      const Tensor loss = model->loss(ids, targets);
      CHECK(loss.value()() == Approx(e.at("loss")()).epsilon(1e-5));
      loss.backward();
      std::size_t compared = 0;
      for (const auto& [pname, p] : model->named_parameters()) {
        const auto want = e.find("grad." + pname);
        INFO(pname);
        REQUIRE(want != e.end());
        REQUIRE(p.grad().shape() == want->second.shape());
        const double err = testing::rel_error(p.grad(), want->second);
        CAPTURE(err);
        CHECK(err <= kGradTol);
        ++compared;
      }
      std::size_t grads = 0;
      for (const auto& [n, a] : e) grads += n.rfind("grad.", 0) == 0;
      CHECK(compared == grads);
    }
  }
}

TEST_CASE("hf families: the cached forward, in chunks and token by token, equals the full one", "[hf_families][gemm]") {
  for (const char* name : {"qwen2", "qwen3", "phi3", "gpt_neox", "mistral", "phi3_window"}) {
    SECTION(name) {
      const auto model = weights::load_hf_model(folder(name));
      const std::size_t window = model->options().sliding_window();
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
          const Array logits = model->forward_cached(part, cache, nn::Attentions::none).logits.value();
          for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < n; ++t)
              for (std::size_t v = 0; v < full.shape()[2]; ++v) cached(b, first + t, v) = logits(b, t, v);
        }
        INFO("chunk " << chunk);
        CHECK(testing::rel_error(cached, full) <= kLogitTol);
        // a sliding window keeps only its last positions
        CHECK(cache.length() == T);
        for (const nn::KVCache& block : cache.blocks) CHECK(block.held() == (window ? window : T));
      }
    }
  }
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
      "(this xgrad loads \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"phi3\", \"gpt_neox\")";
  {
    Broken b("qwen2");
    b.edit("model_type", "gemma2");
    CHECK_THAT(b.error(), Contains("config.json': model_type \"gemma2\" is not implemented " + families));
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
    b.edit("use_sliding_window", true);
    CHECK_THAT(b.error(), Contains("field \"use_sliding_window\" is true; sliding-window attention "
                                   "(use_sliding_window) is not implemented"));
    b.edit("use_sliding_window", false);
    b.edit("use_mrope", true);
    CHECK_THAT(b.error(), Contains("field \"use_mrope\" is true; multimodal rotary embeddings (use_mrope) is not "
                                   "implemented"));
  }
  {
    Broken b("qwen3");
    b.edit("layer_types", json::array({"full_attention", "sliding_attention"}));
    CHECK_THAT(b.error(), Contains("field \"layer_types\" holds \"sliding_attention\"; only \"full_attention\" layers "
                                   "are implemented"));
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
    CHECK_THAT(b.error(), Contains("field \"rope_scaling\" is {\"type\":\"longrope\"}; scaled rotary embeddings are "
                                   "not implemented"));
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
    "hf families: the residual stream of a parallel block and of wide heads decomposes into its parts, head "
    "by head, and the logits attribute to them",
    "[hf_families][gemm]") {
  for (const char* name : {"gpt_neox", "qwen3"}) {
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
        const std::size_t w_o_bias = std::string(name) == "gpt_neox" ? 1 : 0;  // "blocks.L.attn.bias"
        const std::size_t per_layer = by_head ? 4 + w_o_bias + 1 : 2;          // heads (or attn), ffn
        CHECK(s.labels.size() == 1 + 2 * per_layer);
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
