// Attention forward (its backward is the ops' own).
#include "xgrad/nn/attention.hpp"

#include <cmath>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"

namespace xgrad::nn {

void Attention::check(const MultiHeadAttentionOptions& o) {
  if (o.num_heads() == 0 || o.d_model() == 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " and num_heads ", o.num_heads(), " must be positive");
  }
  if (o.d_model() % o.num_heads() != 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " is not divisible by num_heads ", o.num_heads());
  }
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f)) fail("MultiHeadAttention: dropout ", o.dropout(), " is outside [0, 1)");
}

Attention::Attention(const MultiHeadAttentionOptions& o, Generator& gen) : RandomStream(gen), options_(o) {
  check(o);
  const std::size_t C = o.d_model();
  w_q = register_module("w_q", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_k = register_module("w_k", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_v = register_module("w_v", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_o = register_module("w_o", std::make_shared<Linear>(C, C, o.bias(), gen));
  declare_hook_points({"q", "k", "v", "scores", "pattern", "context", "out"});
}

std::optional<Mask> combine_masks(const AttentionMask& m, std::size_t B, std::size_t H, std::size_t T, std::size_t S) {
  if (!m.causal && !m.attn_mask && !m.key_padding_mask) return std::nullopt;
  const Shape full = {B, H, T, S};
  if (m.attn_mask) {
    const Shape& ms = m.attn_mask->shape();
    bool fits = ms.size() <= 4;
    for (std::size_t k = 0; fits && k < ms.size(); ++k) {
      const std::size_t want = full[4 - ms.size() + k];
      fits = ms[k] == want || ms[k] == 1;
    }
    if (!fits) {
      fail("MultiHeadAttention: attn_mask of shape ", shape_str(ms), " does not broadcast to (B, H, T, S) = ", shape_str(full));
    }
  }
  if (m.key_padding_mask && m.key_padding_mask->shape() != Shape{B, S}) {
    fail("MultiHeadAttention: key_padding_mask of shape ", shape_str(m.key_padding_mask->shape()), " is not (B, S) = ",
         shape_str(Shape{B, S}));
  }
  // Plain loops: xtensor 0.24.3 with xsimd computes a broadcasting || of bool arrays wrongly.
  Mask out = xt::zeros<bool>(full);
  const Mask attn = m.attn_mask ? Mask(xt::broadcast(*m.attn_mask, full)) : Mask();
  bool* o = out.data();
  for (std::size_t b = 0, i = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t s = 0; s < S; ++s, ++i) {
          o[i] = (m.causal && s > t) || (m.attn_mask && attn.data()[i]) ||
                 (m.key_padding_mask && (*m.key_padding_mask)(b, s));
        }
  return out;
}

void Attention::check_input(const Tensor& x) const {
  check_defined(x, "MultiHeadAttention");
  if (x.ndim() != 3 || x.shape()[2] != options_.d_model()) {
    fail("MultiHeadAttention: input must be (B, T, C) with C = d_model ", options_.d_model(), ", got ", shape_str(x.shape()));
  }
}

AttentionOutput Attention::forward(const Tensor& x, const AttentionMask& mask) const {
  check_input(x);
  const std::size_t C = options_.d_model(), H = options_.num_heads(), D = C / H;
  const std::size_t B = x.shape()[0], T = x.shape()[1];
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  // A causal mask alone is applied inside the fused kernel; any other mask is combined in full.
  const bool causal_only = mask.causal && !mask.attn_mask && !mask.key_padding_mask;
  const bool unfused = hooked("scores");
  const std::optional<Mask> blocked = causal_only && !unfused ? std::nullopt : combine_masks(mask, B, H, T, T);

  // q, k, v (B, T, C) hold the H heads side by side: head h is channels hD .. (h+1)D.
  const Tensor q = hook("q", w_q->forward(x)), k = hook("k", w_k->forward(x)), v = hook("v", w_v->forward(x));
  Tensor weights;  // (B, H, T, S)
  if (unfused) {
    // The same kernels as the fused op, so the same bits when the hooks change nothing.
    const Tensor scores = hook("scores", attention_scores(q, k, H, scale));
    weights = blocked ? masked_softmax(scores, *blocked) : softmax(scores);
  } else {
    weights = attention_weights(q, k, H, scale, causal_only, blocked ? &*blocked : nullptr);
  }
  weights = hook("pattern", weights);
  const Tensor context = hook("context", attend(dropout(weights, options_.dropout(), is_training(), generator()), v, H));  // (B, T, C)
  return {hook("out", w_o->forward(context)), weights};
}

}  // namespace xgrad::nn
