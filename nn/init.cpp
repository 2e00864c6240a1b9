// Xavier initialization.
#include "xgrad/nn/init.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/nn/layers.hpp"

namespace xgrad::nn {

void xavier_uniform(Tensor& weight, Generator& gen) {
  if (weight.ndim() != 2) fail("xavier_uniform: weight must be (fan_out, fan_in), got ", shape_str(weight.shape()));
  const double fan_out = static_cast<double>(weight.shape()[0]), fan_in = static_cast<double>(weight.shape()[1]);
  const auto a = static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
  weight.mutable_value() = gen.uniform(weight.shape(), -a, a);
}

void xavier_linears(Module& root, Generator& gen) {
  for (auto& [path, m] : root.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(m);
    if (!linear) continue;
    xavier_uniform(linear->weight, gen);
    if (linear->bias.defined()) linear->bias.mutable_value().fill(0.f);
  }
}

}  // namespace xgrad::nn
