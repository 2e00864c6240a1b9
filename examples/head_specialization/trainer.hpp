// Training loop of the head-specialization example: AdamW on fresh random batches, with a
// progress callback.
#pragma once

#include <functional>
#include <vector>

#include "offset_model.hpp"
#include "task.hpp"
#include "xgrad/core/autograd/precision.hpp"

namespace headspec {

struct TrainOptions {
  std::size_t steps = 1500;
  std::size_t batch = 64;
  float lr = 3e-3f;
  float weight_decay = 0.01f;
  std::size_t warmup = 0;  // linear warm-up steps, then constant
  // The precision of each step's forward, loss and backward (an AutocastGuard closed before the
  // optimizer step) and of the measurements after training.
  xgrad::Precision precision = xgrad::Precision::fp32;
};

struct Progress {
  std::size_t step = 0, steps = 0;
  float loss = 0;
  double accuracy = 0;      // on the current training batch
  double tokens_per_s = 0;  // positions processed per second so far
  double seconds = 0, seconds_left = 0;
};

struct TrainResult {
  std::vector<float> losses;  // one per step
  double seconds = 0;         // wall time of the loop
};

// Mean cross-entropy over every (position, offset) with a target.
xgrad::Tensor shift_loss(const xgrad::Tensor& logits, const xgrad::IndexArray& targets);

// A NaN or infinite loss or gradient stops training with an Error naming the step.
TrainResult train(OffsetModel& model, const ShiftTask& task, const TrainOptions& options, xgrad::Generator& data,
                  const std::function<void(const Progress&)>& on_progress = {});

}  // namespace headspec
