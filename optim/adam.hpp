// Adam and AdamW, following torch.optim.Adam / AdamW (t counts this parameter's updates):
//   Adam:  g = grad + weight_decay * p                (L2 penalty folded into the gradient)
//   AdamW: p = p * (1 - lr * weight_decay); g = grad  (decoupled weight decay)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

struct AdamOptions {
  explicit AdamOptions(float lr = 1e-3f) : lr_(lr) {}
  XGRAD_REQUIRED_ARG(float, lr);
  XGRAD_ARG(float, beta1, 0.9f);
  XGRAD_ARG(float, beta2, 0.999f);
  XGRAD_ARG(float, eps, 1e-8f);
  XGRAD_ARG(float, weight_decay, 0.f);  // AdamW's default is 0.01: see AdamW
};

class Adam : public Optimizer {
 public:
  Adam(NamedTensors params, const AdamOptions& options);
  Adam(const std::vector<Tensor>& params, const AdamOptions& options);
  // The options in use (lr as lr() gives it).
  AdamOptions options() const { return AdamOptions(options_).lr(lr()); }

 protected:
  Adam(NamedTensors params, const AdamOptions& options, bool decoupled, const char* who);
  Adam(const std::vector<Tensor>& params, const AdamOptions& options, bool decoupled, const char* who);

 private:
  void validate(const AdamOptions& o) const;
  void update(Array& param, const Array& grad, ParamState& state) override;
  void check_slot(const std::string& key, std::size_t k, const Array& value) const override;
  std::vector<std::pair<std::string, float>> hyperparameters() const override;
  void set_hyperparameters(const std::map<std::string, float>& values) override;
  AdamOptions options_;
  bool decoupled_;
};

// Adam with decoupled weight decay. Options default to weight_decay 0.01 as in PyTorch.
class AdamW : public Adam {
 public:
  static AdamOptions defaults(float lr = 1e-3f) { return AdamOptions(lr).weight_decay(0.01f); }
  AdamW(NamedTensors params, const AdamOptions& options = defaults());
  AdamW(const std::vector<Tensor>& params, const AdamOptions& options = defaults());
};

}  // namespace xgrad::optim
