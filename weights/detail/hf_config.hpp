// A Hugging Face folder's config.json, read field by field, and the layout of its tensors: what
// each family (weights/hf_<family>.cpp) maps its config.json onto, and weights/hf_import.cpp
// reads. Internal to weights/.
#pragma once

#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights::detail {

/// The fields of config.json, each checked as it is read; errors name the file and the field.
/// Every field read is noted: refuse_unread names the first field no reader took.
class ConfigReader {
 public:
  ConfigReader(const char* who, std::string path);
  /// The fields of `config`, named `path` in messages (a config.json about to be written).
  ConfigReader(const char* who, std::string path, nlohmann::json config);

  /// A positive integer. `fallback` 0: the field is required. `null_is_absent`: Hugging Face
  /// reads an explicit null as the default.
  std::size_t count(const char* field, std::size_t fallback = 0, bool null_is_absent = false) const;
  /// A number > 0 that float32 holds as a finite value other than 0.
  float positive_float(const char* field, bool required, float fallback = 0.f) const;
  float positive_float(const nlohmann::json& v, const std::string& field) const;
  /// A number in [0, 1] (a dropout or a fraction); absent or null: fallback.
  double fraction(const char* field, double fallback) const;
  bool flag(const char* field, bool fallback) const;
  /// A string; absent or null: fallback (nullptr: the field is required).
  std::string text(const char* field, const char* fallback) const;
  /// The field, or nullptr when it is absent (or null, when that reads as absent).
  const nlohmann::json* find(const char* field, bool null_is_absent) const;
  /// The field's only implemented value is `expected` (or null, or absent): any other is refused,
  /// naming what it would have turned on.
  void require(const char* field, const nlohmann::json& expected, const char* what) const;
  /// Every field may change the forward pass unless it was read or is inert (names, token ids,
  /// generation defaults, ...; kInertFields, plus `more`): the first other one is refused by name.
  void refuse_unread(const std::set<std::string>& more = {}) const;
  /// An Error beginning "who: 'path': ".
  [[noreturn]] void fail_field(const std::string& message) const;

  const std::string& path() const { return path_; }
  const char* who() const { return who_; }

 private:
  const char* who_;
  std::string path_;
  nlohmann::json j_;
  mutable std::set<std::string> read_;
};

/// RoPE's base and scaling.
struct Rope {
  float theta;
  RopeScaling scaling;
};
/// `rope_theta` (default 10000) and `rope_scaling`, or transformers 5's `rope_parameters` (its
/// rope_type, rope_theta and the scaling's fields): rope_type (or the older "type") "default",
/// "linear" (factor), "dynamic" (factor; the original context is max_position_embeddings, as in
/// Hugging Face's dynamic RoPE) or "llama3" (factor, low_freq_factor, high_freq_factor,
/// original_max_position_embeddings). Other types (yarn, longrope, ...) and fields are refused by
/// name, as are two values of rope_theta that differ.
Rope read_rope(const ConfigReader& r, std::size_t max_position_embeddings);

/// The hidden activation `field` must be `expected` (or absent).
void require_activation(const ConfigReader& r, const char* field, const char* expected, const char* what);

/// A span of rows of a tensor (elements, for a vector).
struct Rows {
  std::size_t first, count;
};

/// One parameter read from a checkpoint's tensor: the whole tensor, or some of its rows in order
/// (a part of a fused projection: Phi-3's qkv_proj, GPT-NeoX's per-head query_key_value).
struct TensorMap {
  std::string hf;               ///< the tensor's name in the files
  std::string xgrad;            ///< the parameter's name
  Shape shape;                  ///< the parameter's shape
  Shape source = {};            ///< the tensor's shape in the files; empty: shape
  std::vector<Rows> rows = {};  ///< the source's rows taken, in order; empty: all of it
  /// The source (in, out) holds the parameter transposed (GPT-2's Conv1D): `rows` then name the
  /// source's columns, each of which becomes a row of the parameter.
  bool transposed = false;
  const Shape& file_shape() const { return source.empty() ? shape : source; }
};

/// What a family's config.json describes: the model's options and where each parameter is.
struct HfLayout {
  nn::LanguageModelOptions options{1, 1, 1, 1};
  std::vector<TensorMap> before, after;                      ///< the tensors before and after the layers
  std::function<std::vector<TensorMap>(std::size_t)> layer;  ///< layer n's tensors
  /// The head's tensor, which a tied checkpoint may also hold as a copy of the embedding.
  std::string head;
  /// Buffers older versions saved beside the weights (rotary inv_freq, causal masks): skipped.
  std::function<bool(const std::string&)> buffer = [](const std::string&) { return false; };
  /// A prefix of the names that files may leave out (GPT-2's "transformer.", which a GPT2Model
  /// saved alone lacks): when no tensor starts with it, it is dropped from every name.
  std::string optional_prefix;
};

/// A linear layer's weight (out, in) and, with `bias`, its bias (out).
void add_linear(std::vector<TensorMap>& out, const std::string& hf, const std::string& xgrad, std::size_t rows,
                std::size_t cols, bool bias);

/// The fields Llama, Qwen 2 and 3, Mistral and Phi-3 share, read into options with their common
/// architecture: Pre-Norm RMSNorm, RoPE over whole heads, SwiGLU, no biases, dropout 0, GPT-2's
/// init; vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
/// num_key_value_heads, head_dim, max_position_embeddings, rms_norm_eps, rope_theta (or
/// rope_parameters), tie_word_embeddings, hidden_act "silu" (unless !swiglu: the caller reads the
/// activation), attention_dropout 0. An absent head_dim is `default_head_dim` (0: hidden_size /
/// num_attention_heads).
nn::LanguageModelOptions read_llama_like(const ConfigReader& r, std::size_t default_head_dim = 0, bool swiglu = true);
/// Llama's tensor names (model.embed_tokens, model.layers.N.self_attn.q_proj, ..., lm_head) for
/// the model `o` describes: biases, q_norm and k_norm as its options have them.
HfLayout llama_names(const nn::LanguageModelOptions& o);

/// The indexes of the layers layer_types calls "full_attention" (the others "sliding_attention"),
/// or, when it is absent, those `slides` says do not slide (the config class's default).
std::vector<std::size_t> read_full_attention_layers(const ConfigReader& r, std::size_t num_layers,
                                                    const std::function<bool(std::size_t)>& slides);

/// sliding_window: a positive count, or 0 (no window) when it is absent, null, or max_len or more
/// (a window that covers every position a forward takes).
std::size_t read_sliding_window(const ConfigReader& r, std::size_t max_len);

/// The families, one per file: each reads its fields from `r` (refusing what it does not
/// implement) and gives the layout (refuse_unread is called after it), and writes the config.json
/// that describes a model of the family (`<family>_config`; the exporter reads it back with the
/// family's reader to check that it describes the model exactly).
HfLayout llama_layout(const ConfigReader& r);
HfLayout qwen2_layout(const ConfigReader& r);
HfLayout qwen3_layout(const ConfigReader& r);
HfLayout mistral_layout(const ConfigReader& r);
HfLayout phi3_layout(const ConfigReader& r);
HfLayout gpt_neox_layout(const ConfigReader& r);
HfLayout gpt2_layout(const ConfigReader& r);
HfLayout gemma2_layout(const ConfigReader& r);
HfLayout gemma3_layout(const ConfigReader& r);
nlohmann::json llama_config(const nn::LanguageModelOptions& o);
nlohmann::json qwen2_config(const nn::LanguageModelOptions& o);
nlohmann::json qwen3_config(const nn::LanguageModelOptions& o);
nlohmann::json mistral_config(const nn::LanguageModelOptions& o);
nlohmann::json phi3_config(const nn::LanguageModelOptions& o);
nlohmann::json gpt_neox_config(const nn::LanguageModelOptions& o);
nlohmann::json gpt2_config(const nn::LanguageModelOptions& o);
nlohmann::json gemma2_config(const nn::LanguageModelOptions& o);
nlohmann::json gemma3_config(const nn::LanguageModelOptions& o);

/// A family: its model_type, its reader and its writer.
struct Family {
  const char* model_type;
  HfLayout (*layout)(const ConfigReader&);
  nlohmann::json (*config)(const nn::LanguageModelOptions&);
};
/// Every family, in the order hf_model_types() lists them.
const std::vector<Family>& families();
/// The layout the config `r` describes, by its model_type (absent: "llama"; `only`, when given, is
/// the one taken), every field read or refused (refuse_unread) and the options checked
/// (LanguageModel::check); errors name r.who() and r.path().
HfLayout read_layout(const ConfigReader& r, const char* only = nullptr);
/// The layout save_hf_model writes a model of these options with: the family model_type names, or
/// the first that describes the options exactly (empty model_type); an Error as hf_config_json's.
HfLayout describe_layout(const nn::LanguageModelOptions& options, const std::string& model_type, const char* who);
/// Every tensor of the layout for `num_layers` layers: before, each layer's, after.
std::vector<TensorMap> layout_maps(const HfLayout& layout, std::size_t num_layers);

/// A float32 value as the shortest decimal that reads back as it (1e-06, not 9.99999997e-07).
nlohmann::json f32_json(float v);
/// The fields read_llama_like reads, for options of that architecture: the counts, head_dim,
/// max_position_embeddings (dynamic RoPE: the trained context), rms_norm_eps, rope_theta,
/// rope_scaling, tie_word_embeddings, hidden_act "silu", attention_dropout 0, and the
/// architectures, model_type and torch_dtype ("float32") entries.
nlohmann::json llama_like_config(const nn::LanguageModelOptions& o, const char* model_type, const char* architecture);
/// layer_types as Hugging Face writes it: "sliding_attention" for the windowed blocks.
nlohmann::json layer_types_json(const nn::LanguageModelOptions& o);

}  // namespace xgrad::weights::detail
