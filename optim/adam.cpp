// Adam / AdamW update as one fused loop per parameter.
#include "xgrad/optim/adam.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/optim/detail/adam_kernel.hpp"

namespace xgrad::optim {

namespace {
const std::vector<std::string>& adam_slots() {
  static const std::vector<std::string> slots = {"exp_avg", "exp_avg_sq"};
  return slots;
}

AdamOptions from_map(const std::map<std::string, float>& h) {
  return AdamOptions(h.at("lr"))
      .beta1(h.at("beta1"))
      .beta2(h.at("beta2"))
      .eps(h.at("eps"))
      .weight_decay(h.at("weight_decay"));
}
}  // namespace

Adam::Adam(NamedTensors params, const AdamOptions& o) : Adam(std::move(params), o, false, "Adam") {}
Adam::Adam(const std::vector<Tensor>& params, const AdamOptions& o) : Adam(params, o, false, "Adam") {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& o) : Adam(std::move(groups), o, false, "Adam") {}

Adam::Adam(NamedTensors params, const AdamOptions& o, bool decoupled, const char* who)
    : Optimizer(std::move(params), o.lr(), adam_slots(), who), options_(o), decoupled_(decoupled) {
  validate(options_, who_);
  init_groups();
}

Adam::Adam(const std::vector<Tensor>& params, const AdamOptions& o, bool decoupled, const char* who)
    : Optimizer(params, o.lr(), adam_slots(), who), options_(o), decoupled_(decoupled) {
  validate(options_, who_);
  init_groups();
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& o, bool decoupled, const char* who)
    : Optimizer(std::move(groups), o.lr(), adam_slots(), who), options_(o), decoupled_(decoupled) {
  validate(options_, who_);
  init_groups();
}

void Adam::validate(const AdamOptions& o, const std::string& who) const {
  const char* w = who.c_str();
  check_range(w, "beta1", o.beta1(), 0.0, 1.0, true);
  check_range(w, "beta2", o.beta2(), 0.0, 1.0, true);
  // eps = 0 would divide 0 by 0 wherever a gradient and its history are zero.
  if (!(std::isfinite(o.eps()) && o.eps() > 0.f)) fail(who, ": eps ", o.eps(), " must be finite and > 0");
  check_range(w, "weight_decay", o.weight_decay(), 0.0, 1e30);
}

namespace {
std::vector<std::pair<std::string, float>> listed(const AdamOptions& o, float lr) {
  return {{"lr", lr}, {"beta1", o.beta1()}, {"beta2", o.beta2()}, {"eps", o.eps()}, {"weight_decay", o.weight_decay()}};
}
}  // namespace

AdamOptions Adam::group_options(std::size_t g) const {
  const float lr = group_lr(g);  // throws for a group out of range
  return AdamOptions(groups_[g]).lr(lr);
}

Optimizer::Hyperparameters Adam::hyperparameters() const { return listed(options_, lr()); }

Optimizer::Hyperparameters Adam::group_hyperparameters(std::size_t g) const { return listed(groups_[g], group_lr(g)); }

void Adam::check_hyperparameters(const std::map<std::string, float>& h, const std::string& who) const {
  validate(from_map(h), who);
}

void Adam::adopt_hyperparameters(const std::map<std::string, float>& options,
                                 const std::vector<std::map<std::string, float>>& groups) {
  options_ = from_map(options);
  groups_.clear();
  for (const auto& g : groups) groups_.push_back(from_map(g));
}

void Adam::update(Array& param, const Array& grad, ParamState& state, std::size_t group) {
  const AdamOptions& o = groups_[group];
  const float lr = group_lr(group), b1 = o.beta1(), b2 = o.beta2(), eps = o.eps();
  const float wd = o.weight_decay();
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
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamOptions& o) : Adam(std::move(groups), o, true, "AdamW") {}

}  // namespace xgrad::optim
