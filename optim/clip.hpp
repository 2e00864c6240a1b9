// Clipping by the global gradient norm, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::optim {

/// Scales every gradient by min(1, max_norm / (norm + 1e-6)), where norm is the L2 norm of all
/// gradients together (parameters without a gradient are skipped). Returns the norm before
/// clipping. A non-finite norm is returned as is and the gradients are left unchanged. Throws
/// for a max_norm outside [0, 1e30].
float clip_grad_norm(const std::vector<Tensor>& params, float max_norm);
/// The same for named parameters (a module's named_parameters()).
float clip_grad_norm(const NamedTensors& params, float max_norm);

}  // namespace xgrad::optim
