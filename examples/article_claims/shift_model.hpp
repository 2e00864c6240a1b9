// The model of the head-count experiment: token and learned position embeddings, L Pre-Norm
// TransformerBlocks (attention and feed-forward, causal mask, no dropout), a final LayerNorm and
// one linear readout per offset of the shift task.
//   h = tok_emb(tokens) + pos_emb(T);  h = block_1..L(h);  logits[..., k, :] = readout(LN(h))_k
// The head count changes no parameter's shape, so the same seed gives the same initial weights
// for every head count.
// Shapes: B batch, T length, C d_model, K offsets, V vocabulary.
#pragma once

#include <memory>
#include <vector>

#include "xgrad/nn/transformer.hpp"

namespace claims {

struct ShiftModelOptions {
  std::size_t vocab = 16, seq_len = 16, offsets = 8;
  std::size_t d_model = 64, heads = 4, layers = 1;
};

class ShiftModel : public xgrad::nn::Module {
 public:
  ShiftModel(const ShiftModelOptions& options, xgrad::Generator& gen);
  xgrad::Tensor forward(const xgrad::IndexArray& tokens) const;  // logits (B, T, K, V)

 private:
  ShiftModelOptions options_;
  std::shared_ptr<xgrad::nn::Embedding> tok_emb_;
  std::shared_ptr<xgrad::nn::LearnedPositionalEncoding> pos_emb_;
  std::vector<std::shared_ptr<xgrad::nn::TransformerBlock>> blocks_;
  std::shared_ptr<xgrad::nn::LayerNorm> final_norm_;
  std::shared_ptr<xgrad::nn::Linear> readout_;  // C -> K * V
};

}  // namespace claims
