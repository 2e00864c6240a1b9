// The head-count experiment: at one d_model, models with 1, 2, 4, ... heads (so the head size
// D = d_model / H shrinks as H grows) train for the same steps, from the same initial weights, on
// the same FINITE training set of shift-task sequences, epoch after epoch; a held-out set of fresh
// sequences measures what generalizes. The task asks for the tokens at K offsets at once (K
// relations), so head counts below K and above it can be told apart.
// Shapes: B batch, T length, K offsets, V vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/shift_task.hpp"

namespace claims {

struct HeadsConfig {
  std::size_t d_model = 64, layers = 1;
  std::vector<std::size_t> head_counts = {1, 2, 4, 8, 16, 32};
  tasks::ShiftTask task{16, 16, {1, 2, 3, 4, 5, 6, 7, 8}};
  std::size_t train_size = 512, val_size = 1024;  // sequences
  std::size_t steps = 2000, batch = 32;
  float lr = 3e-3f, weight_decay = 0.01f;  // AdamW, constant rate
  std::vector<std::uint64_t> seeds = {0};
};

// Throws xgrad::Error naming the impossible setting (by its command-line flag).
void validate(const HeadsConfig& config);

struct HeadsRun {
  std::size_t heads = 0, head_size = 0;
  std::uint64_t seed = 0;
  std::size_t params = 0;
  std::vector<float> losses;                  // the training batches' losses, one per step
  double train_loss = 0, train_accuracy = 0;  // the whole training set, after training
  double val_loss = 0, val_accuracy = 0;      // the held-out set, after training
  double seconds = 0;                         // the training loop's wall time
  double epochs = 0;                          // passes over the training set
  double gap() const { return val_loss - train_loss; }
};

// One model: `heads` heads, weights, data and batch order from `seed`.
HeadsRun run_heads(const HeadsConfig& config, std::size_t heads, std::uint64_t seed);

// Every head count for every seed, in that order; on_done sees each run as it ends.
std::vector<HeadsRun> run_head_sweep(const HeadsConfig& config,
                                     const std::function<void(const HeadsRun&)>& on_done = {});

}  // namespace claims
