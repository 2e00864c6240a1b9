// Multi-head attention, the classic module: per-head scaled dot-product attention in subspaces
// of size D = d_model / H, dropout on the attention weights, masks, and (MultiHeadAttention) the
// residual connection with LayerNorm placed Pre-Norm or Post-Norm.
//
//   head_h  = softmax(Q_h K_h^T / sqrt(D) + mask) V_h     with Q_h = x W_q[h] etc.
//   Attention(x) = concat(head_1 .. head_H) W_o
//   MultiHeadAttention = Residual<Attention> (residual.hpp), by options.norm():
//     Pre-Norm:  y = x + Attention(norm(x))
//     Post-Norm: y = norm(x + Attention(x))
//     none:      y = Attention(x)            (no residual, no norm: compose your own)
//
// Hook points of Attention (hook.hpp), in forward order:
//   q, k, v    (B, T, C) the projections, heads side by side (head h is channels hD .. (h+1)D)
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

struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(std::size_t d_model, std::size_t num_heads) : d_model_(d_model), num_heads_(num_heads) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);
  XGRAD_ARG(float, dropout, 0.1f);      // on the attention weights, while training; masks come
                                        // from the module's RandomStream
  XGRAD_ARG(Norm, norm, Norm::pre);
  XGRAD_ARG(bool, bias, true);          // biases of the four projections
  XGRAD_ARG(float, layer_norm_eps, 1e-5f);
};

// Masks for one forward call. true marks a position that may NOT be attended to.
struct AttentionMask {
  bool causal = false;                  // query t sees keys 0..t only
  std::optional<Mask> attn_mask;        // broadcastable to (B, H, T, S)
  std::optional<Mask> key_padding_mask; // (B, S): true marks padding keys
};

struct AttentionOutput {
  Tensor output;   // (B, T, C)
  Tensor weights;  // (B, H, T, S), before dropout; a query whose keys are all masked gets zeros
};
inline Tensor& residual_output(AttentionOutput& out) { return out.output; }

// The attention sublayer alone: projections, heads, dropout on the weights, masks. Of the
// options it reads d_model, num_heads, dropout and bias; norm and layer_norm_eps belong to the
// residual connection around it (MultiHeadAttention).
class Attention : public Module, public RandomStream {
 public:
  explicit Attention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator());
  // Throws, naming the option, for options the constructor refuses (a program can check its
  // settings before it builds anything).
  static void check(const MultiHeadAttentionOptions& options);
  AttentionOutput forward(const Tensor& x, const AttentionMask& mask = {}) const;
  void check_input(const Tensor& x) const;  // (B, T, d_model)
  const MultiHeadAttentionOptions& options() const { return options_; }

  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;

 private:
  MultiHeadAttentionOptions options_;
};

// The article's module: Attention inside its residual connection and LayerNorm. Parameters:
// w_q, w_k, w_v, w_o (each weight (C, C), bias (C,)) and, unless norm is none, norm.
class MultiHeadAttention : public Residual<Attention> {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator())
      : Residual<Attention>(options.norm(), options.d_model(), options.layer_norm_eps(), options, gen) {}
};

// The combined boolean mask (true = blocked) for a (B, H, T, S) score tensor, or nullopt when
// nothing is masked. Throws naming the mask whose shape does not fit.
std::optional<Mask> combine_masks(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t T, std::size_t S);

}  // namespace xgrad::nn
