// The one door to BLAS. Only blas.cpp includes <cblas.h> (it clashes with xtensor-blas's
// headers), so everything else calls these wrappers.
#pragma once

#include <cstddef>

namespace xgrad::blas {

// Row-major C (m x n) = alpha * op(A) op(B) + beta * C, where op(A) is m x k and op(B) is k x n;
// op(X) = X^T when the flag is set. lda/ldb/ldc are the row strides of the stored matrices.
// Large products are split across xgrad's kernel threads (parallel.hpp); a call from inside a
// parallel_for body runs on its own thread.
void sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
           const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
           std::size_t ldc);

// Threads OpenBLAS itself may use (0 keeps its default), and how many it uses now. xgrad keeps
// it at 1 and threads GEMMs itself: use xgrad::set_num_threads.
void set_num_threads(int n);
int num_threads();

}  // namespace xgrad::blas
