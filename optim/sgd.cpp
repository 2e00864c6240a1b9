// SGD's update as one fused loop per parameter.
#include "xgrad/optim/sgd.hpp"

#include "xgrad/core/error.hpp"

namespace xgrad::optim {

SGD::SGD(NamedTensors params, const SGDOptions& o)
    : Optimizer(std::move(params), o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate(options_);
}

SGD::SGD(const std::vector<Tensor>& params, const SGDOptions& o)
    : Optimizer(params, o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate(options_);
}

void SGD::validate(const SGDOptions& o) const {
  check_range(who_, "momentum", o.momentum(), 0.0, 1.0, true);
  check_range(who_, "dampening", o.dampening(), 0.0, 1.0);
  check_range(who_, "weight_decay", o.weight_decay(), 0.0, 1e30);
  if (o.nesterov() && (o.momentum() <= 0.f || o.dampening() != 0.f)) {
    fail("SGD: Nesterov momentum needs momentum > 0 and dampening 0 (momentum ", o.momentum(), ", dampening ",
         o.dampening(), ")");
  }
}

std::vector<std::pair<std::string, float>> SGD::hyperparameters() const {
  return {{"lr", lr()},
          {"momentum", options_.momentum()},
          {"dampening", options_.dampening()},
          {"weight_decay", options_.weight_decay()},
          {"nesterov", options_.nesterov() ? 1.f : 0.f}};
}

void SGD::set_hyperparameters(const std::map<std::string, float>& h) {
  const float nesterov = h.at("nesterov");
  if (nesterov != 0.f && nesterov != 1.f) fail(who_, ": hyperparameter 'SGD:nesterov' is ", nesterov, ", not 0 or 1");
  const SGDOptions o = SGDOptions(h.at("lr"))
                           .momentum(h.at("momentum"))
                           .dampening(h.at("dampening"))
                           .weight_decay(h.at("weight_decay"))
                           .nesterov(nesterov == 1.f);
  check_range(who_, "lr", o.lr(), 0.0, 1e30);
  validate(o);
  options_ = o;
  set_lr(o.lr());
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
