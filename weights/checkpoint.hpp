// Checkpoints of a module's state (parameters and buffers) and, carried alongside, an optimizer's
// state, as safetensors files. The module's tensors are stored under their dotted names, so the
// file reads naturally from Python; the optimizer's under "optimizer:<name>", which no module
// path can spell (names refuse ':'). The metadata holds the format marker "xgrad.checkpoint" = "2"
// and, for a LanguageModel, its options as JSON under "xgrad.model_options". Files without the
// marker (format 1, which kept the optimizer under "optimizer.<name>") load as before.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"

/// What reads and writes model files: module states and checkpoints, the options' JSON, PyTorch's
/// and GPT-2's layouts, and Hugging Face's Llama folders. nn builds the modules; weights fills
/// and saves them.
namespace xgrad::weights {

/// How loading treats what it finds, e.g.\ LoadOptions().allow_non_finite(true).strict(false).
struct LoadOptions {
  /// A NaN or infinite weight is an error (naming the parameter and the flat position) unless
  /// allowed: a run that diverged before its save would otherwise resume silently as NaN.
  /// Buffers are not checked (a mask may hold -inf).
  XGRAD_ARG(bool, allow_non_finite, false);
  /// strict: a name the module has and the state lacks (missing), or the other way round
  /// (unexpected), is an error. strict(false) loads the names both have and reports the others,
  /// as torch.nn.Module.load_state_dict(strict=False) does. Wrong shapes are errors either way.
  XGRAD_ARG(bool, strict, true);
};

/// The names load_state_dict did not load, in the module's order (missing) and the state's
/// (unexpected); both empty after a strict load.
struct LoadResult {
  /// missing_keys: the names the module has and the state lacks; unexpected_keys: the names the
  /// state has and the module lacks.
  std::vector<std::string> missing_keys, unexpected_keys;
};

/// Copies of the parameter and buffer values by dotted name (Module::named_state's order).
NamedArrays state_dict(const nn::Module& module);
/// Copies values into the module's parameters and buffers. Missing or unexpected names (when
/// strict), wrong shapes, a name given twice and (unless allowed) non-finite parameter values
/// are errors, checked before anything is written, so on error the module is unchanged. States
/// saved before the block's feed-forward norm moved ("blocks.N.ffn_norm.*", now
/// "blocks.N.ffn.norm.*") load under the new names, with one line on stderr saying so. A tied
/// parameter may also be given under its other names (head.weight with tied embeddings, as
/// torch's state_dict writes it); all its entries must then hold the same values.
LoadResult load_state_dict(nn::Module& module, const NamedArrays& state, const LoadOptions& options = {});

/// The tensors and metadata save_checkpoint writes (format 2): state_dict, then the optimizer's
/// entries as "optimizer:<name>"; the caller's metadata plus "xgrad.checkpoint" and, for a
/// LanguageModel, "xgrad.model_options". Names and metadata that are not UTF-8, and metadata keys
/// starting with "xgrad." (reserved), are Errors naming save_checkpoint and the bytes.
SafetensorsContents checkpoint_contents(const nn::Module& module, const NamedArrays& optimizer_state = {},
                                        const Metadata& metadata = {});
/// Saves checkpoint_contents atomically (see save_safetensors).
void save_checkpoint(const std::string& path, const nn::Module& module, const NamedArrays& optimizer_state = {},
                     const Metadata& metadata = {});

/// What load_checkpoint returns besides the module's state.
struct Checkpoint {
  NamedArrays optimizer_state;                            ///< names without the prefix, for Optimizer::load_state_dict
  Metadata metadata;                                      ///< the caller's metadata, without the "xgrad." keys
  std::optional<nn::LanguageModelOptions> model_options;  ///< when the file stores them
  /// As in LoadResult (non-empty only with strict(false)): missing_keys, the module's names the
  /// file lacks, and unexpected_keys, the file's names the module lacks.
  std::vector<std::string> missing_keys, unexpected_keys;
};

/// Loads the module's state (checked as load_state_dict does; all or nothing) and returns the
/// rest; errors name the file. When `module` is a LanguageModel and the file stores model
/// options, every architecture field (architecture_differences) must agree with the model's.
Checkpoint load_checkpoint(const std::string& path, nn::Module& module, const LoadOptions& options = {});

/// What load_language_model returns.
struct LoadedLanguageModel {
  std::unique_ptr<nn::LanguageModel> model;  ///< the model, built and loaded
  Checkpoint checkpoint;                     ///< the rest of the file
};

/// Builds the LanguageModel that the file's "xgrad.model_options" describe and loads it. The
/// options are checked (LanguageModel::check, and against the sizes of the file's tensors: a
/// model far larger than they hold is refused) before anything is built, as is the memory the
/// model needs. A file without stored options is an Error saying so.
LoadedLanguageModel load_language_model(const std::string& path, const LoadOptions& options = {});
/// The same, for a caller who knows the options: every architecture field of `expected` that
/// contradicts the file is named in one Error ("num_heads 2 in the file, 4 asked"); the model
/// takes `expected`'s dropout. A file without stored options (format 1, or saved from another
/// module type) is built from `expected`.
LoadedLanguageModel load_language_model(const std::string& path, const nn::LanguageModelOptions& expected,
                                        const LoadOptions& options = {});

/// Throws "<who>: ... <field> <stored> in the file, <given> asked; ..." naming every architecture
/// field in which `given` contradicts `stored`.
void check_model_options(const nn::LanguageModelOptions& stored, const nn::LanguageModelOptions& given,
                         const std::string& who);

}  // namespace xgrad::weights
