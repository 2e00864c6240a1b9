// SGD's update as one fused loop per parameter.
#include "xgrad/optim/sgd.hpp"

#include "xgrad/core/error.hpp"

namespace xgrad::optim {

SGD::SGD(NamedTensors params, const SGDOptions& o) : Optimizer(std::move(params), o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate();
}

SGD::SGD(const std::vector<Tensor>& params, const SGDOptions& o)
    : Optimizer(params, o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate();
}

void SGD::validate() {
  check_range(who_, "momentum", options_.momentum(), 0.0, 1.0, true);
  check_range(who_, "dampening", options_.dampening(), 0.0, 1.0);
  check_range(who_, "weight_decay", options_.weight_decay(), 0.0, 1e30);
  if (options_.nesterov() && (options_.momentum() <= 0.f || options_.dampening() != 0.f)) {
    fail("SGD: Nesterov momentum needs momentum > 0 and dampening 0 (momentum ", options_.momentum(), ", dampening ",
         options_.dampening(), ")");
  }
}

void SGD::update(Array& param, const Array& grad, ParamState& state) {
  const float lr = this->lr(), mu = options_.momentum(), damp = options_.dampening(), wd = options_.weight_decay();
  const bool first = state.step == 1;
  float* p = param.data();
  const float* g0 = grad.data();
  float* b = state.slots[0].data();
  for (std::size_t i = 0, n = param.size(); i < n; ++i) {
    float g = g0[i] + wd * p[i];
    if (mu != 0.f) {
      b[i] = first ? g : mu * b[i] + (1.f - damp) * g;
      g = options_.nesterov() ? g + mu * b[i] : b[i];
    }
    p[i] -= lr * g;
  }
}

}  // namespace xgrad::optim
