// Adam and AdamW, following torch.optim.Adam / AdamW.
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

/// The options of Adam and AdamW, set as in AdamOptions(3e-4f).beta2(0.95f).
struct AdamOptions {
  /// The learning rate `lr`, and torch.optim.Adam's defaults for the rest.
  explicit AdamOptions(float lr = 1e-3f) : lr_(lr) {}
  /// The learning rate: finite and >= 0.
  XGRAD_REQUIRED_ARG(float, lr);
  /// The decay of the first moment: in [0, 1).
  XGRAD_ARG(float, beta1, 0.9f);
  /// The decay of the second moment: in [0, 1).
  XGRAD_ARG(float, beta2, 0.999f);
  /// Added to the denominator: finite and > 0.
  XGRAD_ARG(float, eps, 1e-8f);
  /// The weight decay: in [0, 1e30]. AdamW's default is 0.01: see AdamW.
  XGRAD_ARG(float, weight_decay, 0.f);
};

/// Adam, following torch.optim.Adam. The update of Adam and AdamW, where t counts this
/// parameter's updates:
///
///     Adam:  g = grad + weight_decay * p                (L2 penalty folded into the gradient)
///     AdamW: p = p * (1 - lr * weight_decay); g = grad  (decoupled weight decay)
///     m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///     p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
///
/// Its state_dict slots are "exp_avg" (m) and "exp_avg_sq" (v).
class Adam : public Optimizer {
 public:
  /// Adam over named parameters. Throws naming an option outside its range (see AdamOptions),
  /// and for the parameters the Optimizer base refuses.
  Adam(NamedTensors params, const AdamOptions& options);
  /// The same, with the parameters named by their index: "0", "1", ...
  Adam(const std::vector<Tensor>& params, const AdamOptions& options);
  /// Adam over parameter groups, each with the options but those it sets (lr, beta1, beta2,
  /// eps, weight_decay). Throws as above, and for a group the Optimizer base refuses or whose
  /// hyperparameter is out of range, naming the group ("Adam: group 1: beta1 1 is outside [0, 1)").
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options);
  /// The options (the constructor's, or a loaded state's), lr as lr() gives it; each group runs
  /// with its group_options.
  AdamOptions options() const { return AdamOptions(options_).lr(lr()); }
  /// The options group g runs with (lr as group_lr(g) gives it); g out of range throws.
  AdamOptions group_options(std::size_t g) const;

 protected:
  /// Adam (`decoupled` false) or AdamW (true), its type named `who` in messages and state_dict.
  Adam(NamedTensors params, const AdamOptions& options, bool decoupled, const char* who);
  /// The same, with the parameters named by their index.
  Adam(const std::vector<Tensor>& params, const AdamOptions& options, bool decoupled, const char* who);
  /// The same, over parameter groups.
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled, const char* who);

 private:
  void validate(const AdamOptions& o, const std::string& who) const;
  void update(Array& param, const Array& grad, ParamState& state, std::size_t group) override;
  void check_slot(const std::string& key, std::size_t k, const Array& value) const override;
  Hyperparameters hyperparameters() const override;
  Hyperparameters group_hyperparameters(std::size_t g) const override;
  void check_hyperparameters(const std::map<std::string, float>& values, const std::string& who) const override;
  void adopt_hyperparameters(const std::map<std::string, float>& options,
                             const std::vector<std::map<std::string, float>>& groups) override;
  AdamOptions options_;
  std::vector<AdamOptions> groups_;  // their lr is the base's group_lr
  bool decoupled_;
};

/// Adam with decoupled weight decay (the update is Adam's). Options default to weight_decay 0.01
/// as in PyTorch when none are given (defaults()); AdamOptions(lr) alone has weight_decay 0.
class AdamW : public Adam {
 public:
  /// AdamOptions(lr) with weight_decay 0.01, as torch.optim.AdamW has.
  static AdamOptions defaults(float lr = 1e-3f) { return AdamOptions(lr).weight_decay(0.01f); }
  /// AdamW over named parameters; throws as Adam's constructor does.
  AdamW(NamedTensors params, const AdamOptions& options = defaults());
  /// The same, with the parameters named by their index: "0", "1", ...
  AdamW(const std::vector<Tensor>& params, const AdamOptions& options = defaults());
  /// AdamW over parameter groups (see Adam's group constructor), e.g.\ the usual rule of no
  /// decay on norms, biases and embeddings:
  /// `AdamW(decay_groups(nn::split_for_weight_decay(model), 0.1f), AdamOptions(3e-4f))`.
  AdamW(std::vector<ParamGroup> groups, const AdamOptions& options = defaults());
};

}  // namespace xgrad::optim
