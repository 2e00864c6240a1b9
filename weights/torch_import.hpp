// PyTorch state dicts (torch's names and layouts) turned into xgrad's names and layouts, ready for
// load_state_dict (checkpoint.hpp). Every function checks the whole input first: a missing, extra
// or misshapen tensor is an Error naming it (and, when misshapen, the shape it has and the one
// expected).
// Values are copied as they are; load_state_dict checks that they are finite.
//
// Shapes: C = E = d_model (embed_dim), kdim / vdim the key and value widths, F FFN width,
// V vocabulary, P max_len (positions), L layers.
#pragma once

#include <memory>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::weights {

/// The state of a PyTorch nn.MultiheadAttention under an Attention's names.
/// nn.MultiheadAttention(E, H, batch_first=True) -> Attention (or a MultiHeadAttention with
/// Norm::none) built with `options`:
/// @code{.unparsed}
///   in_proj_weight (3E, E)          -> w_q.weight, w_k.weight, w_v.weight: rows 0..E, E..2E, 2E..3E
///   in_proj_bias (3E)               -> w_q.bias, w_k.bias, w_v.bias, the same thirds
///   out_proj.weight (E, E), .bias (E) -> w_o.weight, w_o.bias
/// @endcode
/// When options.kdim() or vdim() differs from E, PyTorch keeps the projections apart:
/// q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim) instead of
/// in_proj_weight (cross-attention: forward(query, key, value)). Without bias
/// (options.bias() false) there is no in_proj_bias and no out_proj.bias. Not supported:
/// add_bias_kv (bias_k, bias_v are extra tensors).
NamedArrays from_torch_multihead_attention(const NamedArrays& state, const nn::MultiHeadAttentionOptions& options);

/// The state of a PyTorch nn.TransformerEncoderLayer under a TransformerBlock's names.
/// nn.TransformerEncoderLayer(C, H, F, batch_first=True) -> TransformerBlock built with `options`
/// (norm pre for norm_first=True, post for False; activation relu or gelu as the layer's):
/// @code{.unparsed}
///   self_attn.* (as above, E = C)          -> attn.w_q .. attn.w_o
///   linear1.weight (F, C), .bias (F)        -> ffn.linear1.*
///   linear2.weight (C, F), .bias (C)        -> ffn.linear2.*
///   norm1.weight (C), .bias (C)             -> attn.norm.*
///   norm2.weight (C), .bias (C)             -> ffn.norm.*
/// @endcode
/// The placements agree: norm_first x = x + sa(norm1(x)); x = x + ff(norm2(x)), otherwise
/// x = norm1(x + sa(x)); x = norm2(x + ff(x)). Options that build another block (RMSNorm, norms
/// or projections without biases, grouped-query heads, QK-norm, rotary positions, a gated
/// feed-forward) throw, naming each, before the state is read.
NamedArrays from_torch_encoder_layer(const NamedArrays& state, const nn::TransformerBlockOptions& options);

/// What from_gpt2 returns: a LanguageModel's options and its state.
struct ImportedLanguageModel {
  nn::LanguageModelOptions options;  ///< the options of the LanguageModel the state fits
  NamedArrays state;                 ///< for load_state_dict on LanguageModel(options)
};

/// The options and state of the LanguageModel that a GPT-2 state dict becomes.
/// A GPT-2 (Hugging Face's GPT2Model / GPT2LMHeadModel names, optionally under "transformer.")
/// -> LanguageModel: Pre-Norm, learned positions, Activation::gelu_tanh, norm_eps 1e-5,
/// dropout 0. Conv1D weights are (in, out), the transpose of a Linear's.
/// @code{.unparsed}
///   wte.weight (V, C)                        -> tok_emb.weight, and head.weight (tied; head.bias 0)
///   wpe.weight (P, C)                        -> pos_emb.weight
///   h.N.ln_1.weight/.bias (C)                -> blocks.N.attn.norm.*
///   h.N.attn.c_attn.weight (C, 3C), .bias (3C) -> blocks.N.attn.w_q, w_k, w_v (columns 0..C, C..2C,
///                                               2C..3C, transposed)
///   h.N.attn.c_proj.weight (C, C), .bias (C) -> blocks.N.attn.w_o (transposed)
///   h.N.ln_2.weight/.bias (C)                -> blocks.N.ffn.norm.*
///   h.N.mlp.c_fc.weight (C, F), .bias (F)    -> blocks.N.ffn.linear1 (transposed)
///   h.N.mlp.c_proj.weight (F, C), .bias (C)  -> blocks.N.ffn.linear2 (transposed)
///   ln_f.weight/.bias (C)                    -> final_norm.*
///   lm_head.weight (V, C), optional          -> head.weight instead of wte
/// @endcode
/// V, C, P, L (h.0 .. h.L-1) and F come from the shapes; num_heads must divide C. GPT-2's
/// causal-mask buffers (h.N.attn.bias, h.N.attn.masked_bias), which older versions of Hugging
/// Face's library save, are skipped.
ImportedLanguageModel from_gpt2(const NamedArrays& state, std::size_t num_heads);

/// The options of the LanguageModel in a GPT-2 safetensors file, from its header alone (checked as
/// from_gpt2 checks a state; none of the data is read).
nn::LanguageModelOptions gpt2_options(const std::string& path, std::size_t num_heads);

/// A GPT-2 safetensors file (F32, F16 or BF16) read straight into a new LanguageModel, with the
/// layout from_gpt2 gives: the header is checked first, then the model's memory against what this
/// process can still allocate (an Error naming the call, the file and both sizes), then each tensor
/// is read once into the parameters that take it (Conv1D weights transposed a block of rows at a
/// time, through a 1 MiB buffer). The peak memory is the model's own, not the file held two or
/// three times over. A non-finite weight is an Error naming the tensor.
std::shared_ptr<nn::LanguageModel> load_gpt2(const std::string& path, std::size_t num_heads);

}  // namespace xgrad::weights
