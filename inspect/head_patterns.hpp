// Statistics and detectors of attention heads, computed from attention patterns (the
// attentions' "pattern" points, or AttentionOutput::weights): arrays (B, H, T, S) whose row
// (b, h, t) is query t's distribution over keys 0..S-1, with queries and keys at the same
// positions (self-attention, S = T). The key t - o is "offset o" from query t. The detectors
// read any such pattern; head_statistics is for causal attention (no weight after the query).
#pragma once

#include <cstddef>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::inspect {

/// The statistics of one attention head over causal patterns (see head_statistics).
struct HeadStatistics {
  /// offset_mass[o]: mean weight on the key o positions back, over the queries t >= o
  /// (o from 0 to T-1).
  std::vector<double> offset_mass;
  /// argmax of offset_mass. Large offsets rest on few queries: a first-token head has mass 1 at
  /// offset T-1, from the last query alone (first_token_scores names such a head).
  std::size_t dominant_offset = 0;
  double dominant_mass = 0;  ///< offset_mass[dominant_offset]
  /// Over the queries t >= dominant_offset: the fraction whose largest weight falls on key
  /// t - dominant_offset.
  double argmax_fraction = 0;
  /// Over the queries t >= dominant_offset: the mean of each query's largest weight.
  double confidence = 0;
  /// The entropy, in nats (-sum p log(p + 1e-9)), of the distribution averaged over a sequence's
  /// queries first, then averaged over sequences. High for an offset head, whose sharp rows point
  /// at different keys.
  double entropy = 0;
  /// The mean over queries of each row's own entropy (in nats, as entropy's). Low for any sharp
  /// head.
  double query_entropy = 0;
};

/// The statistics of head h over one or more patterns of one attention (batches of the same T).
/// Throws for no patterns, a pattern that is not (B, H, T, T), patterns that differ in heads or
/// length, a head past H, and a weight above 1e-6 on a key after its query (not causal).
HeadStatistics head_statistics(const std::vector<Array>& patterns, std::size_t head);
/// Every head's statistics of one pattern.
std::vector<HeadStatistics> head_statistics(const Array& pattern);

// Detectors: one score per head, each in [0, 1], averaged over the batch's queries. Each throws
// for a pattern that is not (B, H, T, T) with T > 0.

/// Per head, in [0, 1]: the mean weight on key t - o over the queries t >= o (o = `offset`).
/// Throws for an offset >= T.
std::vector<double> offset_scores(const Array& pattern, std::size_t offset);
/// Per head, in [0, 1]: offset_scores(pattern, 1), the weight on the previous token (throws for
/// T < 2).
std::vector<double> previous_token_scores(const Array& pattern);
/// Per head, in [0, 1]: the mean weight on key 0 over the queries t >= 1 ("attention sink";
/// query 0 has no other key under a causal mask). Throws for T < 2.
std::vector<double> first_token_scores(const Array& pattern);
/// Per head, in [0, 1]: for each query t whose token occurred before at positions j with
/// j + 1 < t, the total weight on the keys j + 1 (the tokens that followed the earlier
/// occurrences), averaged over such queries; ids (B, T). 0 when no query has an earlier
/// occurrence. Throws for ids of another shape.
std::vector<double> induction_scores(const Array& pattern, const IndexArray& ids);
/// Per head, in [0, 1]: the best offset_scores over offsets 0 to T/2 (each averaged over at
/// least half the queries, so that a first-token head does not score 1 at offset T-1), with that
/// offset in best_offsets when asked.
std::vector<double> fixed_offset_scores(const Array& pattern, std::vector<std::size_t>* best_offsets = nullptr);

}  // namespace xgrad::inspect
