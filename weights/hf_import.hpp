/// @file
/// Hugging Face checkpoint folders (config.json and model.safetensors, or shards under
/// model.safetensors.index.json) read into a LanguageModel, by the family config.json's
/// model_type names: "llama" (Llama 2 and 3, SmolLM2), "qwen2" (Qwen 2 and 2.5), "qwen3",
/// "mistral", "phi3", "gpt_neox" (Pythia), "gpt2", "gemma2", "gemma3_text" (Gemma 3's text models).
/// Everything is checked before the model is built: config.json field by field (a field that may
/// change the forward pass and is not implemented is refused by name), then every file's header
/// against the tensors the configuration needs; then each tensor is read straight into its
/// parameter (no random initialization first).
//
// Shapes: C hidden_size, H num_attention_heads, KV num_key_value_heads, D head_dim (default
// C / H), F intermediate_size, V vocab_size, L num_hidden_layers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

/// How load_llama and load_hf_model read the weights, e.g.\ HfLoadOptions().map_file(true).
struct HfLoadOptions {
  /// map_file: each F32 tensor that the model takes whole (not transposed, not split into rows)
  /// and that is aligned for float32 becomes its parameter in place, over the file mapped
  /// copy-on-write (SafetensorsReader::map_f32): nothing is copied, the weights cost no memory of
  /// the process's own until written, and processes that map one file share its pages. The
  /// other tensors are read as without it. The model then keeps the files mapped while it lives.
  /// What a mapping shows of a file changed in place (FileMapping): a file cut shorter while the
  /// model lives ends the process with SIGBUS; a file rewritten in place changes the weights not
  /// yet written. xgrad's own savers write a new file and rename it, which changes nothing here.
  /// Off by default: reading copies the weights, and nothing done to the files afterwards
  /// reaches the model.
  XGRAD_ARG(bool, map_file, false);
};

/// The options of the LanguageModel a Llama-layout checkpoint folder holds, from its config.json
/// alone (no weights are read).
/// @code{.unparsed}
///   vocab_size V, hidden_size C, num_attention_heads H, num_hidden_layers L   -> the four counts
///   intermediate_size F                    -> d_ff
///   max_position_embeddings                -> max_len
///   num_key_value_heads (default H)        -> num_kv_heads, must divide H
///   rms_norm_eps                           -> norm_eps (norm_kind rms_norm, a weight, no bias)
///   rope_theta (default 10000), or rope_parameters {"rope_type": "default", "rope_theta": ...}
///                                          -> rope_theta (positional rotary on the whole head)
///   tie_word_embeddings (default false)    -> tie_embeddings
///   attention_bias (default false)         -> qkv_bias and out_bias
///   mlp_bias (default false)               -> ffn_bias
///   head_dim (optional, default C / H)    -> head_dim (w_q C -> H D, w_o H D -> C); even
///   hidden_act                             -> must be "silu" (activation swiglu)
///   rope_scaling (or rope_parameters' scaling fields) of rope_type default, linear (factor),
///     dynamic (factor; max_len becomes factor * max_position_embeddings) or llama3 (factor,
///     low_freq_factor, high_freq_factor, original_max_position_embeddings)
///                                          -> rope_scaling and its rope_ fields (RopeScaling)
///   model_type                             -> "llama" (or absent)
///   attention_dropout, sliding_window, rope_interleaved -> must be 0, null, false (or absent)
/// @endcode
/// and Pre-Norm, no head bias, dropout 0. Fields that do not change the forward pass (names,
/// token ids, generation defaults, torch_dtype, ...) are not read; any other field is refused by
/// name, since it may change the computation. A field that is missing, of the wrong JSON type, out of
/// range, or inconsistent with another is an Error naming the file and the field; so are a
/// config.json that is missing or not a JSON object, and options LanguageModel::check refuses.
nn::LanguageModelOptions llama_options(const std::string& directory);

/// A new LanguageModel with the weights of the Llama-layout checkpoint in `directory`, in eval mode.
/// The options come from config.json (llama_options). The weights come from model.safetensors
/// when it exists, else from the shards model.safetensors.index.json names in its "weight_map"
/// (tensor name -> file name in the same folder). Tensors may be F32, F16 or BF16 (read as float32
/// exactly). The names (shapes):
/// @code{.unparsed}
///   model.embed_tokens.weight (V, C)                      -> tok_emb.weight
///   model.layers.N.input_layernorm.weight (C)             -> blocks.N.attn.norm.weight
///   model.layers.N.self_attn.q_proj.weight (H*D, C)       -> blocks.N.attn.w_q.weight
///   model.layers.N.self_attn.k_proj.weight (KV*D, C)      -> blocks.N.attn.w_k.weight
///   model.layers.N.self_attn.v_proj.weight (KV*D, C)      -> blocks.N.attn.w_v.weight
///   model.layers.N.self_attn.o_proj.weight (C, H*D)       -> blocks.N.attn.w_o.weight
///   model.layers.N.post_attention_layernorm.weight (C)    -> blocks.N.ffn.norm.weight
///   model.layers.N.mlp.gate_proj.weight (F, C)            -> blocks.N.ffn.gate.weight
///   model.layers.N.mlp.up_proj.weight (F, C)              -> blocks.N.ffn.linear1.weight
///   model.layers.N.mlp.down_proj.weight (C, F)            -> blocks.N.ffn.linear2.weight
///   model.norm.weight (C)                                 -> final_norm.weight
///   lm_head.weight (V, C)                                 -> head.weight (untied only)
/// @endcode
/// with the .bias of each projection (its output size) when attention_bias or mlp_bias is true.
/// The q and k rows are taken as they are: Hugging Face's layout already pairs channel i with
/// i + D/2 (rotate_half), as xgrad's rotary embedding does.
/// With tie_word_embeddings the head is tok_emb.weight; an lm_head.weight in the checkpoint is
/// then accepted only when it equals model.embed_tokens.weight exactly (it is a copy of the tied
/// weight), and is an Error naming both and the first element that differs otherwise.
///
/// Before the model is built: config.json is checked, then every file's header (a tensor missing,
/// unexpected or of the wrong shape is an Error naming its Hugging Face name, its xgrad name and
/// both shapes; the index is checked for shards that do not exist, tensors it does not name or puts
/// in a file that lacks them, and tensors two shards both hold), then the model's memory against
/// what this process can still allocate. Then each tensor is read once, straight into its
/// parameter; a non-finite weight is an Error naming the tensor and the file.
std::shared_ptr<nn::LanguageModel> load_llama(const std::string& directory, const HfLoadOptions& options = {});

/// The model_types load_hf_model reads, in the order messages list them.
std::vector<std::string> hf_model_types();

/// The options of the LanguageModel the Hugging Face folder `directory` holds, from config.json
/// alone, by its model_type (absent: "llama"):
/// @code{.unparsed}
///   llama   as llama_options
///   qwen2   as llama, with biases on q_proj, k_proj and v_proj (not o_proj) and none elsewhere
///           (qkv_bias, no out_bias); with use_sliding_window, sliding_window (default 4096) on the
///           layers layer_types calls "sliding_attention" (absent: from max_window_layers on,
///           default 28), the others in full_attention_layers; without it, every layer attends to
///           every earlier position
///   qwen3   as qwen2, with self_attn.q_norm and k_norm (qk_norm: an RMSNorm of D with rms_norm_eps
///           over each head's q and k, before RoPE), head_dim (default 128, as Qwen3Config's),
///           and attention_bias (default false) for all four projections
///   mistral as llama, with sliding_window (null: none) -> sliding_window: query i sees keys
///           i - sliding_window + 1 .. i, and the KV cache keeps that many positions
///   phi3    as llama, with self_attn.qkv_proj (H D + 2 KV D, C) read as w_q, w_k and w_v (rows
///           in that order) and mlp.gate_up_proj (2 F, C) as gate then up; partial_rotary_factor
///           (default 1) gives rotary_dim = int(D * factor); resid_pdrop and embd_pdrop 0;
///           sliding_window as mistral's
///   gpt_neox  Pythia: LayerNorms with biases (layer_norm_eps), parallel_residual from
///           use_parallel_residual (default true), rotary_dim int(D * rotary_pct) (default 0.25)
///           with base rotary_emb_base (or rope_theta), exact GELU MLP with biases,
///           attention.query_key_value (3 C, C) read per head (head i's q, k, v are rows
///           3 D i + 0, D, 2 D, D each), an untied embed_out
///   gpt2    learned positions, LayerNorms and projections with biases, tied by default; n_embd,
///           n_head, n_layer, n_positions, n_inner, layer_norm_epsilon, activation_function
///           (gelu_new, gelu_pytorch_tanh, gelu, relu); Conv1D weights (in, out) read transposed,
///           attn.c_attn's columns as q, k, v; names with or without "transformer."; the
///           training dropouts (embd_pdrop, attn_pdrop, resid_pdrop) read, the model at dropout 0
///   gemma2  Gemma 2: norm sandwich (input_layernorm and post_attention_layernorm around the
///           attention, pre_feedforward_layernorm and post_feedforward_layernorm around the MLP),
///           RMSNorms scaling by 1 + weight (norm_unit_offset), GeGLU with the tanh GELU
///           (hidden_activation gelu_pytorch_tanh), head_dim (default 256), num_key_value_heads
///           (default 4), embeddings times
///           sqrt(hidden_size) (embed_scale), scores times query_pre_attn_scalar^-0.5 (attn_scale,
///           default 256), attn_logit_softcapping (default 50) and final_logit_softcapping
///           (default 30; null: none), sliding_window on the layers layer_types calls
///           "sliding_attention" (absent: the even layers 0, 2, ...), tied by default
///   gemma3_text  Gemma 3 (gemma-3-1b, and the text model of the larger ones): gemma2's layout
///           with q_norm and k_norm (qk_norm, 1 + weight), rope_theta (default 1e6) and its
///           rope_scaling on the full layers and rope_local_base_freq (default 1e4, unscaled) on
///           the sliding ones (rope_local_theta), layer_types or sliding_window_pattern (default 6:
///           every sixth layer full), no caps by default; use_bidirectional_attention must be false
/// @endcode
/// Any other model_type is refused, naming the ones implemented ("gemma3", the image-and-text
/// model, among them: its text model is gemma3_text).
nn::LanguageModelOptions hf_model_options(const std::string& directory);
/// A new LanguageModel with the weights of the Hugging Face folder `directory`, in eval mode: the
/// options as hf_model_options gives them, the files and checks as load_llama's, with each
/// family's tensor names (Llama's, Qwen 3's q_norm and k_norm, Phi-3's fused projections).
std::shared_ptr<nn::LanguageModel> load_hf_model(const std::string& directory, const HfLoadOptions& options = {});

}  // namespace xgrad::weights
