// Stopping a training run at the first NaN or infinite loss or gradient, naming the step (a run
// that goes on from there only writes garbage over good weights).
#pragma once

#include <cstddef>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::optim {

/// Throws Error when `loss` is not finite, or when a gradient of `params` holds a NaN or an
/// infinity, naming the step, the first such parameter and the flat position, as in
/// "step 12: the gradient of 'blocks.0.ffn.linear1.weight' is inf at flat position 7". Parameters
/// without a gradient are skipped. Call it after backward and before the optimizer's step.
void check_finite(std::size_t step, float loss, const NamedTensors& params);

}  // namespace xgrad::optim
