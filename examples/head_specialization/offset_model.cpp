// OffsetModel construction and forward.
#include "offset_model.hpp"

#include "xgrad/core/autograd/ops.hpp"

namespace headspec {

using namespace xgrad;

OffsetModel::OffsetModel(const OffsetModelOptions& o, Generator& gen) : options_(o) {
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab, o.d_model, gen));
  pos_emb = register_module("pos_emb", std::make_shared<nn::LearnedPositionalEncoding>(o.seq_len, o.d_model, gen));
  auto list = register_module("layers", std::make_shared<nn::ModuleList>());
  for (std::size_t l = 0; l < o.layers; ++l) {
    layers.push_back(list->push_back(std::make_shared<nn::MultiHeadAttention>(
        nn::MultiHeadAttentionOptions(o.d_model, o.heads).dropout(o.dropout).norm(o.norm), gen)));
  }
  if (o.norm == nn::Norm::pre) final_norm = register_module("final_norm", std::make_shared<nn::LayerNorm>(o.d_model));
  readout = register_module("readout", std::make_shared<nn::Linear>(o.d_model, o.offsets * o.vocab, true, gen));
}

OffsetOutput OffsetModel::forward(const IndexArray& tokens) const {
  const std::size_t B = tokens.shape()[0], T = tokens.shape()[1];
  Tensor h = tok_emb->forward(tokens) + pos_emb->forward(T);  // (B, T, C)
  nn::AttentionMask mask;
  mask.causal = true;
  OffsetOutput out;
  for (const auto& layer : layers) {
    nn::AttentionOutput a = layer->forward(h, mask);
    h = a.output;
    out.attentions.push_back(a.weights);
  }
  if (final_norm) h = final_norm->forward(h);
  const auto b = static_cast<std::int64_t>(B), t = static_cast<std::int64_t>(T);
  out.logits = reshape(readout->forward(h),
                       {b, t, static_cast<std::int64_t>(options_.offsets), static_cast<std::int64_t>(options_.vocab)});
  return out;
}

}  // namespace headspec
