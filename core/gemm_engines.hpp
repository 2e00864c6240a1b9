// The engines behind blas::sgemm, one translation unit each (their headers clash with
// xtensor-blas's and with each other's enums). Each computes one row-major product serially, on
// the calling thread; blas.cpp chooses the engine and splits large products across threads.
#pragma once

#include <cstddef>

namespace xgrad::blas::detail {

void openblas_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                    const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                    std::size_t ldc);

// Defined only when xgrad is built with oneDNN (XGRAD_HAS_ONEDNN).
void onednn_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                  const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                  std::size_t ldc);

}  // namespace xgrad::blas::detail
