// Attention forward (its backward is the ops' own).
#include "xgrad/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <xtensor/xbroadcast.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"

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

// x (B, S, KV D) -> (B, S, KV groups D): each key/value head repeated for its group of query heads.
Tensor repeat_heads(const Tensor& x, std::size_t kv_heads, std::size_t groups, std::size_t D) {
  if (groups == 1) return x;
  const auto B = static_cast<std::int64_t>(x.shape()[0]), S = static_cast<std::int64_t>(x.shape()[1]);
  const auto KV = static_cast<std::int64_t>(kv_heads), d = static_cast<std::int64_t>(D);
  const Tensor heads = reshape(x, {B, S, KV, 1, d});
  return reshape(concat(std::vector<Tensor>(groups, heads), 3), {B, S, KV * static_cast<std::int64_t>(groups) * d});
}

// positions (B, T), (1, T) or (T) as (B, T).
IndexArray row_positions(const IndexArray& positions, std::size_t B, std::size_t T) {
  if (positions.size() != T && positions.shape() != Shape{B, T}) {
    fail("MultiHeadAttention: positions of shape ", shape_str(positions.shape()),
         " are not (B, T) = ", shape_str(Shape{B, T}), ", (1, T) or (T)");
  }
  if (positions.shape() == Shape{B, T}) return positions;
  IndexArray rows = IndexArray::from_shape({B, T});
  for (std::size_t b = 0; b < B; ++b) std::copy(positions.begin(), positions.end(), rows.begin() + b * T);
  return rows;
}

}  // namespace

float MultiHeadAttentionOptions::score_scale() const {
  return scale_ > 0.f ? scale_ : 1.f / std::sqrt(static_cast<float>(head_dim()));
}

void Attention::check(const MultiHeadAttentionOptions& o) {
  if (o.num_heads() == 0 || o.d_model() == 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " and num_heads ", o.num_heads(), " must be positive");
  }
  if (!o.head_dim_set() && o.d_model() % o.num_heads() != 0) {
    fail("MultiHeadAttention: d_model ", o.d_model(), " is not divisible by num_heads ", o.num_heads(),
         " (or set head_dim)");
  }
  if (o.num_heads() % o.kv_heads() != 0) {
    fail("MultiHeadAttention: num_heads ", o.num_heads(), " is not divisible by num_kv_heads ", o.kv_heads());
  }
  if (!(o.dropout() >= 0.f && o.dropout() < 1.f))
    fail("MultiHeadAttention: dropout ", o.dropout(), " is outside [0, 1)");
  check_norm_options(o.norm_options(), "MultiHeadAttention");
  if (!(std::isfinite(o.rope_theta()) && o.rope_theta() > 0.f)) {
    fail("MultiHeadAttention: rope_theta ", o.rope_theta(), " must be finite and > 0");
  }
  const std::size_t D = o.head_dim();
  if (o.rotary_dim() % 2 != 0 || o.rotary_dim() > D) {
    fail("MultiHeadAttention: rotary_dim ", o.rotary_dim(), " must be even and at most the head size ", D);
  }
  check_rope_scaling(o.rope_scaling(), "MultiHeadAttention");
  const std::size_t r = o.rotary_dim() ? o.rotary_dim() : D;
  if (o.rotary() && o.rope_scaling().type == RopeScaling::Type::dynamic && r < 4) {
    fail("MultiHeadAttention: dynamic rope scaling needs at least 4 rotary channels, got ", r);
  }
  if (o.rotary() && D % 2 != 0) fail("MultiHeadAttention: rotary needs an even head size, got ", D);
  if (!(std::isfinite(o.scale()) && o.scale() >= 0.f))
    fail("MultiHeadAttention: scale ", o.scale(), " must be finite and >= 0 (0: 1 / sqrt(head_dim))");
  if (!(std::isfinite(o.logit_softcap()) && o.logit_softcap() >= 0.f))
    fail("MultiHeadAttention: logit_softcap ", o.logit_softcap(), " must be finite and >= 0 (0: none)");
  if (o.attention_tile() < 1 || o.attention_tile() > 1024) {
    fail("MultiHeadAttention: attention_tile ", o.attention_tile(), " is outside [1, 1024]");
  }
}

Attention::Attention(const MultiHeadAttentionOptions& o, Generator& gen) : RandomStream(gen), options_(o) {
  check(o);
  const std::size_t C = o.d_model(), HD = o.num_heads() * o.head_dim(), KVD = o.kv_heads() * o.head_dim();
  w_q = register_module("w_q", std::make_shared<Linear>(C, HD, o.qkv_bias(), gen));
  w_k = register_module("w_k", std::make_shared<Linear>(key_width(o), KVD, o.qkv_bias(), gen));
  w_v = register_module("w_v", std::make_shared<Linear>(value_width(o), KVD, o.qkv_bias(), gen));
  w_o = register_module("w_o", std::make_shared<Linear>(HD, C, o.out_bias(), gen));
  if (o.qk_norm()) {
    const float eps = o.norm_options().eps();
    const bool offset = o.norm_options().unit_offset();
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(o.head_dim(), eps, true, offset));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(o.head_dim(), eps, true, offset));
  }
  if (o.rotary()) {
    declare_hook_points({"q", "k", "v", "rot_q", "rot_k", "scores", "pattern", "context", "z", "result", "out"});
  } else {
    declare_hook_points({"q", "k", "v", "scores", "pattern", "context", "z", "result", "out"});
  }
}

// The context (B, T, H D) through the points context, z and result to w_o's output. z and result
// are formed only while hooked. With result, out = sum over heads of result + w_o's bias, where
// result[b, t, h] = z[b, t, h] W_o[:, hD .. (h+1)D]^T: each head's share of out, before the bias.
Tensor Attention::project_out(const Tensor& context_in) const {
  Tensor context = hook("context", context_in);
  const auto B = static_cast<std::int64_t>(context.shape()[0]), T = static_cast<std::int64_t>(context.shape()[1]);
  const auto H = static_cast<std::int64_t>(options_.num_heads()), D = static_cast<std::int64_t>(options_.head_dim());
  const auto C = static_cast<std::int64_t>(options_.d_model());
  if (hooked("z")) context = reshape(hook("z", reshape(context, {B, T, H, D})), {B, T, H * D});
  if (!hooked("result")) return hook("out", w_o->forward(context));
  const Tensor z_by_head = reshape(permute(reshape(context, {B, T, H, D}), {2, 0, 1, 3}), {H, B * T, D});
  const Tensor w_by_head = permute(reshape(w_o->effective_weight(), {C, H, D}), {1, 2, 0});  // (H, D, C)
  const Tensor per_head = reshape(matmul(z_by_head, w_by_head), {H, B, T, C});
  const Tensor result = hook("result", permute(per_head, {1, 2, 0, 3}));  // (B, T, H, C)
  Tensor out = sum(result, {2});
  if (w_o->bias.defined()) out = out + w_o->bias;
  return hook("out", out);
}

// x (B, T, n D) -> norm over each head's D channels, same shape.
Tensor Attention::norm_heads(const std::shared_ptr<RMSNorm>& norm, const Tensor& x) const {
  if (!norm) return x;
  const auto B = static_cast<std::int64_t>(x.shape()[0]), T = static_cast<std::int64_t>(x.shape()[1]);
  const auto D = static_cast<std::int64_t>(options_.head_dim());
  const auto C = static_cast<std::int64_t>(x.shape()[2]);
  return reshape(norm->forward(reshape(x, {B, T, C / D, D})), {B, T, C});
}

std::optional<Mask> combine_masks(const AttentionMask& m, std::size_t B, std::size_t H, std::size_t T, std::size_t S,
                                  std::size_t offset, std::size_t window) {
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
          o[i] = (m.causal && (s > t + offset || (window > 0 && s + window <= t + offset))) ||
                 (m.attn_mask && attn.data()[i]) || (m.key_padding_mask && (*m.key_padding_mask)(b, s)) ||
                 (m.additive_mask && std::isinf(add.data()[i]));
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

namespace {
// The first S positions of x (B, rows, C).
Tensor first_positions(const Tensor& x, std::size_t S) { return S < x.shape()[1] ? slice(x, 1, 0, S) : x; }
}  // namespace

KVCache::KVCache(const KVCache& other)
    : positions(other.positions),
      turned(other.turned),
      dropped(other.dropped),
      k_(other.k_),
      v_(other.v_),
      held_(other.held_),
      reserved_(other.reserved_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

Tensor KVCache::keys() const { return k_.defined() ? first_positions(k_, held_) : Tensor(); }
Tensor KVCache::values() const { return v_.defined() ? first_positions(v_, held_) : Tensor(); }

void KVCache::reserve(std::size_t positions) {
  if (positions > 0 && positions < held_) {
    fail("KVCache::reserve: ", positions, " positions is fewer than the ", held_, " held");
  }
  reserved_ = positions;
}

void KVCache::keep_rows(const std::vector<std::size_t>& rows) {
  IndexArray ids = IndexArray::from_shape({rows.size()});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= this->rows())
      fail("KVCache::keep_rows: row ", rows[i], " is outside the batch of ", this->rows(), " rows");
    ids(i) = static_cast<std::int64_t>(rows[i]);
  }
  k_ = index_select(keys(), 0, ids);
  v_ = index_select(values(), 0, ids);
  owns_room_ = false;
  if (positions) positions = IndexArray(xt::view(*positions, xt::keep(rows), xt::all()));
}

void KVCache::clear() {
  k_ = Tensor(), v_ = Tensor(), positions.reset(), turned = false, dropped = 0, held_ = 0, owns_room_ = false;
}

void KVCache::write_after_held(const Tensor& k, const Tensor& v) {
  const std::size_t B = k.shape()[0], T = k.shape()[1], C = k.shape()[2];
  if (!owns_room_ || !k_.defined() || k_.shape()[1] < held_ + T) {
    check_available_memory(
        2.0 * static_cast<double>(B) * static_cast<double>(reserved_) * static_cast<double>(C) * sizeof(float),
        "KVCache",
        "room for " + std::to_string(reserved_) + " positions of " + std::to_string(B) + " rows of " +
            std::to_string(C) + " key and value channels");
    const auto room = [&](const Tensor& held) {
      Array a = Array::from_shape({B, reserved_, C});
      for (std::size_t b = 0; b < B && held_ > 0; ++b) {
        std::copy_n(held.value().data() + b * held.shape()[1] * C, held_ * C, a.data() + b * reserved_ * C);
      }
      return Tensor(std::move(a));
    };
    k_ = room(k_), v_ = room(v_), owns_room_ = true;
  }
  const std::size_t R = k_.shape()[1];
  float* kd = k_.mutable_value().data();
  float* vd = v_.mutable_value().data();
  for (std::size_t b = 0; b < B; ++b) {
    std::copy_n(k.value().data() + b * T * C, T * C, kd + (b * R + held_) * C);
    std::copy_n(v.value().data() + b * T * C, T * C, vd + (b * R + held_) * C);
  }
}

AttentionOutput Attention::forward(const Tensor& x, const AttentionMask& mask, KVCache* cache,
                                   const IndexArray* positions) const {
  check_input(x);
  if (key_width(options_) != options_.d_model() || value_width(options_) != options_.d_model()) {
    fail("MultiHeadAttention: self-attention needs kdim and vdim equal to d_model ", options_.d_model(), " (kdim ",
         key_width(options_), ", vdim ", value_width(options_), "); call forward(query, key, value)");
  }
  const std::size_t KVD = options_.kv_heads() * options_.head_dim();
  const std::size_t B = x.shape()[0], T = x.shape()[1];
  if (cache && cache->held() > 0 && (cache->rows() != B || cache->k_.shape()[2] != KVD)) {
    fail("MultiHeadAttention: the KVCache holds keys (", cache->rows(), ", ", cache->held(), ", ", cache->k_.shape()[2],
         "), which do not continue an input of shape ", shape_str(x.shape()), " (keys (B, P, ", KVD, "))");
  }
  if (cache && cache->reserved() > 0 && cache->held() + T > cache->reserved()) {
    fail("MultiHeadAttention: ", T, " positions after the ", cache->held(), " the KVCache holds go past the ",
         cache->reserved(), " it reserves (KVCache::reserve)");
  }
  // held: the keys the cache holds, of indices first .. first + held - 1; x's are the next T.
  const std::size_t held = cache ? cache->held() : 0, first = cache ? cache->dropped : 0;
  // Keys are cached turned by RoPE, each once at its position. Dynamic scaling's frequencies follow
  // the sequence's length, so its keys are cached unturned (with the positions given, if any) and
  // all turned again at each step, as a forward over the whole sequence turns them.
  const bool rotary = options_.rotary();
  const bool turn_once = rotary && options_.rope_scaling().type != RopeScaling::Type::dynamic;
  if (cache && held > 0 && cache->turned != turn_once) {
    fail("MultiHeadAttention: the KVCache holds keys ", cache->turned ? "turned" : "not turned",
         " by RoPE, and this attention caches them ", turn_once ? "turned" : "unturned",
         "; a cache continues only in an attention like the one that filled it");
  }
  if (cache && held > 0 && rotary && !turn_once && (positions != nullptr) != cache->positions.has_value()) {
    fail("MultiHeadAttention: ",
         positions ? "positions are given with a KVCache filled without them"
                   : "a KVCache filled with positions needs them at every step",
         " (", held, " positions held; dynamic rope scaling turns them again at each step)");
  }
  auto count_from = [](std::size_t from, std::size_t n) {
    IndexArray p = IndexArray::from_shape({n});
    for (std::size_t i = 0; i < n; ++i) p(i) = static_cast<std::int64_t>(from + i);
    return p;
  };
  const IndexArray query_pos = positions ? *positions : count_from(first + held, T);
  const float theta = options_.rope_theta();
  const std::size_t r = options_.rotary_dim();
  const RopeScaling& scaling = options_.rope_scaling();
  // Three products, not one on the packed [W_q; W_k; W_v] and a split: bench_fused_products
  // (docs/speed.md, "Fused products") measured the packed product, packed each step as training
  // must, at 0.96x the speed of three in forward and backward (0.92x to 1.03x over six runs of the
  // benchmark's shapes), and 0.97x forward alone.
  const Tensor q = hook("q", norm_heads(q_norm, w_q->forward(x)));
  // The new positions' keys and values (k before v: hook points fire in forward order).
  Tensor k = hook("k", norm_heads(k_norm, w_k->forward(x)));
  Tensor v = hook("v", w_v->forward(x));
  Tensor rotated_q = q;
  if (turn_once) {
    rotated_q = hook("rot_q", rotary_embedding(q, options_.num_heads(), query_pos, theta, r, scaling));
    k = hook("rot_k", rotary_embedding(k, options_.kv_heads(), query_pos, theta, r, scaling));
  }
  const std::size_t window = options_.sliding_window();
  // With room reserved, a step that records nothing writes its keys and values after the held ones
  // and attends to the first S positions of the room.
  const bool in_room = cache && cache->reserved() > 0 && window == 0 && (!rotary || turn_once) &&
                       !rotated_q.requires_grad() && !k.requires_grad() && !v.requires_grad();
  if (in_room) {
    cache->write_after_held(k, v);
    k = cache->k_;
    v = cache->v_;
  } else if (held > 0) {
    k = concat({cache->keys(), k}, 1);
    v = concat({cache->values(), v}, 1);
  }
  const std::size_t S = held + T;
  std::optional<IndexArray> key_positions;  // dynamic scaling, cached with positions: (B, S)
  Tensor turned_k = k;
  if (rotary && !turn_once) {
    if (cache && positions) {
      const IndexArray given = row_positions(*positions, B, T);
      key_positions = held == 0 ? given : IndexArray(xt::concatenate(xt::xtuple(*cache->positions, given), 1));
    }
    const IndexArray key_pos = key_positions ? *key_positions : held == 0 ? query_pos : count_from(first, S);
    rotated_q = hook("rot_q", rotary_embedding(q, options_.num_heads(), query_pos, theta, r, scaling));
    turned_k = hook("rot_k", rotary_embedding(k, options_.kv_heads(), key_pos, theta, r, scaling));
  }
  AttentionOutput out = attend_heads(rotated_q, turned_k, v, S, mask, held, window);
  if (in_room) {
    cache->held_ = S;
    cache->turned = turn_once;
  } else if (cache) {
    // What the hooks returned, stored once the step has succeeded. A window keeps its last
    // `window` positions: the next query sees no earlier key.
    const std::size_t drop = window > 0 && mask.causal && S > window ? S - window : 0;
    cache->k_ = drop ? slice(k, 1, drop, S) : k;
    cache->v_ = drop ? slice(v, 1, drop, S) : v;
    cache->held_ = S - drop;
    cache->owns_room_ = false;
    if (key_positions) cache->positions = IndexArray(xt::view(*key_positions, xt::all(), xt::range(drop, S)));
    cache->turned = turn_once;
    cache->dropped = first + drop;
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
  if (options_.rotary()) fail("MultiHeadAttention: rotary positions apply to self-attention only");
  const Tensor q = hook("q", norm_heads(q_norm, w_q->forward(query)));
  const Tensor k = hook("k", norm_heads(k_norm, w_k->forward(key)));
  return attend_heads(q, k, hook("v", w_v->forward(value)), key.shape()[1], mask, 0, options_.sliding_window());
}

bool Attention::tiled(const AttentionMask& m, std::size_t T, std::size_t S, std::size_t offset, bool room) const {
  const AttentionKernel kernel = options_.kernel();
  if (kernel == AttentionKernel::full || m.need_weights || hooked("scores") || hooked("pattern")) return false;
  if (options_.logit_softcap() > 0.f) return false;
  if (m.attn_mask || m.key_padding_mask || m.additive_mask) return false;
  if (m.causal && offset + T != S) return false;  // flash_attention's causal mask is bottom-right aligned
  // Keys in a cache's room are read where they are by the tiled kernel; the full kernel would copy them.
  return kernel == AttentionKernel::tiled || S >= kTiledFromKeys || room;
}

// q (B, T, H D), k and v (B, S, KV D); queries are positions offset .. offset + T - 1 for the
// causal mask, which a window > 0 narrows to the last `window` keys of each.
AttentionOutput Attention::attend_heads(const Tensor& q, const Tensor& kv_k, const Tensor& kv_v, std::size_t S,
                                        const AttentionMask& mask, std::size_t offset, std::size_t window) const {
  const std::size_t H = options_.num_heads(), D = options_.head_dim();
  const std::size_t B = q.shape()[0], T = q.shape()[1];
  const bool room = S < kv_k.shape()[1];
  const float scale = options_.score_scale(), cap = options_.logit_softcap();
  AttentionMask m = mask;
  if (!m.causal || S <= window) window = 0;                          // no query has a key outside its window
  if (m.causal && offset + 1 >= S && window == 0) m.causal = false;  // the first query already sees every key
  const float p = is_training() ? options_.dropout() : 0.f;
  const std::size_t groups = H / options_.kv_heads();
  if (T == 1 && groups > 1 && !m.causal && !m.attn_mask && !m.additive_mask && cap == 0.f && p == 0.f &&
      !hooked("scores") && !hooked("pattern")) {
    return attend_grouped(q, kv_k, kv_v, S, m);
  }
  const bool flash = tiled(m, T, S, offset, room);
  const bool in_place = flash && groups == 1;  // the tiled kernel reads the first S keys where they are
  const Tensor k = in_place ? kv_k : repeat_heads(first_positions(kv_k, S), options_.kv_heads(), groups, D);
  const Tensor v = in_place ? kv_v : repeat_heads(first_positions(kv_v, S), options_.kv_heads(), groups, D);
  if (flash) {
    FlashAttentionOptions f;
    f.query_tile = f.key_tile = options_.attention_tile();
    f.dropout = p;
    f.generator = &generator();
    f.window = window;
    f.keys = S;
    // flash_attention's causal mask ends each query's keys at S - T + t, which is offset + t here
    return {project_out(flash_attention(q, k, v, H, scale, m.causal, f)), Tensor()};
  }
  // A causal mask alone is applied inside the fused kernel; any other mask is combined in full.
  const bool causal_only = m.causal && offset == 0 && !m.attn_mask && !m.key_padding_mask && !m.additive_mask;
  const bool unfused = hooked("scores") || m.additive_mask || cap > 0.f;
  const std::optional<Mask> blocked =
      causal_only && !unfused ? std::nullopt : combine_masks(m, B, H, T, S, offset, window);

  Tensor weights;  // (B, H, T, S)
  if (unfused) {
    // The same kernels as the fused op, so the same bits when the hooks change nothing.
    Tensor scores = attention_scores(q, k, H, scale);
    if (cap > 0.f) scores = tanh(scores / cap) * cap;  // Gemma 2's attn_logit_softcapping
    scores = hook("scores", scores);
    if (m.additive_mask) {
      Array finite = *m.additive_mask;  // -inf entries are in `blocked`; 0 keeps them finite here
      for (float& a : finite) a = std::isinf(a) ? 0.f : a;
      scores = scores + Tensor(std::move(finite));
    }
    weights = blocked ? masked_softmax(scores, *blocked) : softmax(scores);
  } else {
    weights = attention_weights(q, k, H, scale, causal_only, blocked ? &*blocked : nullptr, causal_only ? window : 0);
  }
  weights = hook("pattern", weights);
  return {project_out(attend(dropout(weights, p, p > 0.f, generator()), v, H)), weights};  // context (B, T, C)
}

// One query against grouped key/value heads (a decoding step): each key/value head's g query heads
// become g queries of that head, so the keys and values are read as the cache holds them instead of
// repeated g times (a copy of every cached key and value at every step). q (B, 1, KV g D) ->
// (B, g, KV D); the weights (B, KV, g, S) are (B, H, 1, S) in the same order. No causal mask (the
// query sees every key), no per-head mask, softcap, dropout or hook on scores or pattern.
AttentionOutput Attention::attend_grouped(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t S,
                                          const AttentionMask& mask) const {
  const std::size_t KV = options_.kv_heads(), groups = options_.num_heads() / KV;
  const auto B = static_cast<std::int64_t>(q.shape()[0]), kv = static_cast<std::int64_t>(KV),
             g = static_cast<std::int64_t>(groups), d = static_cast<std::int64_t>(options_.head_dim());
  const Tensor qg = reshape(transpose(reshape(q, {B, kv, g, d}), 1, 2), {B, g, kv * d});
  const auto back = [&](const Tensor& context) {
    return reshape(transpose(reshape(context, {B, g, kv, d}), 1, 2), {B, 1, kv * g * d});
  };
  const float scale = options_.score_scale();
  if (tiled(mask, groups, S, S - groups, S < k.shape()[1])) {
    FlashAttentionOptions f;
    f.query_tile = f.key_tile = options_.attention_tile();
    f.keys = S;
    return {project_out(back(flash_attention(qg, k, v, KV, scale, false, f))), Tensor()};
  }
  const std::optional<Mask> blocked = combine_masks(mask, q.shape()[0], KV, groups, S);
  const Tensor weights = attention_weights(qg, first_positions(k, S), KV, scale, false, blocked ? &*blocked : nullptr);
  return {project_out(back(attend(weights, first_positions(v, S), KV))),
          reshape(weights, {B, kv * g, 1, static_cast<std::int64_t>(S)})};
}

}  // namespace xgrad::nn
