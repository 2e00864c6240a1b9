// The model of the head-specialization example: token and learned position embeddings, L
// attention layers (MultiHeadAttention with its residual and LayerNorm, causal mask, no
// feed-forward, so every bit of information moved between positions is moved by a head), and
// one linear readout per offset.
//   h0 = tok_emb(tokens) + pos_emb(T)
//   h_l = attention_l(h_{l-1})          (Pre-Norm: h + Attn(LN(h)); Post-Norm: LN(h + Attn(h)))
//   logits[..., k, :] = readout(LN(h_L))_k  (the final LN only in Pre-Norm)
// Shapes: B batch, T length, C d_model, H heads, K offsets, V vocabulary.
#pragma once

#include <memory>
#include <vector>

#include "xgrad/nn/attention.hpp"

namespace headspec {

struct OffsetModelOptions {
  std::size_t vocab = 16, seq_len = 16, offsets = 4;
  std::size_t d_model = 64, heads = 4, layers = 1;
  xgrad::nn::Norm norm = xgrad::nn::Norm::pre;
  float dropout = 0.f;  // on the attention weights
};

struct OffsetOutput {
  xgrad::Tensor logits;                   // (B, T, K, V)
  std::vector<xgrad::Tensor> attentions;  // per layer, (B, H, T, T)
};

class OffsetModel : public xgrad::nn::Module {
 public:
  OffsetModel(const OffsetModelOptions& options, xgrad::Generator& gen);
  OffsetOutput forward(const xgrad::IndexArray& tokens) const;
  const OffsetModelOptions& options() const { return options_; }

  std::shared_ptr<xgrad::nn::Embedding> tok_emb;
  std::shared_ptr<xgrad::nn::LearnedPositionalEncoding> pos_emb;
  std::vector<std::shared_ptr<xgrad::nn::MultiHeadAttention>> layers;
  std::shared_ptr<xgrad::nn::LayerNorm> final_norm;  // Pre-Norm only
  std::shared_ptr<xgrad::nn::Linear> readout;        // C -> K * V

 private:
  OffsetModelOptions options_;
};

}  // namespace headspec
