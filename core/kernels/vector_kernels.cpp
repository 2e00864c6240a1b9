// See vector_kernels.hpp. GCC builds a function marked XGRAD_CLONES for each listed target and
// resolves the call once, at load time, from the CPU's features: AVX-512 made the tiny benchmark
// step about 10% faster than AVX2 alone (bench_train_step, alternating runs, medians 20.9 and
// 23.1 ms). The AVX-512 copy is x86-64-v4 (F, BW, CD, DQ, VL), not AVX-512F alone: without VL
// the 256-bit code GCC prefers has 16 registers, not 32, and spilled in the fused GELU-dropout
// loops (its backward ran 1.0 ns per element, 0.53 with VL).
#include "xgrad/core/kernels/detail/vector_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "xgrad/core/kernels/detail/fast_math.hpp"
#include "xgrad/core/kernels/detail/target_clones.hpp"

namespace xgrad::XGRAD_KERNELS_NS {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Vectors of 16, 8, 4 and 2 floats; GCC lowers them to whatever registers the target has. They
// only pass between inlined helpers of this file, so GCC's note that their ABI differs between
// targets (-Wpsabi) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Floats16 __attribute__((vector_size(64)));
typedef float Floats8 __attribute__((vector_size(32)));
typedef float Floats4 __attribute__((vector_size(16)));
typedef float Floats2 __attribute__((vector_size(8)));

// Combines 32 partials pairwise, p[l] with p[l + w] for w = 16, 8, 4, 2, 1, and returns the result
// for lane 0. Written on vectors, the halves stay in registers: as a loop over the array, GCC
// stored each level and reloaded narrower parts of it, and the failed store forwarding made
// softmax on rows of 32 take 60 ns a row.
template <class Op>
XGRAD_KERNEL_INLINE float fold32(const float* p, Op op) {
  Floats16 lo, hi;
  std::memcpy(&lo, p, sizeof lo);
  std::memcpy(&hi, p + 16, sizeof hi);
  const Floats16 a = op(lo, hi);
  const Floats8 b = op(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7),
                       __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15));
  const Floats4 c = op(__builtin_shufflevector(b, b, 0, 1, 2, 3), __builtin_shufflevector(b, b, 4, 5, 6, 7));
  const Floats2 d = op(__builtin_shufflevector(c, c, 0, 1), __builtin_shufflevector(c, c, 2, 3));
  return op(d[0], d[1]);
}

// sum over j < n of f(j) as 32 partial sums (j mod 32) added pairwise (16 + 16, 8 + 8, ...): the
// same order on every target. The compiler turns the partials into several independent vector
// accumulators; with 8 partials, one vector, each add waited for the previous one, and layer
// norm's row sums ran at a third of the adders' rate (forward at C 256: 0.56 ns per element,
// 0.23 with 32).
template <class F>
XGRAD_KERNEL_INLINE float sum32(std::size_t n, F f) {
  float acc[32] = {};
  std::size_t j = 0;
  for (; j + 32 <= n; j += 32) {
    for (std::size_t l = 0; l < 32; ++l) acc[l] += f(j + l);
  }
  for (std::size_t l = 0; l < n - j; ++l) acc[l] += f(j + l);  // n - j < 32
  return fold32(acc, [](auto a, auto b) { return a + b; });
}

// max over j < n of f(j), skipping NaN (std::max keeps its first argument when the second is
// NaN); -inf when n is 0. Exact, so the partials' order does not matter.
template <class F>
XGRAD_KERNEL_INLINE float max32(std::size_t n, F f) {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float part[32];
  std::fill(part, part + 32, kLowest);
  std::size_t j = 0;
  for (; j + 32 <= n; j += 32) {
    for (std::size_t l = 0; l < 32; ++l) part[l] = std::max(part[l], f(j + l));
  }
  for (std::size_t l = 0; l < n - j; ++l) part[l] = std::max(part[l], f(j + l));  // n - j < 32
  return fold32(part, [](auto a, auto b) { return a < b ? b : a; });
}

}  // namespace

namespace {

// Dropout's keep flags for elements first .. first + n - 1 (see dropout_forward).
XGRAD_KERNEL_INLINE void keep_flags(std::uint8_t* keep, std::size_t first, std::size_t n, std::uint32_t k0,
                                    std::uint32_t k1, std::uint32_t threshold) {
  // The hash reads the index modulo 2^32, so the loop counts in 32 bits (64-bit index arithmetic
  // took half the vector lanes), in chunks below 2^31 elements.
  for (std::size_t done = 0; done < n;) {
    const std::uint32_t count = static_cast<std::uint32_t>(std::min<std::size_t>(n - done, std::size_t{1} << 31));
    const std::uint32_t base = static_cast<std::uint32_t>(first + done);
    std::uint8_t* kp = keep + done;
    for (std::uint32_t i = 0; i < count; ++i) {
      // murmur3's 32-bit finalizer over the index, keyed by k0 and k1
      std::uint32_t h = ((base + i) * 0x9e3779b9u) ^ k0;
      h ^= h >> 16;
      h *= 0x85ebca6bu;
      h ^= h >> 13;
      h *= 0xc2b2ae35u;
      h ^= h >> 16;
      h ^= k1;
      h *= 0x27d4eb2du;
      h ^= h >> 15;
      kp[i] = h >= threshold;
    }
    done += count;
  }
}

XGRAD_KERNEL_INLINE float gelu_of(float x) { return 0.5f * x * (1.f + fast::erf(x * kInvSqrt2)); }

// d gelu / dx = Phi(x) + x phi(x)
XGRAD_KERNEL_INLINE float gelu_slope(float x) {
  const float cdf = 0.5f * (1.f + fast::erf(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * fast::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

}  // namespace

XGRAD_CLONES void gelu_forward(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = gelu_of(x[i]);
}

XGRAD_CLONES void gelu_backward(const float* x, const float* g, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = g[i] * gelu_slope(x[i]);
}

namespace {

constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluTanhCoef = 0.044715f;

// 1 / (1 + e^-x) from e = e^-|x|, which never overflows; 0 below -87, where fast::exp clamps
// (the true value is below 1.7e-38 there). NaN stays NaN.
XGRAD_KERNEL_INLINE float sigmoid_of(float x) {
  const float a = std::fabs(x);
  const float e = a > 87.f ? 0.f : fast::exp(-a);
  const float r = 1.f / (1.f + e);
  return x >= 0.f ? r : (x < 0.f ? e * r : x);
}

// tanh u: Cephes' tanhf, u + u^3 P(u^2) below |u| = 0.625, where (1 - e) / (1 + e) would cancel;
// above, sign(u) (1 - e) / (1 + e) with e = e^(-2|u|), 0 past |u| = 43.5 (tanh is +-1 in float).
// NaN stays NaN.
XGRAD_KERNEL_INLINE float tanh_of(float u) {
  const float a = std::fabs(u);
  const float z = u * u;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = u + u * z * p;
  const float e = a > 43.5f ? 0.f : fast::exp(-2.f * a);
  const float t = (1.f - e) / (1.f + e);
  const float large = u < 0.f ? -t : (u >= 0.f ? t : u);
  return a < 0.625f ? small : large;
}

// act(x) and act'(x) for the gated units' activation codes (see gated_forward).
template <int Act>
XGRAD_KERNEL_INLINE float activation_of(float x) {
  if constexpr (Act == 0) return x * sigmoid_of(x);
  if constexpr (Act == 1) return gelu_of(x);
  return 0.5f * x * (1.f + tanh_of(kSqrt2OverPi * (x + kGeluTanhCoef * x * x * x)));
}

template <int Act>
XGRAD_KERNEL_INLINE float activation_slope(float x) {
  if constexpr (Act == 0) {
    const float s = sigmoid_of(x);  // silu' = s + x s (1 - s)
    return s * (1.f + x * (1.f - s));
  }
  if constexpr (Act == 1) return gelu_slope(x);
  // (1 + t) / 2 + x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2, t = tanh(sqrt(2/pi) (x + 0.044715 x^3))
  const float t = tanh_of(kSqrt2OverPi * (x + kGeluTanhCoef * x * x * x));
  const float sech2 = 1.f - t * t;  // 0 once |u| is large, while du may overflow to inf
  const float du = kSqrt2OverPi * (1.f + 3.f * kGeluTanhCoef * x * x);
  return 0.5f * (1.f + t) + (sech2 == 0.f ? 0.f : 0.5f * x * sech2 * du);
}

template <int Act>
XGRAD_KERNEL_INLINE void gated_forward_loop(const float* gate, const float* up, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = activation_of<Act>(gate[i]) * up[i];
}

template <int Act>
XGRAD_KERNEL_INLINE void gated_backward_loop(const float* gate, const float* up, const float* g, float* dgate,
                                             float* dup, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    dgate[i] = (g[i] * up[i]) * activation_slope<Act>(gate[i]);
    dup[i] = g[i] * activation_of<Act>(gate[i]);
  }
}

}  // namespace

XGRAD_CLONES void gated_forward(const float* gate, const float* up, float* y, std::size_t n, int activation) {
  if (activation == 0) return gated_forward_loop<0>(gate, up, y, n);
  if (activation == 1) return gated_forward_loop<1>(gate, up, y, n);
  gated_forward_loop<2>(gate, up, y, n);
}

XGRAD_CLONES void gated_backward(const float* gate, const float* up, const float* g, float* dgate, float* dup,
                                 std::size_t n, int activation) {
  if (activation == 0) return gated_backward_loop<0>(gate, up, g, dgate, dup, n);
  if (activation == 1) return gated_backward_loop<1>(gate, up, g, dgate, dup, n);
  gated_backward_loop<2>(gate, up, g, dgate, dup, n);
}

XGRAD_CLONES void gelu_tanh_forward(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = activation_of<2>(x[i]);
}

XGRAD_CLONES void gelu_tanh_backward(const float* x, const float* g, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = g[i] * activation_slope<2>(x[i]);
}

XGRAD_CLONES void dropout_forward(const float* x, float* y, std::uint8_t* keep, std::size_t first, std::size_t n,
                                  std::uint32_t k0, std::uint32_t k1, std::uint32_t threshold, float scale) {
  keep_flags(keep, first, n, k0, k1, threshold);
  // A second pass: GCC 12 vectorizes neither loop when the hash and the float product share one.
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * (scale * static_cast<float>(keep[i]));
}

XGRAD_CLONES void gelu_dropout_forward(const float* x, float* y, std::uint8_t* keep, std::size_t first, std::size_t n,
                                       std::uint32_t k0, std::uint32_t k1, std::uint32_t threshold, float scale) {
  keep_flags(keep, first, n, k0, k1, threshold);
  for (std::size_t i = 0; i < n; ++i) y[i] = gelu_of(x[i]) * (scale * static_cast<float>(keep[i]));
}

XGRAD_CLONES void gelu_dropout_backward(const float* x, const float* g, const std::uint8_t* keep, float* dx,
                                        std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = (g[i] * (scale * static_cast<float>(keep[i]))) * gelu_slope(x[i]);
}

XGRAD_CLONES void dropout_backward(const float* g, const std::uint8_t* keep, float* dx, std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = g[i] * (scale * static_cast<float>(keep[i]));
}

namespace {

// See masked_softmax_row; kept(s) must read no memory conditionally, so the loops vectorize.
template <class Kept>
XGRAD_KERNEL_INLINE void softmax_row(float* row, std::size_t n, Kept kept) {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float m = max32(n, [&](std::size_t j) { return kept(j) ? row[j] : kLowest; });
  std::size_t s = 0;
  // A NaN score makes the row NaN, as in exact arithmetic: max skips NaN, and fast::exp clamps
  // it to a tiny finite value, so without this check it would vanish silently.
  std::uint32_t nans = 0;
  for (s = 0; s < n; ++s) nans += kept(s) & (row[s] != row[s]);
  if (nans) {
    std::fill(row, row + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  if (!(m > kLowest && m < -kLowest)) m = 0.f;  // nothing kept (or an infinite score): keep arithmetic finite
  // Below -87 fast::exp clamps; the exact value is below 1.7e-38 there, and 0 keeps a score far
  // below the maximum at exactly 0 weight, as in exact arithmetic.
  for (s = 0; s < n; ++s) row[s] = (kept(s) & (row[s] - m >= -87.f)) ? fast::exp(row[s] - m) : 0.f;
  const float total = sum32(n, [&](std::size_t j) { return row[j]; });
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (s = 0; s < n; ++s) row[s] *= inv;
}

}  // namespace

XGRAD_CLONES void masked_softmax_row(float* row, std::size_t n, std::size_t end, const std::uint8_t* keep) {
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    if (keep) return softmax_row(row, n, [&](std::size_t s) { return (s < end) & (keep[s] != 0); });
    return softmax_row(row, n, [&](std::size_t s) { return s < end; });
  }
  // 32-bit positions fill twice the vector lanes of 64-bit ones: rows of 32 took 33 ns, not 47.
  const auto e = static_cast<std::uint32_t>(end);
  if (keep)
    return softmax_row(row, n, [&](std::size_t s) { return (static_cast<std::uint32_t>(s) < e) & (keep[s] != 0); });
  const auto causal = [&](std::size_t s) { return static_cast<std::uint32_t>(s) < e; };
  // A constant length for attention's usual rows: the arithmetic is the same, but GCC unrolls the
  // passes with no loop or tail code, and causal rows of 32 took 23 ns, not 35 (one AVX-512 core).
  switch (n) {
    case 32:
      return softmax_row(row, 32, causal);
    case 64:
      return softmax_row(row, 64, causal);
    case 128:
      return softmax_row(row, 128, causal);
    default:
      return softmax_row(row, n, causal);
  }
}

namespace {

XGRAD_KERNEL_INLINE void softmax_backward_row(const float* p, const float* g, float* dz, std::size_t n) {
  const float dot = sum32(n, [&](std::size_t s) { return g[s] * p[s]; });
  for (std::size_t s = 0; s < n; ++s) dz[s] = p[s] * (g[s] - dot);
}

}  // namespace

XGRAD_CLONES void softmax_row_backward(const float* p, const float* g, float* dz, std::size_t n) {
  switch (n) {  // constant lengths, as in masked_softmax_row
    case 32:
      return softmax_backward_row(p, g, dz, 32);
    case 64:
      return softmax_backward_row(p, g, dz, 64);
    case 128:
      return softmax_backward_row(p, g, dz, 128);
    default:
      return softmax_backward_row(p, g, dz, n);
  }
}

XGRAD_CLONES float online_softmax_row(float* z, std::size_t n, std::size_t kept, float* m, bool* nan,
                                      float* correction) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::uint32_t nans = 0;
  for (std::size_t s = 0; s < kept; ++s) nans += z[s] != z[s];
  if (nans) *nan = true;
  const float before = *m;
  const float mx = std::max(before, max32(kept, [&](std::size_t s) { return z[s]; }));
  *m = mx;
  *correction = before == kNegInf ? 0.f : fast::exp(before - mx);
  if (!(mx > kNegInf)) {  // nothing kept yet
    std::fill(z, z + n, 0.f);
    return 0.f;
  }
  for (std::size_t s = 0; s < kept; ++s) z[s] = z[s] - mx >= -87.f ? fast::exp(z[s] - mx) : 0.f;
  std::fill(z + kept, z + n, 0.f);
  return sum32(kept, [&](std::size_t s) { return z[s]; });
}

XGRAD_CLONES void exp_shifted_row(float* z, std::size_t n, std::size_t live, float shift) {
  for (std::size_t s = 0; s < live; ++s) z[s] = z[s] - shift >= -87.f ? fast::exp(z[s] - shift) : 0.f;
  std::fill(z + live, z + n, 0.f);
}

XGRAD_CLONES bool log_sum_exp_finite(const float* x, std::size_t n, float* max, float* log_sum) {
  // x * 0 is 0 for a finite x and NaN for NaN and +-inf
  std::uint32_t non_finite = 0;
  for (std::size_t j = 0; j < n; ++j) non_finite += !(x[j] * 0.f == 0.f);
  if (non_finite || n == 0) return false;
  const float m = max32(n, [&](std::size_t j) { return x[j]; });
  const float total = sum32(n, [&](std::size_t i) { return fast::exp(x[i] - m); });
  *max = m;
  *log_sum = std::log(total);
  return true;
}

XGRAD_CLONES void add_scaled_softmax(const float* x, std::size_t n, float m, float l, float scale, float* d) {
  for (std::size_t j = 0; j < n; ++j) d[j] += scale * fast::exp((x[j] - m) - l);
}

XGRAD_CLONES void scaled_softmax(const float* x, std::size_t n, float m, float l, float scale, float* d) {
  for (std::size_t j = 0; j < n; ++j) d[j] = scale * fast::exp((x[j] - m) - l);
}

XGRAD_CLONES void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                     float* rstd, std::size_t rows, std::size_t C, float eps) {
  const float inv_c = 1.f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * C;
    const float m = sum32(C, [&](std::size_t j) { return row[j]; }) * inv_c;
    const float var = sum32(C, [&](std::size_t j) { return (row[j] - m) * (row[j] - m); }) * inv_c;
    const float rs = 1.f / std::sqrt(var + eps);
    mean[r] = m;
    rstd[r] = rs;
    float* out = y + r * C;
    for (std::size_t j = 0; j < C; ++j) {
      const float h = (row[j] - m) * rs;
      out[j] = (gamma ? h * gamma[j] : h) + (beta ? beta[j] : 0.f);
    }
  }
}

XGRAD_CLONES void layer_norm_backward(const float* x, const float* g, const float* gamma, const float* mean,
                                      const float* rstd, float* dx, float* dgamma, float* dbeta, std::size_t rows,
                                      std::size_t C) {
  const float inv_c = 1.f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * C;
    const float* gr = g + r * C;
    const float m = mean[r], rs = rstd[r];
    if (dx) {
      auto dh = [&](std::size_t j) { return gamma ? gr[j] * gamma[j] : gr[j]; };
      const float sum_dh = sum32(C, dh);
      const float sum_dh_h = sum32(C, [&](std::size_t j) { return dh(j) * ((row[j] - m) * rs); });
      float* d = dx + r * C;
      for (std::size_t j = 0; j < C; ++j) {
        const float h = (row[j] - m) * rs;
        d[j] += rs * (dh(j) - sum_dh * inv_c - h * sum_dh_h * inv_c);
      }
    }
    if (dgamma) {
      for (std::size_t j = 0; j < C; ++j) dgamma[j] += gr[j] * ((row[j] - m) * rs);
    }
    if (dbeta) {
      for (std::size_t j = 0; j < C; ++j) dbeta[j] += gr[j];
    }
  }
}

XGRAD_CLONES void rms_norm_forward(const float* x, const float* gamma, float* y, float* rstd, std::size_t rows,
                                   std::size_t C, float eps) {
  const float inv_c = 1.f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * C;
    const float ms = sum32(C, [&](std::size_t j) { return row[j] * row[j]; }) * inv_c;
    const float rs = 1.f / std::sqrt(ms + eps);
    rstd[r] = rs;
    float* out = y + r * C;
    if (gamma) {
      for (std::size_t j = 0; j < C; ++j) out[j] = (row[j] * rs) * gamma[j];
    } else {
      for (std::size_t j = 0; j < C; ++j) out[j] = row[j] * rs;
    }
  }
}

XGRAD_CLONES void rms_norm_backward(const float* x, const float* g, const float* gamma, const float* rstd, float* dx,
                                    float* dgamma, std::size_t rows, std::size_t C) {
  const float inv_c = 1.f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * C;
    const float* gr = g + r * C;
    const float rs = rstd[r];
    if (dx) {
      auto dh = [&](std::size_t j) { return gamma ? gr[j] * gamma[j] : gr[j]; };
      const float mean_dh_h = sum32(C, [&](std::size_t j) { return dh(j) * (row[j] * rs); }) * inv_c;
      float* d = dx + r * C;
      for (std::size_t j = 0; j < C; ++j) d[j] += rs * (dh(j) - (row[j] * rs) * mean_dh_h);
    }
    if (dgamma) {
      for (std::size_t j = 0; j < C; ++j) dgamma[j] += gr[j] * (row[j] * rs);
    }
  }
}

XGRAD_CLONES void add_column_sums(const float* x, std::size_t rows, std::size_t cols, float* sums) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (std::size_t j = 0; j < cols; ++j) sums[j] += row[j];
  }
}

}  // namespace xgrad::XGRAD_KERNELS_NS
