// The Gemma families: "gemma2" (Gemma 2) and "gemma3_text" (Gemma 3's text models, gemma-3-1b and
// the text part Gemma3ForCausalLM loads). Formulas as in transformers 4.57's
// models/gemma2/modeling_gemma2.py and models/gemma3/modeling_gemma3.py: embeddings times
// sqrt(hidden_size); RMSNorms that scale by (1 + weight); a norm before and after each sublayer
// (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
// post_feedforward_layernorm); GeGLU with the tanh GELU; scores scaled by
// query_pre_attn_scalar^-0.5 and soft-capped (Gemma 2); sliding and full attention by layer_types;
// Gemma 3's q_norm and k_norm, and its local RoPE base on the sliding layers.
#include <cmath>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

namespace {

// A soft cap: a positive number, or 0 when the field is null (off).
float read_softcap(const ConfigReader& r, const char* field, float fallback) {
  const nlohmann::json* v = r.find(field, false);
  if (!v) return fallback;
  return v->is_null() ? 0.f : r.positive_float(field, true);
}

// What Gemma 2 and 3 share; `pattern` is the default sliding-window pattern.
nn::LanguageModelOptions read_gemma(const ConfigReader& r, std::size_t pattern) {
  nn::LanguageModelOptions o = read_llama_like(r, 256, false);  // Gemma2Config's and Gemma3TextConfig's head_dim
  if (!r.find("num_key_value_heads", true)) {                   // their default is 4, not num_attention_heads
    if (o.num_heads() % 4 != 0) {
      r.fail_field("num_key_value_heads (absent: 4) does not divide num_attention_heads " +
                   std::to_string(o.num_heads()));
    }
    o.num_kv_heads(4);
  }
  require_activation(r, "hidden_activation", "gelu_pytorch_tanh", "GeGLU with the tanh GELU");
  r.find("hidden_act", true);            // Gemma2Config keeps it; the MLP reads hidden_activation
  r.find("cache_implementation", true);  // the runtime's cache class ("hybrid")
  const bool bias = r.flag("attention_bias", false);
  const float scalar = r.positive_float("query_pre_attn_scalar", false, 256.f);
  const std::size_t L = o.num_layers();
  std::vector<std::size_t> full =
      read_full_attention_layers(r, L, [&](std::size_t i) { return (i + 1) % pattern != 0; });
  // Absent: the config classes' 4096. A window of max_len or more (or none, null) covers every
  // position a forward takes; the sliding layers still differ by their RoPE base in Gemma 3, so
  // they keep a window of max_len.
  const nlohmann::json* given = r.find("sliding_window", false);
  std::size_t window = !given ? 4096 : given->is_null() ? o.max_len() : r.count("sliding_window");
  if (window > o.max_len()) window = o.max_len();
  if (full.size() == L) {
    full.clear();
    window = 0;
  }
  const std::size_t C = o.d_model();
  return o.norm(nn::Norm::sandwich)
      .norm_unit_offset(true)
      .activation(nn::Activation::geglu_tanh)
      .qkv_bias(bias)
      .out_bias(bias)
      .tie_embeddings(r.flag("tie_word_embeddings", true))
      .embed_scale(std::sqrt(static_cast<float>(C)))
      .attn_scale(1.f / std::sqrt(scalar))
      .sliding_window(window)
      .full_attention_layers(full);
}

// Gemma's tensor names: Llama's, with the two norms after each sublayer. Gemma's
// post_attention_layernorm normalizes the attention's output (Llama's is the feed-forward's input
// norm, pre_feedforward_layernorm here).
HfLayout gemma_names(const nn::LanguageModelOptions& o) {
  HfLayout l = llama_names(o);
  const std::size_t C = o.d_model();
  const auto llama_layer = l.layer;
  l.layer = [=](std::size_t n) {
    std::vector<TensorMap> ex = llama_layer(n);
    const std::string h = "model.layers." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    for (TensorMap& t : ex) {
      if (t.hf == h + "post_attention_layernorm.weight") t.hf = h + "pre_feedforward_layernorm.weight";
    }
    ex.push_back({h + "post_attention_layernorm.weight", b + "attn.post_norm.weight", {C}});
    ex.push_back({h + "post_feedforward_layernorm.weight", b + "ffn.post_norm.weight", {C}});
    return ex;
  };
  return l;
}

}  // namespace

HfLayout gemma2_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_gemma(r, 2);
  return gemma_names(o.attn_softcap(read_softcap(r, "attn_logit_softcapping", 50.f))
                         .final_softcap(read_softcap(r, "final_logit_softcapping", 30.f)));
}

HfLayout gemma3_layout(const ConfigReader& r) {
  // Gemma3TextConfig's rope_theta is 1e6 where Llama's is 1e4.
  const bool theta_given = r.find("rope_theta", true) || r.find("rope_parameters", true);
  nn::LanguageModelOptions o = read_gemma(r, r.count("sliding_window_pattern", 6, true));
  if (!theta_given) o.rope_theta(1e6f);
  r.require("use_bidirectional_attention", false, "bidirectional attention (EmbeddingGemma)");
  const float local = r.positive_float("rope_local_base_freq", false, 10000.f);
  o.qk_norm(true)
      .attn_softcap(read_softcap(r, "attn_logit_softcapping", 0.f))
      .final_softcap(read_softcap(r, "final_logit_softcapping", 0.f));
  if (o.sliding_window() > 0) o.rope_local_theta(local);
  return gemma_names(o);
}

namespace {

// query_pre_attn_scalar for a scale s = scalar^-1/2: the whole number Gemma's configs use when it
// gives s back in float32, else the double 1 / s^2.
nlohmann::json pre_attn_scalar(const nn::LanguageModelOptions& o) {
  const float s = o.block().attention().score_scale();
  const double q = 1.0 / (static_cast<double>(s) * s), whole = std::round(q);
  return whole > 0 && 1.f / std::sqrt(static_cast<float>(whole)) == s ? nlohmann::json(whole) : nlohmann::json(q);
}

nlohmann::json softcap_json(float cap) { return cap > 0.f ? f32_json(cap) : nlohmann::json(nullptr); }

nlohmann::json gemma_config(const nn::LanguageModelOptions& o, const char* type, const char* architecture) {
  nlohmann::json j = llama_like_config(o, type, architecture);
  j.erase("hidden_act");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["attention_bias"] = o.qkv_bias();
  j["query_pre_attn_scalar"] = pre_attn_scalar(o);
  j["attn_logit_softcapping"] = softcap_json(o.attn_softcap());
  j["final_logit_softcapping"] = softcap_json(o.final_softcap());
  j["sliding_window"] = o.sliding_window() ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  j["layer_types"] = layer_types_json(o);
  return j;
}

}  // namespace

nlohmann::json gemma2_config(const nn::LanguageModelOptions& o) {
  return gemma_config(o, "gemma2", "Gemma2ForCausalLM");
}

nlohmann::json gemma3_config(const nn::LanguageModelOptions& o) {
  nlohmann::json j = gemma_config(o, "gemma3_text", "Gemma3ForCausalLM");
  j["rope_local_base_freq"] = f32_json(o.rope_local_theta() > 0.f ? o.rope_local_theta() : o.rope_theta());
  j["use_bidirectional_attention"] = false;
  return j;
}

}  // namespace xgrad::weights::detail
