// The finite-loss-and-gradient check of a training step.
#include "xgrad/optim/finite.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"

namespace xgrad::optim {

namespace {

const char* name_of(float v) { return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf"); }

}  // namespace

void check_finite(std::size_t step, float loss, const NamedTensors& params) {
  if (!std::isfinite(loss)) fail("step ", step, ": the loss is ", name_of(loss));
  for (const auto& [name, p] : params) {
    if (!p.defined() || !p.has_grad()) continue;
    const Array& g = p.grad();
    if (const std::size_t i = first_non_finite(g); i < g.size()) {
      fail("step ", step, ": the gradient of '", name, "' is ", name_of(g.data()[i]), " at flat position ", i);
    }
  }
}

}  // namespace xgrad::optim
