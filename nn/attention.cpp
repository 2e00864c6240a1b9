// Attention forward (its backward is the ops' own).
#include "xgrad/nn/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::nn {

namespace {

std::size_t key_width(const MultiHeadAttentionOptions& o) { return o.kdim() ? o.kdim() : o.d_model(); }
std::size_t value_width(const MultiHeadAttentionOptions& o) { return o.vdim() ? o.vdim() : o.d_model(); }

void check_broadcasts(const char* name, const Shape& ms, const Shape& full) {
  bool fits = ms.size() <= 4;
  for (std::size_t k = 0; fits && k < ms.size(); ++k) {
    const std::size_t want = full[4 - ms.size() + k];
    fits = ms[k] == want || ms[k] == 1;
  }
  if (!fits)
    fail("MultiHeadAttention: ", name, " of shape ", shape_str(ms),
         " does not broadcast to (B, H, T, S) = ", shape_str(full));
}

}  // namespace

void Attention::check(const MultiHeadAttentionOptions& o) {
  if (o.num_heads() == 0 || o.d_model() == 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " and num_heads ", o.num_heads(), " must be positive");
  }
  if (o.d_model() % o.num_heads() != 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " is not divisible by num_heads ", o.num_heads());
  }
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f))
    fail("MultiHeadAttention: dropout ", o.dropout(), " is outside [0, 1)");
}

Attention::Attention(const MultiHeadAttentionOptions& o, Generator& gen) : RandomStream(gen), options_(o) {
  check(o);
  const std::size_t C = o.d_model();
  w_q = register_module("w_q", std::make_shared<Linear>(C, C, o.bias(), gen));
  w_k = register_module("w_k", std::make_shared<Linear>(key_width(o), C, o.bias(), gen));
  w_v = register_module("w_v", std::make_shared<Linear>(value_width(o), C, o.bias(), gen));
  w_o = register_module("w_o", std::make_shared<Linear>(C, C, o.bias(), gen));
  declare_hook_points({"q", "k", "v", "scores", "pattern", "context", "out"});
}

std::optional<Mask> combine_masks(const AttentionMask& m, std::size_t B, std::size_t H, std::size_t T, std::size_t S,
                                  std::size_t offset) {
  if (!m.causal && !m.attn_mask && !m.key_padding_mask && !m.additive_mask) return std::nullopt;
  const Shape full = {B, H, T, S};
  if (m.attn_mask) check_broadcasts("attn_mask", m.attn_mask->shape(), full);
  if (m.additive_mask) {
    check_broadcasts("additive_mask", m.additive_mask->shape(), full);
    for (std::size_t i = 0; i < m.additive_mask->size(); ++i) {
      const float a = m.additive_mask->data()[i];
      if (std::isnan(a) || a == std::numeric_limits<float>::infinity()) {
        fail("MultiHeadAttention: additive_mask holds ", a, " at flat position ", i,
             " (only finite values and -inf are allowed)");
      }
    }
  }
  if (m.key_padding_mask && m.key_padding_mask->shape() != Shape{B, S}) {
    fail("MultiHeadAttention: key_padding_mask of shape ", shape_str(m.key_padding_mask->shape()),
         " is not (B, S) = ", shape_str(Shape{B, S}));
  }
  // Plain loops: xtensor 0.24.3 with xsimd computes a broadcasting || of bool arrays wrongly.
  Mask out = xt::zeros<bool>(full);
  const Mask attn = m.attn_mask ? Mask(xt::broadcast(*m.attn_mask, full)) : Mask();
  const Array add = m.additive_mask ? Array(xt::broadcast(*m.additive_mask, full)) : Array();
  bool* o = out.data();
  for (std::size_t b = 0, i = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t s = 0; s < S; ++s, ++i) {
          o[i] = (m.causal && s > t + offset) || (m.attn_mask && attn.data()[i]) ||
                 (m.key_padding_mask && (*m.key_padding_mask)(b, s)) || (m.additive_mask && std::isinf(add.data()[i]));
        }
  return out;
}

void Attention::check_input(const Tensor& query) const {
  check_defined(query, "MultiHeadAttention");
  if (query.ndim() != 3 || query.shape()[2] != options_.d_model()) {
    fail("MultiHeadAttention: input must be (B, T, C) with C = d_model ", options_.d_model(), ", got ",
         shape_str(query.shape()));
  }
}

AttentionOutput Attention::forward(const Tensor& x, const AttentionMask& mask, KVCache* cache) const {
  check_input(x);
  if (key_width(options_) != options_.d_model() || value_width(options_) != options_.d_model()) {
    fail("MultiHeadAttention: self-attention needs kdim and vdim equal to d_model ", options_.d_model(), " (kdim ",
         key_width(options_), ", vdim ", value_width(options_), "); call forward(query, key, value)");
  }
  if (cache && cache->k.defined()) {
    const Shape& ks = cache->k.shape();
    if (ks.size() != 3 || ks[0] != x.shape()[0] || ks[2] != options_.d_model() || !cache->v.defined() ||
        cache->v.shape() != ks) {
      fail("MultiHeadAttention: the KVCache holds keys ", shape_str(ks), " and values ",
           cache->v.defined() ? shape_str(cache->v.shape()) : std::string("(none)"),
           ", which do not continue an input of shape ", shape_str(x.shape()));
    }
  }
  const Tensor q = hook("q", w_q->forward(x));
  Tensor k = w_k->forward(x), v = w_v->forward(x);
  const std::size_t offset = cache ? cache->length() : 0;
  if (offset > 0) {
    k = concat({cache->k, k}, 1);
    v = concat({cache->v, v}, 1);
  }
  const Tensor hooked_k = hook("k", k);  // k before v: hook points fire in forward order
  AttentionOutput out = attend_heads(q, hooked_k, hook("v", v), mask, offset);
  if (cache) {
    // Stored as they were before the hooks (a hook sees every position at each step, as without
    // a cache), and only once the step has succeeded.
    cache->k = k;
    cache->v = v;
  }
  return out;
}

AttentionOutput Attention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const AttentionMask& mask) const {
  check_input(query);
  check_defined(key, "MultiHeadAttention: key");
  check_defined(value, "MultiHeadAttention: value");
  const std::size_t B = query.shape()[0], kdim = key_width(options_), vdim = value_width(options_);
  if (key.ndim() != 3 || key.shape()[0] != B || key.shape()[2] != kdim) {
    fail("MultiHeadAttention: key must be (B, S, kdim) = (", B, ", S, ", kdim, "), got ", shape_str(key.shape()));
  }
  if (value.ndim() != 3 || value.shape()[0] != B || value.shape()[1] != key.shape()[1] || value.shape()[2] != vdim) {
    fail("MultiHeadAttention: value must be (B, S, vdim) = (", B, ", ", key.shape()[1], ", ", vdim,
         ") like the key, got ", shape_str(value.shape()));
  }
  if (key.shape()[1] == 0) fail("MultiHeadAttention: key and value have no positions (S = 0)");
  const Tensor q = hook("q", w_q->forward(query));
  const Tensor k = hook("k", w_k->forward(key));
  return attend_heads(q, k, hook("v", w_v->forward(value)), mask, 0);
}

// q (B, T, C), k and v (B, S, C); queries are positions offset .. offset + T - 1 for the causal mask.
AttentionOutput Attention::attend_heads(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                                        std::size_t offset) const {
  const std::size_t C = options_.d_model(), H = options_.num_heads(), D = C / H;
  const std::size_t B = q.shape()[0], T = q.shape()[1], S = k.shape()[1];
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  AttentionMask m = mask;
  if (m.causal && offset + 1 >= S) m.causal = false;  // the first query already sees every key
  // A causal mask alone is applied inside the fused kernel; any other mask is combined in full.
  const bool causal_only = m.causal && offset == 0 && !m.attn_mask && !m.key_padding_mask && !m.additive_mask;
  const bool unfused = hooked("scores") || m.additive_mask;
  const std::optional<Mask> blocked = causal_only && !unfused ? std::nullopt : combine_masks(m, B, H, T, S, offset);

  Tensor weights;  // (B, H, T, S)
  if (unfused) {
    // The same kernels as the fused op, so the same bits when the hooks change nothing.
    Tensor scores = hook("scores", attention_scores(q, k, H, scale));
    if (m.additive_mask) {
      Array finite = *m.additive_mask;  // -inf entries are in `blocked`; 0 keeps them finite here
      for (float& a : finite) a = std::isinf(a) ? 0.f : a;
      scores = scores + Tensor(std::move(finite));
    }
    weights = blocked ? masked_softmax(scores, *blocked) : softmax(scores);
  } else {
    weights = attention_weights(q, k, H, scale, causal_only, blocked ? &*blocked : nullptr);
  }
  weights = hook("pattern", weights);
  const Tensor context =
      hook("context", attend(dropout(weights, options_.dropout(), is_training(), generator()), v, H));  // (B, T, C)
  return {hook("out", w_o->forward(context)), weights};
}

}  // namespace xgrad::nn
