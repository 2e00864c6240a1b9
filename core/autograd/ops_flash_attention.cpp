// Tiled attention (FlashAttention's algorithm) on the projections' own layout, heads side by side
// in the channels as in ops_attention.cpp. The weights P = softmax(scale q_h k_h^T) are never
// stored: the forward walks the keys tile by tile with an online softmax and keeps, per query row,
// lse = log sum_s exp(z_s) (z the scaled scores); backward recomputes each tile's P = exp(z - lse).
//
// Forward, per query row and key tile, with m the running max and l the running sum:
//   m' = max(m, max_s z_s),  l' = l e^(m - m') + sum_s e^(z_s - m'),  acc' = acc e^(m - m') + p' V
// where p'_s = e^(z_s - m') (times the dropout mask / (1 - p) in training); out = acc / l.
// Backward, with dO the gradient at the output and Delta_t = dO_t . O_t (= sum_s P_ts dP_ts, the
// dropout mask included):
//   dP = (dO V^T) o M,  dV += (P o M)^T dO,  dZ = P o (dP - Delta),  dQ += scale dZ K,
//   dK += scale dZ^T Q
// (M the mask over (1 - p), all ones without dropout).
//
// Under a bf16 AutocastGuard the tile products take bf16 operands and accumulate in fp32, as
// linear's do; the online softmax, the log-sum-exps and every gradient stay fp32. A call with at
// most kFp32Queries queries per entry (a decoding step) multiplies in fp32 instead (see there).
//
// Shapes: B batch, T queries, S keys, H heads, D head width, C = H D; tiles Tq x Tk.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "xgrad/core/autograd/detail/dropout_key.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/bf16_vector.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

constexpr std::size_t kMaxTile = 1024;
// A decoding step's queries: one position, or a grouped key/value head's query heads as its rows
// (up to 7 in the families xgrad loads). With so few queries each key and value is read about once,
// so bf16 products would convert every held key and value to bf16 at every step to save nothing:
// SmolLM2-135M's shape decoding 257 tokens after a 128-token prompt in bf16 ran 1.01-1.15x as
// fast with these products in fp32 (median 1.09x, six pairs alternating in one process), the
// conversions having been 7.7% of its profile.
constexpr std::size_t kFp32Queries = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  std::size_t B, T, S, H, D, C, Tq, Tk;
  std::size_t rows;  // the positions k and v hold per entry (S of them attended): entry b's key s is row b rows + s
  bool causal;
  std::size_t window;  // with causal: keys within `window` positions of the query (0: every earlier one)
  // Keys query t may see: begin(t) <= s < end(t). Causal is bottom-right aligned (query t is
  // position S - T + t).
  std::size_t end(std::size_t t) const {
    if (!causal) return S;
    const std::size_t shifted = t + 1 + S;  // S - T + t + 1, kept unsigned
    return shifted <= T ? 0 : std::min(S, shifted - T);
  }
  std::size_t begin(std::size_t t) const {
    if (!causal || window == 0) return 0;
    const std::size_t shifted = t + 1 + S;  // S - T + t + 1
    return shifted <= T + window ? 0 : shifted - T - window;
  }
};

// Row t's live keys within the tile of keys s0 .. s0 + n - 1, as offsets [lo, hi) into it.
struct Live {
  std::size_t lo, hi;
};
Live live_keys(const Dims& d, std::size_t t, std::size_t s0, std::size_t n) {
  const std::size_t e = d.end(t), b = d.begin(t);
  const std::size_t hi = e > s0 ? std::min(n, e - s0) : 0, lo = b > s0 ? std::min(n, b - s0) : 0;
  return {lo, std::max(lo, hi)};
}

Dims check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t heads, float scale, bool causal,
                  const FlashAttentionOptions& o) {
  if (!q.defined() || !k.defined() || !v.defined()) fail("flash_attention: input is an undefined tensor");
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (qs.size() != 3 || ks.size() != 3 || vs.size() != 3) {
    fail("flash_attention: q, k and v must be (B, T, C), (B, S, C) and (B, S, C), got ", shape_str(qs), ", ",
         shape_str(ks), " and ", shape_str(vs));
  }
  if (heads == 0 || qs[2] % heads != 0)
    fail("flash_attention: ", qs[2], " channels do not split into ", heads, " heads");
  if (ks != vs || ks[0] != qs[0] || ks[2] != qs[2]) {
    fail("flash_attention: k of shape ", shape_str(ks), " and v of shape ", shape_str(vs),
         " must both be (B, S, C) with q's B and C, q being ", shape_str(qs));
  }
  if (!std::isfinite(scale)) fail("flash_attention: scale ", scale, " is not finite");
  if (o.window > 0 && !causal) fail("flash_attention: a window of ", o.window, " needs the causal mask");
  if (o.query_tile < 1 || o.query_tile > kMaxTile || o.key_tile < 1 || o.key_tile > kMaxTile) {
    fail("flash_attention: query_tile ", o.query_tile, " and key_tile ", o.key_tile, " must be in [1, ", kMaxTile, "]");
  }
  if (o.keys > ks[1]) fail("flash_attention: keys ", o.keys, " is more than the ", ks[1], " positions k and v hold");
  detail::check_dropout_probability("flash_attention: dropout", o.dropout);
  const std::size_t S = o.keys > 0 ? o.keys : ks[1];
  return {qs[0], qs[1], S, heads, qs[2] / heads, qs[2], o.query_tile, o.key_tile, ks[1], causal, o.window};
}

// One tile's dropout: row[j] *= keep / (1 - p) for keys s0 .. s0 + n - 1 of row r of (B, H, T),
// the flags those elements have in dropout's mask over (B, H, T, S).
void drop_tile_row(float* row, std::size_t n, std::size_t r, std::size_t S, std::size_t s0,
                   const detail::DropoutKey& key, std::uint8_t* keep) {
  kernels::dropout_forward(row, row, keep, r * S + s0, n, key.k0, key.k1, key.threshold, key.scale);
}

struct Saved {
  std::vector<float> lse;  // (B, H, T); -inf for a row with no key, NaN for a row whose scores had NaN
  bool dropout;
  detail::DropoutKey key;
  Precision precision;  // the forward's, for backward's products too
};

// An operand of the tile products: float32 values, and under a bf16 AutocastGuard their bf16
// copy (q, k, v and dO are rounded once per call; the tiles of P and dZ on the fly).
using blas::Operand;

// The bf16 copy of x when the precision asks for one (else empty).
blas::Bf16Vector bf16_copy(Precision precision, const Array& x) {
  if (precision != Precision::bf16) return {};
  blas::Bf16Vector h(x.size());
  blas::to_bf16(x.data(), x.size(), h.data());
  return h;
}
// The same for k or v (B, rows, C): the attended rows 0 .. S - 1 of each entry, in place in a
// buffer of x's layout (the rest is never read).
blas::Bf16Vector bf16_copy_keys(Precision precision, const Array& x, const Dims& d) {
  if (precision != Precision::bf16 || d.S == d.rows) return bf16_copy(precision, x);
  blas::Bf16Vector h(x.size());
  for (std::size_t b = 0; b < d.B; ++b)
    blas::to_bf16(x.data() + b * d.rows * d.C, d.S * d.C, h.data() + b * d.rows * d.C);
  return h;
}
Operand operand(const Array& x, const blas::Bf16Vector& h) { return {x.data(), h.empty() ? nullptr : h.data()}; }

// C = alpha op(A) op(B) + beta C: in bf16 (fp32 accumulation) when B has bf16 values (its copies
// exist under bf16 only), else in fp32.
void product(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, Operand a, std::size_t lda,
             Operand b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  blas::gemm(b.h ? Precision::bf16 : Precision::fp32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Rows t0 .. t0 + nq - 1 of head h of entry b: writes their context into O and their lse.
void forward_tile(const Dims& d, std::size_t b, std::size_t h, std::size_t t0, float scale, Operand Q, Operand K,
                  Operand V, float* O, float* lse, const Saved& sv) {
  const std::size_t nq = std::min(d.Tq, d.T - t0);
  std::vector<float> z(nq * d.Tk), acc(nq * d.D, 0.f), m(nq, kNegInf), l(nq, 0.f);
  std::vector<std::uint8_t> keep(d.Tk);
  std::vector<std::uint8_t> nan(nq, 0);
  const Operand q = Q.at((b * d.T + t0) * d.C + h * d.D);
  // keys any row of the tile sees; the walk starts on the key tiles' grid
  const std::size_t first = d.begin(t0) / d.Tk * d.Tk, last = d.end(t0 + nq - 1);
  for (std::size_t s0 = first; s0 < last; s0 += d.Tk) {
    const std::size_t n = std::min(d.Tk, last - s0);
    const Operand k = K.at((b * d.rows + s0) * d.C + h * d.D), v = V.at((b * d.rows + s0) * d.C + h * d.D);
    product(false, true, nq, n, d.D, scale, q, d.C, k, d.C, 0.f, z.data(), d.Tk);
    for (std::size_t i = 0; i < nq; ++i) {
      float* zi = z.data() + i * d.Tk;
      const Live k = live_keys(d, t0 + i, s0, n);
      bool seen_nan = false;
      float correction = 0.f;
      std::fill(zi, zi + k.lo, 0.f);  // before the window
      const float sum = kernels::online_softmax_row(zi + k.lo, n - k.lo, k.hi - k.lo, &m[i], &seen_nan, &correction);
      if (seen_nan) nan[i] = true;
      if (m[i] == kNegInf) continue;  // no key yet: z is zeros, nothing to add
      l[i] = l[i] * correction + sum;
      if (correction != 1.f) {
        for (std::size_t c = 0; c < d.D; ++c) acc[i * d.D + c] *= correction;
      }
      if (sv.dropout) drop_tile_row(zi, n, (b * d.H + h) * d.T + t0 + i, d.S, s0, sv.key, keep.data());
    }
    product(false, false, nq, d.D, n, 1.f, {z.data()}, d.Tk, v, d.C, 1.f, acc.data(), d.D);
  }
  for (std::size_t i = 0; i < nq; ++i) {
    float* o = O + (b * d.T + t0 + i) * d.C + h * d.D;
    const std::size_t r = (b * d.H + h) * d.T + t0 + i;
    if (nan[i]) {
      std::fill(o, o + d.D, std::numeric_limits<float>::quiet_NaN());
      lse[r] = std::numeric_limits<float>::quiet_NaN();
    } else if (l[i] > 0.f) {
      const float inv = 1.f / l[i];
      for (std::size_t c = 0; c < d.D; ++c) o[c] = acc[i * d.D + c] * inv;
      lse[r] = m[i] + std::log(l[i]);
    } else {
      std::fill(o, o + d.D, 0.f);
      lse[r] = kNegInf;
    }
  }
}

struct Grads {
  float *dQ, *dK, *dV;  // zeroed buffers, or null when not needed
};

// Head h of entry b, every tile: adds its gradients into g (columns hD .. (h+1)D, which no other
// head writes).
void backward_head(const Dims& d, std::size_t b, std::size_t h, float scale, Operand Q, Operand K, Operand V,
                   const float* O, Operand G, const Saved& sv, const Grads& g) {
  std::vector<float> p(d.Tq * d.Tk), dp(d.Tq * d.Tk), pm(sv.dropout ? d.Tq * d.Tk : 0), delta(d.T);
  blas::Bf16Vector dz16(Q.h ? d.Tq * d.Tk : 0);
  std::vector<std::uint8_t> keep(d.Tk);
  const std::size_t hd = h * d.D;
  for (std::size_t t = 0; t < d.T; ++t) {
    const float* o = O + (b * d.T + t) * d.C + hd;
    const float* go = G.f + (b * d.T + t) * d.C + hd;
    float s = 0.f;
    for (std::size_t c = 0; c < d.D; ++c) s += o[c] * go[c];
    delta[t] = s;
  }
  const float* lse = sv.lse.data() + (b * d.H + h) * d.T;
  for (std::size_t s0 = 0; s0 < d.S; s0 += d.Tk) {
    const std::size_t n = std::min(d.Tk, d.S - s0);
    const std::size_t kv = (b * d.rows + s0) * d.C + hd;
    for (std::size_t t0 = 0; t0 < d.T; t0 += d.Tq) {
      const std::size_t nq = std::min(d.Tq, d.T - t0);
      if (d.end(t0 + nq - 1) <= s0 || d.begin(t0) >= s0 + n) continue;  // above the diagonal, before the window
      const std::size_t qo = (b * d.T + t0) * d.C + hd;
      product(false, true, nq, n, d.D, scale, Q.at(qo), d.C, K.at(kv), d.C, 0.f, p.data(), d.Tk);
      product(false, true, nq, n, d.D, 1.f, G.at(qo), d.C, V.at(kv), d.C, 0.f, dp.data(), d.Tk);
      for (std::size_t i = 0; i < nq; ++i) {
        float* pi = p.data() + i * d.Tk;
        float* dpi = dp.data() + i * d.Tk;
        const Live k = live_keys(d, t0 + i, s0, n);
        const float li = lse[t0 + i];
        const std::size_t live = std::isfinite(li) ? k.hi - k.lo : 0;  // no key, or NaN scores: no gradient
        std::fill(pi, pi + k.lo, 0.f);
        kernels::exp_shifted_row(pi + k.lo, n - k.lo, live, li);
        if (sv.dropout) {
          // the row's flags drawn once, then applied to P (for dV) and to dP
          const std::size_t r = (b * d.H + h) * d.T + t0 + i;
          float* pmi = pm.data() + i * d.Tk;
          kernels::dropout_forward(pi, pmi, keep.data(), r * d.S + s0, n, sv.key.k0, sv.key.k1, sv.key.threshold,
                                   sv.key.scale);
          kernels::dropout_backward(dpi, keep.data(), dpi, n, sv.key.scale);
        }
        const float di = delta[t0 + i];
        for (std::size_t j = 0; j < n; ++j) dpi[j] = pi[j] * (dpi[j] - di);  // dZ, in dp
      }
      if (g.dV) {
        const float* pd = sv.dropout ? pm.data() : p.data();
        product(true, false, n, d.D, nq, 1.f, {pd}, d.Tk, G.at(qo), d.C, 1.f, g.dV + kv, d.C);
      }
      // dZ feeds two products: in bf16 it is rounded once for both
      Operand dz{dp.data()};
      if (K.h && g.dQ && g.dK) {
        blas::to_bf16(dp.data(), nq * d.Tk, dz16.data());
        dz.h = dz16.data();
      }
      if (g.dQ) product(false, false, nq, d.D, n, scale, dz, d.Tk, K.at(kv), d.C, 1.f, g.dQ + qo, d.C);
      if (g.dK) product(true, false, n, d.D, nq, scale, dz, d.Tk, Q.at(qo), d.C, 1.f, g.dK + kv, d.C);
    }
  }
}

}  // namespace

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t heads, float scale, bool causal,
                       const FlashAttentionOptions& options) {
  const Dims d = check_inputs(q, k, v, heads, scale, causal, options);
  auto saved = std::make_shared<Saved>();
  saved->dropout = options.dropout > 0.f;
  saved->precision = d.T <= kFp32Queries ? Precision::fp32 : autocast_precision();
  if (saved->dropout) {
    saved->key =
        detail::draw_dropout_key(options.dropout, options.generator ? *options.generator : default_generator());
  }
  saved->lse.assign(d.B * d.H * d.T, kNegInf);
  Array out = Array::from_shape({d.B, d.T, d.C});
  std::fill(out.begin(), out.end(), 0.f);
  const blas::Bf16Vector qh = bf16_copy(saved->precision, q.value()),
                         kh = bf16_copy_keys(saved->precision, k.value(), d),
                         vh = bf16_copy_keys(saved->precision, v.value(), d);
  const Operand Q = operand(q.value(), qh), K = operand(k.value(), kh), V = operand(v.value(), vh);
  float* O = out.data();
  const std::size_t tiles = (d.T + d.Tq - 1) / d.Tq, tasks = d.B * d.H * tiles;
  if (d.D > 0 && d.S > 0) {
    // Causal tiles differ in work (the last sees every key); ranges of one tile each balance them.
    parallel_for(tasks, 1, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t task = lo; task < hi; ++task) {
        const std::size_t bh = task / tiles, t0 = task % tiles * d.Tq;
        forward_tile(d, bh / d.H, bh % d.H, t0, scale, Q, K, V, O, saved->lse.data(), *saved);
      }
    });
  }
  return record("flash_attention", std::move(out), {q, k, v}, [d, scale, saved](GradContext& ctx) {
    const Precision precision = saved->precision;
    const blas::Bf16Vector gh = bf16_copy(precision, ctx.grad_out()), qh = bf16_copy(precision, ctx.input(0)),
                           kh = bf16_copy_keys(precision, ctx.input(1), d),
                           vh = bf16_copy_keys(precision, ctx.input(2), d);
    const Operand G = operand(ctx.grad_out(), gh), Q = operand(ctx.input(0), qh), K = operand(ctx.input(1), kh),
                  V = operand(ctx.input(2), vh);
    const float* O = ctx.output().data();
    // grad_buffer zeroes and accumulates in place, so q, k and v may be one tensor.
    const Grads g{ctx.needs(0) ? ctx.grad_buffer(0).data() : nullptr,
                  ctx.needs(1) ? ctx.grad_buffer(1).data() : nullptr,
                  ctx.needs(2) ? ctx.grad_buffer(2).data() : nullptr};
    if (d.D == 0 || d.S == 0) return;
    parallel_for(d.B * d.H, 1, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t bh = lo; bh < hi; ++bh) backward_head(d, bh / d.H, bh % d.H, scale, Q, K, V, O, G, *saved, g);
    });
  });
}

}  // namespace xgrad
