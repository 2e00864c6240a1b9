// What the head-specialization example measures after training: accuracy per offset, each
// head's attention statistics by relative offset, two entropies, and head ablations.
// Shapes: B batch, H heads, T query positions, S key positions (S = T).
#pragma once

#include <vector>

#include "offset_model.hpp"
#include "task.hpp"
#include "xgrad/inspect/head_patterns.hpp"

namespace headspec {

struct Accuracy {
  double overall = 0;
  std::vector<double> per_offset;  // aligned with ShiftTask::offsets
};

// The library's statistics of one head (inspect/head_patterns.hpp: offset masses, dominant
// offset, argmax fraction, confidence, both entropies) and what this example adds.
struct HeadStats : xgrad::inspect::HeadStatistics {
  std::size_t layer = 0, head = 0;
  bool specialized = false;  // argmax_fraction >= 0.9 (Voita et al. 2019's positional heads)
  // The library's fixed-offset detector over all held-out sequences: the offset and its score.
  std::size_t detected_offset = 0;
  double offset_score = 0;
  Accuracy ablated;                          // accuracy with this head's output zeroed
  std::vector<std::vector<double>> pattern;  // (T, S) attention of the first held-out sequence
};

// A fixed held-out set: `count` batches drawn from their own generator.
std::vector<ShiftBatch> held_out(const ShiftTask& task, std::size_t count, std::size_t batch, std::uint64_t seed);

Accuracy evaluate(const OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data);

// Statistics of every head of every layer, with ablations. Leaves the model as it found it.
std::vector<HeadStats> analyze_heads(OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data);

// True when every offset of the task is the dominant offset of some specialized head (heads
// have one dominant offset each, so those heads are distinct).
bool every_offset_owned(const ShiftTask& task, const std::vector<HeadStats>& heads);

}  // namespace headspec
