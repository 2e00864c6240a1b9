// The GPT-NeoX family (model_type "gpt_neox": Pythia): LayerNorms with biases, a parallel residual
// (both sublayers read the block's input), RoPE on the first rotary_pct of each head, a GELU MLP
// with biases, q, k and v fused per head in query_key_value, an untied embed_out. Formulas as in
// transformers 4.57's models/gpt_neox/modeling_gpt_neox.py.
#include <cmath>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

namespace {

// One setting under its old name (Pythia's files) or its new one (what GPTNeoXConfig also writes):
// both must agree when both are given.
double either(const ConfigReader& r, const char* old_name, const char* new_name, double fallback, bool fraction) {
  const nlohmann::json *a = r.find(old_name, true), *b = r.find(new_name, true);
  auto value = [&](const char* name) {
    return fraction ? r.fraction(name, fallback) : static_cast<double>(r.positive_float(name, false));
  };
  if (a && b && value(old_name) != value(new_name)) {
    r.fail_field(std::string(old_name) + " " + xgrad::detail::json_excerpt(*a) + " and " + new_name + " " +
                 xgrad::detail::json_excerpt(*b) + " differ");
  }
  return a ? value(old_name) : b ? value(new_name) : fallback;
}

bool is_neox_buffer(const std::string& name) {
  for (const char* suffix : {".attention.bias", ".attention.masked_bias", ".attention.rotary_emb.inv_freq"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

}  // namespace

HfLayout gpt_neox_layout(const ConfigReader& r) {
  const std::size_t V = r.count("vocab_size"), C = r.count("hidden_size"), F = r.count("intermediate_size");
  const std::size_t L = r.count("num_hidden_layers"), H = r.count("num_attention_heads");
  const std::size_t P = r.count("max_position_embeddings");
  const float eps = r.positive_float("layer_norm_eps", false, 1e-5f);
  require_activation(r, "hidden_act", "gelu", "the exact GELU");
  r.require("attention_dropout", 0.0, "dropout on the attention weights");
  r.require("hidden_dropout", 0.0, "dropout on the sublayers' outputs");
  r.find("classifier_dropout", true);  // GPTNeoXForTokenClassification's head only
  if (const nlohmann::json* scaling = r.find("rope_scaling", true)) {
    r.fail_field("field \"rope_scaling\" is " + xgrad::detail::json_excerpt(*scaling) +
                 "; scaled rotary embeddings are not implemented (only an absent or null rope_scaling)");
  }
  const double theta = either(r, "rotary_emb_base", "rope_theta", 10000.0, false);
  const double pct = either(r, "rotary_pct", "partial_rotary_factor", 0.25, true);
  const bool parallel = r.flag("use_parallel_residual", true), bias = r.flag("attention_bias", true);
  const bool tied = r.flag("tie_word_embeddings", false);
  if (C % H != 0)
    r.fail_field("num_attention_heads " + std::to_string(H) + " does not divide hidden_size " + std::to_string(C));
  const std::size_t D = C / H;
  const auto rotary = static_cast<std::size_t>(std::floor(static_cast<double>(D) * pct));  // int() in Python
  if (rotary == 0 || rotary % 2 != 0) {
    r.fail_field("rotary_pct " + xgrad::detail::json_excerpt(nlohmann::json(pct)) + " turns " + std::to_string(rotary) +
                 " of the " + std::to_string(D) + " channels of each head; it must be a positive even number");
  }
  HfLayout l;
  l.options = nn::LanguageModelOptions(V, C, H, L)
                  .d_ff(F)
                  .max_len(P)
                  .dropout(0.f)
                  .norm(nn::Norm::pre)
                  .norm_kind(nn::NormKind::layer_norm)
                  .norm_eps(eps)
                  .norm_affine(true)
                  .norm_bias(true)
                  .activation(nn::Activation::gelu)
                  .positional(nn::Positional::rotary)
                  .rope_theta(static_cast<float>(theta))
                  .rotary_dim(rotary == D ? 0 : rotary)
                  .qkv_bias(bias)
                  .out_bias(bias)
                  .ffn_bias(true)
                  .head_bias(false)
                  .tie_embeddings(tied)
                  .parallel_residual(parallel)
                  .init(nn::Init::gpt2);
  l.before = {{"gpt_neox.embed_in.weight", "tok_emb.weight", {V, C}}};
  l.after = {{"gpt_neox.final_layer_norm.weight", "final_norm.weight", {C}},
             {"gpt_neox.final_layer_norm.bias", "final_norm.bias", {C}}};
  if (!tied) l.after.push_back({"embed_out.weight", "head.weight", {V, C}});
  l.head = "embed_out.weight";
  l.buffer = is_neox_buffer;
  l.layer = [=](std::size_t n) {
    const std::string h = "gpt_neox.layers." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    // query_key_value's rows are per head: head i's q, k and v are rows 3 D i + (0, D, 2 D) .. + D.
    const std::string qkv = h + "attention.query_key_value.";
    std::vector<TensorMap> ex = {{h + "input_layernorm.weight", b + "attn.norm.weight", {C}},
                                 {h + "input_layernorm.bias", b + "attn.norm.bias", {C}}};
    const char* parts[] = {"attn.w_q.", "attn.w_k.", "attn.w_v."};
    for (std::size_t part = 0; part < 3; ++part) {
      std::vector<Rows> rows;
      for (std::size_t i = 0; i < H; ++i) rows.push_back({3 * D * i + part * D, D});
      ex.push_back({qkv + "weight", b + parts[part] + "weight", {C, C}, {3 * C, C}, rows});
      if (bias) ex.push_back({qkv + "bias", b + parts[part] + "bias", {C}, {3 * C}, rows});
    }
    add_linear(ex, h + "attention.dense", b + "attn.w_o", C, C, bias);
    ex.push_back({h + "post_attention_layernorm.weight", b + "ffn.norm.weight", {C}});
    ex.push_back({h + "post_attention_layernorm.bias", b + "ffn.norm.bias", {C}});
    add_linear(ex, h + "mlp.dense_h_to_4h", b + "ffn.linear1", F, C, true);
    add_linear(ex, h + "mlp.dense_4h_to_h", b + "ffn.linear2", C, F, true);
    return ex;
  };
  return l;
}

nlohmann::json gpt_neox_config(const nn::LanguageModelOptions& o) {
  const std::size_t D = o.block().attention().head_dim(), r = o.rotary_dim() ? o.rotary_dim() : D;
  return {{"architectures", {"GPTNeoXForCausalLM"}},
          {"model_type", "gpt_neox"},
          {"vocab_size", o.vocab_size()},
          {"hidden_size", o.d_model()},
          {"intermediate_size", o.d_ff()},
          {"num_hidden_layers", o.num_layers()},
          {"num_attention_heads", o.num_heads()},
          {"max_position_embeddings", o.max_len()},
          {"layer_norm_eps", f32_json(o.norm_eps())},
          {"hidden_act", "gelu"},
          {"rotary_pct", static_cast<double>(r) / static_cast<double>(D)},
          {"rotary_emb_base", f32_json(o.rope_theta())},
          {"use_parallel_residual", o.parallel_residual()},
          {"attention_bias", o.qkv_bias()},
          {"tie_word_embeddings", o.tie_embeddings()},
          {"attention_dropout", 0.0},
          {"hidden_dropout", 0.0},
          {"torch_dtype", "float32"}};
}

}  // namespace xgrad::weights::detail
