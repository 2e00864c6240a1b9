// What the head-specialization example measures after training: accuracy per offset, each
// head's attention statistics by relative offset, two entropies, and head ablations.
// Shapes: B batch, H heads, T query positions, S key positions (S = T).
#pragma once

#include <vector>

#include "offset_model.hpp"
#include "task.hpp"

namespace headspec {

struct Accuracy {
  double overall = 0;
  std::vector<double> per_offset;  // aligned with ShiftTask::offsets
};

struct HeadStats {
  std::size_t layer = 0, head = 0;
  // offset_mass[o]: mean attention weight on the key o positions back (query t, key t - o),
  // over the queries for which that key exists (t >= o). o = 0 .. T-1.
  std::vector<double> offset_mass;
  std::size_t dominant_offset = 0;  // argmax of offset_mass
  double dominant_mass = 0;         // offset_mass[dominant_offset]
  // Over queries with t >= dominant_offset: the fraction whose largest weight falls on key
  // t - dominant_offset, and the mean of each query's largest weight.
  double argmax_fraction = 0;
  double confidence = 0;
  // The seed article's entropy: the head's attention averaged over queries first, then
  // -sum p log(p + 1e-9) (averaged over sequences). High for an offset head, whose sharp rows
  // point at different keys.
  double entropy = 0;
  // Mean over queries of each row's own entropy -sum_s w log(w + 1e-9). Low for a sharp head.
  double query_entropy = 0;
  bool specialized = false;  // argmax_fraction >= 0.9 (Voita et al. 2019's positional heads)
  Accuracy ablated;          // accuracy with this head's output zeroed
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
