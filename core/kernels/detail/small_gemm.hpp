// xgrad's own kernel for products whose rows of C fit in vector registers, compiled for AVX-512,
// AVX2 with FMA and the baseline like the vector kernels (target_clones.hpp), but with its
// multiply-adds fused where the target has FMA: the copies agree to rounding, as the GEMM engines
// do, not to the bit. blas::sgemm_batched sends attention's short per-head products here, and
// blas::sgemm and blas::linear the tall, narrow products of small models' linear layers, in
// column blocks (blas::small_kernel_takes_plain).
#pragma once

#include <cstddef>
#include <cstdint>

#include "xgrad/core/kernels/detail/target_clones.hpp"

namespace xgrad::XGRAD_KERNELS_NS {

// The widest op(B) (columns of C) the kernel takes: four 16-float vectors per row.
constexpr std::size_t kSmallGemmMaxN = 64;

// Row-major C (m x n) = alpha op(A) op(B) + beta C, as blas::sgemm (beta 0 ignores what C held, NaN
// included; k 0 gives beta C), for n <= kSmallGemmMaxN (the caller checks), serially on the calling
// thread. Writes only C's m x n elements.
void small_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

// The most rows of A few_rows_gemm takes.
constexpr std::size_t kFewRowsMaxM = 4;

// Row-major C (m x n) = alpha A B^T + beta C, A m x k and B n x k (row strides lda, ldb; a Linear
// layer's weight is B), for m <= kFewRowsMaxM (the caller checks), serially: every row of B is read
// once and multiplied with the m rows of A, four rows of B at a time, each element of C one sum of
// 16-lane partial products. A matrix-vector product (m 1: a decoding step) streams B at memory
// bandwidth. beta 0 ignores what C held; k 0 gives beta C.
void few_rows_gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                   const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
// The same with B in bf16 (a weight held in bf16, read at half the bytes), widened to float32 as it
// is read (exactly) and multiplied with A's float32 values (rounded to bf16 by the caller when the
// product is a bf16 one). Each element of C is a sum in another order than few_rows_gemm's on B's
// float32 values: they agree to rounding.
void few_rows_gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                   const std::uint16_t* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

}  // namespace xgrad::XGRAD_KERNELS_NS
