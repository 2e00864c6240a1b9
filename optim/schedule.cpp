// Warm-up and decay schedules.
#include "xgrad/optim/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/optim/optimizer.hpp"

namespace xgrad::optim {

LrSchedule::LrSchedule(const ScheduleOptions& o) : options_(o) {
  check_range("LrSchedule", "base_lr", o.base_lr(), 0.0, 1e30);
  check_range("LrSchedule", "min_lr", o.min_lr(), 0.0, o.base_lr());
  if (o.decay() != Decay::constant && o.total_steps() <= o.warmup_steps()) {
    fail("LrSchedule: decay needs total_steps (", o.total_steps(), ") greater than warmup_steps (", o.warmup_steps(),
         ")");
  }
}

float LrSchedule::lr(std::size_t s) const {
  const auto& o = options_;
  if (s < o.warmup_steps()) return o.base_lr() * static_cast<float>(s + 1) / static_cast<float>(o.warmup_steps());
  if (o.decay() == Decay::constant) return o.base_lr();
  const double q = std::clamp(
      static_cast<double>(s - o.warmup_steps()) / static_cast<double>(o.total_steps() - o.warmup_steps()), 0.0, 1.0);
  const double span = o.base_lr() - o.min_lr();
  const double pi = 3.14159265358979323846;
  const double f = o.decay() == Decay::linear ? 1.0 - q : 0.5 * (1.0 + std::cos(pi * q));
  return static_cast<float>(o.min_lr() + span * f);
}

}  // namespace xgrad::optim
