// Adam / AdamW update as one fused loop per parameter.
#include "xgrad/optim/adam.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/optim/detail/adam_kernel.hpp"

namespace xgrad::optim {

Adam::Adam(NamedTensors params, const AdamOptions& o) : Adam(std::move(params), o, false, "Adam") {}
Adam::Adam(const std::vector<Tensor>& params, const AdamOptions& o) : Adam(params, o, false, "Adam") {}

Adam::Adam(NamedTensors params, const AdamOptions& o, bool decoupled, const char* who)
    : Optimizer(std::move(params), o.lr(), {"exp_avg", "exp_avg_sq"}, who), options_(o), decoupled_(decoupled) {
  validate(options_);
}

Adam::Adam(const std::vector<Tensor>& params, const AdamOptions& o, bool decoupled, const char* who)
    : Optimizer(params, o.lr(), {"exp_avg", "exp_avg_sq"}, who), options_(o), decoupled_(decoupled) {
  validate(options_);
}

void Adam::validate(const AdamOptions& o) const {
  check_range(who_, "beta1", o.beta1(), 0.0, 1.0, true);
  check_range(who_, "beta2", o.beta2(), 0.0, 1.0, true);
  // eps = 0 would divide 0 by 0 wherever a gradient and its history are zero.
  if (!(std::isfinite(o.eps()) && o.eps() > 0.f)) fail(who_, ": eps ", o.eps(), " must be finite and > 0");
  check_range(who_, "weight_decay", o.weight_decay(), 0.0, 1e30);
}

std::vector<std::pair<std::string, float>> Adam::hyperparameters() const {
  return {{"lr", lr()},
          {"beta1", options_.beta1()},
          {"beta2", options_.beta2()},
          {"eps", options_.eps()},
          {"weight_decay", options_.weight_decay()}};
}

void Adam::set_hyperparameters(const std::map<std::string, float>& h) {
  const AdamOptions o = AdamOptions(h.at("lr"))
                            .beta1(h.at("beta1"))
                            .beta2(h.at("beta2"))
                            .eps(h.at("eps"))
                            .weight_decay(h.at("weight_decay"));
  check_range(who_, "lr", o.lr(), 0.0, 1e30);
  validate(o);
  options_ = o;
  set_lr(o.lr());
}

void Adam::update(Array& param, const Array& grad, ParamState& state) {
  const float lr = this->lr(), b1 = options_.beta1(), b2 = options_.beta2(), eps = options_.eps();
  const float wd = options_.weight_decay();
  const double t = static_cast<double>(state.step);
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
  const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float step_size = lr / bias1;
  const float decay = decoupled_ ? 1.f - lr * wd : 1.f;
  float* p = param.data();
  const float* g0 = grad.data();
  float* m = state.slots[0].data();
  float* v = state.slots[1].data();
  const AdamStep s{b1, b2, eps, wd, decay, step_size, bias2_sqrt, decoupled_};
  parallel_for(param.size(), kGrainCostly, [&](std::size_t lo, std::size_t hi) {
    kernels::adam_update(p + lo, g0 + lo, m + lo, v + lo, hi - lo, s);
  });
}

void Adam::check_slot(const std::string& key, std::size_t k, const Array& value) const {
  Optimizer::check_slot(key, k, value);
  if (k == 1) {  // exp_avg_sq: its square root is taken
    for (float v : value) {
      if (v < 0.f) fail(who_, ": state '", key, "' holds ", v, "; a second moment cannot be negative");
    }
  }
}

AdamW::AdamW(NamedTensors params, const AdamOptions& o) : Adam(std::move(params), o, true, "AdamW") {}
AdamW::AdamW(const std::vector<Tensor>& params, const AdamOptions& o) : Adam(params, o, true, "AdamW") {}

}  // namespace xgrad::optim
