// Learning-rate schedules: linear warm-up, then constant, linear or cosine decay.
#pragma once

#include <cstddef>

#include "xgrad/core/arg.hpp"

namespace xgrad::optim {

/// How the learning rate goes after the warm-up: constant (stays at base_lr), or a linear or
/// cosine decay to min_lr at total_steps (see LrSchedule).
enum class Decay { constant, linear, cosine };

/// The options of LrSchedule, set as in ScheduleOptions(3e-4f).warmup_steps(100).total_steps(5000).
struct ScheduleOptions {
  /// The peak learning rate `base_lr`, with no warm-up and no decay.
  explicit ScheduleOptions(float base_lr) : base_lr_(base_lr) {}
  /// The rate after the warm-up: in [0, 1e30].
  XGRAD_REQUIRED_ARG(float, base_lr);
  /// The steps of the linear warm-up (0 for none).
  XGRAD_ARG(std::size_t, warmup_steps, 0);
  /// The step at which the decay ends: needed by linear and cosine decay (> warmup_steps).
  XGRAD_ARG(std::size_t, total_steps, 0);
  XGRAD_ARG(Decay, decay, Decay::constant);
  /// The rate the decay ends at: in [0, base_lr].
  XGRAD_ARG(float, min_lr, 0.f);
};

/// A learning-rate schedule: linear warm-up, then constant, linear or cosine decay. For step s:
///
///     step s < warmup:  lr = base * (s + 1) / warmup
///     afterwards, with q = (s - warmup) / (total - warmup) clamped to [0, 1]:
///       constant: lr = base
///       linear:   lr = min + (base - min) * (1 - q)
///       cosine:   lr = min + (base - min) * (1 + cos(pi q)) / 2
class LrSchedule {
 public:
  /// Throws for a base_lr or min_lr out of range, and for a decay without total_steps greater
  /// than warmup_steps.
  explicit LrSchedule(const ScheduleOptions& options);
  /// The learning rate for step s (0-based: the rate of the first update is lr(0)).
  float lr(std::size_t step) const;

 private:
  ScheduleOptions options_;
};

}  // namespace xgrad::optim
