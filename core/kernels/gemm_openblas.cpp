// OpenBLAS through its CBLAS interface, held at one thread (parallel.cpp): xgrad threads products
// itself.
#include <cblas.h>

#include <algorithm>

#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"

namespace xgrad::blas {

namespace detail {

void openblas_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                    const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                    std::size_t ldc) {
  // BLAS requires leading dimensions >= 1 even for empty operands.
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(std::max<std::size_t>(lda, 1)), b, static_cast<int>(std::max<std::size_t>(ldb, 1)), beta,
              c, static_cast<int>(std::max<std::size_t>(ldc, 1)));
}

}  // namespace detail

void set_num_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

}  // namespace xgrad::blas
