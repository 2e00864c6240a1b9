// Thin wrappers over OpenBLAS's CBLAS interface.
#include "xgrad/core/blas.hpp"

#include <cblas.h>

#include <algorithm>

#include "xgrad/core/parallel.hpp"

namespace xgrad::blas {

namespace {

void sgemm_serial(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                  std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  // BLAS requires leading dimensions >= 1 even for empty operands.
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(std::max<std::size_t>(lda, 1)), b, static_cast<int>(std::max<std::size_t>(ldb, 1)),
              beta, c, static_cast<int>(std::max<std::size_t>(ldc, 1)));
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
           const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
           std::size_t ldc) {
  // OpenBLAS runs on one thread (see set_num_threads in parallel.cpp); large products are split
  // here across the kernel threads, by rows of C when it is tall and by columns when it is wide.
  // Each piece runs over the full K. Below 2 * kGrainGemm multiply-adds waking a second thread
  // costs more than it saves. OpenBLAS rounds some elements of a piece differently from the whole
  // product (by an ulp), so results agree across thread counts to rounding, not to the bit.
  const std::size_t work = m * n * std::max<std::size_t>(k, 1);
  if (work < 2 * kGrainGemm) return sgemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (m >= n) {
    const std::size_t grain = grain_for(kGrainGemm, work / m);
    parallel_for(m, grain, [=](std::size_t lo, std::size_t hi) {
      // rows lo..hi of op(A): A is m x k stored (trans: k x m)
      const float* a_part = trans_a ? a + lo : a + lo * lda;
      sgemm_serial(trans_a, trans_b, hi - lo, n, k, alpha, a_part, lda, b, ldb, beta, c + lo * ldc, ldc);
    });
  } else {
    const std::size_t grain = grain_for(kGrainGemm, work / n);
    parallel_for(n, grain, [=](std::size_t lo, std::size_t hi) {
      // columns lo..hi of op(B): B is k x n stored (trans: n x k)
      const float* b_part = trans_b ? b + lo * ldb : b + lo;
      sgemm_serial(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, b_part, ldb, beta, c + lo, ldc);
    });
  }
}

void set_num_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

}  // namespace xgrad::blas
