// The copy/shift task of the examples: random token sequences; at every position t the model
// must name the tokens found at fixed offsets before it (t-1, t-2, ...). Positions before the
// start have no answer (target kIgnore, ignored by the loss and by accuracy). The
// head-specialization example uses four offsets, the gradient-flow example one (the previous
// token).
// Shapes: B batch, T sequence length, K number of offsets.
#pragma once

#include <cstdint>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"

namespace tasks {

constexpr std::int64_t kIgnore = xgrad::kIgnoreIndex;

struct ShiftTask {
  std::size_t vocab = 16;
  std::size_t seq_len = 16;
  std::vector<std::size_t> offsets = {1, 2, 3, 4};
};

struct ShiftBatch {
  xgrad::IndexArray tokens;   // (B, T), uniform over the vocabulary
  xgrad::IndexArray targets;  // (B, T, K): tokens[b, t - offsets[k]], or kIgnore when t < offsets[k]
};

// Throws xgrad::Error for an empty vocabulary, no offsets, a zero offset or an offset not
// smaller than the sequence length.
void validate(const ShiftTask& task);

ShiftBatch make_batch(const ShiftTask& task, std::size_t batch, xgrad::Generator& gen);

}  // namespace tasks
