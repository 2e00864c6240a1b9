// blas::sgemm: picks the engine for each product and splits large products across xgrad's kernel
// threads. The engines themselves live in gemm_openblas.cpp and gemm_onednn.cpp.
#include "xgrad/core/kernels/blas.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/detail/small_gemm.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad::blas {

namespace {

#ifdef XGRAD_HAS_ONEDNN
constexpr bool kHaveOnednn = true;
#else
constexpr bool kHaveOnednn = false;
#endif

// Products of fewer multiply-adds than this go to OpenBLAS under `automatic`. Measured on one
// core with bench_gemm (bench/gemm.cpp), every shape of the benchmarks' steps: oneDNN is 1.6x to
// 2.1x OpenBLAS's rate from 32 x 32 x 32 up, equal around 32 x 32 x 16 (16K multiply-adds) and
// about half of it at 16 x 16 x 16, where its per-call overhead dominates.
constexpr std::size_t kOnednnMinWork = std::size_t{1} << 14;

constexpr int kUnset = -1;
std::atomic<int> chosen{kUnset};
std::atomic<std::size_t> choice_reads{0};

void check_built(Engine e, const char* who) {
  if (e == Engine::onednn && !kHaveOnednn)
    fail(who, ": this xgrad was built without oneDNN (install libdnnl-dev and reconfigure); use openblas or auto");
}

Engine from_environment() {
  const char* text = std::getenv("XGRAD_GEMM");
  if (!text || !*text) return Engine::automatic;
  Engine e;
  try {
    e = parse_engine(text);
  } catch (const Error&) {
    fail("XGRAD_GEMM: '", text, "' is not an engine (openblas, onednn or auto)");
  }
  check_built(e, "XGRAD_GEMM=onednn");
  return e;
}

void run_engine(Engine e, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                std::size_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // C = beta C, as BLAS defines it (beta 0 sets C to 0 whatever it held); oneDNN refuses K = 0.
    for (std::size_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (std::size_t j = 0; j < n; ++j) row[j] = beta == 0.f ? 0.f : beta * row[j];
    }
    return;
  }
#ifdef XGRAD_HAS_ONEDNN
  if (e == Engine::onednn) return detail::onednn_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)e;
#endif
  detail::openblas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Under `automatic`, plain products (op(A) = A, either op(B)) at least 1024 rows tall with C at most
// 256 wide and K at most 1024 go to xgrad's small-product kernel (kernels/small_gemm.cpp), in
// column blocks of 64: the linear layers of the narrow models, forward (X W^T) and the input
// gradient (dY W). One core, warm, best of 8 (GFLOP/s, oneDNN's sgemm against the kernel):
// 2048 x 64 x 64 NT 190 -> 212, 2048 x 256 x 64 NT 172 -> 187, 2048 x 64 x 256 NN 184 -> 210,
// 2048 x 256 x 1024 NN 178 -> 194; C 1024 wide lost (2048 x 1024 x 256 198 -> 192) and 512 wide
// tied. The A^T products (weight gradients) stay with oneDNN: 2048 x 64 x 256 TN lost (166 -> 134).
// The rule reads the whole product, so how sgemm splits its rows across threads never changes it.
constexpr std::size_t kPlainMinRows = 1024, kPlainMaxN = 4 * kernels::kSmallGemmMaxN, kPlainMaxK = 1024;
std::atomic<std::size_t> small_plain_calls{0};

// Under `automatic`, products A B^T with at most kFewRowsMaxM rows of A (a Linear layer on one to
// four positions: a decoding step's every product, the head's included) go to the few-rows kernel
// (kernels/small_gemm.cpp), which reads each row of B once. One core, the 45M-parameter Llama's
// head (1 x 50257 x 384), bench_gemm --matvec-only: oneDNN's sgemm read its weight at 17 to 18
// GB/s, the kernel at 22 to 24, 86-92% of the read bandwidth measured in the same run; its
// projections (in cache) 1.1x to 1.3x oneDNN's. Split by columns across threads, as sgemm splits
// wide C, but by the weight's elements rather than by multiply-adds: the kernel is bound by reading
// B, so each range holds at least kGrainStream of them (256 KB in fp32). Splitting by multiply-adds
// (kGrainGemm) had left every projection of a decoding step on one thread and only the head split:
// the comparison model at two threads (bench_generate --bf16 --threads 2, four alternating pairs)
// decoded at 577, 421, 446, 530 tokens/s in fp32 that way and 669, 544, 660, 549 split by the
// weight; in bf16 757, 709, 699, 722 against 831, 789, 827, 810.
constexpr std::size_t kGrainStream = std::size_t{1} << 16;
std::atomic<std::size_t> few_rows_calls{0};

template <class BT>
void few_rows_split(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                    const BT* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  few_rows_calls.fetch_add(1, std::memory_order_relaxed);
  const std::size_t weight = n * std::max<std::size_t>(k, 1);
  if (weight < 2 * kGrainStream) return kernels::few_rows_gemm(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  parallel_for(n, grain_for(kGrainStream, std::max<std::size_t>(k, 1)), [=](std::size_t lo, std::size_t hi) {
    kernels::few_rows_gemm(m, hi - lo, k, alpha, a, lda, b + lo * ldb, ldb, beta, c + lo, ldc);
  });
}

// The small-product kernel over C's columns in blocks it takes, on the calling thread.
void small_gemm_columns(bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                        std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  if (m == 0) return;
  small_plain_calls.fetch_add(1, std::memory_order_relaxed);
  for (std::size_t j = 0; j < n; j += kernels::kSmallGemmMaxN) {
    const std::size_t width = std::min(kernels::kSmallGemmMaxN, n - j);
    // columns j..j+width of op(B): B is k x n stored (trans: n x k)
    const float* b_part = trans_b ? b + j * ldb : b + j;
    kernels::small_gemm(false, trans_b, m, width, k, alpha, a, lda, b_part, ldb, beta, c + j, ldc);
  }
}

}  // namespace

void set_engine(Engine engine) {
  check_built(engine, "blas::set_engine(onednn)");
  chosen.store(static_cast<int>(engine));
}

Engine engine() {
  choice_reads.fetch_add(1, std::memory_order_relaxed);
  int e = chosen.load();
  if (e == kUnset) {
    // The environment is read on first use; a concurrent set_engine wins.
    int expected = kUnset;
    chosen.compare_exchange_strong(expected, static_cast<int>(from_environment()));
    e = chosen.load();
  }
  return static_cast<Engine>(e);
}

bool small_kernel_takes_plain(bool trans_a, std::size_t m, std::size_t n, std::size_t k) {
  return engine() == Engine::automatic && !trans_a && m >= kPlainMinRows && n <= kPlainMaxN && k > 0 && k <= kPlainMaxK;
}

bool has_engine(Engine engine) { return engine != Engine::onednn || kHaveOnednn; }

Engine engine_for(std::size_t m, std::size_t n, std::size_t k) {
  const Engine e = engine();
  if (e != Engine::automatic) return e;
  if (!kHaveOnednn) return Engine::openblas;
  return m * n * std::max<std::size_t>(k, 1) >= kOnednnMinWork ? Engine::onednn : Engine::openblas;
}

std::string engine_name(Engine engine) {
  switch (engine) {
    case Engine::automatic:
      return "auto";
    case Engine::openblas:
      return "openblas";
    case Engine::onednn:
      return "onednn";
  }
  return "?";
}

Engine parse_engine(const std::string& name) {
  if (name == "auto") return Engine::automatic;
  if (name == "openblas") return Engine::openblas;
  if (name == "onednn") return Engine::onednn;
  fail("blas::parse_engine: '", name, "' is not an engine (openblas, onednn or auto)");
}

namespace {

// y (rows x out) += bias in every row.
void add_bias_rows(std::size_t rows, std::size_t out, const float* bias, float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = y + r * out;
    for (std::size_t j = 0; j < out; ++j) row[j] += bias[j];
  }
}

// Rows lo..hi of Y = X W^T + bias on the calling thread.
void linear_rows(Engine e, std::size_t lo, std::size_t hi, std::size_t out, std::size_t in, const float* x,
                 const float* w, const float* bias, float* y) {
  const std::size_t rows = hi - lo;
  x += lo * in;
  y += lo * out;
  // The product first, then the bias added while the rows are in cache (copying the bias rows
  // first, one memmove per row, measured the same).
  run_engine(e, false, true, rows, out, in, 1.f, x, in, w, in, 0.f, y, out);
  add_bias_rows(rows, out, bias, y);
}

// act over n elements of y in place, with the kernels the activation ops use.
void apply_epilogue(Epilogue act, float* y, std::size_t n) {
  switch (act) {
    case Epilogue::none:
      return;
    case Epilogue::relu:
      for (std::size_t i = 0; i < n; ++i) y[i] = y[i] > 0.f ? y[i] : 0.f;
      return;
    case Epilogue::gelu:
      return kernels::gelu_forward(y, y, n);
    case Epilogue::gelu_tanh:
      return kernels::gelu_tanh_forward(y, y, n);
  }
}

// Rows lo..hi of Y = act(X W^T + bias) on the calling thread; `small` sends the product to the
// small-product kernel (small_kernel_takes_plain, read on the whole product).
void linear_activation_rows(Engine e, bool small, std::size_t lo, std::size_t hi, std::size_t out, std::size_t in,
                            const float* x, const float* w, const float* bias, float* y, Epilogue act) {
  if (small) {
    small_gemm_columns(true, hi - lo, out, in, 1.f, x + lo * in, in, w, in, 0.f, y + lo * out, out);
    if (bias) add_bias_rows(hi - lo, out, bias, y + lo * out);
    return apply_epilogue(act, y + lo * out, (hi - lo) * out);
  }
#ifdef XGRAD_HAS_ONEDNN
  if (e == Engine::onednn && in > 0 && detail::onednn_linear(hi - lo, out, in, x + lo * in, w, bias, y + lo * out, act))
    return;
#endif
  if (bias) {
    linear_rows(e, lo, hi, out, in, x, w, bias, y);
  } else {
    run_engine(e, false, true, hi - lo, out, in, 1.f, x + lo * in, in, w, in, 0.f, y + lo * out, out);
  }
  apply_epilogue(act, y + lo * out, (hi - lo) * out);
}

}  // namespace

void linear_activation(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w,
                       const float* bias, float* y, Epilogue act) {
  if (rows == 0 || out == 0) return;
  if (detail::few_rows_take(false, true, rows)) {
    detail::few_rows_columns(rows, out, in, 1.f, x, in, w, in, 0.f, y, out);
    if (bias) add_bias_rows(rows, out, bias, y);
    return apply_epilogue(act, y, rows * out);
  }
  const Engine e = engine_for(rows, out, in);
  const bool small = small_kernel_takes_plain(false, rows, out, in);
  const std::size_t work = rows * out * std::max<std::size_t>(in, 1);
  if (work < 2 * kGrainGemm) return linear_activation_rows(e, small, 0, rows, out, in, x, w, bias, y, act);
  parallel_for(rows, grain_for(kGrainGemm, work / rows), [=](std::size_t lo, std::size_t hi) {
    linear_activation_rows(e, small, lo, hi, out, in, x, w, bias, y, act);
  });
}

void linear(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w, const float* bias,
            float* y) {
  if (!bias) return sgemm(false, true, rows, out, in, 1.f, x, in, w, in, 0.f, y, out);
  if (detail::few_rows_take(false, true, rows)) {
    detail::few_rows_columns(rows, out, in, 1.f, x, in, w, in, 0.f, y, out);
    return add_bias_rows(rows, out, bias, y);
  }
  if (small_kernel_takes_plain(false, rows, out, in))
    return linear_activation(rows, out, in, x, w, bias, y, Epilogue::none);
  const Engine e = engine_for(rows, out, in);
  const std::size_t work = rows * out * std::max<std::size_t>(in, 1);
  if (work < 2 * kGrainGemm) return linear_rows(e, 0, rows, out, in, x, w, bias, y);
  parallel_for(rows, grain_for(kGrainGemm, work / rows),
               [=](std::size_t lo, std::size_t hi) { linear_rows(e, lo, hi, out, in, x, w, bias, y); });
}

namespace {

// oneDNN's A^T B runs at about 160 GFLOP/s when C is at least twice as tall as wide and about 195
// on the transposed product B^T A. Measured on one core, direct against transposed including the
// transpose: 1024 x 256 x 2048 158 -> 190, 2048 x 512 x 1024 161 -> 188, 256 x 64 x 2048
// 165 -> 203, but 2048 x 1024 x 2048 lost 2%, so C is swapped only up to 2^20 elements
// (bench_gemm's TN rows show the result). These are the weight gradients of layers that widen
// their input (the FFN's first Linear: dW = dY^T X).
constexpr std::size_t kSwapMaxElements = std::size_t{1} << 20;

bool swap_tall_tn(Engine e, bool trans_a, bool trans_b, std::size_t m, std::size_t n) {
  return e == Engine::onednn && trans_a && !trans_b && m >= 2 * n && m * n <= kSwapMaxElements;
}

// C (m x n, row stride ldc) = beta C + T^T, T (n x m) contiguous, in 16 x 16 tiles.
void add_transposed(std::size_t m, std::size_t n, const float* t, float beta, float* c, std::size_t ldc) {
  constexpr std::size_t kTile = 16;
  parallel_for((m + kTile - 1) / kTile, grain_for(kGrainCheap, kTile * n), [=](std::size_t lo, std::size_t hi) {
    for (std::size_t i0 = lo * kTile; i0 < std::min(m, hi * kTile); i0 += kTile) {
      const std::size_t i1 = std::min(m, i0 + kTile);
      for (std::size_t j0 = 0; j0 < n; j0 += kTile) {
        const std::size_t j1 = std::min(n, j0 + kTile);
        for (std::size_t i = i0; i < i1; ++i) {
          float* row = c + i * ldc;
          // beta 0 ignores what C held, NaN included, as BLAS does
          if (beta == 0.f) {
            for (std::size_t j = j0; j < j1; ++j) row[j] = t[j * m + i];
          } else {
            for (std::size_t j = j0; j < j1; ++j) row[j] = beta * row[j] + t[j * m + i];
          }
        }
      }
    }
  });
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
           std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  if (k > 0 && swap_tall_tn(engine_for(m, n, k), trans_a, trans_b, m, n)) {
    // C^T = alpha B^T A, computed (n x m, now wide: no second swap) and added transposed
    const std::unique_ptr<float[]> t(new float[m * n]);  // beta 0 below: no need to zero it
    sgemm(true, false, n, m, k, alpha, b, ldb, a, lda, 0.f, t.get(), m);
    return add_transposed(m, n, t.get(), beta, c, ldc);
  }
  // Large products are split here across the kernel threads, by rows of C when it is tall and by
  // columns when it is wide; each piece runs over the full K, with the engine chosen for the
  // whole product. Below 2 * kGrainGemm multiply-adds waking a second thread costs more than it
  // saves. An engine may round some elements of a piece differently from the whole product (by an
  // ulp), so results agree across thread counts to rounding, not to the bit.
  if (detail::few_rows_take(trans_a, trans_b, m))
    return detail::few_rows_columns(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const std::size_t work = m * n * std::max<std::size_t>(k, 1);
  if (small_kernel_takes_plain(trans_a, m, n, k)) {
    // m >= 1024 >= 4 n: split by rows
    if (work < 2 * kGrainGemm) return small_gemm_columns(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return parallel_for(m, grain_for(kGrainGemm, work / m), [=](std::size_t lo, std::size_t hi) {
      small_gemm_columns(trans_b, hi - lo, n, k, alpha, a + lo * lda, lda, b, ldb, beta, c + lo * ldc, ldc);
    });
  }
  const Engine e = engine_for(m, n, k);
  if (work < 2 * kGrainGemm) return run_engine(e, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (m >= n) {
    const std::size_t grain = grain_for(kGrainGemm, work / m);
    parallel_for(m, grain, [=](std::size_t lo, std::size_t hi) {
      // rows lo..hi of op(A): A is m x k stored (trans: k x m)
      const float* a_part = trans_a ? a + lo : a + lo * lda;
      run_engine(e, trans_a, trans_b, hi - lo, n, k, alpha, a_part, lda, b, ldb, beta, c + lo * ldc, ldc);
    });
  } else {
    const std::size_t grain = grain_for(kGrainGemm, work / n);
    parallel_for(n, grain, [=](std::size_t lo, std::size_t hi) {
      // columns lo..hi of op(B): B is k x n stored (trans: n x k)
      const float* b_part = trans_b ? b + lo * ldb : b + lo;
      run_engine(e, trans_a, trans_b, m, hi - lo, k, alpha, a, lda, b_part, ldb, beta, c + lo, ldc);
    });
  }
}

namespace {

// Batched products go to oneDNN's matmul primitive, one call per range of b, when each product
// is 2^12 to 2^21 multiply-adds. The rule reads the product alone, not how many there are, so
// how a caller splits its batch (by thread count) never changes which engine computes a product.
// bench_gemm's second table (one core, attention's products of each benchmark configuration, one
// call against the loop of sgemm it replaced): 1.7x to 2.7x on tiny's 32 x 32 x 16 heads, 1.1x
// to 1.6x on small's and standard's. Measured apart: long's 1024 x 1024 x 64 heads ran at 175
// GFLOP/s in one call against 196 in the loop; 64 x 4 products of 16^3 at 74 against 23, and of
// 8^3 at 15 against 6, but 2 of 8^3 at 0.2 against 3.3 (a call costs a few microseconds).
constexpr std::size_t kBatchedMinWork = std::size_t{1} << 12;

std::atomic<std::size_t> primitive_calls{0};
constexpr std::size_t kBatchedMaxWork = std::size_t{1} << 21;
std::atomic<std::size_t> small_kernel_calls{0};

// Under `automatic`, batched products with C at most 64 wide (and at most 2^21 multiply-adds, where
// the primitive's range ends) go to xgrad's own kernel (kernels/small_gemm.cpp), whatever the
// forms. Measured on a tiny training step (bench_train_step --config tiny, one thread pinned,
// five alternating rounds, medians): 13.46 ms/step with oneDNN's primitive, 13.00 with the kernel
// on the plain products (P v, dZ k) alone, 13.07 on the A^T ones (P^T dO, dZ^T q) alone, 12.69 on
// both, 12.59 with the B^T ones (q k^T, dO v^T) too; standard (its scores are 128 wide, so the
// kernel takes the others) 268.6 -> 261.7 ms, small 266.6 -> 265.5. In isolation, warm, oneDNN's primitive keeps an
// edge on tiny's scores (143 against 117-128 GFLOP/s); in the step its operand copies run from colder caches.
bool small_kernel_takes(std::size_t m, std::size_t n, std::size_t k) {
  return engine() == Engine::automatic && n <= kernels::kSmallGemmMaxN && m * n * k <= kBatchedMaxWork;
}

template <class T>
Strided<T> from_batch(Strided<T> s, std::size_t b) {
  s.data += b * s.batch_stride;
  return s;
}

}  // namespace

namespace {

// The batch as ranges of b split across the kernel threads: each range one call of `batched`
// (oneDNN's primitive) when `primitive` and it takes the call, else a loop of `single` over its
// products.
template <class T, class Batched, class Single>
void run_batched(std::size_t batches, std::size_t heads, std::size_t m, std::size_t n, std::size_t k, bool primitive,
                 Strided<const T> a, Strided<const T> b, Strided<float> c, Batched batched, Single single) {
  if (batches == 0 || heads == 0 || m == 0 || n == 0) return;
  const std::size_t per_product = m * n * std::max<std::size_t>(k, 1), work = per_product * heads * batches;
  primitive = primitive && k > 0 && per_product >= kBatchedMinWork && per_product <= kBatchedMaxWork;
  auto range = [=](std::size_t lo, std::size_t hi) {
    if (primitive && batched(hi - lo, from_batch(a, lo), from_batch(b, lo), from_batch(c, lo))) {
      primitive_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    for (std::size_t i = lo; i < hi; ++i) {
      for (std::size_t h = 0; h < heads; ++h) {
        single(a.data + i * a.batch_stride + h * a.head_stride, b.data + i * b.batch_stride + h * b.head_stride,
               c.data + i * c.batch_stride + h * c.head_stride);
      }
    }
  };
  if (work < 2 * kGrainGemm) return range(0, batches);
  parallel_for(batches, grain_for(kGrainGemm, per_product * heads), range);
}

}  // namespace

void sgemm_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m, std::size_t n,
                   std::size_t k, float alpha, Strided<const float> a, Strided<const float> b, float beta,
                   Strided<float> c) {
  if (small_kernel_takes(m, n, k)) {
    return run_batched(
        batches, heads, m, n, k, false, a, b, c, [](std::size_t, auto, auto, auto) { return false; },
        [=](const float* pa, const float* pb, float* pc) {
      small_kernel_calls.fetch_add(1, std::memory_order_relaxed);
      kernels::small_gemm(trans_a, trans_b, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld);
        });
  }
  const bool primitive = kHaveOnednn && engine() != Engine::openblas;
  run_batched(
      batches, heads, m, n, k, primitive, a, b, c,
      [=](std::size_t count, Strided<const float> ra, Strided<const float> rb, Strided<float> rc) {
#ifdef XGRAD_HAS_ONEDNN
    return detail::onednn_sgemm_batched(trans_a, trans_b, count, heads, m, n, k, alpha, ra, rb, beta, rc);
#else
    (void)count, (void)ra, (void)rb, (void)rc;
    return false;
#endif
      },
      // sgemm, not the engine directly: it applies the tall A^T B swap (inside a range it runs on
      // the calling thread)
      [=](const float* pa, const float* pb, float* pc) {
    sgemm(trans_a, trans_b, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld);
  });
}

void gemm_batched(Precision precision, bool trans_a, bool trans_b, std::size_t batches, std::size_t heads,
                  std::size_t m, std::size_t n, std::size_t k, float alpha, const BatchedOperand& a,
                  const BatchedOperand& b, float beta, Strided<float> c) {
  detail::check_operands("blas::gemm_batched", precision, batches * heads * m * n * k, a.first, b.first);
  if (precision == Precision::fp32) {
    return sgemm_batched(trans_a, trans_b, batches, heads, m, n, k, alpha,
                         {a.first.f, a.ld, a.batch_stride, a.head_stride},
                         {b.first.f, b.ld, b.batch_stride, b.head_stride}, beta, c);
  }
  if (!a.first.h || !b.first.h) {  // an operand rounded on the fly: gemm per product
    for (std::size_t i = 0; i < batches; ++i) {
      for (std::size_t h = 0; h < heads; ++h) {
        gemm(precision, trans_a, trans_b, m, n, k, alpha, a.at(i, h), a.ld, b.at(i, h), b.ld, beta,
             c.data + i * c.batch_stride + h * c.head_stride, c.ld);
      }
    }
    return;
  }
  const Strided<const std::uint16_t> ah{a.first.h, a.ld, a.batch_stride, a.head_stride},
      bh{b.first.h, b.ld, b.batch_stride, b.head_stride};
  const bool primitive = bf16_path() == Bf16Path::hardware;  // else emulated: gemm says so once
  run_batched(
      batches, heads, m, n, k, primitive, ah, bh, c,
      [=](std::size_t count, Strided<const std::uint16_t> ra, Strided<const std::uint16_t> rb, Strided<float> rc) {
#ifdef XGRAD_HAS_ONEDNN
    return detail::onednn_gemm_bf16_batched(trans_a, trans_b, count, heads, m, n, k, alpha, ra, rb, beta, rc);
#else
    (void)count, (void)ra, (void)rb, (void)rc;
    return false;
#endif
      },
      [=](const std::uint16_t* pa, const std::uint16_t* pb, float* pc) {
    gemm(Precision::bf16, trans_a, trans_b, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld);
  });
}

namespace detail {
std::size_t onednn_batched_calls() { return primitive_calls.load(); }
std::size_t small_kernel_products() { return small_kernel_calls.load(); }
std::size_t small_kernel_plain_calls() { return small_plain_calls.load(); }
std::size_t few_rows_products() { return few_rows_calls.load(); }
bool few_rows_take(bool trans_a, bool trans_b, std::size_t m) {
  return engine() == Engine::automatic && !trans_a && trans_b && m > 0 && m <= kernels::kFewRowsMaxM;
}
void few_rows_columns(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  few_rows_split(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void few_rows_columns(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const std::uint16_t* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  few_rows_split(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
std::size_t engine_choice_reads() { return choice_reads.load(); }
}  // namespace detail

}  // namespace xgrad::blas
