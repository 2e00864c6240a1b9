// The Llama family (model_type "llama": Llama 2 and 3, SmolLM2, TinyLlama) and the fields and
// tensor names the Llama-like families share.
#include <cmath>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

nn::LanguageModelOptions read_llama_like(const ConfigReader& r, std::size_t default_head_dim, bool swiglu) {
  const std::size_t V = r.count("vocab_size"), C = r.count("hidden_size"), F = r.count("intermediate_size");
  const std::size_t L = r.count("num_hidden_layers"), H = r.count("num_attention_heads");
  const std::size_t KV = r.count("num_key_value_heads", H, true), P = r.count("max_position_embeddings");
  const float eps = r.positive_float("rms_norm_eps", true);
  const Rope rope = read_rope(r, P);
  // Dynamic scaling stretches RoPE past the trained context, by factor at most: so may max_len.
  const double reach = rope.scaling.type == RopeScaling::Type::dynamic
                           ? std::floor(static_cast<double>(P) * rope.scaling.factor)
                           : static_cast<double>(P);
  if (reach > 4294967296.0) {
    r.fail_field("dynamic rope scaling's factor " + std::to_string(rope.scaling.factor) +
                 " times max_position_embeddings " + std::to_string(P) + " is past 2^32 positions");
  }
  const auto max_len = static_cast<std::size_t>(reach);
  const bool tied = r.flag("tie_word_embeddings", false);
  if (swiglu) require_activation(r, "hidden_act", "silu", "the SwiGLU feed-forward");
  r.require("attention_dropout", 0.0, "dropout on the attention weights");
  const bool head_dim_given = r.find("head_dim", true) != nullptr || default_head_dim != 0;
  if (!head_dim_given && C % H != 0)
    r.fail_field("num_attention_heads " + std::to_string(H) + " does not divide hidden_size " + std::to_string(C));
  if (H % KV != 0) {
    r.fail_field("num_key_value_heads " + std::to_string(KV) + " does not divide num_attention_heads " +
                 std::to_string(H));
  }
  const std::size_t D = head_dim_given ? r.count("head_dim", default_head_dim, true) : C / H;
  if (D % 2 != 0) {
    r.fail_field((head_dim_given ? "field \"head_dim\" is " + std::to_string(D)
                                 : "the head width hidden_size / num_attention_heads = " + std::to_string(D)) +
                 " is odd; rotary embeddings need it even");
  }
  return nn::LanguageModelOptions(V, C, H, L)
      .d_ff(F)
      .max_len(max_len)
      .dropout(0.f)
      .norm(nn::Norm::pre)
      .norm_kind(nn::NormKind::rms_norm)
      .norm_eps(eps)
      .norm_affine(true)
      .norm_bias(false)
      .num_kv_heads(KV)
      .head_dim(head_dim_given && D != C / H ? D : 0)
      .activation(nn::Activation::swiglu)
      .positional(nn::Positional::rotary)
      .rope_theta(rope.theta)
      .rope_scaling_options(rope.scaling)
      .rotary_dim(0)
      .qk_norm(false)
      .bias(false)
      .tie_embeddings(tied)
      .init(nn::Init::gpt2);
}

namespace {

// Buffers that older Hugging Face versions saved with the weights: model.layers.N.self_attn.rotary_emb.inv_freq.
bool is_rotary_buffer(const std::string& name) {
  static const std::string suffix = ".self_attn.rotary_emb.inv_freq";
  return name.compare(0, 13, "model.layers.") == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

HfLayout llama_names(const nn::LanguageModelOptions& o) {
  const nn::MultiHeadAttentionOptions a = o.block().attention();
  const std::size_t V = o.vocab_size(), C = o.d_model(), F = o.d_ff(), D = a.head_dim();
  const std::size_t HD = a.num_heads() * D, KVD = a.kv_heads() * D;
  HfLayout l;
  l.options = o;
  l.before = {{"model.embed_tokens.weight", "tok_emb.weight", {V, C}}};
  l.after = {{"model.norm.weight", "final_norm.weight", {C}}};
  if (!o.tie_embeddings()) l.after.push_back({"lm_head.weight", "head.weight", {V, C}});
  l.head = "lm_head.weight";
  l.buffer = is_rotary_buffer;
  l.layer = [=](std::size_t n) {
    const std::string h = "model.layers." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    std::vector<TensorMap> ex = {{h + "input_layernorm.weight", b + "attn.norm.weight", {C}}};
    add_linear(ex, h + "self_attn.q_proj", b + "attn.w_q", HD, C, o.qkv_bias());
    add_linear(ex, h + "self_attn.k_proj", b + "attn.w_k", KVD, C, o.qkv_bias());
    add_linear(ex, h + "self_attn.v_proj", b + "attn.w_v", KVD, C, o.qkv_bias());
    add_linear(ex, h + "self_attn.o_proj", b + "attn.w_o", C, HD, o.out_bias());
    if (o.qk_norm()) {
      ex.push_back({h + "self_attn.q_norm.weight", b + "attn.q_norm.weight", {D}});
      ex.push_back({h + "self_attn.k_norm.weight", b + "attn.k_norm.weight", {D}});
    }
    ex.push_back({h + "post_attention_layernorm.weight", b + "ffn.norm.weight", {C}});
    add_linear(ex, h + "mlp.gate_proj", b + "ffn.gate", F, C, o.ffn_bias());
    add_linear(ex, h + "mlp.up_proj", b + "ffn.linear1", F, C, o.ffn_bias());
    add_linear(ex, h + "mlp.down_proj", b + "ffn.linear2", C, F, o.ffn_bias());
    return ex;
  };
  return l;
}

HfLayout llama_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r);
  const bool attention_bias = r.flag("attention_bias", false), mlp_bias = r.flag("mlp_bias", false);
  r.require("sliding_window", nullptr, "sliding-window attention");
  r.require("rope_interleaved", false, "rotating interleaved channel pairs");
  o.qkv_bias(attention_bias).out_bias(attention_bias).ffn_bias(mlp_bias);
  return llama_names(o);
}

nlohmann::json llama_config(const nn::LanguageModelOptions& o) {
  nlohmann::json j = llama_like_config(o, "llama", "LlamaForCausalLM");
  j["attention_bias"] = o.qkv_bias();
  j["mlp_bias"] = o.ffn_bias();
  return j;
}

}  // namespace xgrad::weights::detail
