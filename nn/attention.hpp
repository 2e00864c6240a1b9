// MultiHeadAttention, the classic module: per-head scaled dot-product attention in subspaces
// of size D = d_model / H, dropout on the attention weights, masks, and the residual
// connection with LayerNorm placed Pre-Norm or Post-Norm.
//
//   head_h  = softmax(Q_h K_h^T / sqrt(D) + mask) V_h     with Q_h = LN?(x) W_q[h] etc.
//   Attn(x) = concat(head_1 .. head_H) W_o
//   Pre-Norm:  y = x + Attn(LN(x))
//   Post-Norm: y = LN(x + Attn(x))
//   none:      y = Attn(x)            (no residual, no norm: compose your own)
//
// Shapes: B batch, T query length, S key length (S = T: self-attention), C = d_model,
// H heads, D = C / H.
#pragma once

#include <memory>
#include <optional>

#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/options.hpp"

namespace xgrad::nn {

struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(std::size_t d_model, std::size_t num_heads) : d_model_(d_model), num_heads_(num_heads) {}
  XGRAD_ARG(std::size_t, d_model, 512);
  XGRAD_ARG(std::size_t, num_heads, 8);
  XGRAD_ARG(float, dropout, 0.1f);      // on the attention weights, while training; masks come
                                        // from default_generator() (seed it with manual_seed)
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

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator());
  AttentionOutput forward(const Tensor& x, const AttentionMask& mask = {}) const;
  const MultiHeadAttentionOptions& options() const { return options_; }

  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;
  std::shared_ptr<LayerNorm> norm;  // null when options.norm() is Norm::none

  // Optional (H,) gates multiplying each head's context before W_o (undefined: no gating).
  // Set a gate to 0 to ablate a head; a gate of ones that requires grad yields the head
  // importance dLoss/dgate of Michel et al. (2019). Not a parameter.
  Tensor head_gates;

 private:
  MultiHeadAttentionOptions options_;
};

// The combined boolean mask (true = blocked) for a (B, H, T, S) score tensor, or nullopt when
// nothing is masked. Throws naming the mask whose shape does not fit.
std::optional<Mask> combine_masks(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t T, std::size_t S);

}  // namespace xgrad::nn
