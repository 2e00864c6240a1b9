// MultiHeadAttention forward (its backward is the ops' own).
#include "xgrad/nn/attention.hpp"

#include <cmath>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"
#include "xgrad/nn/residual.hpp"

namespace xgrad::nn {

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o, Generator& gen) : options_(o) {
  if (o.num_heads() == 0 || o.d_model() == 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " and num_heads ", o.num_heads(), " must be positive");
  }
  if (o.d_model() % o.num_heads() != 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " is not divisible by num_heads ", o.num_heads());
  }
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f)) fail("MultiHeadAttention: dropout ", o.dropout(), " is outside [0, 1)");
  const std::size_t C = o.d_model();
  w_q = register_module("w_q", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_k = register_module("w_k", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_v = register_module("w_v", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_o = register_module("w_o", std::make_shared<Linear>(C, C, o.bias(), gen));
  if (o.norm() != Norm::none) norm = register_module("norm", std::make_shared<LayerNorm>(C, o.layer_norm_eps()));
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

AttentionOutput MultiHeadAttention::forward(const Tensor& x, const AttentionMask& mask) const {
  check_defined(x, "MultiHeadAttention");
  const std::size_t C = options_.d_model(), H = options_.num_heads(), D = C / H;
  if (x.ndim() != 3 || x.shape()[2] != C) {
    fail("MultiHeadAttention: input must be (B, T, C) with C = d_model ", C, ", got ", shape_str(x.shape()));
  }
  const std::size_t B = x.shape()[0], T = x.shape()[1];
  const auto b = static_cast<std::int64_t>(B), t = static_cast<std::int64_t>(T);
  const auto h = static_cast<std::int64_t>(H), d = static_cast<std::int64_t>(D);

  // A causal mask alone is applied inside the kernel; any other mask is combined in full.
  const bool causal_only = mask.causal && !mask.attn_mask && !mask.key_padding_mask;
  const std::optional<Mask> blocked = causal_only ? std::nullopt : combine_masks(mask, B, H, T, T);
  Tensor weights;
  auto attention = [&](const Tensor& in) {
    // q, k, v (B, T, C) hold the H heads side by side: head h is channels hD .. (h+1)D.
    const Tensor q = w_q->forward(in), k = w_k->forward(in), v = w_v->forward(in);
    weights = attention_weights(q, k, H, 1.f / std::sqrt(static_cast<float>(D)), causal_only,
                                blocked ? &*blocked : nullptr);  // (B, H, T, S)
    const Tensor attended = dropout(weights, options_.dropout(), is_training());
    Tensor context = attend(attended, v, H);  // (B, T, C)
    if (head_gates.defined()) {
      if (head_gates.shape() != Shape{H}) {
        fail("MultiHeadAttention: head_gates of shape ", shape_str(head_gates.shape()), " is not (H,) = (", H, ",)");
      }
      context = reshape(reshape(context, {b, t, h, d}) * reshape(head_gates, {1, 1, h, 1}), {b, t, static_cast<std::int64_t>(C)});
    }
    probe("context", context);
    return w_o->forward(context);
  };
  const Tensor out = residual_connection(*this, "residual", x, options_.norm(), norm.get(), attention);
  return {out, weights};
}

}  // namespace xgrad::nn
