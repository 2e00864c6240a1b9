// One residual connection around a sublayer f, the LayerNorm placed by `norm`:
//   pre:  y = x + f(LN(x))      post: y = LN(x + f(x))      none: y = f(x)
// While probes are attached (probe.hpp) it records "<name>.in" (x), "<name>.skip" and
// "<name>.branch" (identity copies of x taken by the skip path and by f), "<name>.sublayer"
// (f's output) and "<name>.out" (y) under the owner's path.
#pragma once

#include <functional>
#include <string>

#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/options.hpp"

namespace xgrad::nn {

Tensor residual_connection(const Module& owner, const std::string& name, const Tensor& x, Norm norm,
                           const LayerNorm* layer_norm, const std::function<Tensor(const Tensor&)>& sublayer);

}  // namespace xgrad::nn
