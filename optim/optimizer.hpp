// The optimizer base: the parameters it updates, the learning rate, per-parameter state and
// its save/restore. Optimizers see only parameters and their gradients.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

/// Optimizers (SGD, Adam, AdamW) on one base, gradient clipping, the finite check of a training
/// step and learning-rate schedules.
namespace xgrad::optim {

/// The optimizer base: the parameters it updates, the learning rate, per-parameter state and its
/// save/restore. Optimizers see only parameters and their gradients.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update of every parameter that has a gradient (parameters without one are skipped).
  void step();
  /// Forgets every parameter's gradient (the next backward starts from zero).
  void zero_grad();

  /// The learning rate of the next step.
  float lr() const { return lr_; }
  /// Sets the learning rate: finite and >= 0, else throws naming the value.
  void set_lr(float lr);

  /// Everything needed to resume exactly, as named arrays.
  /// The hyperparameters as 0-d arrays `"<type>:<name>"` (e.g. "AdamW:lr", "AdamW:beta1";
  /// what torch.optim keeps in param_groups), the number of parameters as `"<type>:parameters"`,
  /// then `"<param>.<slot>"` arrays (e.g. "head.weight.exp_avg") and `"<param>.step"`, for
  /// parameters that have been updated at least once. Parameter names cannot hold ':', so the two
  /// never collide.
  NamedArrays state_dict() const;
  /// Restores a state_dict, hyperparameters included (the learning rate and the rest replace the
  /// optimizer's current ones). A state of another optimizer type ("SGD:lr" given to AdamW) or of
  /// another number of parameters, unknown names, wrong shapes, an incomplete or invalid set of
  /// hyperparameters are errors and leave everything as it was. A state saved before
  /// hyperparameters were stored keeps the current ones, and says so in one line on stderr.
  void load_state_dict(const NamedArrays& state);

  /// The parameters, by name, in the order they were given.
  const NamedTensors& params() const { return params_; }

 protected:
  /// An optimizer of `params` at learning rate `lr`. `slots` names the per-parameter buffers
  /// (e.g. {"exp_avg", "exp_avg_sq"}); `who` names the optimizer type in messages and state_dict
  /// keys, and must outlive it (a literal). Throws for no parameters, a name that is not UTF-8
  /// or holds ':', a name given twice, an undefined parameter, one that is not a leaf requiring
  /// grad, the same tensor twice, and a learning rate set_lr refuses.
  Optimizer(NamedTensors params, float lr, std::vector<std::string> slots, const char* who);
  /// The same, with the parameters named by their index: "0", "1", ...
  Optimizer(const std::vector<Tensor>& params, float lr, std::vector<std::string> slots, const char* who);

  /// The state of one parameter.
  struct ParamState {
    std::size_t step = 0;      ///< updates this parameter has received
    std::vector<Array> slots;  ///< allocated (zeros) at the first update
  };
  /// Updates one parameter in place; state.step already counts this update.
  virtual void update(Array& param, const Array& grad, ParamState& state) = 0;
  /// Checks a state buffer being loaded (slot k, saved under `key`); throws naming the key.
  /// The base requires finite values.
  virtual void check_slot(const std::string& key, std::size_t k, const Array& value) const;
  /// The hyperparameters state_dict stores, by name, lr first; the base has lr alone.
  virtual std::vector<std::pair<std::string, float>> hyperparameters() const { return {{"lr", lr_}}; }
  /// Adopts a complete set (every name hyperparameters() lists) once all of it is valid; throws
  /// naming the value otherwise, changing nothing.
  virtual void set_hyperparameters(const std::map<std::string, float>& values);

  /// The optimizer type ("SGD", "Adam", "AdamW"): the prefix of messages and of state_dict keys.
  const char* who_;

 private:
  NamedTensors params_;
  std::vector<ParamState> state_;
  std::vector<std::string> slot_names_;
  float lr_;
};

/// Throws naming `who` unless `value` is finite and within [low, high] (or [low, high) when
/// high_open); used to validate hyper-parameters.
void check_range(const char* who, const char* what, double value, double low, double high, bool high_open = false);

}  // namespace xgrad::optim
