// Batches of the copy/shift task.
#include "common/shift_task.hpp"

#include "xgrad/core/error.hpp"

namespace tasks {

void validate(const ShiftTask& task) {
  if (task.vocab < 2) xgrad::fail("ShiftTask: vocabulary size ", task.vocab, " must be at least 2");
  if (task.offsets.empty()) xgrad::fail("ShiftTask: no offsets given");
  for (std::size_t k : task.offsets) {
    if (k == 0 || k >= task.seq_len) {
      xgrad::fail("ShiftTask: offset ", k, " must be between 1 and the sequence length ", task.seq_len, " minus 1");
    }
  }
}

ShiftBatch make_batch(const ShiftTask& task, std::size_t batch, xgrad::Generator& gen) {
  const std::size_t T = task.seq_len, K = task.offsets.size();
  ShiftBatch out{xgrad::IndexArray::from_shape({batch, T}), xgrad::IndexArray::from_shape({batch, T, K})};
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t t = 0; t < T; ++t) out.tokens(b, t) = static_cast<std::int64_t>(gen.below(task.vocab));
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t o = task.offsets[k];
        out.targets(b, t, k) = t >= o ? out.tokens(b, t - o) : kIgnore;
      }
    }
  }
  return out;
}

}  // namespace tasks
