// Measuring one TransformerBlock on random input: the time of a training step (against the same
// block with one head of width C) and the bytes a forward keeps for backward.
// Shapes: B batch, T length, C d_model, H heads.
#pragma once

#include <cstdint>
#include <utility>

#include "sizes.hpp"

namespace claims {

struct StepOptions {
  std::size_t batch = 8, seq_len = 128;
  std::size_t steps = 7;  // timed steps, after one untimed warm-up step
  float dropout = 0.1f;   // attention weights and FFN hidden, as in the article's module
  bool causal = true;
  std::uint64_t seed = 0;
};

// Medians over the timed steps of one Pre-Norm TransformerBlock on random input:
// forward + backward of mean(block(x)), and the AdamW update that follows.
struct StepTimes {
  double forward_backward_ms = 0, optimizer_ms = 0;
};
// The block of `size` and the same block with one head of width C, their steps alternating, so
// the load of a shared machine falls on both alike. Returns {H heads, 1 head}.
std::pair<StepTimes, StepTimes> time_block_steps(const BlockSize& size, const StepOptions& options);

// Heap bytes (glibc's mallinfo2) that one training-mode forward of the block leaves allocated
// until backward: the activations the tape holds, plus the block's output.
double measured_activation_bytes(const BlockSize& size, const StepOptions& options);

// The attention-weight bytes the measurements imply: the bytes that grow with H, from
// m_H = rest + H w and m_1 = rest + w, so H w = H (m_H - m_1) / (H - 1). 0 for H = 1.
double measured_attention_weight_bytes(double bytes_h_heads, double bytes_one_head, std::size_t heads);

}  // namespace claims
