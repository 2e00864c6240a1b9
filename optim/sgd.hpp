// Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay, following
// torch.optim.SGD.
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

/// The options of SGD, set as in SGDOptions(0.1f).momentum(0.9f).nesterov(true).
struct SGDOptions {
  /// The learning rate `lr`, and plain SGD for the rest (no momentum, no weight decay).
  explicit SGDOptions(float lr) : lr_(lr) {}
  /// The learning rate: finite and >= 0.
  XGRAD_REQUIRED_ARG(float, lr);
  /// The momentum: in [0, 1), 0 for none.
  XGRAD_ARG(float, momentum, 0.f);
  /// The dampening of the momentum: in [0, 1].
  XGRAD_ARG(float, dampening, 0.f);
  /// The L2 weight decay: in [0, 1e30].
  XGRAD_ARG(float, weight_decay, 0.f);
  /// Nesterov momentum: needs momentum > 0 and dampening 0.
  XGRAD_ARG(bool, nesterov, false);
};

/// Stochastic gradient descent, following torch.optim.SGD. Its update:
///
///     g = grad + weight_decay * p
///     b = g at the first step, then b = momentum * b + (1 - dampening) * g
///     g = nesterov ? g + momentum * b : b          (when momentum > 0)
///     p = p - lr * g
///
/// Its state_dict slot is "momentum_buffer" (b).
class SGD : public Optimizer {
 public:
  /// SGD over named parameters. Throws naming an option outside its range (see SGDOptions), and
  /// for the parameters the Optimizer base refuses.
  SGD(NamedTensors params, const SGDOptions& options);
  /// The same, with the parameters named by their index: "0", "1", ...
  SGD(const std::vector<Tensor>& params, const SGDOptions& options);
  /// SGD over parameter groups, each with the options but those it sets (lr, momentum,
  /// dampening, weight_decay, nesterov). Throws as above, and for a group the Optimizer base
  /// refuses or whose hyperparameter is out of range, naming the group
  /// ("SGD: group 1: momentum 1 is outside [0, 1)").
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  /// The options (the constructor's, or a loaded state's), lr as lr() gives it; each group runs
  /// with its group_options.
  SGDOptions options() const { return SGDOptions(options_).lr(lr()); }
  /// The options group g runs with (lr as group_lr(g) gives it); g out of range throws.
  SGDOptions group_options(std::size_t g) const;

 private:
  void validate(const SGDOptions& o, const std::string& who) const;
  void update(Array& param, const Array& grad, ParamState& state, std::size_t group) override;
  Hyperparameters hyperparameters() const override;
  Hyperparameters group_hyperparameters(std::size_t g) const override;
  void check_hyperparameters(const std::map<std::string, float>& values, const std::string& who) const override;
  void adopt_hyperparameters(const std::map<std::string, float>& options,
                             const std::vector<std::map<std::string, float>>& groups) override;
  SGDOptions options_;
  std::vector<SGDOptions> groups_;  // their lr is the base's group_lr
};

}  // namespace xgrad::optim
