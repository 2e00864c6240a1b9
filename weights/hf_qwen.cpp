// The Qwen families: "qwen2" (Qwen 2 and 2.5: biases on q, k and v but not on o) and "qwen3"
// (an RMSNorm over each head's q and k before RoPE, an explicit head_dim). Formulas as in
// transformers 4.57's models/qwen2/modeling_qwen2.py and models/qwen3/modeling_qwen3.py.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

namespace {

// Qwen 2's config.json also says use_mrope false (Qwen2-VL's position scheme; true is refused).
// The window is on only with use_sliding_window; then layer_types names the sliding layers, or
// (absent) the layers from max_window_layers (default 28) on slide, with sliding_window (default
// 4096), as Qwen2Config and Qwen3Config say. Without it the two fields change nothing and
// layer_types, when given, is only checked.
nn::LanguageModelOptions& read_window(const ConfigReader& r, nn::LanguageModelOptions& o) {
  r.require("use_mrope", false, "multimodal rotary embeddings (use_mrope)");
  const bool on = r.flag("use_sliding_window", false);
  const nlohmann::json *layers = r.find("max_window_layers", true), *window = r.find("sliding_window", true);
  const std::size_t L = o.num_layers();
  if (!on) {
    if (r.find("layer_types", true)) read_full_attention_layers(r, L, [](std::size_t) { return false; });
    return o;
  }
  if (layers && !layers->is_number_unsigned()) {
    r.fail_field("field \"max_window_layers\" must be a whole number, got " + xgrad::detail::json_excerpt(*layers));
  }
  const std::uint64_t first = layers ? layers->get<std::uint64_t>() : 28;
  const std::size_t W = window ? r.count("sliding_window") : 4096;
  const std::vector<std::size_t> full = read_full_attention_layers(r, L, [&](std::size_t i) { return i >= first; });
  if (full.size() == L) return o;
  return o.sliding_window(std::min(W, o.max_len())).full_attention_layers(full);
}

}  // namespace

HfLayout qwen2_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r);
  return llama_names(read_window(r, o).qkv_bias(true).out_bias(false).ffn_bias(false));
}

HfLayout qwen3_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r, 128);  // Qwen3Config's head_dim
  read_window(r, o);
  const bool bias = r.flag("attention_bias", false);
  return llama_names(o.qk_norm(true).qkv_bias(bias).out_bias(bias).ffn_bias(false));
}

namespace {

// use_sliding_window and its fields, with layer_types naming each layer.
nlohmann::json qwen_config(const nn::LanguageModelOptions& o, const char* type, const char* architecture) {
  nlohmann::json j = llama_like_config(o, type, architecture);
  const bool window = o.sliding_window() > 0;
  j["use_sliding_window"] = window;
  j["sliding_window"] = window ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  j["max_window_layers"] = o.num_layers();
  j["layer_types"] = layer_types_json(o);
  return j;
}

}  // namespace

nlohmann::json qwen2_config(const nn::LanguageModelOptions& o) { return qwen_config(o, "qwen2", "Qwen2ForCausalLM"); }

nlohmann::json qwen3_config(const nn::LanguageModelOptions& o) {
  nlohmann::json j = qwen_config(o, "qwen3", "Qwen3ForCausalLM");
  j["attention_bias"] = o.qkv_bias();
  return j;
}

}  // namespace xgrad::weights::detail
