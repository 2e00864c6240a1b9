// Logit lens for the language model: what the model would predict if it stopped after each
// block. The residual stream after the embedding and after every block goes through the final
// norm (Pre-Norm models; Post-Norm streams are normalized already) and the output head.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::inspect {

/// What the model predicts from one read-out point of the residual stream.
struct LensLayer {
  std::string point;  ///< "embed", then "blocks.N.stream_out"
  double loss = 0;    ///< mean next-token cross-entropy against the targets (kIgnoreIndex skipped)
  IndexArray top;     ///< (B, T, k): the k likeliest tokens at each position, likeliest first
  Array top_prob;     ///< (B, T, k): their probabilities
};

/// One entry per read-out point, from one forward of ids (B, T) in eval mode without recording
/// (the model's mode is restored). The last entry's loss is the model's own loss. Throws for a
/// top_k outside [1, vocab_size], targets of another shape than ids, and a target outside the
/// vocabulary other than kIgnoreIndex.
std::vector<LensLayer> logit_lens(nn::LanguageModel& model, const IndexArray& ids, const IndexArray& targets,
                                  std::size_t top_k = 5);

}  // namespace xgrad::inspect
