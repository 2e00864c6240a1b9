// The Qwen families: "qwen2" (Qwen 2 and 2.5: biases on q, k and v but not on o) and "qwen3"
// (an RMSNorm over each head's q and k before RoPE, an explicit head_dim). Formulas as in
// transformers 4.57's models/qwen2/modeling_qwen2.py and models/qwen3/modeling_qwen3.py.
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

namespace {

// Qwen 2's config.json also says use_mrope false (Qwen2-VL's position scheme; true is refused).
// Sliding-window attention is on only with use_sliding_window (and then from layer
// max_window_layers on), or where layer_types names "sliding_attention": both refused; without
// it sliding_window and max_window_layers change nothing.
void refuse_sliding_window(const ConfigReader& r) {
  r.require("use_mrope", false, "multimodal rotary embeddings (use_mrope)");
  r.require("use_sliding_window", false, "sliding-window attention (use_sliding_window)");
  r.find("sliding_window", true);
  r.find("max_window_layers", true);
  if (const nlohmann::json* types = r.find("layer_types", true)) {
    if (!types->is_array())
      r.fail_field("field \"layer_types\" must be an array, got " + xgrad::detail::json_excerpt(*types));
    for (const auto& t : *types) {
      if (t != "full_attention") {
        r.fail_field("field \"layer_types\" holds " + xgrad::detail::json_excerpt(t) +
                     "; only \"full_attention\" layers are implemented");
      }
    }
  }
}

}  // namespace

HfLayout qwen2_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r);
  refuse_sliding_window(r);
  return llama_names(o.qkv_bias(true).out_bias(false).ffn_bias(false));
}

HfLayout qwen3_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r, 128);  // Qwen3Config's head_dim
  refuse_sliding_window(r);
  const bool bias = r.flag("attention_bias", false);
  return llama_names(o.qk_norm(true).qkv_bias(bias).out_bias(bias).ffn_bias(false));
}

}  // namespace xgrad::weights::detail
