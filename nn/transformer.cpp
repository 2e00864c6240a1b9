// FeedForward, TransformerBlock and LanguageModel.
#include "xgrad/nn/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"
#include "xgrad/core/tape.hpp"

namespace xgrad::nn {

FeedForward::FeedForward(const FeedForwardOptions& o, Generator& gen) : RandomStream(gen), options_(o) {
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f)) fail("FeedForward: dropout ", o.dropout(), " is outside [0, 1)");
  linear1 = register_module("linear1", std::make_shared<Linear>(o.d_model(), o.d_ff(), true, gen));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.d_ff(), o.d_model(), true, gen));
  declare_hook_points({"pre", "hidden", "out"});
}

void FeedForward::check_input(const Tensor& x) const {
  check_defined(x, "FeedForward");
  if (x.ndim() == 0 || x.shape().back() != options_.d_model()) {
    fail("FeedForward: input of shape ", shape_str(x.shape()), " does not end in d_model ", options_.d_model());
  }
}

Tensor FeedForward::forward(const Tensor& x) const {
  check_input(x);
  const Tensor h = hook("pre", linear1->forward(x));
  const float p = options_.dropout();
  Tensor a;
  switch (options_.activation()) {
    case Activation::gelu: a = gelu_dropout(h, p, is_training(), generator()); break;
    case Activation::gelu_tanh: a = dropout(gelu(h, GeluApprox::tanh), p, is_training(), generator()); break;
    case Activation::relu: a = dropout(relu(h), p, is_training(), generator()); break;
  }
  return hook("out", linear2->forward(hook("hidden", a)));
}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& o, Generator& gen) : options_(o) {
  if (o.norm() == Norm::none) fail("TransformerBlock: norm must be Norm::pre or Norm::post");
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(MultiHeadAttentionOptions(o.d_model(), o.num_heads())
                                                                          .dropout(o.dropout())
                                                                          .norm(o.norm())
                                                                          .layer_norm_eps(o.layer_norm_eps()),
                                                                      gen));
  ffn = register_module("ffn", std::make_shared<Residual<FeedForward>>(
                                   o.norm(), o.d_model(), o.layer_norm_eps(),
                                   FeedForwardOptions(o.d_model(), o.d_ff()).activation(o.activation()).dropout(o.dropout()), gen));
  declare_hook_points({"stream_in", "stream_mid", "stream_out"});
}

BlockOutput TransformerBlock::forward(const Tensor& x, const AttentionMask& mask) const {
  check_defined(x, "TransformerBlock");
  if (x.ndim() != 3 || x.shape()[2] != options_.d_model()) {
    fail("TransformerBlock: input must be (B, T, C) with C = d_model ", options_.d_model(), ", got ", shape_str(x.shape()));
  }
  const AttentionOutput a = attn->forward(hook("stream_in", x), mask);
  const Tensor y = ffn->forward(hook("stream_mid", a.output));
  return {hook("stream_out", y), a.weights};
}

void LanguageModel::check(const LanguageModelOptions& o) {
  if (o.vocab_size() == 0 || o.num_layers() == 0 || o.max_len() == 0) {
    fail("LanguageModel: vocab_size ", o.vocab_size(), ", num_layers ", o.num_layers(), " and max_len ", o.max_len(),
         " must be positive");
  }
  if (o.norm() == Norm::none) fail("LanguageModel: norm must be Norm::pre or Norm::post");
  Attention::check(MultiHeadAttentionOptions(o.d_model(), o.num_heads()).dropout(o.dropout()));
}

LanguageModel::LanguageModel(const LanguageModelOptions& o, Generator& gen) : options_(o) {
  check(o);
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(o.vocab_size(), o.d_model(), gen));
  if (o.positional() == Positional::learned) {
    pos_emb = register_module("pos_emb", std::make_shared<LearnedPositionalEncoding>(o.max_len(), o.d_model(), gen));
  } else {
    pos_table = std::make_shared<SinusoidalPositionalEncoding>(o.max_len(), o.d_model());
  }
  auto list = register_module("blocks", std::make_shared<ModuleList>());
  for (std::size_t i = 0; i < o.num_layers(); ++i) {
    blocks.push_back(list->push_back(std::make_shared<TransformerBlock>(TransformerBlockOptions(o.d_model(), o.num_heads())
                                                                  .d_ff(o.d_ff())
                                                                  .dropout(o.dropout())
                                                                  .norm(o.norm())
                                                                  .activation(o.activation())
                                                                  .layer_norm_eps(o.layer_norm_eps()),
                                                              gen)));
  }
  if (o.norm() == Norm::pre) {
    final_norm = register_module("final_norm", std::make_shared<LayerNorm>(o.d_model(), o.layer_norm_eps()));
  }
  head = register_module("head", std::make_shared<Linear>(o.d_model(), o.vocab_size(), true, gen));
  declare_hook_points({"embed", "logits"});
}

LanguageModelOutput LanguageModel::forward(const IndexArray& ids) const {
  if (ids.dimension() != 2) fail("LanguageModel: ids must be (B, T), got ", shape_str(ids.shape()));
  const std::size_t T = ids.shape()[1];
  if (T == 0) fail("LanguageModel: empty sequence (T = 0)");
  if (T > options_.max_len()) fail("LanguageModel: sequence length ", T, " exceeds max_len ", options_.max_len());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids.data()[i];
    if (id < 0 || id >= static_cast<std::int64_t>(options_.vocab_size())) {
      fail("LanguageModel: token id ", id, " at flat position ", i, " is outside the vocabulary [0, ", options_.vocab_size(), ")");
    }
  }
  const Tensor pos = pos_emb ? pos_emb->forward(T) : pos_table->forward(T);  // (T, C)
  Tensor h = hook("embed", tok_emb->forward(ids) + pos);                     // (B, T, C)
  AttentionMask mask;
  mask.causal = true;
  LanguageModelOutput out;
  for (const auto& block : blocks) {
    BlockOutput b = block->forward(h, mask);
    h = b.output;
    out.attentions.push_back(b.attention);
  }
  if (final_norm) h = final_norm->forward(h);
  out.logits = hook("logits", head->forward(h));
  return out;
}

Tensor LanguageModel::loss(const IndexArray& ids, const IndexArray& targets) const {
  if (targets.shape() != ids.shape()) {
    fail("LanguageModel::loss: targets of shape ", shape_str(targets.shape()), " do not match ids of shape ",
         shape_str(ids.shape()));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int64_t t = targets.data()[i];
    if (t != kIgnoreIndex && (t < 0 || t >= static_cast<std::int64_t>(options_.vocab_size()))) {
      fail("LanguageModel::loss: target ", t, " at flat position ", i, " is outside the vocabulary [0, ",
           options_.vocab_size(), ") (and is not the ignore index ", kIgnoreIndex, ")");
    }
  }
  return cross_entropy(forward(ids).logits, targets);
}

std::vector<std::int64_t> LanguageModel::generate(std::vector<std::int64_t> prompt, std::size_t count,
                                                  const GenerateOptions& opt, Generator& gen) {
  if (prompt.empty()) fail("LanguageModel::generate: the prompt is empty");
  if (!(opt.temperature >= 0.f)) {  // +inf is allowed: uniform over the top-k tokens
    fail("LanguageModel::generate: temperature ", opt.temperature, " must be a number >= 0");
  }
  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  const std::size_t V = options_.vocab_size();
  try {
    for (std::size_t step = 0; step < count; ++step) {
      const std::size_t T = std::min(prompt.size(), options_.max_len());
      IndexArray ids = IndexArray::from_shape({1, T});
      std::copy(prompt.end() - static_cast<std::ptrdiff_t>(T), prompt.end(), ids.begin());
      const Tensor logits = forward(ids).logits;  // held by value: nothing else keeps it alive
      const float* last = logits.value().data() + (T - 1) * V;  // next-token logits
      std::vector<std::size_t> order(V);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return last[a] > last[b]; });
      if (opt.temperature == 0.f) {
        prompt.push_back(static_cast<std::int64_t>(order[0]));
        continue;
      }
      const std::size_t k = opt.top_k == 0 ? V : std::min(opt.top_k, V);
      // p_i = exp((l_i - l_max) / temperature) over the k most likely tokens
      std::vector<double> p(k);
      double total = 0;
      for (std::size_t i = 0; i < k; ++i) total += p[i] = std::exp((last[order[i]] - last[order[0]]) / opt.temperature);
      double u = static_cast<double>(gen.uniform()) * total;
      std::size_t pick = k - 1;
      for (std::size_t i = 0; i < k; ++i) {
        if (u < p[i]) {
          pick = i;
          break;
        }
        u -= p[i];
      }
      prompt.push_back(static_cast<std::int64_t>(order[pick]));
    }
  } catch (...) {
    train(was_training);
    throw;
  }
  train(was_training);
  return prompt;
}

}  // namespace xgrad::nn
