// Activation patching on the shift task: which head carries the token o positions back?
// Corrupt the token at one position p of every held-out sequence, then run the corrupted
// sequences again with one head's output (its slice of the attention's "context" point, at
// every position) taken from the clean run. The prediction for offset o at position p + o
// names the token at p: it is restored when the patched head is the one that moves that token.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis.hpp"
#include "xgrad/inspect/patching_sweep.hpp"

namespace headspec {

struct PatchingTable {
  std::size_t position = 0;  // p, the corrupted position
  // restored[i][k]: over the held-out sequences, the fraction whose prediction for offset k at
  // p + offsets[k] is the clean token at p, with head i (heads of all layers, in order) patched.
  std::vector<std::vector<double>> restored;
  std::vector<double> clean, corrupted;  // the same fraction with no patch, clean and corrupted
};

// p is the largest position from which every offset's p + o is still in the sequence.
PatchingTable patch_each_head(OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data,
                              std::uint64_t seed);

// Attribution patching against the real sweep of every head at every position, on the first
// held-out batch with the token at p corrupted as above. The metric is differentiable: the
// clean token's logit, averaged over the batch, at each prediction that reads position p
// (offset o at p + o), summed over the offsets.
struct AttributionAgreement {
  double correlation = 0;                             // over heads x positions
  double sweep_seconds = 0, attribution_seconds = 0;  // wall time of each
  xgrad::inspect::SweepResult sweep, estimate;        // the two tables (the viewer shows them)
};
AttributionAgreement compare_attribution(OffsetModel& model, const ShiftTask& task, const ShiftBatch& batch,
                                         std::uint64_t seed);

// True when each offset is restored (>= 0.9) by exactly one head, the one whose dominant offset
// it is, and every other head restores it at most 0.1.
bool each_offset_restored_by_its_own_head(const ShiftTask& task, const std::vector<HeadStats>& heads,
                                          const PatchingTable& table);

}  // namespace headspec
