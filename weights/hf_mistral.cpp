// The Mistral family (model_type "mistral": Mistral 7B v0.1 to v0.3, Ministral): Llama's
// architecture with sliding-window attention when sliding_window is a number. Formulas as in
// transformers 4.57's models/mistral/modeling_mistral.py and masking_utils.py (query i sees keys
// j with i - sliding_window < j <= i).
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

std::size_t read_sliding_window(const ConfigReader& r, std::size_t max_len) {
  const std::size_t window = r.find("sliding_window", true) ? r.count("sliding_window") : 0;
  return window < max_len ? window : 0;
}

HfLayout mistral_layout(const ConfigReader& r) {
  nn::LanguageModelOptions o = read_llama_like(r);
  return llama_names(o.sliding_window(read_sliding_window(r, o.max_len())).bias(false));
}

nlohmann::json mistral_config(const nn::LanguageModelOptions& o) {
  nlohmann::json j = llama_like_config(o, "mistral", "MistralForCausalLM");
  j.erase("rope_scaling");  // MistralConfig has none
  j["sliding_window"] = o.sliding_window() ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  return j;
}

}  // namespace xgrad::weights::detail
