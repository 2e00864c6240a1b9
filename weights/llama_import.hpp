/// @file
/// Hugging Face Llama-layout checkpoints (LlamaForCausalLM: config.json and model.safetensors, or
/// shards under model.safetensors.index.json) read into a LanguageModel. Everything is checked
/// before the model is built: config.json field by field, then every file's header against the
/// tensors the configuration needs.
//
// Shapes: C hidden_size, H num_attention_heads, KV num_key_value_heads, D = C / H, F
// intermediate_size, V vocab_size, L num_hidden_layers.
#pragma once

#include <memory>
#include <string>

#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

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
///   head_dim (optional)                    -> must equal C / H
///   hidden_act                             -> must be "silu" (activation swiglu)
///   rope_scaling                           -> must be absent or null
///   model_type                             -> must be "llama" (or absent)
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
std::shared_ptr<nn::LanguageModel> load_llama(const std::string& directory);

}  // namespace xgrad::weights
