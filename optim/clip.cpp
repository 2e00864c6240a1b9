// Global-norm gradient clipping.
#include "xgrad/optim/clip.hpp"

#include <cmath>

#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

float clip_grad_norm(const std::vector<Tensor>& params, float max_norm) {
  check_range("clip_grad_norm", "max_norm", max_norm, 0.0, 1e30);
  double sq = 0;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.has_grad()) continue;
    sq += sum_of_squares(p.grad());
  }
  const float norm = static_cast<float>(std::sqrt(sq));
  if (!std::isfinite(norm)) return norm;
  const float coef = max_norm / (norm + 1e-6f);
  if (coef < 1.f) {
    for (Tensor p : params) {
      if (p.defined() && p.has_grad()) p.mutable_grad() *= coef;
    }
  }
  return norm;
}

float clip_grad_norm(const NamedTensors& params, float max_norm) {
  std::vector<Tensor> plain;
  for (const auto& [name, p] : params) plain.push_back(p);
  return clip_grad_norm(plain, max_norm);
}

}  // namespace xgrad::optim
