// Closed forms for one transformer block of the article's configurations: parameter counts,
// forward FLOPs split into projections, score/context products and feed-forward, and the
// activation bytes a training step keeps, split into attention weights and the rest. Nothing
// here builds a module; configs.hpp counts and measures the real ones.
// Shapes: B batch, T length, C d_model, H heads, D = C / H head size, F feed-forward width.
#pragma once

#include <cstddef>

namespace claims {

struct BlockSize {
  std::size_t d_model = 512, heads = 8, d_ff = 0;  // d_ff 0: 4 * d_model
  std::size_t ffn_width() const { return d_ff ? d_ff : 4 * d_model; }
  std::size_t head_size() const { return d_model / heads; }
};

// MultiHeadAttention (biases, Pre-Norm LayerNorm): W_q, W_k, W_v, W_o (C x C each), their
// biases (C each), LayerNorm gamma and beta: 4 C^2 + 4 C + 2 C.
double attention_params(const BlockSize& s);
// The Q, K and V weights alone, as the article writes them: 3 x C x D x H (= 3 C^2 for any H).
double qkv_weight_params(const BlockSize& s);
// TransformerBlock: the attention above plus the FFN's two Linears and its LayerNorm:
// 4 C^2 + 6 C + (C F + F) + (F C + C) + 2 C.
double block_params(const BlockSize& s);

// Forward FLOPs of one block on B sequences of length T, counting a multiply-add as 2 and only
// the matrix products (softmax, LayerNorm, GELU and residual adds are O(B T C + B H T^2)):
//   projections   4 products (B T x C) (C x C)                     8 B T C^2
//   scores        H products (T x D) (D x T) per sequence           2 B T^2 C
//   context       H products (T x T) (T x D) per sequence           2 B T^2 C
//   feed-forward  (B T x C) (C x F) and (B T x F) (F x C)           4 B T C F
// No H anywhere: heads split D, not the work. The full T x T products are counted, as xgrad
// computes them under a causal mask too. Backward costs about twice these, so the shares of a
// training step are the same.
struct BlockFlops {
  double projections = 0, scores_context = 0, feed_forward = 0;
  double attention() const { return projections + scores_context; }
  double total() const { return attention() + feed_forward; }
  double attention_share() const { return attention() / total(); }
  double scores_context_share() const { return scores_context / total(); }
};
BlockFlops block_flops(const BlockSize& s, double batch, double seq_len);

// Bytes a training step of a Pre-Norm block keeps from forward for backward, from the tensors
// xgrad's ops hold:
//   attention weights  per weight: P (4 bytes), P after dropout (4) and dropout's keep flag (1),
//                      9 B H T^2; without dropout P alone, 4 B H T^2
//   the rest           per position: LN1 output, q, k, v, context, the residual sum, LN2 output and
//                      the block's output (8 C floats; W_o's and the second Linear's outputs are
//                      freed once the residual sums, which do not read them in backward, have
//                      run), the FFN hidden before and after GELU with dropout (2 F floats) and its
//                      keep flags (F bytes): B T (32 C + 9 F) with dropout, B T (32 C + 8 F) without
struct BlockActivations {
  double attention_weights = 0, rest = 0;
  double total() const { return attention_weights + rest; }
  double attention_weight_share() const { return attention_weights / total(); }
};
BlockActivations block_activation_bytes(const BlockSize& s, double batch, double seq_len, bool dropout);

}  // namespace claims
