// Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay,
// following torch.optim.SGD:
//   g = grad + weight_decay * p
//   b = g at the first step, then b = momentum * b + (1 - dampening) * g
//   g = nesterov ? g + momentum * b : b          (when momentum > 0)
//   p = p - lr * g
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

struct SGDOptions {
  explicit SGDOptions(float lr) : lr_(lr) {}
  XGRAD_REQUIRED_ARG(float, lr);
  XGRAD_ARG(float, momentum, 0.f);
  XGRAD_ARG(float, dampening, 0.f);
  XGRAD_ARG(float, weight_decay, 0.f);
  XGRAD_ARG(bool, nesterov, false);
};

class SGD : public Optimizer {
 public:
  SGD(NamedTensors params, const SGDOptions& options);
  SGD(const std::vector<Tensor>& params, const SGDOptions& options);
  // The options in use (lr as lr() gives it).
  SGDOptions options() const { return SGDOptions(options_).lr(lr()); }

 private:
  void validate(const SGDOptions& o) const;
  void update(Array& param, const Array& grad, ParamState& state) override;
  std::vector<std::pair<std::string, float>> hyperparameters() const override;
  void set_hyperparameters(const std::map<std::string, float>& values) override;
  SGDOptions options_;
};

}  // namespace xgrad::optim
