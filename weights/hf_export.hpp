/// @file
/// A LanguageModel written as a Hugging Face folder (config.json and model.safetensors, F32) under
/// the names of the family that describes it, the inverse of load_hf_model (hf_import.hpp), with
/// the tokenizer files of another folder copied beside it.
#pragma once

#include <string>

#include "xgrad/nn/freeze.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

/// What save_hf_model writes.
struct HfExportOptions {
  /// The family's model_type (one of hf_model_types()); empty: the first family, in that order,
  /// whose config.json describes the model exactly.
  std::string model_type;
  /// A folder whose tokenizer files (tokenizer.json, tokenizer_config.json,
  /// special_tokens_map.json, vocab.json, merges.txt, tokenizer.model, those present) are copied
  /// beside the model; empty: none.
  std::string tokenizer_dir;
};

/// The config.json that describes a model of these options in its family (see HfExportOptions),
/// as text. It is checked by reading it back with the family's reader (load_hf_model's): the
/// options it gives must be `options`' architecture (architecture_differences; the
/// initialization aside). An Error names the family and every field that differs (for the
/// automatic choice, those of the family that comes closest), or an unknown model_type.
std::string hf_config_json(const nn::LanguageModelOptions& options, const HfExportOptions& export_options = {});

/// The Hugging Face tensor name of every parameter of a model of these options, in the family
/// that describes it (HfExportOptions::model_type; empty: the first that does), as save_hf_model
/// writes them; the parts of a fused tensor all give its name ("model.layers.0.self_attn.qkv_proj.weight").
/// For name patterns in Hugging Face's spelling (nn::freeze, nn::apply_lora). Refused as
/// hf_config_json refuses.
nn::NameAliases hf_parameter_names(const nn::LanguageModelOptions& options, const std::string& model_type = "");

/// Writes `model` into `directory` (created if missing): model.safetensors (every parameter in F32
/// under the family's names, fused tensors joined and GPT-2's Conv1D weights transposed as the
/// family's files hold them; a tied head is not written), then config.json (hf_config_json), then
/// the tokenizer files; each file atomically, so a failed save leaves an earlier one whole. A
/// tokenizer file that is already the output (tokenizer_dir is `directory`) is refused by name.
/// load_hf_model(directory) gives the model back: the same options and every parameter bit for bit.
/// A model with LoRA adapters is refused by name (merge them first with nn::merge_lora, or save
/// them with save_peft_adapter).
void save_hf_model(const nn::LanguageModel& model, const std::string& directory, const HfExportOptions& options = {});

}  // namespace xgrad::weights
