// What linear_activation keeps for a GELU's backward, for the benchmark that chose it
// (bench/fused_products.cpp); the op itself always takes kGeluKeeps (ops_fused.cpp).
#pragma once

#include "xgrad/core/autograd/ops.hpp"

namespace xgrad::detail {

/// pre_activation: the forward computes z = x W^T + b (bias fused in the product), keeps z and
/// applies the GELU in a pass of its own; recompute: the forward is one product with the bias and
/// the GELU fused, and the backward computes z again (one product more).
enum class GeluKeeps { pre_activation, recompute };

/// linear_activation with the GELU's choice made by the caller (ReLU ignores it: it keeps y).
Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, LinearActivation a,
                         GeluKeeps keeps);

}  // namespace xgrad::detail
