// The residual stream of a Pre-Norm language model taken apart: the stream accumulated before
// each block, the final stream as a sum of its components (embeddings, each attention layer or
// head, each MLP), the final norm's scale applied to them (TransformerLens's apply_ln_to_stack),
// and direct logit attribution: how much of a logit, or a logit difference, each component
// writes. All from an ActivationCache of one forward (cache it with residual_points()).
//
// Why it adds up: in a Pre-Norm model the stream leaving the last block is
//   x = tok_embed + pos_embed + sum over blocks L of (attn_L + ffn_L),   attn_L = sum over heads h
//   of z_h W_o[h] plus W_o's bias,
// and the final norm is linear in x once its scale s (per position) is fixed:
//   LayerNorm(x) = (x - mean x) / s * weight + bias,  s = sqrt(var x + eps);  RMSNorm: x / s * weight.
// So logit_v = sum over components c of (c - mean c) / s * weight . W_U[v]  +  bias . W_U[v] + b_U[v].
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::inspect {

/// Named vectors in the residual stream's space: stack (N, B, T, C), labels[n] naming entry n.
struct ResidualStack {
  std::vector<std::string> labels;  ///< what each entry is, e.g. "tok_embed", "blocks.0.attn.head.2"
  Array stack;                      ///< (N, B, T, C)
};

/// The points the functions below read, for cache_activations: the embeddings, each block's
/// stream points and sublayer outputs, each attention's context (for the per-head split), and
/// the final norm's output.
PointFilter residual_points();

/// The stream entering each block, "blocks.L.stream_in" (with incl_mid, each block's
/// "blocks.L.stream_mid" after it), and the stream leaving the last block (TransformerLens's
/// accumulated_resid with layer n_layers).
ResidualStack accumulated_residual(const nn::LanguageModel& model, const ActivationCache& cache, bool incl_mid = false);

/// The stream leaving the last block as a sum of components, in forward order: "tok_embed",
/// "pos_embed" (learned or sinusoidal positions only), then for each block "blocks.L.attn" and
/// "blocks.L.ffn" (their sublayers' outputs). With by_head, each attention is split into its heads,
/// "blocks.L.attn.head.H" (z_h W_o[h]), and "blocks.L.attn.bias" (W_o's bias, when it has one).
/// The entries sum to the cached "blocks.{last}.stream_out" within fp32 rounding. Throws for a
/// Post-Norm model (its stream is normalized after every sublayer, so it is no such sum), for a
/// sandwich-norm model (Gemma: what the stream receives is each sublayer's output normalized, not
/// its out point) and for a cache that lacks a point it needs (naming it).
ResidualStack decompose_residual(const nn::LanguageModel& model, const ActivationCache& cache, bool by_head = false);

/// Each entry of `stack` (N, B, T, C) scaled as the final norm scales the whole stream at that
/// position, without the norm's weight and bias: (c - mean c) / s for LayerNorm, c / s for RMSNorm,
/// with s computed from the cached last "stream_out"; unchanged for a model without a final norm.
/// So for a decomposition the scaled entries sum to the final norm's output before its weight
/// and bias. Throws when the stack's (B, T, C) is not the cache's.
Array apply_final_norm_to_stack(const nn::LanguageModel& model, const ActivationCache& cache, const Array& stack);

/// Direct logit attribution of a stack (usually decompose_residual's) to the logits of `tokens`.
struct LogitAttribution {
  /// The stack's labels, then "bias": the final norm's bias and the head's bias on the logit.
  std::vector<std::string> labels;
  /// (N + 1, B, T): entry n at (b, t) is what component n adds to logit tokens(b, t) at (b, t)
  /// (minus what it adds to logit other(b, t), when given). For a decomposition, the entries at
  /// (b, t) sum to that logit (difference) as the model computes it, within fp32 rounding.
  Array values;
};

/// `tokens` and `other` are (B, T) ids; `other`, when given, turns each logit into the logit
/// difference tokens - other (e.g.\ the right answer's logit minus a wrong one's). Throws for ids
/// outside the vocabulary, for shapes that do not match the stack's (B, T), for the models
/// decompose_residual refuses, and for logits under final_softcap (no longer a sum).
LogitAttribution direct_logit_attribution(const nn::LanguageModel& model, const ActivationCache& cache,
                                          const ResidualStack& stack, const IndexArray& tokens,
                                          const std::optional<IndexArray>& other = std::nullopt);

}  // namespace xgrad::inspect
