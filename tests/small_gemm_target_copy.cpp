// One copy of core/kernels/small_gemm.cpp for a single target, in its own namespace, compiled as
// the library compiles it (multiply-adds fused where the target has FMA); CMake defines
// XGRAD_KERNELS_NS, XGRAD_KERNELS_ONLY_<target> and XGRAD_SMALL_GEMM for each copy.
#include "core/kernels/small_gemm.cpp"
#include "kernel_table.hpp"

namespace xgrad::testing {

SmallGemm XGRAD_SMALL_GEMM() { return &xgrad::XGRAD_KERNELS_NS::small_gemm; }

}  // namespace xgrad::testing
