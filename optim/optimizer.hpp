// The optimizer base: the parameters it updates in groups of their own hyperparameters, the
// learning rate, per-parameter state and its save/restore. Optimizers see only parameters and
// their gradients.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

/// Optimizers (SGD, Adam, AdamW) on one base, gradient clipping, the finite check of a training
/// step and learning-rate schedules.
namespace xgrad::optim {

/// A group of parameters with hyperparameters of their own, as one of torch.optim's
/// param_groups: ParamGroup(params).lr(1e-4f).weight_decay(0.f). A hyperparameter the group
/// does not set is the optimizer's option. Given to an optimizer's group constructor (e.g.
/// `AdamW({ParamGroup(a).weight_decay(0.1f), ParamGroup(b).weight_decay(0.f)}, AdamOptions(3e-4f))`),
/// which refuses a name the optimizer does not have (momentum for Adam, beta1 for SGD).
class ParamGroup {
 public:
  /// The group of `params`, named as the optimizer's state_dict will name them.
  explicit ParamGroup(NamedTensors params) : params_(std::move(params)) {}
  /// The group's learning rate (see Optimizer::set_lr for how it follows the optimizer's).
  ParamGroup& lr(float v) { return set("lr", v); }
  /// The group's weight decay (SGD, Adam, AdamW).
  ParamGroup& weight_decay(float v) { return set("weight_decay", v); }
  /// The group's momentum (SGD).
  ParamGroup& momentum(float v) { return set("momentum", v); }
  /// The group's dampening (SGD).
  ParamGroup& dampening(float v) { return set("dampening", v); }
  /// The group's Nesterov flag (SGD).
  ParamGroup& nesterov(bool v) { return set("nesterov", v ? 1.f : 0.f); }
  /// The group's decay of the first moment (Adam, AdamW).
  ParamGroup& beta1(float v) { return set("beta1", v); }
  /// The group's decay of the second moment (Adam, AdamW).
  ParamGroup& beta2(float v) { return set("beta2", v); }
  /// The group's eps (Adam, AdamW).
  ParamGroup& eps(float v) { return set("eps", v); }
  /// Sets the hyperparameter of that name (as state_dict names it: "beta1"); setting one
  /// again replaces the value.
  ParamGroup& set(const std::string& name, float value);
  /// The parameters, by name.
  const NamedTensors& params() const { return params_; }
  /// The hyperparameters the group sets, in the order first set.
  const std::vector<std::pair<std::string, float>>& overrides() const { return overrides_; }

 private:
  NamedTensors params_;
  std::vector<std::pair<std::string, float>> overrides_;
};

/// The optimizer base: the parameters it updates, in one or more groups of their own
/// hyperparameters, the learning rate, per-parameter state and its save/restore. Optimizers see
/// only parameters and their gradients.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update of every parameter that has a gradient (parameters without one are skipped).
  /// Inside a bf16 AutocastGuard on the calling thread it is an Error that changes nothing.
  void step();
  /// Forgets every parameter's gradient (the next backward starts from zero).
  void zero_grad();

  /// The optimizer's learning rate: the rate of its options, which set_lr sets. Each group
  /// runs at lr() times its factor (group_lr_factor), so this is the rate of every group that
  /// sets no lr of its own.
  float lr() const { return lr_; }
  /// Sets lr(): finite and >= 0, else throws naming the value (and the group, when lr times a
  /// group's factor passes float32; nothing changes then). Every group's rate becomes
  /// lr times its factor, so a schedule driving set_lr scales all groups and keeps their
  /// ratios, as torch's schedulers scale each group's initial lr.
  void set_lr(float lr);

  /// The number of parameter groups (1 for an optimizer built without groups).
  std::size_t num_groups() const { return groups_.size(); }
  /// The learning rate of group g (0-based) for the next step; g out of range throws.
  float group_lr(std::size_t g) const { return group(g).lr; }
  /// Sets group g's rate (finite and >= 0) and makes it that multiple of lr() for later
  /// set_lr calls. A rate of 0 freezes the group (factor 0); a rate above 0 when lr() is 0
  /// throws, as no factor gives it, and so does a factor past 1e30 (which a state cannot hold).
  void set_group_lr(std::size_t g, float lr);
  /// Group g's rate divided by lr(): 1 for a group that sets no lr of its own, x / lr for a
  /// group given lr x (0 for x = 0).
  float group_lr_factor(std::size_t g) const { return group(g).lr_factor; }
  /// The parameters of group g, by name, in the order the group gave them.
  NamedTensors group_params(std::size_t g) const;

  /// Everything needed to resume exactly, as named arrays.
  /// The hyperparameters of the options as 0-d arrays `"<type>:<name>"` (e.g. "AdamW:lr",
  /// "AdamW:beta1"; what torch.optim keeps in param_groups), the number of parameters as
  /// `"<type>:parameters"`, then `"<param>.<slot>"` arrays (e.g. "head.weight.exp_avg") and
  /// `"<param>.step"`, for parameters that have been updated at least once. Parameter names
  /// cannot hold ':', so the two never collide.
  /// An optimizer of several groups, or of one whose hyperparameters are not the options' (a
  /// group lr or weight_decay of its own), also stores `"<type>:groups"` (their number),
  /// every group's hyperparameters as `"<type>:group<g>:<name>"` (g from 0; "AdamW:group1:lr"
  /// is the group's rate now, "AdamW:group1:lr_factor" its factor) and each parameter's group
  /// as `"<type>:group_of:<param>"` = g. An optimizer built without groups writes none of them.
  NamedArrays state_dict() const;
  /// Restores a state_dict, hyperparameters and groups' hyperparameters included (they replace
  /// the optimizer's current ones). A state of another optimizer type ("SGD:lr" given to AdamW),
  /// of another number of parameters, of another number of groups or of other group members
  /// (named), unknown names, wrong shapes, an incomplete or invalid set of hyperparameters are
  /// errors and leave everything as it was. A state without group entries is one group, and
  /// loads into an optimizer of one group only. A state saved before hyperparameters were stored
  /// keeps the current ones and groups (of any number), and says so in one line on stderr.
  void load_state_dict(const NamedArrays& state);

  /// The parameters, by name: group 0's, then group 1's, ..., each in the order given.
  const NamedTensors& params() const { return params_; }
  /// The bytes of the per-parameter state buffers (allocated at each parameter's first update):
  /// 8 bytes per trained value for Adam and AdamW, 4 for SGD with momentum. A frozen parameter,
  /// never given to the optimizer (nn::Module::named_trainable_parameters), holds none.
  std::size_t state_bytes() const;

 protected:
  /// Named hyperparameters, lr first.
  using Hyperparameters = std::vector<std::pair<std::string, float>>;

  /// An optimizer of `params` (one group) at learning rate `lr`. `slots` names the
  /// per-parameter buffers (e.g. {"exp_avg", "exp_avg_sq"}); `who` names the optimizer type in
  /// messages and state_dict keys, and must outlive it (a literal). Throws for no parameters, a
  /// name that is not UTF-8 or holds ':', a name given twice, an undefined parameter, one that is
  /// not a leaf requiring grad, the same tensor twice, and a learning rate set_lr refuses.
  /// The derived constructor validates its options, then calls init_groups().
  Optimizer(NamedTensors params, float lr, std::vector<std::string> slots, const char* who);
  /// The same, with the parameters named by their index: "0", "1", ...
  Optimizer(const std::vector<Tensor>& params, float lr, std::vector<std::string> slots, const char* who);
  /// An optimizer of parameter groups, checked as the parameters above and, in addition, for no
  /// group, an empty group and a parameter in two groups (naming both groups). The groups'
  /// hyperparameters are resolved and checked by init_groups().
  Optimizer(std::vector<ParamGroup> groups, float lr, std::vector<std::string> slots, const char* who);

  /// Resolves each group's hyperparameters (the options', with the group's overrides) and
  /// checks them, naming the group ("AdamW: group 1: weight_decay -1 is outside ..."), then
  /// adopts them; throws for a name the optimizer does not have. Called once, by the derived
  /// constructor, once its options are validated.
  void init_groups();

  /// The state of one parameter.
  struct ParamState {
    std::size_t step = 0;      ///< updates this parameter has received
    std::vector<Array> slots;  ///< allocated (zeros) at the first update
  };
  /// Updates one parameter of group `group` in place; state.step already counts this update.
  virtual void update(Array& param, const Array& grad, ParamState& state, std::size_t group) = 0;
  /// Checks a state buffer being loaded (slot k, saved under `key`); throws naming the key.
  /// The base requires finite values.
  virtual void check_slot(const std::string& key, std::size_t k, const Array& value) const;
  /// The hyperparameters of the options, lr first (lr as lr() gives it).
  virtual Hyperparameters hyperparameters() const = 0;
  /// The hyperparameters of group g, named and ordered as hyperparameters() (lr as group_lr).
  virtual Hyperparameters group_hyperparameters(std::size_t g) const = 0;
  /// Throws, its message starting with `who`, unless `values` (every name hyperparameters()
  /// lists) is a valid set; the base has checked lr.
  virtual void check_hyperparameters(const std::map<std::string, float>& values, const std::string& who) const = 0;
  /// Adopts checked sets: the options' and one per group (their lr is the base's business).
  virtual void adopt_hyperparameters(const std::map<std::string, float>& options,
                                     const std::vector<std::map<std::string, float>>& groups) = 0;

  /// The optimizer type ("SGD", "Adam", "AdamW"): the prefix of messages and of state_dict keys.
  const char* who_;

 private:
  struct Group {
    std::size_t begin = 0, end = 0;  // params_[begin, end)
    float lr = 0.f, lr_factor = 1.f;
  };
  const Group& group(std::size_t g) const;
  void check_factor(const std::string& who, float lr, float factor) const;
  bool writes_groups() const;
  NamedTensors params_;
  std::vector<ParamState> state_;
  std::vector<std::string> slot_names_;
  std::vector<Group> groups_;
  std::vector<std::vector<std::pair<std::string, float>>> overrides_;  // until init_groups()
  float lr_ = 0.f;
};

/// Throws naming `who` unless `value` is finite and within [low, high] (or [low, high) when
/// high_open); used to validate hyper-parameters.
void check_range(const char* who, const char* what, double value, double low, double high, bool high_open = false);

/// The two groups of the usual weight-decay rule: `decay` with weight_decay `weight_decay` and
/// `no_decay` with weight_decay 0, in that order; an empty list gives no group. With nn's split
/// of a model (nn/weight_decay.hpp), in one line:
///
///     optim::AdamW opt(optim::decay_groups(nn::split_for_weight_decay(model), 0.1f), optim::AdamOptions(3e-4f));
///
/// The optimizer checks the weight_decay as any group's (naming group 0) and refuses no groups.
std::vector<ParamGroup> decay_groups(NamedTensors decay, NamedTensors no_decay, float weight_decay);
/// The same for a (decay, no_decay) pair, as nn::split_for_weight_decay returns it.
std::vector<ParamGroup> decay_groups(std::pair<NamedTensors, NamedTensors> split, float weight_decay);

}  // namespace xgrad::optim
