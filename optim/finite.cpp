// The finite-loss-and-gradient check of a training step.
#include "xgrad/optim/finite.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"

namespace xgrad::optim {

namespace {

// x * 0 is 0 for every finite x and NaN for NaN and the infinities, so one vectorizable sum
// answers "all finite?"; the slow search for the position runs only when it says no.
bool all_finite(const float* d, std::size_t n) {
  float probe = 0.f;
  for (std::size_t i = 0; i < n; ++i) probe += d[i] * 0.f;
  return probe == 0.f;
}

const char* name_of(float v) { return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf"); }

}  // namespace

void check_finite(std::size_t step, float loss, const NamedTensors& params) {
  if (!std::isfinite(loss)) fail("step ", step, ": the loss is ", name_of(loss));
  for (const auto& [name, p] : params) {
    if (!p.defined() || !p.has_grad()) continue;
    const Array& g = p.grad();
    if (all_finite(g.data(), g.size())) continue;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!std::isfinite(g.data()[i])) {
        fail("step ", step, ": the gradient of '", name, "' is ", name_of(g.data()[i]), " at flat position ", i);
      }
    }
  }
}

}  // namespace xgrad::optim
