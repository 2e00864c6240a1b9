// Refusing a configuration that cannot fit before anything is allocated: a rough upper estimate
// of a transformer training step's memory, and the memory this process may use.
#pragma once

#include <cstdint>
#include <string>

#include "xgrad/core/io/memory.hpp"

namespace cli {

// The sizes that decide a transformer training step's memory. Shapes: B batch, T length,
// C d_model, H heads, F feed-forward width, V vocabulary (or output classes per position), L layers.
struct TransformerSize {
  double layers = 0, d_model = 0, heads = 0, d_ff = 0, vocab = 0, batch = 0, seq_len = 0;
  double outputs_per_position = 1;  // logits of V per position, times this
};

// Parameters (with gradient and two AdamW moments) plus the activations a step keeps for backward
// and their gradients:
//   4 P + 2 B T (L (12 C + 3 H T + 3 F) + 3 V k)   float32 values, k = outputs_per_position,
// with P = V C + T C + L (4 C^2 + 2 C F). Computed in double, so absurd sizes give a huge number
// instead of wrapping around.
double transformer_training_bytes(const TransformerSize& s);

// Bytes this process may use: physical memory, or less under a RLIMIT_AS limit.
double memory_limit_bytes();

// Throws cli::UsageError when `bytes` exceeds memory_limit_bytes(), naming `what` and both sizes.
void check_memory(double bytes, const std::string& what);

// What a run keeps for every step it takes (losses, log rows, plot points and their SVG text):
// `steps` x `bytes_per_step`, for the memory check of --steps.
inline double per_step_bytes(double steps, double bytes_per_step) { return steps * bytes_per_step; }

// "1.5 GiB", "300.0 MiB": the library's.
using xgrad::bytes_str;

}  // namespace cli
