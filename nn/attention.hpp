// Multi-head attention, the classic module: per-head scaled dot-product attention in subspaces
// of size D = d_model / H, dropout on the attention weights, masks, and (MultiHeadAttention) the
// residual connection with LayerNorm placed Pre-Norm or Post-Norm.
//
//   head_h  = softmax(Q_h K_h^T / sqrt(D) + mask) V_h     with Q_h = query W_q[h], K_h = key W_k[h],
//                                                           V_h = value W_v[h]
// Self-attention takes query = key = value = x; cross-attention takes key and value of another
// length S and, optionally, other widths (kdim, vdim, as PyTorch's nn.MultiheadAttention).
//   Attention(x) = concat(head_1 .. head_H) W_o
//   MultiHeadAttention = Residual<Attention> (residual.hpp), by options.norm():
//     Pre-Norm:  y = x + Attention(norm(x))
//     Post-Norm: y = norm(x + Attention(x))
//     none:      y = Attention(x)            (no residual, no norm: compose your own)
//
// Hook points of Attention (hook.hpp), in forward order:
//   q          (B, T, C) the query projection, heads side by side (head h is channels hD .. (h+1)D)
//   k, v       (B, S, C) the key and value projections (with a KVCache: every cached position)
//   scores     (B, H, T, S) scale Q_h K_h^T before masks and softmax (formed only while hooked)
//   pattern    (B, H, T, S) the attention weights, before dropout
//   context    (B, T, C) each head's output, side by side, before W_o
//   out        (B, T, C) the attention's output
//
// Shapes: B batch, T query length, S key length (S = T: self-attention), C = d_model,
// H heads, D = C / H.
#pragma once

#include <memory>
#include <optional>

#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/options.hpp"
#include "xgrad/nn/random_stream.hpp"
#include "xgrad/nn/residual.hpp"

namespace xgrad::nn {

/// The options of Attention and MultiHeadAttention:
/// MultiHeadAttentionOptions(512, 8).dropout(0.1f).norm(Norm::post), for example.
struct MultiHeadAttentionOptions {
  /// d_model C and num_heads H (H must divide C); the other options at their defaults.
  MultiHeadAttentionOptions(std::size_t d_model, std::size_t num_heads) : d_model_(d_model), num_heads_(num_heads) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);    ///< the model width C, of the query and the output
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);  ///< the number of heads H
  /// On the attention weights, while training; masks come from the module's RandomStream.
  XGRAD_ARG(float, dropout, 0.1f);
  XGRAD_ARG(Norm, norm, Norm::pre);         ///< where MultiHeadAttention's LayerNorm sits
  XGRAD_ARG(bool, bias, true);              ///< biases of the four projections
  XGRAD_ARG(float, layer_norm_eps, 1e-5f);  ///< the eps of MultiHeadAttention's LayerNorm
  XGRAD_ARG(std::size_t, kdim, 0);          ///< width of the key input; 0: d_model
  XGRAD_ARG(std::size_t, vdim, 0);          ///< width of the value input; 0: d_model
};

/// Masks for one forward call. In the boolean masks true marks a key that may NOT be attended to.
/// A query left with no key gets weights of zero (and so a context of zero), never NaN, and no
/// gradient flows through its scores.
struct AttentionMask {
  /// Query t sees keys 0..t only (with a KVCache holding P positions: query t is position P + t,
  /// and sees 0..P + t).
  bool causal = false;
  std::optional<Mask> attn_mask;         ///< broadcastable to (B, H, T, S)
  std::optional<Mask> key_padding_mask;  ///< (B, S): true marks padding keys
  /// Added to the scaled scores before the softmax, broadcastable to (B, H, T, S), as PyTorch's
  /// float attn_mask; -inf blocks a key, and +inf or NaN is an error.
  std::optional<Array> additive_mask;
};

/// The keys and values an Attention has projected so far, for generating one position at a time:
/// forward(x, mask, &cache) projects only x's positions, appends them, and attends over all.
/// The stored tensors keep their autograd history while gradients are recorded: run cached steps
/// under NoGradGuard (generate does) unless a backward through every step is wanted.
struct KVCache {
  /// The keys, (B, P, C): the P positions seen so far; undefined while empty.
  Tensor k, v;  ///< the values, (B, P, C); undefined while empty
  /// P, the number of positions held (0 while empty).
  std::size_t length() const { return k.defined() ? k.shape()[1] : 0; }
  /// Empties the cache.
  void clear() { k = Tensor(), v = Tensor(); }
};

/// What Attention::forward returns.
struct AttentionOutput {
  Tensor output;   ///< (B, T, C)
  Tensor weights;  ///< (B, H, T, S), before dropout; a query whose keys are all masked gets zeros
};
/// The main tensor of an AttentionOutput, for Residual: its output.
inline Tensor& residual_output(AttentionOutput& out) { return out.output; }

/// The attention sublayer alone: projections, heads, dropout on the weights, masks. Of the
/// options it reads d_model, num_heads, dropout, bias, kdim and vdim; norm and layer_norm_eps
/// belong to the residual connection around it (MultiHeadAttention). Hook points, in forward
/// order: q (B, T, C), k and v (B, S, C), scores (B, H, T, S; before masks and softmax, formed
/// only while hooked), pattern (B, H, T, S; the weights before dropout), context (B, T, C; the
/// heads' outputs side by side, before w_o) and out (B, T, C).
class Attention : public Module, public RandomStream {
 public:
  /// Checks the options (check), then draws the four projections from `gen`, from which the
  /// module's RandomStream is also spawned.
  explicit Attention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator());
  /// Throws, naming the option, for options the constructor refuses (a program can check its
  /// settings before it builds anything).
  static void check(const MultiHeadAttentionOptions& options);
  /// Self-attention of x (B, T, d_model). With a cache, x holds the next T positions of sequences
  /// whose earlier positions the cache holds; their keys and values are appended to it.
  /// Throws unless kdim and vdim are d_model, and for a cache that does not continue x.
  AttentionOutput forward(const Tensor& x, const AttentionMask& mask = {}, KVCache* cache = nullptr) const;
  /// Attention of query (B, T, d_model) over key (B, S, kdim) and value (B, S, vdim).
  /// Throws naming the input whose shape does not fit, and for S = 0.
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const AttentionMask& mask = {}) const;
  /// Throws, naming MultiHeadAttention and the shape, unless query is (B, T, d_model).
  void check_input(const Tensor& query) const;
  /// The options it was built with.
  const MultiHeadAttentionOptions& options() const { return options_; }

  /// @var w_k
  /// The key projection, kdim -> d_model.
  /// @var w_v
  /// The value projection, vdim -> d_model.

  /// The query projection, d_model -> d_model.
  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;  ///< the output projection, d_model -> d_model

 private:
  AttentionOutput attend_heads(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                               std::size_t offset) const;
  MultiHeadAttentionOptions options_;
};

/// The article's module: Attention inside its residual connection and LayerNorm. Parameters:
/// w_q, w_k, w_v, w_o (weights (C, C), (C, kdim), (C, vdim), (C, C); biases (C,)) and, unless
/// norm is none, norm. In cross-attention, forward(query, key, value, mask), the residual path and
/// the norm are the query's; key and value enter the projections as given (as the memory does in
/// PyTorch's nn.TransformerDecoderLayer).
class MultiHeadAttention : public Residual<Attention> {
 public:
  /// Attention(options, gen) with the norm options.norm() places (LayerNorm(d_model,
  /// layer_norm_eps)).
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator())
      : Residual<Attention>(options.norm(), options.d_model(), options.layer_norm_eps(), options, gen) {}
};

/// The combined boolean mask (true = blocked) for a (B, H, T, S) score tensor, or nullopt when
/// `mask` asks for none; queries are positions offset to offset + T - 1 for the causal mask, and
/// the -inf entries of additive_mask count as blocked. Throws naming the mask whose shape or
/// values do not fit.
std::optional<Mask> combine_masks(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t T, std::size_t S,
                                  std::size_t offset = 0);

}  // namespace xgrad::nn
