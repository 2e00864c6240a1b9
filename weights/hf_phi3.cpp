// The Phi-3 family (model_type "phi3": Phi-3 and Phi-3.5 mini, Phi-4 mini): Llama's architecture
// with q, k and v in one fused qkv_proj and gate and up in one gate_up_proj, whose rows are read
// into xgrad's separate projections; partial_rotary_factor turns the first part of each head;
// sliding_window, when a number, narrows every layer's attention (Phi-3-mini-4k's 2047).
// Formulas as in transformers 4.57's models/phi3/modeling_phi3.py.
#include <cmath>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

HfLayout phi3_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r);
  r.require("resid_pdrop", 0.0, "dropout on the sublayers' outputs");
  r.require("embd_pdrop", 0.0, "dropout on the embeddings");
  o.sliding_window(read_sliding_window(r, o.max_len()));
  r.find("original_max_position_embeddings", true);  // read by scaled RoPE only, which is refused
  const std::size_t D = o.block().attention().head_dim();
  const double factor = r.fraction("partial_rotary_factor", 1.0);
  const auto rotary = static_cast<std::size_t>(std::floor(static_cast<double>(D) * factor));  // int() in Python
  if (rotary == 0 || rotary % 2 != 0) {
    r.fail_field("partial_rotary_factor " + xgrad::detail::json_excerpt(nlohmann::json(factor)) + " turns " +
                 std::to_string(rotary) + " of the " + std::to_string(D) +
                 " channels of each head; it must be a positive even number");
  }
  o.rotary_dim(rotary == D ? 0 : rotary).bias(false);

  HfLayout l = llama_names(o);
  const std::size_t C = o.d_model(), F = o.d_ff(), HD = o.num_heads() * D;
  const std::size_t KVD = o.block().attention().kv_heads() * D;
  l.layer = [=](std::size_t n) {
    const std::string h = "model.layers." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    const std::string qkv = h + "self_attn.qkv_proj.weight", gate_up = h + "mlp.gate_up_proj.weight";
    const Shape qkv_shape{HD + 2 * KVD, C}, gate_up_shape{2 * F, C};
    return std::vector<TensorMap>{
        {h + "input_layernorm.weight", b + "attn.norm.weight", {C}},
        {qkv, b + "attn.w_q.weight", {HD, C}, qkv_shape, {{0, HD}}},
        {qkv, b + "attn.w_k.weight", {KVD, C}, qkv_shape, {{HD, KVD}}},
        {qkv, b + "attn.w_v.weight", {KVD, C}, qkv_shape, {{HD + KVD, KVD}}},
        {h + "self_attn.o_proj.weight", b + "attn.w_o.weight", {C, HD}},
        {h + "post_attention_layernorm.weight", b + "ffn.norm.weight", {C}},
        {gate_up, b + "ffn.gate.weight", {F, C}, gate_up_shape, {{0, F}}},  // chunk(2): gate first
        {gate_up, b + "ffn.linear1.weight", {F, C}, gate_up_shape, {{F, F}}},
        {h + "mlp.down_proj.weight", b + "ffn.linear2.weight", {C, F}},
    };
  };
  return l;
}

nlohmann::json phi3_config(const nn::LanguageModelOptions& o) {
  nlohmann::json j = llama_like_config(o, "phi3", "Phi3ForCausalLM");
  const std::size_t D = o.block().attention().head_dim(), r = o.rotary_dim() ? o.rotary_dim() : D;
  j["partial_rotary_factor"] = static_cast<double>(r) / static_cast<double>(D);
  j["sliding_window"] = o.sliding_window() ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  return j;
}

}  // namespace xgrad::weights::detail
