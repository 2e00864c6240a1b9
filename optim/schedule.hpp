// Learning-rate schedules: linear warm-up, then constant, linear or cosine decay.
//   step s < warmup:  lr = base * (s + 1) / warmup
//   afterwards, with q = (s - warmup) / (total - warmup) clamped to [0, 1]:
//     constant: lr = base
//     linear:   lr = min + (base - min) * (1 - q)
//     cosine:   lr = min + (base - min) * (1 + cos(pi q)) / 2
#pragma once

#include <cstddef>

#include "xgrad/core/arg.hpp"

namespace xgrad::optim {

enum class Decay { constant, linear, cosine };

struct ScheduleOptions {
  explicit ScheduleOptions(float base_lr) : base_lr_(base_lr) {}
  XGRAD_REQUIRED_ARG(float, base_lr);
  XGRAD_ARG(std::size_t, warmup_steps, 0);
  XGRAD_ARG(std::size_t, total_steps, 0);  // needed by linear and cosine decay
  XGRAD_ARG(Decay, decay, Decay::constant);
  XGRAD_ARG(float, min_lr, 0.f);
};

class LrSchedule {
 public:
  explicit LrSchedule(const ScheduleOptions& options);
  // The learning rate for step s (0-based: the rate of the first update is lr(0)).
  float lr(std::size_t step) const;

 private:
  ScheduleOptions options_;
};

}  // namespace xgrad::optim
