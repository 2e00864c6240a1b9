// The vector kernels of one compilation target, as function pointers: tests/kernel_target_copy.cpp
// is compiled once per target (tests/CMakeLists.txt) and each copy returns its table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/optim/detail/adam_kernel.hpp"

namespace xgrad::testing {

struct KernelTable {
  void (*gelu_forward)(const float*, float*, std::size_t);
  void (*gelu_backward)(const float*, const float*, float*, std::size_t);
  void (*gated_forward)(const float*, const float*, float*, std::size_t, int);
  void (*gated_backward)(const float*, const float*, const float*, float*, float*, std::size_t, int);
  void (*dropout_forward)(const float*, float*, std::uint8_t*, std::size_t, std::size_t, std::uint32_t, std::uint32_t,
                          std::uint32_t, float);
  void (*dropout_backward)(const float*, const std::uint8_t*, float*, std::size_t, float);
  void (*gelu_dropout_forward)(const float*, float*, std::uint8_t*, std::size_t, std::size_t, std::uint32_t,
                               std::uint32_t, std::uint32_t, float);
  void (*gelu_dropout_backward)(const float*, const float*, const std::uint8_t*, float*, std::size_t, float);
  void (*masked_softmax_row)(float*, std::size_t, std::size_t, const std::uint8_t*);
  void (*softmax_row_backward)(const float*, const float*, float*, std::size_t);
  bool (*log_sum_exp_finite)(const float*, std::size_t, float*, float*);
  void (*add_scaled_softmax)(const float*, std::size_t, float, float, float, float*);
  void (*layer_norm_forward)(const float*, const float*, const float*, float*, float*, float*, std::size_t, std::size_t,
                             float);
  void (*layer_norm_backward)(const float*, const float*, const float*, const float*, const float*, float*, float*,
                              float*, std::size_t, std::size_t);
  void (*rms_norm_forward)(const float*, const float*, float*, float*, std::size_t, std::size_t, float);
  void (*rms_norm_backward)(const float*, const float*, const float*, const float*, float*, float*, std::size_t,
                            std::size_t);
  void (*add_column_sums)(const float*, std::size_t, std::size_t, float*);
  void (*adam_update)(float*, const float*, float*, float*, std::size_t, const optim::AdamStep&);
  void (*gelu_tanh_forward)(const float*, float*, std::size_t);
  void (*gelu_tanh_backward)(const float*, const float*, float*, std::size_t);
  float (*online_softmax_row)(float*, std::size_t, std::size_t, float*, bool*, float*);
  void (*exp_shifted_row)(float*, std::size_t, std::size_t, float);
};

KernelTable kernels_avx512_table();
KernelTable kernels_avx2_table();
KernelTable kernels_baseline_table();

// The small-product kernel (core/kernels/small_gemm.cpp) of one target (small_gemm_target_copy.cpp).
using SmallGemm = void (*)(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t,
                           const float*, std::size_t, float, float*, std::size_t);
SmallGemm small_gemm_avx512();
SmallGemm small_gemm_avx2();
SmallGemm small_gemm_baseline();
// Its few-rows product with B in bf16, of the same target.
using FewRowsBf16 = void (*)(std::size_t, std::size_t, std::size_t, float, const float*, std::size_t,
                             const std::uint16_t*, std::size_t, float, float*, std::size_t);
FewRowsBf16 small_gemm_avx512_few_rows_bf16();
FewRowsBf16 small_gemm_avx2_few_rows_bf16();
FewRowsBf16 small_gemm_baseline_few_rows_bf16();

}  // namespace xgrad::testing
