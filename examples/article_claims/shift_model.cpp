// ShiftModel construction and forward.
#include "shift_model.hpp"

#include "xgrad/core/autograd/ops.hpp"

namespace claims {

using namespace xgrad;

ShiftModel::ShiftModel(const ShiftModelOptions& o, Generator& gen) : options_(o) {
  tok_emb_ = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab, o.d_model, gen));
  pos_emb_ = register_module("pos_emb", std::make_shared<nn::LearnedPositionalEncoding>(o.seq_len, o.d_model, gen));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (std::size_t l = 0; l < o.layers; ++l) {
    blocks_.push_back(list->push_back(std::make_shared<nn::TransformerBlock>(
        nn::TransformerBlockOptions(o.d_model, o.heads).dropout(0.f).norm(nn::Norm::pre), gen)));
  }
  final_norm_ = register_module("final_norm", std::make_shared<nn::LayerNorm>(o.d_model));
  readout_ = register_module("readout", std::make_shared<nn::Linear>(o.d_model, o.offsets * o.vocab, true, gen));
}

Tensor ShiftModel::forward(const IndexArray& tokens) const {
  const std::size_t B = tokens.shape()[0], T = tokens.shape()[1];
  Tensor h = tok_emb_->forward(tokens) + pos_emb_->forward(T);  // (B, T, C)
  nn::AttentionMask mask;
  mask.causal = true;
  for (const auto& block : blocks_) h = block->forward(h, mask).output;
  const auto as_int = [](std::size_t n) { return static_cast<std::int64_t>(n); };
  return reshape(readout_->forward(final_norm_->forward(h)),
                 {as_int(B), as_int(T), as_int(options_.offsets), as_int(options_.vocab)});
}

}  // namespace claims
