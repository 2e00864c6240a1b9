// SGD's update as one fused loop per parameter.
#include "xgrad/optim/sgd.hpp"

#include "xgrad/core/error.hpp"

namespace xgrad::optim {

namespace {
// The map holds nesterov as 0 or 1 (check_hyperparameters refuses other values first).
SGDOptions from_map(const std::map<std::string, float>& h) {
  return SGDOptions(h.at("lr"))
      .momentum(h.at("momentum"))
      .dampening(h.at("dampening"))
      .weight_decay(h.at("weight_decay"))
      .nesterov(h.at("nesterov") == 1.f);
}

std::vector<std::pair<std::string, float>> listed(const SGDOptions& o, float lr) {
  return {{"lr", lr},
          {"momentum", o.momentum()},
          {"dampening", o.dampening()},
          {"weight_decay", o.weight_decay()},
          {"nesterov", o.nesterov() ? 1.f : 0.f}};
}
}  // namespace

SGD::SGD(NamedTensors params, const SGDOptions& o)
    : Optimizer(std::move(params), o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate(options_, who_);
  init_groups();
}

SGD::SGD(const std::vector<Tensor>& params, const SGDOptions& o)
    : Optimizer(params, o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate(options_, who_);
  init_groups();
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& o)
    : Optimizer(std::move(groups), o.lr(), {"momentum_buffer"}, "SGD"), options_(o) {
  validate(options_, who_);
  init_groups();
}

void SGD::validate(const SGDOptions& o, const std::string& who) const {
  const char* w = who.c_str();
  check_range(w, "momentum", o.momentum(), 0.0, 1.0, true);
  check_range(w, "dampening", o.dampening(), 0.0, 1.0);
  check_range(w, "weight_decay", o.weight_decay(), 0.0, 1e30);
  if (o.nesterov() && (o.momentum() <= 0.f || o.dampening() != 0.f)) {
    fail(who, ": Nesterov momentum needs momentum > 0 and dampening 0 (momentum ", o.momentum(), ", dampening ",
         o.dampening(), ")");
  }
}

SGDOptions SGD::group_options(std::size_t g) const {
  const float lr = group_lr(g);  // throws for a group out of range
  return SGDOptions(groups_[g]).lr(lr);
}

Optimizer::Hyperparameters SGD::hyperparameters() const { return listed(options_, lr()); }

Optimizer::Hyperparameters SGD::group_hyperparameters(std::size_t g) const { return listed(groups_[g], group_lr(g)); }

void SGD::check_hyperparameters(const std::map<std::string, float>& h, const std::string& who) const {
  const float nesterov = h.at("nesterov");
  if (nesterov != 0.f && nesterov != 1.f) fail(who, ": nesterov ", nesterov, " is not 0 or 1");
  validate(from_map(h), who);
}

void SGD::adopt_hyperparameters(const std::map<std::string, float>& options,
                                const std::vector<std::map<std::string, float>>& groups) {
  options_ = from_map(options);
  groups_.clear();
  for (const auto& g : groups) groups_.push_back(from_map(g));
}

void SGD::update(Array& param, const Array& grad, ParamState& state, std::size_t group) {
  const SGDOptions& o = groups_[group];
  const float lr = group_lr(group), mu = o.momentum(), damp = o.dampening(), wd = o.weight_decay();
  const bool first = state.step == 1, nesterov = o.nesterov();
  float* p = param.data();
  const float* g0 = grad.data();
  float* b = state.slots[0].data();
  for (std::size_t i = 0, n = param.size(); i < n; ++i) {
    float g = g0[i] + wd * p[i];
    if (mu != 0.f) {
      b[i] = first ? g : mu * b[i] + (1.f - damp) * g;
      g = nesterov ? g + mu * b[i] : b[i];
    }
    p[i] -= lr * g;
  }
}

}  // namespace xgrad::optim
