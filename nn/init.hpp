// Alternative initializations (the modules' constructors already use PyTorch's defaults).
#pragma once

#include "xgrad/core/random.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

/// Xavier/Glorot uniform for a (fan_out, fan_in) weight: U(-a, a), a = sqrt(6 / (fan_in + fan_out)).
/// A weight that is not 2-D throws.
void xavier_uniform(Tensor& weight, Generator& gen);

/// Every Linear under root: Xavier-uniform weight, zero bias.
/// The weights are drawn from `gen` in named_modules() order (root itself first).
void xavier_linears(Module& root, Generator& gen);

}  // namespace xgrad::nn
