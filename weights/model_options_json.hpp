// LanguageModelOptions as JSON (the architecture a checkpoint stores under "xgrad.model_options"),
// and the fields in which two options differ.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

/// The options as one JSON object with every field under its own name (enums by name: "pre",
/// "gelu_tanh", "sinusoidal"); what save_checkpoint stores for a LanguageModel under
/// "xgrad.model_options".
std::string to_json(const nn::LanguageModelOptions& options);
/// Reads to_json's text back. A field that is missing, unknown, of the wrong type or out of range
/// is an Error naming `who`, the field and the value (so are text that is not a JSON object, a
/// field given twice, and options LanguageModel::check refuses).
nn::LanguageModelOptions language_model_options_from_json(const std::string& text, const std::string& who);
/// The names of an option's values as files and command lines spell them, in the enum's order.
template <class E>
using OptionNames = std::vector<std::pair<std::string, E>>;
const OptionNames<nn::Norm>& norm_names();                   ///< pre, post, sandwich
const OptionNames<nn::NormKind>& norm_kind_names();          ///< layer_norm, rms_norm
const OptionNames<nn::Activation>& activation_names();       ///< gelu, gelu_tanh, relu, swiglu, geglu, geglu_tanh
const OptionNames<nn::Positional>& positional_names();       ///< learned, sinusoidal, none, rotary
const OptionNames<nn::Init>& init_names();                   ///< pytorch, gpt2
const OptionNames<RopeScaling::Type>& rope_scaling_names();  ///< none, linear, dynamic, llama3

/// One field in which two options differ, with both values as to_json writes them.
struct OptionsDifference {
  /// The field's name (e.g.\ "num_heads"), then its value in the stored and in the given options.
  std::string field, stored, given;
};
/// The architecture fields in which `given` differs from `stored`, in to_json's order: every
/// field but dropout (a training setting that does not change what the weights compute in eval
/// mode, so a caller may pick another). Two spellings of one model are no difference: num_kv_heads
/// 0 and num_heads, head_dim 0 and d_model / num_heads, rotary_dim 0 and the head size, attn_scale 0 and
/// 1 / sqrt(head size); nor are fields that build
/// nothing: rope_theta, rotary_dim and the RoPE scaling without rotary positions, the rope_ factors without a scaling,
/// head_bias with tied embeddings, norm_bias with RMSNorm or without a norm weight.
std::vector<OptionsDifference> architecture_differences(const nn::LanguageModelOptions& stored,
                                                        const nn::LanguageModelOptions& given);

}  // namespace xgrad::weights
