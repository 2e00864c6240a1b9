// The Adam / AdamW update as one vectorized loop, compiled per target like core's vector
// kernels (core/kernels/detail/target_clones.hpp) and tested bit for bit across the copies.
#pragma once

#include <cstddef>

#include "xgrad/core/kernels/detail/target_clones.hpp"

namespace xgrad::optim {

// One step's constants (see adam.hpp for the formulas): g = grad (+ wd p unless decoupled);
// p *= decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step_size m / (sqrt(v) / bias2_sqrt + eps).
struct AdamStep {
  float b1, b2, eps, wd, decay, step_size, bias2_sqrt;
  bool decoupled;
};

namespace XGRAD_KERNELS_NS {
// The step over elements [0, n) of the parameter, its gradient and its two moments.
void adam_update(float* p, const float* grad, float* m, float* v, std::size_t n, const AdamStep& s);
}  // namespace XGRAD_KERNELS_NS

}  // namespace xgrad::optim
