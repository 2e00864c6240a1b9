/// @file
/// LoRA adapters in PEFT's format, so an adapter moves between xgrad and PEFT: a folder with
/// adapter_config.json (LoraConfig's fields) and adapter_model.safetensors, whose tensors are named
/// after the base model's Hugging Face modules:
/// @code{.unparsed}
///   base_model.model.<module>.lora_A.weight (r, in)    -> <xgrad module>.lora.A
///   base_model.model.<module>.lora_B.weight (out, r)   -> <xgrad module>.lora.B
///   e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight -> blocks.0.attn.w_q.lora.A
/// @endcode
/// The modules are named in the family that describes the model (hf_parameter_names).
#pragma once

#include <string>
#include <vector>

#include "xgrad/nn/lora.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

/// What save_peft_adapter writes beside the tensors.
struct PeftExportOptions {
  /// The family whose module names the tensors take (see HfExportOptions::model_type); empty:
  /// the first that describes the model.
  std::string model_type;
  /// adapter_config.json's base_model_name_or_path (where PEFT finds the base model); may be empty.
  std::string base_model_name_or_path;
};

/// Writes the adapters of `model` (nn::apply_lora) into `directory` (created if missing):
/// adapter_model.safetensors (F32), then adapter_config.json with peft_type "LORA", task_type
/// "CAUSAL_LM", r, lora_alpha, lora_dropout, use_rslora, bias "none" and target_modules: the
/// modules' last names ("q_proj") when those select exactly the adapted modules, else their full
/// names. Each file is written atomically. Refused by name before anything is written: a model
/// without adapters, adapters of different options (PEFT's rank_pattern is not written), a merged
/// adapter, and one on a module the family's files fuse with others (Phi-3's qkv_proj) or hold
/// transposed (GPT-2's Conv1D).
void save_peft_adapter(nn::LanguageModel& model, const std::string& directory, const PeftExportOptions& options = {});
/// Throws the Error save_peft_adapter would throw for this model and these options, writing
/// nothing (a training run checks it before its first step).
void check_peft_adapter(nn::LanguageModel& model, const PeftExportOptions& options = {});

/// Adds the adapters of the PEFT folder `directory` to `model`, which has none yet, and fills them;
/// every other parameter is frozen (nn::apply_lora). Returns the adapted xgrad module names.
/// adapter_config.json: peft_type "LORA"; r, lora_alpha (default 8), lora_dropout (default 0),
/// use_rslora (default false); target_modules a list (PEFT's rule: a module's name or last names),
/// a string (a regular expression over the whole name) or "all-linear" (every Linear but the
/// head). Options not implemented are refused by name: use_dora, bias other than "none",
/// modules_to_save, layers_to_transform, layers_pattern, rank_pattern, alpha_pattern,
/// fan_in_fan_out, lora_bias, exclude_modules, trainable_token_indices, target_parameters,
/// layer_replication, use_qalora, task_type other than CAUSAL_LM, and any unknown field; fields
/// that only say how weights were first drawn (init_lora_weights true, false, "gaussian" or "eva";
/// loftq_config, ...) are not read, and an init_lora_weights that also rewrote the base weights
/// (pissa, olora, corda, loftq, lora_ga) is refused by name.
/// Before the model changes, the tensors' names and shapes are compared with the modules the
/// config selects (a tensor missing, one for another module, a shape of another rank or layer
/// are Errors naming it) and every value is read.
std::vector<std::string> load_peft_adapter(nn::LanguageModel& model, const std::string& directory,
                                           const std::string& model_type = "");

}  // namespace xgrad::weights
