// The engines behind blas::sgemm, one translation unit each (their headers clash with
// xtensor-blas's and with each other's enums). Each computes one row-major product serially, on
// the calling thread; blas.cpp chooses the engine and splits large products across threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xgrad/core/kernels/blas.hpp"

namespace xgrad::blas::detail {

void openblas_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                    const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                    std::size_t ldc);

// Defined only when xgrad is built with oneDNN (XGRAD_HAS_ONEDNN).
void onednn_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                  std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
// blas::sgemm_batched over all `batches` in one call of oneDNN's matmul primitive (k > 0). Returns
// false, computing nothing, when oneDNN has no primitive for these strides.
bool onednn_sgemm_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m,
                          std::size_t n, std::size_t k, float alpha, Strided<const float> a, Strided<const float> b,
                          float beta, Strided<float> c);
// The same with bf16 operands (C float32), for blas::gemm_batched at Precision::bf16.
bool onednn_gemm_bf16_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m,
                              std::size_t n, std::size_t k, float alpha, Strided<const std::uint16_t> a,
                              Strided<const std::uint16_t> b, float beta, Strided<float> c);

// Whether oneDNN creates a bf16 matmul primitive (bf16 inputs, float32 output) on this CPU: probed
// once, on the first call, then cached (gemm_onednn_bf16.cpp). Defined only with oneDNN.
bool onednn_bf16_available();
// C = alpha op(A) op(B) + beta C with bf16 A and B and float32 C, on oneDNN's matmul primitive
// (k > 0), serially on the calling thread; with `bias` (n floats, alpha 1 and beta 0 only) the
// primitive adds it to every row of C as it writes C. Defined only with oneDNN.
void onednn_gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                      const std::uint16_t* a, std::size_t lda, const std::uint16_t* b, std::size_t ldb, float beta,
                      float* c, std::size_t ldc, const float* bias = nullptr);

// Y (rows x out) = act(X W^T + bias) in one call of oneDNN's matmul primitive, the bias (may be
// null) and the activation fused (blas::linear_activation; in > 0). Returns false, computing
// nothing, when oneDNN has no primitive for it.
bool onednn_linear(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w, const float* bias,
                   float* y, Epilogue act);

// How many calls of oneDNN's matmul primitive blas::sgemm_batched has made so far (0 without
// oneDNN); tests check that the path runs.
std::size_t onednn_batched_calls();
// How many products blas::sgemm_batched has given xgrad's small-product kernel so far.
std::size_t small_kernel_products();
// How many row ranges of plain products (blas::sgemm, blas::linear) it has run so far.
std::size_t small_kernel_plain_calls();
// Whether the few-rows kernel takes op(A) op(B) of m rows of A (blas.cpp's rule for `automatic`).
bool few_rows_take(bool trans_a, bool trans_b, std::size_t m);
// C (m x n) = alpha A B^T + beta C on the few-rows kernel (m <= 4), split by columns across the
// kernel threads; B float32, or bf16 for blas::gemm's bf16 products of a decoding step.
void few_rows_columns(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
void few_rows_columns(std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                      const std::uint16_t* b, std::size_t ldb, float beta, float* c, std::size_t ldc);
// How many products (blas::sgemm, blas::linear, blas::linear_activation, and blas::gemm and linear
// at bf16 with a bf16 B) the few-rows kernel has computed so far.
std::size_t few_rows_products();
// An Error naming `who` and the operand (a_name or b_name) when a product of `work` > 0
// multiply-adds has an operand with no values, or an fp32 product has one held only in bf16.
void check_operands(const char* who, Precision precision, std::size_t work, const Operand& a, const Operand& b,
                    const char* a_name = "A", const char* b_name = "B");

// How many times blas::engine() has been read so far: every product reads it (to pick its engine or
// kernel), so a computation that reads it never is one whose result XGRAD_GEMM cannot change. The
// test programs check with it that every test case whose result depends on the engine is labelled.
std::size_t engine_choice_reads();

// While alive, holds the calling thread's OpenMP thread count at 1 (see gemm_onednn.cpp).
class OnednnOnThisThread {
 public:
  OnednnOnThisThread();
  ~OnednnOnThisThread();
  OnednnOnThisThread(const OnednnOnThisThread&) = delete;
  OnednnOnThisThread& operator=(const OnednnOnThisThread&) = delete;

 private:
  int outer_;
};

}  // namespace xgrad::blas::detail
