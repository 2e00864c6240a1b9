// One copy of core/kernels/small_gemm.cpp for a single target, in its own namespace, compiled as
// the library compiles it (multiply-adds fused where the target has FMA); CMake defines
// XGRAD_KERNELS_NS, XGRAD_KERNELS_ONLY_<target> and XGRAD_SMALL_GEMM for each copy.
#include "core/kernels/small_gemm.cpp"
#include "kernel_table.hpp"

namespace xgrad::testing {

SmallGemm XGRAD_SMALL_GEMM() { return &xgrad::XGRAD_KERNELS_NS::small_gemm; }

#define XGRAD_JOIN(a, b) a##b
#define XGRAD_NAME(a, b) XGRAD_JOIN(a, b)
FewRowsBf16 XGRAD_NAME(XGRAD_SMALL_GEMM, _few_rows_bf16)() { return &xgrad::XGRAD_KERNELS_NS::few_rows_gemm; }

}  // namespace xgrad::testing
