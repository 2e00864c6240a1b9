// FeedForward, TransformerBlock and LanguageModel (its generation is in generate.cpp).
#include "xgrad/nn/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/nn/detail/model_size.hpp"

namespace xgrad::nn {

namespace {

// Whether FeedForward computes act(linear1(x)) as one linear_activation. Measured with
// bench_fused_products (docs/speed.md, "Fused products"): linear1 and the activation with dropout
// 0.1 after it, forward and backward, on the benchmark's FFN shapes; unfused time over fused,
// median and range of 18 (six runs of three shapes, 1 and 2 threads, medians of 15 each):
// - ReLU: 1.02x (0.97 to 1.10), and 1.07x forward alone without grad mode. Fused.
// - exact GELU: 0.95x (0.90 to 1.03): the unfused path is gelu_dropout (GELU and dropout in one
//   pass) and the fused one must keep z; without grad mode 0.97x (oneDNN's erf post-op is slower
//   than xgrad's GELU kernel). Never fused.
// - tanh GELU: 1.00x (0.94 to 1.10) in training, not fused there; without grad mode (evaluation,
//   generation) 1.10x (0.98 to 1.16), fused.
bool fused_linear1(Activation a) { return a == Activation::relu || (a == Activation::gelu_tanh && !grad_enabled()); }

}  // namespace

FeedForward::FeedForward(const FeedForwardOptions& o, Generator& gen) : RandomStream(gen), options_(o) {
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f)) fail("FeedForward: dropout ", o.dropout(), " is outside [0, 1)");
  if (o.d_model() == 0 || o.d_ff() == 0)
    fail("FeedForward: d_model ", o.d_model(), " and d_ff ", o.d_ff(), " must be positive");
  if (static_cast<int>(o.activation()) < 0 ||
      static_cast<int>(o.activation()) > static_cast<int>(Activation::geglu_tanh))
    fail("FeedForward: unknown activation ", static_cast<int>(o.activation()));
  linear1 = register_module("linear1", std::make_shared<Linear>(o.d_model(), o.d_ff(), o.bias(), gen));
  if (is_gated(o.activation())) {
    gate = register_module("gate", std::make_shared<Linear>(o.d_model(), o.d_ff(), o.bias(), gen));
  }
  linear2 = register_module("linear2", std::make_shared<Linear>(o.d_ff(), o.d_model(), o.bias(), gen));
  if (gate) {
    declare_hook_points({"pre", "pre_linear", "hidden", "out"});
  } else {
    declare_hook_points({"pre", "hidden", "out"});
  }
}

void FeedForward::check_input(const Tensor& x) const {
  check_defined(x, "FeedForward");
  if (x.ndim() == 0 || x.shape().back() != options_.d_model()) {
    fail("FeedForward: input of shape ", shape_str(x.shape()), " does not end in d_model ", options_.d_model());
  }
}

Tensor FeedForward::forward(const Tensor& x) const {
  check_input(x);
  const float p = options_.dropout();
  Tensor a;
  if (gate) {
    const Tensor g = hook("pre", gate->forward(x));
    const Tensor up = hook("pre_linear", linear1->forward(x));
    const GatedActivation act = options_.activation() == Activation::swiglu  ? GatedActivation::silu
                                : options_.activation() == Activation::geglu ? GatedActivation::gelu
                                                                             : GatedActivation::gelu_tanh;
    a = dropout(gated_unit(g, up, act), p, is_training(), generator());
  } else if (fused_linear1(options_.activation()) && !hooked("pre") && !linear1->adapted()) {
    // act(linear1(x)) as one op: "pre" (linear1's output) is never formed, so only while no hook
    // reads or replaces it (and no LoRA adapter adds its path)
    const LinearActivation act = options_.activation() == Activation::gelu        ? LinearActivation::gelu
                                 : options_.activation() == Activation::gelu_tanh ? LinearActivation::gelu_tanh
                                                                                  : LinearActivation::relu;
    a = dropout(linear_activation(x, linear1->weight, linear1->bias, act), p, is_training(), generator());
  } else {
    const Tensor h = hook("pre", linear1->forward(x));
    switch (options_.activation()) {
      case Activation::gelu:
        a = gelu_dropout(h, p, is_training(), generator());
        break;
      case Activation::gelu_tanh:
        a = dropout(gelu(h, GeluApprox::tanh), p, is_training(), generator());
        break;
      default:
        a = dropout(relu(h), p, is_training(), generator());
        break;
    }
  }
  return hook("out", linear2->forward(hook("hidden", a)));
}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& o, Generator& gen) : options_(o) {
  if (o.norm() == Norm::none) fail("TransformerBlock: norm must be Norm::pre, Norm::post or Norm::sandwich");
  if (o.parallel_residual() && o.norm() != Norm::pre) fail("TransformerBlock: parallel_residual needs Norm::pre");
  if (o.feed_forward().d_model() != o.d_model()) {
    fail("TransformerBlock: the feed-forward's d_model ", o.feed_forward().d_model(), " is not the attention's ",
         o.d_model());
  }
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(o.attention(), gen));
  ffn = register_module(
      "ffn", std::make_shared<Residual<FeedForward>>(o.norm(), o.d_model(), o.norm_options(), o.feed_forward(), gen));
  declare_hook_points({"stream_in", "stream_mid", "stream_out"});
}

BlockOutput TransformerBlock::forward(const Tensor& x, const AttentionMask& mask, KVCache* cache,
                                      const IndexArray* positions) const {
  check_defined(x, "TransformerBlock");
  if (x.ndim() != 3 || x.shape()[2] != options_.d_model()) {
    fail("TransformerBlock: input must be (B, T, C) with C = d_model ", options_.d_model(), ", got ",
         shape_str(x.shape()));
  }
  const Tensor in = hook("stream_in", x);
  const AttentionOutput a = attn->forward(in, mask, cache, positions);
  const Tensor mid = hook("stream_mid", a.output);
  const Tensor y = options_.parallel_residual() ? mid + ffn->forward_branch(in) : ffn->forward(mid);
  return {hook("stream_out", y), a.weights};
}

bool LanguageModelOptions::windowed(std::size_t layer) const {
  // check() keeps the list in increasing order
  return sliding_window_ > 0 &&
         !std::binary_search(full_attention_layers_.begin(), full_attention_layers_.end(), layer);
}

TransformerBlockOptions LanguageModelOptions::block(std::size_t layer) const {
  const bool window = windowed(layer), local = window && rope_local_theta_ > 0.f;
  const auto attention = MultiHeadAttentionOptions(d_model_, num_heads_)
                             .num_kv_heads(num_kv_heads_)
                             .head_dim(head_dim_)
                             .dropout(dropout_)
                             .norm(norm_)
                             .norm_options(norm_options())
                             .qkv_bias(qkv_bias_)
                             .out_bias(out_bias_)
                             .rotary(positional_ == Positional::rotary)
                             .rope_theta(local ? rope_local_theta_ : rope_theta_)
                             .rope_scaling(local ? RopeScaling() : rope_scaling_options())
                             .rotary_dim(rotary_dim_)
                             .qk_norm(qk_norm_)
                             .sliding_window(window ? sliding_window_ : 0)
                             .scale(attn_scale_)
                             .logit_softcap(attn_softcap_)
                             .kernel(attention_kernel_)
                             .attention_tile(attention_tile_);
  const auto feed_forward =
      FeedForwardOptions(d_model_, d_ff_).activation(activation_).dropout(dropout_).bias(ffn_bias_);
  return TransformerBlockOptions(d_model_, num_heads_)
      .attention(attention)
      .feed_forward(feed_forward)
      .parallel_residual(parallel_residual_);
}

LanguageModelOptions LanguageModelOptions::gpt2_style(std::size_t V, std::size_t C, std::size_t H, std::size_t L) {
  return LanguageModelOptions(V, C, H, L)
      .positional(Positional::learned)
      .norm(Norm::pre)
      .norm_kind(NormKind::layer_norm)
      .norm_eps(1e-5f)
      .activation(Activation::gelu_tanh)
      .tie_embeddings(true)
      .init(Init::gpt2);
}

LanguageModelOptions LanguageModelOptions::llama_style(std::size_t V, std::size_t C, std::size_t H, std::size_t L,
                                                       std::size_t KV) {
  const std::size_t hidden = (8 * C / 3 + 7) / 8 * 8;  // 8 C / 3 rounded up to a multiple of 8
  return LanguageModelOptions(V, C, H, L)
      .positional(Positional::rotary)
      .norm(Norm::pre)
      .norm_kind(NormKind::rms_norm)
      .norm_eps(1e-5f)
      .activation(Activation::swiglu)
      .d_ff(hidden)
      .num_kv_heads(KV)
      .bias(false)
      .init(Init::gpt2);
}

void LanguageModel::check(const LanguageModelOptions& o) {
  if (o.vocab_size() == 0 || o.num_layers() == 0 || o.max_len() == 0) {
    fail("LanguageModel: vocab_size ", o.vocab_size(), ", num_layers ", o.num_layers(), " and max_len ", o.max_len(),
         " must be positive");
  }
  if (o.norm() == Norm::none) fail("LanguageModel: norm must be Norm::pre, Norm::post or Norm::sandwich");
  if (o.parallel_residual() && o.norm() != Norm::pre) fail("LanguageModel: parallel_residual needs Norm::pre");
  if (!(std::isfinite(o.norm_eps()) && o.norm_eps() > 0.f)) {
    fail("LanguageModel: norm_eps ", o.norm_eps(), " must be finite and > 0");
  }
  if (o.d_ff() == 0) fail("LanguageModel: d_ff 0 must be positive");
  if (!(std::isfinite(o.embed_scale()) && o.embed_scale() > 0.f))
    fail("LanguageModel: embed_scale ", o.embed_scale(), " must be finite and > 0");
  if (!(std::isfinite(o.attn_scale()) && o.attn_scale() >= 0.f))
    fail("LanguageModel: attn_scale ", o.attn_scale(), " must be finite and >= 0 (0: 1 / sqrt(head_dim))");
  if (!(std::isfinite(o.attn_softcap()) && o.attn_softcap() >= 0.f))
    fail("LanguageModel: attn_softcap ", o.attn_softcap(), " must be finite and >= 0 (0: none)");
  if (!(std::isfinite(o.final_softcap()) && o.final_softcap() >= 0.f))
    fail("LanguageModel: final_softcap ", o.final_softcap(), " must be finite and >= 0 (0: none)");
  if (!(std::isfinite(o.rope_local_theta()) && o.rope_local_theta() >= 0.f))
    fail("LanguageModel: rope_local_theta ", o.rope_local_theta(), " must be finite and >= 0 (0: rope_theta)");
  if (o.sliding_window() == 0 && (!o.full_attention_layers().empty() || o.rope_local_theta() > 0.f))
    fail("LanguageModel: full_attention_layers and rope_local_theta apply to windowed blocks; sliding_window is 0");
  for (std::size_t i = 0; i < o.full_attention_layers().size(); ++i) {
    const std::size_t l = o.full_attention_layers()[i];
    if (l >= o.num_layers() || (i > 0 && l <= o.full_attention_layers()[i - 1])) {
      fail("LanguageModel: full_attention_layers[", i, "] = ", l, " is not a block index in increasing order below ",
           "num_layers ", o.num_layers());
    }
  }
  if (static_cast<int>(o.positional()) < 0 || static_cast<int>(o.positional()) > static_cast<int>(Positional::rotary))
    fail("LanguageModel: unknown positional ", static_cast<int>(o.positional()));
  if (o.init() != Init::pytorch && o.init() != Init::gpt2)
    fail("LanguageModel: unknown init ", static_cast<int>(o.init()));
  // The attention as the model builds it, so its checks name the option.
  // Blocks differ only by the window and its RoPE base: one of each kind is checked.
  // O(full_attention_layers), whatever num_layers: the first full block, or the first windowed one.
  std::vector<std::size_t> kinds = {0};
  const std::vector<std::size_t>& full = o.full_attention_layers();
  if (o.sliding_window() > 0 && !full.empty()) {
    std::size_t first_windowed = 0;
    while (first_windowed < full.size() && full[first_windowed] == first_windowed) ++first_windowed;
    const std::size_t other = o.windowed(0) ? full.front() : first_windowed;
    if (other > 0 && other < o.num_layers()) kinds.push_back(other);
  }
  for (std::size_t layer : kinds) {
    const MultiHeadAttentionOptions attention = o.block(layer).attention();
    Attention::check(attention);
    if (!attention.rotary()) continue;
    // RoPE's highest frequency, the largest 1 / theta^(2i / r) over i < r / 2: 1 (i = 0) for
    // theta >= 1, 1 / theta^((r - 2) / r) (the last i) for theta < 1. At the last position a tiny
    // theta passes float32 there, and the angles' cos and sin would be NaN. O(1), whatever r.
    const std::size_t r = attention.rotary_dim() ? attention.rotary_dim() : attention.head_dim();
    const std::size_t i = attention.rope_theta() >= 1.f ? 0 : r / 2 - 1;
    const float top = 1.f / std::pow(attention.rope_theta(), static_cast<float>(2 * i) / static_cast<float>(r));
    if (!std::isfinite(static_cast<float>(o.max_len() - 1) * top)) {
      const bool local = o.windowed(layer) && o.rope_local_theta() > 0.f;
      fail("LanguageModel: ", local ? "rope_local_theta " : "rope_theta ", attention.rope_theta(), " with rotary_dim ",
           r, " gives the frequency ", top, ", and the angle at position max_len - 1 = ", o.max_len() - 1,
           " passes float32");
    }
  }
}

namespace {

// GPT-2's init (Init::gpt2): see the enum.
void init_gpt2(LanguageModel& model, Generator& gen) {
  const float std = 0.02f, residual_std = std / std::sqrt(2.f * static_cast<float>(model.blocks.size()));
  auto normal = [&](Tensor& w, float s) { gen.fill_normal(w.mutable_value(), 0.f, s); };  // in place: no second copy
  auto linear = [&](Linear& l, float s) {
    normal(l.weight, s);
    if (l.bias.defined()) l.bias.mutable_value().fill(0.f);
  };
  normal(model.tok_emb->weight, std);
  if (model.pos_emb) normal(model.pos_emb->weight, std);
  for (auto& block : model.blocks) {
    Attention& a = *block->attn;
    linear(*a.w_q, std), linear(*a.w_k, std), linear(*a.w_v, std), linear(*a.w_o, residual_std);
    FeedForward& f = *block->ffn;
    linear(*f.linear1, std);
    if (f.gate) linear(*f.gate, std);
    linear(*f.linear2, residual_std);
  }
  if (!model.options().tie_embeddings()) linear(*model.head, std);
}

}  // namespace

detail::ModelSize detail::model_size(const LanguageModelOptions& o) {
  const double V = static_cast<double>(o.vocab_size()), C = static_cast<double>(o.d_model()),
               F = static_cast<double>(o.d_ff()), L = static_cast<double>(o.num_layers()),
               P = static_cast<double>(o.max_len());
  const MultiHeadAttentionOptions a = o.block().attention();
  const double D = static_cast<double>(a.head_dim()), KVD = D * static_cast<double>(a.kv_heads());
  const double HD = D * static_cast<double>(a.num_heads());
  const NormOptions n = o.norm_options();
  const bool norm_bias = n.affine() && n.bias() && n.kind() == NormKind::layer_norm;
  detail::ModelSize block;  // one block's
  for (int k = 0; k < (o.norm() == Norm::sandwich ? 4 : 2); ++k) block.add(C, n.affine()), block.add(C, norm_bias);
  block.add(HD * C), block.add(HD, a.qkv_bias());
  for (int k = 0; k < 2; ++k) block.add(KVD * C), block.add(KVD, a.qkv_bias());
  block.add(C * HD), block.add(C, a.out_bias());
  for (int k = 0; k < 2; ++k) block.add(D, a.qk_norm());
  for (int k = 0; k < (is_gated(o.activation()) ? 2 : 1); ++k) block.add(F * C), block.add(F, o.ffn_bias());
  block.add(C * F), block.add(C, o.ffn_bias());
  detail::ModelSize m;
  m.add(V * C);
  m.add(P * C, o.positional() == Positional::learned);
  if (o.norm() != Norm::post) m.add(C, n.affine()), m.add(C, norm_bias);
  m.add(V * C, !o.tie_embeddings()), m.add(V, !o.tie_embeddings() && o.head_bias());
  m.values += L * block.values;
  m.tensors += L * block.tensors;
  m.bytes = 4 * (m.values + (o.positional() == Positional::sinusoidal ? P * C : 0)) + L * 34 * 1024;
  return m;
}

LanguageModel::LanguageModel(const LanguageModelOptions& o, Generator& gen) : options_(o) {
  check(o);
  // Refused before the first block: a model too large (a num_layers of 2^32 with tiny blocks
  // included) would otherwise allocate until the process is killed.
  const detail::ModelSize size = detail::model_size(o);
  char values[48];  // a count past 2^64 is printed whole too
  std::snprintf(values, sizeof values, "%.0f", size.values);
  check_available_memory(
      size.bytes, "LanguageModel",
      "building the model (" + std::to_string(o.num_layers()) + " blocks, " + values + " float32 values)");
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(o.vocab_size(), o.d_model(), gen));
  if (o.positional() == Positional::learned) {
    pos_emb = register_module("pos_emb", std::make_shared<LearnedPositionalEncoding>(o.max_len(), o.d_model(), gen));
  } else if (o.positional() == Positional::sinusoidal) {
    pos_table = std::make_shared<SinusoidalPositionalEncoding>(o.max_len(), o.d_model());
  }
  auto list = register_module("blocks", std::make_shared<ModuleList>());
  for (std::size_t i = 0; i < o.num_layers(); ++i) {
    blocks.push_back(list->push_back(std::make_shared<TransformerBlock>(o.block(i), gen)));
  }
  if (o.norm() != Norm::post) final_norm = register_module("final_norm", make_norm(o.d_model(), o.norm_options()));
  if (o.tie_embeddings()) {
    head = register_module("head", std::make_shared<Linear>(tok_emb->weight));  // listed once, as tok_emb.weight
  } else {
    head = register_module("head", std::make_shared<Linear>(o.d_model(), o.vocab_size(), o.head_bias(), gen));
  }
  if (o.init() == Init::gpt2) init_gpt2(*this, gen);
  // in forward order
  declare_hook_points({"tok_embed"});
  if (pos_emb || pos_table) declare_hook_points({"pos_embed"});
  declare_hook_points({"embed"});
  if (final_norm) declare_hook_points({"normalized"});
  declare_hook_points({"logits"});
}

void LanguageModel::check_ids(const IndexArray& ids, std::size_t first) const {
  if (ids.dimension() != 2) fail("LanguageModel: ids must be (B, T), got ", shape_str(ids.shape()));
  const std::size_t T = ids.shape()[1];
  if (T == 0) fail("LanguageModel: empty sequence (T = 0)");
  if (first + T > options_.max_len()) {
    if (first == 0) fail("LanguageModel: sequence length ", T, " exceeds max_len ", options_.max_len());
    fail("LanguageModel: sequence length ", first + T, " (", first, " cached and ", T, " new) exceeds max_len ",
         options_.max_len());
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t id = ids.data()[i];
    if (id < 0 || id >= static_cast<std::int64_t>(options_.vocab_size())) {
      fail("LanguageModel: token id ", id, " at flat position ", i, " is outside the vocabulary [0, ",
           options_.vocab_size(), ")");
    }
  }
}

Tensor LanguageModel::run_blocks(const IndexArray& ids, const IndexArray& positions, const Mask* padding,
                                 LanguageModelCache* cache, Attentions attentions, Logits logits,
                                 std::vector<Tensor>& weights) const {
  if (logits != Logits::all && logits != Logits::last) {
    fail("LanguageModel: unknown Logits ", static_cast<int>(logits), " (all or last)");
  }
  Tensor h = tok_emb->forward(ids);  // (B, T, C)
  if (options_.embed_scale() != 1.f) h = h * options_.embed_scale();
  h = hook("tok_embed", h);
  if (pos_emb) h = h + hook("pos_embed", pos_emb->at(positions));  // (T, C), or (B, T, C) with padding
  if (pos_table) h = h + hook("pos_embed", pos_table->at(positions));
  h = hook("embed", h);
  AttentionMask mask;
  mask.causal = true;
  if (padding) mask.key_padding_mask = *padding;
  mask.need_weights = attentions == Attentions::keep;
  // RoPE turns q and k inside attention: by the given positions, or (cached, unpadded) from the
  // cache's length.
  const bool per_row = !cache || padding;
  const IndexArray* rotary = options_.positional() == Positional::rotary && per_row ? &positions : nullptr;
  // Hook points see every forward, so a model with hooks attached keeps its activations.
  const bool recompute = checkpoint_activations_ && !cache && !mask.need_weights && grad_enabled() && num_hooks() == 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (recompute) {
      h = checkpointed_block(i, h, mask, rotary);
      continue;
    }
    if (cache && padding) {
      // The keys block i attends to: those it holds (a window drops the first) and the new ones.
      const std::size_t all = padding->shape()[1], S = cache->blocks[i].held() + ids.shape()[1];
      mask.key_padding_mask = Mask(xt::view(*padding, xt::all(), xt::range(all - S, all)));
    }
    BlockOutput b = blocks[i]->forward(h, mask, cache ? &cache->blocks[i] : nullptr, rotary);
    h = b.output;
    if (mask.need_weights) weights.push_back(b.attention);
  }
  const std::size_t T = h.shape()[1];
  if (logits == Logits::last && T > 1) h = slice(h, 1, T - 1, T);  // each row's last position
  if (final_norm) h = hook("normalized", final_norm->forward(h));
  return h;
}

LanguageModelOutput LanguageModel::run(const IndexArray& ids, const IndexArray& positions, const Mask* padding,
                                       LanguageModelCache* cache, Attentions attentions, Logits logits) const {
  LanguageModelOutput out;
  const Tensor h = run_blocks(ids, positions, padding, cache, attentions, logits, out.attentions);
  out.logits = hook("logits", head_logits(h));
  return out;
}

Tensor LanguageModel::head_loss(const Tensor& h, const IndexArray& targets) const {
  if (options_.final_softcap() == 0.f && !head->adapted() && !hooked("logits")) {
    return linear_cross_entropy(h, head->weight, head->bias, targets);
  }
  return cross_entropy(hook("logits", head_logits(h)), targets);
}

Tensor LanguageModel::checkpointed_block(std::size_t i, const Tensor& h, const AttentionMask& mask,
                                         const IndexArray* rotary) const {
  const std::shared_ptr<TransformerBlock> owner = blocks[i];  // kept alive for backward
  std::vector<Tensor> inputs{h};
  for (const auto& [n, p] : owner->named_parameters()) inputs.push_back(p);
  // The block's dropout streams as they are now: the recomputation in backward starts them here
  // again, so its masks are the ones this forward draws (regenerated, not stored).
  std::vector<std::pair<std::string, Generator>> start;  // by module path: found again at recomputation
  for (const auto& [n, m] : owner->named_modules()) {
    if (auto* s = dynamic_cast<RandomStream*>(m)) start.emplace_back(n, s->generator());
  }
  const std::optional<IndexArray> positions = rotary ? std::optional<IndexArray>(*rotary) : std::nullopt;
  auto calls = std::make_shared<std::size_t>(0);  // the first call is the forward, later ones recompute
  return checkpoint(
      [owner, mask, positions, start, calls, i](const std::vector<Tensor>& in) {
    // The streams as they were at the forward, found again by path (a module replaced or removed
    // since is an Error: the recomputation would be another function), then set back.
    std::vector<std::pair<Generator*, Generator>> now;
    if ((*calls)++ > 0) {
      const auto modules = owner->named_modules();
      for (const auto& [path, state] : start) {
        const auto at = std::find_if(modules.begin(), modules.end(), [&](const auto& m) { return m.first == path; });
        auto* s = at == modules.end() ? nullptr : dynamic_cast<RandomStream*>(at->second);
        if (!s)
          fail("LanguageModel: block ", i, "'s module '", path,
               "' was removed between the forward and the backward of a checkpointed step");
        now.emplace_back(&s->generator(), s->generator());
        s->generator() = state;
      }
    }
    struct Restore {
      std::vector<std::pair<Generator*, Generator>>& now;
      ~Restore() {
        for (auto& [g, state] : now) *g = state;
      }
    } restore{now};
    return owner->forward(in[0], mask, nullptr, positions ? &*positions : nullptr).output;
      },
      inputs);
}

namespace {

// Positions first .. first + T - 1, (T).
IndexArray count_positions(std::size_t first, std::size_t T) {
  IndexArray p = IndexArray::from_shape({T});
  for (std::size_t t = 0; t < T; ++t) p(t) = static_cast<std::int64_t>(first + t);
  return p;
}

}  // namespace

Tensor LanguageModel::head_logits(const Tensor& h) const {
  const float cap = options_.final_softcap();
  const Tensor logits = head->forward(h);
  return cap > 0.f ? tanh(logits / cap) * cap : logits;  // Gemma 2's final_logit_softcapping
}

Tensor LanguageModel::unembed(const Tensor& h) const { return head_logits(final_norm ? final_norm->forward(h) : h); }

LanguageModelOutput LanguageModel::forward(const IndexArray& ids, Attentions attentions) const {
  check_ids(ids, 0);
  return run(ids, count_positions(0, ids.shape()[1]), nullptr, nullptr, attentions);
}

LanguageModelOutput LanguageModel::forward(const IndexArray& ids, const Mask& key_padding_mask,
                                           Attentions attentions) const {
  check_ids(ids, 0);
  return run(ids, padded_positions(ids, key_padding_mask), &key_padding_mask, nullptr, attentions);
}

IndexArray LanguageModel::padded_positions(const IndexArray& ids, const Mask& key_padding_mask) const {
  if (key_padding_mask.shape() != ids.shape()) {
    fail("LanguageModel: key_padding_mask of shape ", shape_str(key_padding_mask.shape()),
         " does not match ids of shape ", shape_str(ids.shape()));
  }
  const std::size_t B = ids.shape()[0], T = ids.shape()[1];
  IndexArray positions = IndexArray::from_shape({B, T});  // each row's count of real tokens before t
  for (std::size_t b = 0; b < B; ++b) {
    std::int64_t real = 0;
    for (std::size_t t = 0; t < T; ++t) {
      // A sliding window counts keys by index: padding between real tokens would put other keys in it.
      if (options_.sliding_window() > 0 && t > 0 && key_padding_mask(b, t) && !key_padding_mask(b, t - 1) &&
          std::find(&key_padding_mask(b, t), &key_padding_mask(b, 0) + T, false) != &key_padding_mask(b, 0) + T) {
        fail("LanguageModel: row ", b, " of key_padding_mask has padding at position ", t,
             " between real tokens; with sliding_window ", options_.sliding_window(),
             " padding must sit at a row's start or end");
      }
      positions(b, t) = real;
      if (!key_padding_mask(b, t)) ++real;
    }
  }
  return positions;
}

void LanguageModelCache::keep_rows(const std::vector<std::size_t>& rows) {
  const std::size_t B = blocks.empty() ? 0 : blocks.front().rows();
  for (const std::size_t r : rows) {
    if (r >= B) fail("LanguageModelCache::keep_rows: row ", r, " is outside the batch of ", B, " rows");
  }
  std::vector<KVCache> kept = blocks;
  for (KVCache& c : kept) c.keep_rows(rows);
  if (padding) padding = Mask(xt::view(*padding, xt::keep(rows), xt::all()));
  blocks = std::move(kept);
}

void LanguageModelCache::reserve(std::size_t positions) {
  for (const KVCache& c : blocks) {
    if (positions > 0 && positions < c.held()) {
      fail("LanguageModelCache::reserve: ", positions, " positions is fewer than the ", c.held(), " a block holds");
    }
  }
  for (KVCache& c : blocks) c.reserve(positions);
  reserved_ = positions;
}

void LanguageModel::check_cache(LanguageModelCache& cache, std::size_t first, std::size_t n) const {
  if (cache.blocks.empty()) {
    cache.blocks.resize(blocks.size());
    for (KVCache& c : cache.blocks) c.reserve(cache.reserved());
  }
  if (cache.blocks.size() != blocks.size()) {
    fail("LanguageModel::forward_cached: the cache holds ", cache.blocks.size(), " blocks, the model has ",
         blocks.size());
  }
  for (std::size_t i = 1; i < cache.blocks.size(); ++i) {
    if (cache.blocks[i].length() != first) {
      fail("LanguageModel::forward_cached: the cache's blocks hold ", first, " and ", cache.blocks[i].length(),
           " positions");
    }
  }
  for (const KVCache& c : cache.blocks) {
    if (c.reserved() > 0 && c.held() + n > c.reserved()) {
      fail("LanguageModel::forward_cached: ", n, " positions after the ", c.held(), " held go past the ", c.reserved(),
           " the cache reserves (LanguageModelCache::reserve)");
    }
  }
}

LanguageModelOutput LanguageModel::forward_cached(const IndexArray& ids, LanguageModelCache& cache,
                                                  Attentions attentions, Logits logits) const {
  const std::size_t first = cache.length();
  check_ids(ids, first);
  check_cache(cache, first, ids.shape()[1]);
  if (cache.padding) return forward_cached(ids, Mask(xt::zeros<bool>(ids.shape())), cache, attentions, logits);
  // A failed step leaves the cache as it was (each block would otherwise hold what it reached).
  const std::vector<KVCache> before = cache.blocks;
  try {
    return run(ids, count_positions(first, ids.shape()[1]), nullptr, &cache, attentions, logits);
  } catch (...) {
    cache.blocks = before;
    throw;
  }
}

LanguageModelOutput LanguageModel::forward_cached(const IndexArray& ids, const Mask& key_padding_mask,
                                                  LanguageModelCache& cache, Attentions attentions,
                                                  Logits logits) const {
  const std::size_t first = cache.length();
  check_ids(ids, first);
  check_cache(cache, first, ids.shape()[1]);
  if (key_padding_mask.shape() != ids.shape()) {
    fail("LanguageModel::forward_cached: key_padding_mask of shape ", shape_str(key_padding_mask.shape()),
         " does not match ids of shape ", shape_str(ids.shape()));
  }
  const std::size_t B = ids.shape()[0], n = ids.shape()[1];
  if (first > 0 && !cache.padding) {
    fail("LanguageModel::forward_cached: the cache was filled without a key_padding_mask (", first,
         " positions held); it continues only without one");
  }
  if (first > 0 && cache.padding->shape()[0] != B) {
    fail("LanguageModel::forward_cached: the cache holds ", cache.padding->shape()[0], " rows, ids have ", B);
  }
  // Every position's mark: the cached ones, then the new ones.
  Mask padding = first > 0 ? Mask(xt::concatenate(xt::xtuple(*cache.padding, key_padding_mask), 1)) : key_padding_mask;
  IndexArray positions = IndexArray::from_shape({B, n});  // each row's count of real tokens before
  for (std::size_t b = 0; b < B; ++b) {
    std::int64_t real = 0;
    bool seen_real = false;
    for (std::size_t t = 0; t < first + n; ++t) {
      // A sliding window counts keys by index: padding after a real token would put other keys in it.
      if (options_.sliding_window() > 0 && seen_real && padding(b, t)) {
        fail("LanguageModel::forward_cached: row ", b, " has padding at position ", t,
             " after a real token; with sliding_window ", options_.sliding_window(),
             " padding must come before a row's first real token");
      }
      if (t >= first) positions(b, t - first) = real;
      if (!padding(b, t)) ++real, seen_real = true;
    }
  }
  const std::vector<KVCache> before = cache.blocks;
  const std::optional<Mask> marks_before = cache.padding;
  try {
    cache.padding = std::move(padding);
    return run(ids, positions, &*cache.padding, &cache, attentions, logits);
  } catch (...) {
    cache.blocks = before;
    cache.padding = marks_before;
    throw;
  }
}

Tensor LanguageModel::loss(const IndexArray& ids, const IndexArray& targets) const {
  check_targets(ids, targets);
  check_ids(ids, 0);
  std::vector<Tensor> none;
  return head_loss(
      run_blocks(ids, count_positions(0, ids.shape()[1]), nullptr, nullptr, Attentions::none, Logits::all, none),
      targets);
}

void LanguageModel::check_targets(const IndexArray& ids, const IndexArray& targets) const {
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
}

Tensor LanguageModel::loss(const IndexArray& ids, const IndexArray& targets, const Mask& key_padding_mask) const {
  check_targets(ids, targets);
  check_ids(ids, 0);
  std::vector<Tensor> none;
  return head_loss(run_blocks(ids, padded_positions(ids, key_padding_mask), &key_padding_mask, nullptr,
                              Attentions::none, Logits::all, none),
                   targets);
}

}  // namespace xgrad::nn
