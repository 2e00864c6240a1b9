// One copy of core/kernels/vector_kernels.cpp and optim/adam_kernel.cpp for a single target, in its own
// namespace; CMake defines XGRAD_KERNELS_NS, XGRAD_KERNELS_ONLY_<target> and XGRAD_KERNEL_TABLE
// for each copy.
#include "core/kernels/vector_kernels.cpp"
#include "kernel_table.hpp"
#include "optim/adam_kernel.cpp"

namespace xgrad::testing {

KernelTable XGRAD_KERNEL_TABLE() {
  namespace k = xgrad::XGRAD_KERNELS_NS;
  return {&k::gelu_forward,         &k::gelu_backward,         &k::gated_forward,
          &k::gated_backward,       &k::dropout_forward,       &k::dropout_backward,
          &k::gelu_dropout_forward, &k::gelu_dropout_backward, &k::masked_softmax_row,
          &k::softmax_row_backward, &k::log_sum_exp_finite,    &k::add_scaled_softmax,
          &k::layer_norm_forward,   &k::layer_norm_backward,   &k::rms_norm_forward,
          &k::rms_norm_backward,    &k::add_column_sums,       &xgrad::optim::XGRAD_KERNELS_NS::adam_update,
          &k::gelu_tanh_forward,    &k::gelu_tanh_backward,    &k::online_softmax_row,
          &k::exp_shifted_row};
}

}  // namespace xgrad::testing
