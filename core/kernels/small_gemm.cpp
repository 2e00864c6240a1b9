// See small_gemm.hpp. Products whose rows of C fit in a few vector registers (n <= 64):
// attention's per-head products at short lengths (tiny's 32 x 32 x 16 heads), where oneDNN's
// batched primitive spent more time copying its operands than multiplying them. op(B) is copied
// once per product into k rows of 16-float vectors (zero-padded past n); then each block of R rows
// of C is R x NV vector accumulators, and each step p adds op(A)[i, p] times row p of the copy:
//   acc[r][v] += A(i0 + r, p) * Bp[p][v],   v < NV = ceil(n / 16)
// All in registers, so every multiply-add is one FMA and nothing but op(A) and the copy is read.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "xgrad/core/kernels/detail/small_gemm.hpp"

namespace xgrad::XGRAD_KERNELS_NS {

namespace {

// 16 floats; GCC lowers it to one AVX-512 register or two AVX2 ones. Passed only between inlined
// helpers of this file, so GCC's note that the ABI differs between targets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Floats16 __attribute__((vector_size(64)));
typedef float Floats8 __attribute__((vector_size(32)));
typedef float Floats4 __attribute__((vector_size(16)));
constexpr std::size_t kLanes = 16;

// One vector of row `row` of C: y times alpha plus beta times what C held (beta 0 ignores it, NaN
// included, as BLAS does); only the n - v * 16 columns that are C's are written.
template <int V>
XGRAD_KERNEL_INLINE void store(Floats16 y, float* row, std::size_t n, float alpha, float beta) {
  float* out = row + V * kLanes;
  y *= alpha;
  if ((V + 1) * kLanes <= n) {
    if (beta != 0.f) {
      Floats16 old;
      std::memcpy(&old, out, sizeof old);
      y += beta * old;
    }
    std::memcpy(out, &y, sizeof y);
    return;
  }
  float part[kLanes];
  std::memcpy(part, &y, sizeof y);
  const std::size_t left = (n - V * kLanes) % kLanes;
  for (std::size_t j = 0; j < left; ++j) out[j] = beta == 0.f ? part[j] : part[j] + beta * out[j];
}

// Rows i0 .. i0 + R - 1 of C = alpha op(A) Bp + beta C; Bp is k x NV vectors. The R x NV
// accumulators are indexed by constants (I = r NV + v, the pack expansions below) so that they
// live in registers: as loops over arrays, GCC kept those of 6 x 2 on the stack.
template <bool TA, int NV, int R, std::size_t... I, std::size_t... Rs, std::size_t... Vs>
XGRAD_KERNEL_INLINE void row_block(std::index_sequence<I...>, std::index_sequence<Rs...>, std::index_sequence<Vs...>,
                                   const float* a, std::size_t lda, const float* bp, std::size_t k, std::size_t n,
                                   std::size_t i0, float alpha, float beta, float* c, std::size_t ldc) {
  Floats16 acc[R * NV] = {};
  for (std::size_t p = 0; p < k; ++p) {
    Floats16 b[NV];
    (std::memcpy(&b[Vs], bp + (p * NV + Vs) * kLanes, sizeof(Floats16)), ...);
    const float x[R] = {(TA ? a[p * lda + i0 + Rs] : a[(i0 + Rs) * lda + p])...};
    ((acc[I] += x[I / NV] * b[I % NV]), ...);
  }
  (store<I % NV>(acc[I], c + (i0 + I / NV) * ldc, n, alpha, beta), ...);
}

template <bool TA, int NV, int R>
XGRAD_KERNEL_INLINE void row_block(const float* a, std::size_t lda, const float* bp, std::size_t k, std::size_t n,
                                   std::size_t i0, float alpha, float beta, float* c, std::size_t ldc) {
  row_block<TA, NV, R>(std::make_index_sequence<R * NV>{}, std::make_index_sequence<R>{},
                       std::make_index_sequence<NV>{}, a, lda, bp, k, n, i0, alpha, beta, c, ldc);
}

// Every row of C, in blocks of R and then one remainder block.
template <bool TA, int NV, int R>
XGRAD_KERNEL_INLINE void all_rows(const float* a, std::size_t lda, const float* bp, std::size_t m, std::size_t k,
                                  std::size_t n, float alpha, float beta, float* c, std::size_t ldc) {
  std::size_t i = 0;
  for (; i + R <= m; i += R) row_block<TA, NV, R>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
  switch (m - i) {
    case 0:
      return;
    case 1:
      return row_block<TA, NV, 1>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    case 2:
      return row_block<TA, NV, 2>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    case 3:
      return row_block<TA, NV, 3>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    case 4:
      return row_block<TA, NV, 4>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    case 5:
      return row_block<TA, NV, 5>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    case 6:
      return row_block<TA, NV, 6>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
    default:
      for (; i < m; ++i) row_block<TA, NV, 1>(a, lda, bp, k, n, i, alpha, beta, c, ldc);
  }
}

// R x NV accumulators, NV vectors of B and a broadcast: 8 x 1, 6 x 2 and 4 x 3 or 4 leave room in
// AVX-512's 32 registers and keep enough FMAs in flight to hide their latency.
template <bool TA>
XGRAD_KERNEL_INLINE void dispatch(const float* a, std::size_t lda, const float* bp, std::size_t m, std::size_t k,
                                  std::size_t n, float alpha, float beta, float* c, std::size_t ldc) {
  switch ((n + kLanes - 1) / kLanes) {
    case 1:
      return all_rows<TA, 1, 8>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
    case 2:
      return all_rows<TA, 2, 6>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
    case 3:
      return all_rows<TA, 3, 4>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
    default:
      return all_rows<TA, 4, 4>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
  }
}

// 16 x 16 floats transposed in registers: tile row j (16 floats from src + j * ld) becomes column j
// of the 16 rows written at dst + p * dst_ld. Four stages, each swapping the off-diagonal b x b
// blocks of every 2b x 2b block (b = 8, 4, 2, 1): rows r and r + b exchange X's odd column blocks
// of width b for Y's even ones.
XGRAD_KERNEL_INLINE void transpose16(const float* src, std::size_t ld, float* dst, std::size_t dst_ld) {
  Floats16 x[16];
  for (int j = 0; j < 16; ++j) std::memcpy(&x[j], src + j * ld, sizeof x[j]);
#define XGRAD_STAGE(b, ...)                                   \
  for (int r = 0; r < 16; ++r) {                              \
    if (r & b) continue;                                      \
    const Floats16 lo = x[r], hi = x[r + b];                  \
    x[r] = __builtin_shufflevector(lo, hi, XGRAD_LO_##b);     \
    x[r + b] = __builtin_shufflevector(lo, hi, XGRAD_HI_##b); \
  }
#define XGRAD_LO_8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define XGRAD_HI_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define XGRAD_LO_4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define XGRAD_HI_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define XGRAD_LO_2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define XGRAD_HI_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define XGRAD_LO_1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define XGRAD_HI_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#pragma GCC unroll 16
  XGRAD_STAGE(8)
#pragma GCC unroll 16
  XGRAD_STAGE(4)
#pragma GCC unroll 16
  XGRAD_STAGE(2)
#pragma GCC unroll 16
  XGRAD_STAGE(1)
  for (int p = 0; p < 16; ++p) std::memcpy(dst + p * dst_ld, &x[p], sizeof x[p]);
}

// op(B) as k rows of nv vectors (row stride nv * 16 floats), zeros past n.
XGRAD_KERNEL_INLINE void pack_b(bool trans_b, std::size_t n, std::size_t k, const float* b, std::size_t ldb,
                                std::size_t nv, float* bp) {
  const std::size_t width = nv * kLanes;
  if (!trans_b) {  // B is k x n: rows copied, a vector at a time
    for (std::size_t p = 0; p < k; ++p) {
      const float* src = b + p * ldb;
      float* row = bp + p * width;
      std::size_t j = 0;
      for (; j + kLanes <= n; j += kLanes) std::memcpy(row + j, src + j, kLanes * sizeof(float));
      for (; j < n; ++j) row[j] = src[j];
      for (; j < width; ++j) row[j] = 0.f;
    }
    return;
  }
  // B is n x k: 16 x 16 tiles transposed in registers, the edges element by element
  const std::size_t n16 = n / kLanes * kLanes, k16 = k / kLanes * kLanes;
  for (std::size_t j0 = 0; j0 < n16; j0 += kLanes) {
    for (std::size_t p0 = 0; p0 < k16; p0 += kLanes) transpose16(b + j0 * ldb + p0, ldb, bp + p0 * width + j0, width);
    for (std::size_t p = k16; p < k; ++p) {
      for (std::size_t j = j0; j < j0 + kLanes; ++j) bp[p * width + j] = b[j * ldb + p];
    }
  }
  for (std::size_t p = 0; p < k; ++p) {
    float* row = bp + p * width;
    for (std::size_t j = n16; j < n; ++j) row[j] = b[j * ldb + p];
    for (std::size_t j = n; j < width; ++j) row[j] = 0.f;
  }
}

// The copy of op(B). A vector of floats, read with memcpy: the AVX-512 copy of this file may not
// assume the 64-byte alignment of Floats16 for memory the baseline code allocated.
thread_local std::vector<float> packed;

// C[r, j0 + j] = alpha sum(acc[r NB + j]) + beta C[r, j0 + j]: each accumulator's 16 lanes summed
// as a tree of halves (a chain of 16 scalar additions took longer than the block's multiply-adds at
// K 384).
template <int M, int NB>
XGRAD_KERNEL_INLINE void store_sums(const Floats16* acc, std::size_t j0, float alpha, float beta, float* c,
                                    std::size_t ldc) {
  float sums[M * NB];
  for (std::size_t i = 0; i < M * NB; ++i) {
    const Floats8 h = __builtin_shufflevector(acc[i], acc[i], 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(acc[i], acc[i], 8, 9, 10, 11, 12, 13, 14, 15);
    const Floats4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
    sums[i] = (q[0] + q[2]) + (q[1] + q[3]);
  }
  for (std::size_t i = 0; i < M * NB; ++i) {
    float& out = c[(i / NB) * ldc + j0 + i % NB];
    out = beta == 0.f ? alpha * sums[i] : alpha * sums[i] + beta * out;
  }
}

// Columns j0 .. j0 + NB - 1 of C's M rows: C[r, j] = alpha dot(A row r, B row j) + beta C[r, j].
// The M x NB accumulators are indexed by constants (I = r NB + j) so that they stay in registers.
template <int M, int NB, std::size_t... I, std::size_t... Rs, std::size_t... Js>
XGRAD_KERNEL_INLINE void few_rows_block(std::index_sequence<I...>, std::index_sequence<Rs...>,
                                        std::index_sequence<Js...>, const float* a, std::size_t lda, const float* b,
                                        std::size_t ldb, std::size_t k, std::size_t j0, float alpha, float beta,
                                        float* c, std::size_t ldc) {
  Floats16 acc[M * NB] = {};
  std::size_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    // The same cache line of the next block's rows, fetched while this block computes: the head's
    // 1 x 50257 x 384 went from 74% of the read bandwidth measured in the same run to 86-94%
    // (bench_gemm --matvec-only). Fetching two blocks ahead non-temporally read the head alone at
    // 101-105%, but decoding the llama.cpp comparison's model after its 128-token prompt ran 0.91x
    // as fast (240 and 263 against 220 and 238 tokens/s; it keeps less of the blocks' weights in
    // cache between tokens), so fp32 keeps this.
    (__builtin_prefetch(b + (j0 + NB + Js) * ldb + p), ...);
    Floats16 x[M], w[NB];
    (std::memcpy(&x[Rs], a + Rs * lda + p, sizeof(Floats16)), ...);
    (std::memcpy(&w[Js], b + (j0 + Js) * ldb + p, sizeof(Floats16)), ...);
    ((acc[I] += x[I / NB] * w[I % NB]), ...);
  }
  if (p < k) {  // the last k - p < 16 columns, zero-padded
    float xs[M][kLanes] = {}, ws[NB][kLanes] = {};
    for (std::size_t q = p; q < k; ++q) {
      ((xs[Rs][q - p] = a[Rs * lda + q]), ...);
      ((ws[Js][q - p] = b[(j0 + Js) * ldb + q]), ...);
    }
    Floats16 x[M], w[NB];
    (std::memcpy(&x[Rs], xs[Rs], sizeof(Floats16)), ...);
    (std::memcpy(&w[Js], ws[Js], sizeof(Floats16)), ...);
    ((acc[I] += x[I / NB] * w[I % NB]), ...);
  }
  store_sums<M, NB>(acc, j0, alpha, beta, c, ldc);
}

template <int M>
XGRAD_KERNEL_INLINE void few_rows(std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                                  const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  std::size_t j = 0;
  if constexpr (M == 1) {
    // One row (a decoding step) takes eight rows of B at a time, fetching the next eight: a
    // decoding step's cold products of SmolLM2-135M's shape read 32.5-33.9 GB/s against 31.6-32.1
    // with four (three alternating pairs; the 45M comparison model, whose blocks' weights partly
    // stay in cache, 35.8-38.2 against 33.1-42.2).
    for (; j + 8 <= n; j += 8) {
      few_rows_block<M, 8>(std::make_index_sequence<8>{}, std::make_index_sequence<1>{}, std::make_index_sequence<8>{},
                           a, lda, b, ldb, k, j, alpha, beta, c, ldc);
    }
  }
  for (; j + 4 <= n; j += 4) {
    few_rows_block<M, 4>(std::make_index_sequence<M * 4>{}, std::make_index_sequence<M>{},
                         std::make_index_sequence<4>{}, a, lda, b, ldb, k, j, alpha, beta, c, ldc);
  }
  for (; j < n; ++j) {
    few_rows_block<M, 1>(std::make_index_sequence<M>{}, std::make_index_sequence<M>{}, std::make_index_sequence<1>{}, a,
                         lda, b, ldb, k, j, alpha, beta, c, ldc);
  }
}

// bf16 B, 32 elements of K per step. A 64-byte load of a row of B, as 16 words, holds the step's
// elements 2l (low half) and 2l + 1 (high half) in word l; a shift and a mask widen them to float32
// exactly, with no shuffle (a widening load per 16 elements ran at 78-85% of the read bandwidth,
// and at the fp32 kernel's element rate in cache). A comes with each step's even elements before
// its odd ones (pair_order), so lane l sums a(2l) b(2l) + a(2l + 1) b(2l + 1).
typedef std::uint32_t Words16 __attribute__((vector_size(64)));
constexpr std::size_t kPairStep = 2 * kLanes;

XGRAD_KERNEL_INLINE Floats16 bits_as_floats(Words16 w) {
  Floats16 f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

XGRAD_KERNEL_INLINE Floats16 load16(const float* p) {
  Floats16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// One step: the NB rows' words w against A's M rows at p.
template <int M, int NB, std::size_t... I, std::size_t... Rs>
XGRAD_KERNEL_INLINE void pair_step(std::index_sequence<I...>, std::index_sequence<Rs...>, Floats16* acc,
                                   const float* ap, std::size_t ldap, std::size_t p, const Words16* w) {
  Floats16 even[M], odd[M];
  ((even[Rs] = load16(ap + Rs * ldap + p)), ...);
  ((odd[Rs] = load16(ap + Rs * ldap + p + kLanes)), ...);
  ((acc[I] += even[I / NB] * bits_as_floats(w[I % NB] << 16)), ...);
  ((acc[I] += odd[I / NB] * bits_as_floats(w[I % NB] & 0xffff0000u)), ...);
}

template <int M, int NB, std::size_t... Js>
XGRAD_KERNEL_INLINE void few_rows_block_bf16(std::index_sequence<Js...>, const float* ap, std::size_t ldap,
                                             const std::uint16_t* b, std::size_t ldb, std::size_t k, std::size_t j0,
                                             float alpha, float beta, float* c, std::size_t ldc) {
  constexpr std::size_t ahead = NB >= 8 ? NB : 2 * NB;  // rows
  Floats16 acc[M * NB] = {};
  std::size_t p = 0;
  for (; p + kPairStep <= k; p += kPairStep) {
    // Rows `ahead` further on, non-temporally: the bf16 head read at 80-87% of the read bandwidth
    // against 72-78% fetching the next block's rows of four as the fp32 kernel does, and decoding
    // the llama.cpp comparison's model after its 128-token prompt ran 1.12-1.14x as fast (390 and
    // 385 against 349 and 337 tokens/s, alternating in one process, medians of 7).
    (__builtin_prefetch(b + (j0 + ahead + Js) * ldb + p, 0, 0), ...);
    Words16 w[NB];
    (std::memcpy(&w[Js], b + (j0 + Js) * ldb + p, sizeof(Words16)), ...);
    pair_step<M, NB>(std::make_index_sequence<M * NB>{}, std::make_index_sequence<M>{}, acc, ap, ldap, p, w);
  }
  if (p < k) {  // the last k - p < 32 elements, zero-padded (A's copy is padded already)
    std::uint16_t ws[NB][kPairStep] = {};
    for (std::size_t q = p; q < k; ++q) ((ws[Js][q - p] = b[(j0 + Js) * ldb + q]), ...);
    Words16 w[NB];
    (std::memcpy(&w[Js], ws[Js], sizeof(Words16)), ...);
    pair_step<M, NB>(std::make_index_sequence<M * NB>{}, std::make_index_sequence<M>{}, acc, ap, ldap, p, w);
  }
  store_sums<M, NB>(acc, j0, alpha, beta, c, ldc);
}

template <int M>
XGRAD_KERNEL_INLINE void few_rows_bf16(std::size_t n, std::size_t k, float alpha, const float* ap, std::size_t ldap,
                                       const std::uint16_t* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  std::size_t j = 0;
  if constexpr (M == 1) {
    // One row (a decoding step) takes twelve rows of B at a time, fetching the next twelve, where
    // it had taken eight fetching sixteen ahead. A decoding step's products, every weight once and
    // cold (five steps in a row, the last four timed, medians; time relative to a copy of the
    // eight-row kernel in the same process, four processes each, alternating): SmolLM2-135M's shape
    // 0.93-0.97 against 1.03-1.04 (21.4-22.3 GB/s against 20.2-20.9), the llama.cpp comparison's
    // model 0.78-0.93 against 1.01-1.06 (27.4-31.9 against 23.1-23.9; its blocks' weights partly
    // stay in cache). Whole bf16 decodes (bench_generate --bf16, three and four pairs): SmolLM2's
    // shape 85.1, 86.8, 84.5 tokens/s against 71.1, 79.9, 80.5; the 45M model 1.70x to 1.98x fp32
    // against 1.76x to 1.85x. Four rows had streamed SmolLM2's shape at 20.9 GB/s where eight read
    // 23.5 (fp32's kernel: 28-31).
    for (; j + 12 <= n; j += 12) {
      few_rows_block_bf16<M, 12>(std::make_index_sequence<12>{}, ap, ldap, b, ldb, k, j, alpha, beta, c, ldc);
    }
  }
  for (; j + 4 <= n; j += 4) {
    few_rows_block_bf16<M, 4>(std::make_index_sequence<4>{}, ap, ldap, b, ldb, k, j, alpha, beta, c, ldc);
  }
  for (; j < n; ++j) {
    few_rows_block_bf16<M, 1>(std::make_index_sequence<1>{}, ap, ldap, b, ldb, k, j, alpha, beta, c, ldc);
  }
}

// A's rows in few_rows_block_bf16's order, zero-padded to whole steps: within each step of 32,
// elements 0, 2, .., 30, then 1, 3, .., 31.
thread_local std::vector<float> pair_order;

}  // namespace

XGRAD_CLONES void few_rows_gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                                std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                                std::size_t ldc) {
  switch (m) {
    case 1:
      return few_rows<1>(n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case 2:
      return few_rows<2>(n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case 3:
      return few_rows<3>(n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case 4:
      return few_rows<4>(n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    default:
      return;
  }
}

XGRAD_CLONES void few_rows_gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                                std::size_t lda, const std::uint16_t* b, std::size_t ldb, float beta, float* c,
                                std::size_t ldc) {
  if (m == 0 || m > kFewRowsMaxM) return;
  const std::size_t ldap = (k + kPairStep - 1) / kPairStep * kPairStep;
  if (pair_order.size() < m * ldap) pair_order.resize(m * ldap);
  float* ap = pair_order.data();
  for (std::size_t r = 0; r < m; ++r) {
    const float* from = a + r * lda;
    float* to = ap + r * ldap;
    std::size_t p = 0;
    for (; p + kPairStep <= k; p += kPairStep) {  // whole steps, without a division per element
      for (std::size_t l = 0; l < kLanes; ++l) {
        to[p + l] = from[p + 2 * l];
        to[p + kLanes + l] = from[p + 2 * l + 1];
      }
    }
    for (std::size_t l = 0; p + l < ldap; ++l) {  // the last step, zero-padded
      const std::size_t q = p + (l < kLanes ? 2 * l : 2 * (l - kLanes) + 1);
      to[p + l] = q < k ? from[q] : 0.f;
    }
  }
  switch (m) {
    case 1:
      return few_rows_bf16<1>(n, k, alpha, ap, ldap, b, ldb, beta, c, ldc);
    case 2:
      return few_rows_bf16<2>(n, k, alpha, ap, ldap, b, ldb, beta, c, ldc);
    case 3:
      return few_rows_bf16<3>(n, k, alpha, ap, ldap, b, ldb, beta, c, ldc);
    default:
      return few_rows_bf16<4>(n, k, alpha, ap, ldap, b, ldb, beta, c, ldc);
  }
}

XGRAD_CLONES void small_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                             const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                             std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const std::size_t nv = (n + kLanes - 1) / kLanes;
  if (packed.size() < k * nv * kLanes) packed.resize(k * nv * kLanes);
  float* bp = packed.data();
  pack_b(trans_b, n, k, b, ldb, nv, bp);
  if (trans_a) return dispatch<true>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
  dispatch<false>(a, lda, bp, m, k, n, alpha, beta, c, ldc);
}

#undef XGRAD_INLINE
#undef XGRAD_STAGE
#undef XGRAD_LO_8
#undef XGRAD_HI_8
#undef XGRAD_LO_4
#undef XGRAD_HI_4
#undef XGRAD_LO_2
#undef XGRAD_HI_2
#undef XGRAD_LO_1
#undef XGRAD_HI_1

}  // namespace xgrad::XGRAD_KERNELS_NS
