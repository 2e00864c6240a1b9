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

struct HeadStatistics {
  // offset_mass[o]: mean weight on the key o positions back, over the queries t >= o
  // (o = 0 .. T-1).
  std::vector<double> offset_mass;
  // argmax of offset_mass. Large offsets rest on few queries: a first-token head has mass 1 at
  // offset T-1, from the last query alone (first_token_scores names such a head).
  std::size_t dominant_offset = 0;
  double dominant_mass = 0;  // offset_mass[dominant_offset]
  // Over the queries t >= dominant_offset: the fraction whose largest weight falls on key
  // t - dominant_offset, and the mean of each query's largest weight.
  double argmax_fraction = 0;
  double confidence = 0;
  // Two entropies, in nats, with the 1e-9 of -sum p log(p + 1e-9):
  // entropy: of the distribution averaged over a sequence's queries first, then averaged over
  // sequences. High for an offset head, whose sharp rows point at different keys.
  double entropy = 0;
  // query_entropy: the mean over queries of each row's own entropy. Low for any sharp head.
  double query_entropy = 0;
};

// The statistics of head h over one or more patterns of one attention (batches of the same T).
// Throws for a weight above 1e-6 on a key after its query (not causal).
HeadStatistics head_statistics(const std::vector<Array>& patterns, std::size_t head);
// Every head's statistics of one pattern.
std::vector<HeadStatistics> head_statistics(const Array& pattern);

// Detectors: one score per head, each in [0, 1], averaged over the batch.
//   offset_scores(p, o):       mean weight on key t - o over the queries t >= o.
//   previous_token_scores(p):  offset_scores(p, 1).
//   first_token_scores(p):     mean weight on key 0 over the queries t >= 1 ("attention sink";
//                              query 0 has no other key under a causal mask).
//   induction_scores(p, ids):  for each query t whose token occurred before at positions j with
//                              j + 1 < t, the total weight on the keys j + 1 (the tokens that
//                              followed the earlier occurrences), averaged over such queries;
//                              ids (B, T). 0 when no query has an earlier occurrence.
//   fixed_offset_scores(p):    the best offset_scores over offsets 0 .. T/2 (each averaged over
//                              at least half the queries, so that a first-token head does not
//                              score 1 at offset T-1), with that offset in best_offsets when
//                              asked.
std::vector<double> offset_scores(const Array& pattern, std::size_t offset);
std::vector<double> previous_token_scores(const Array& pattern);
std::vector<double> first_token_scores(const Array& pattern);
std::vector<double> induction_scores(const Array& pattern, const IndexArray& ids);
std::vector<double> fixed_offset_scores(const Array& pattern, std::vector<std::size_t>* best_offsets = nullptr);

}  // namespace xgrad::inspect
