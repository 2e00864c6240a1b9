// See adam_kernel.hpp. AdamW reads and writes 28 bytes per parameter, so the loop is bound by
// memory bandwidth once the parameters leave the cache.
#include "xgrad/optim/detail/adam_kernel.hpp"

#include <cmath>

namespace xgrad::optim::XGRAD_KERNELS_NS {

XGRAD_CLONES void adam_update(float* p, const float* grad, float* m, float* v, std::size_t n, const AdamStep& s) {
  const float b1 = s.b1, b2 = s.b2, eps = s.eps, wd = s.wd, decay = s.decay, step_size = s.step_size;
  const float bias2_sqrt = s.bias2_sqrt;
  const bool decoupled = s.decoupled;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = decoupled ? grad[i] : grad[i] + wd * p[i];
    p[i] *= decay;
    m[i] = b1 * m[i] + (1.f - b1) * g;
    v[i] = b2 * v[i] + (1.f - b2) * g * g;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
  }
}

}  // namespace xgrad::optim::XGRAD_KERNELS_NS
