// Evaluation only: a model's next-token loss over a long run of tokens, read a window at a time.
#pragma once

#include <cstdint>
#include <functional>

#include "xgrad/nn/transformer.hpp"

namespace xgrad::nn {

/// How evaluate cuts the tokens into windows.
struct EvaluateOptions {
  std::size_t seq_len = 0;  ///< positions per window; 0: the model's max_len
  std::size_t batch = 8;    ///< windows per forward
};

/// What evaluate returns: the summed loss and the tokens it was summed over.
struct Evaluation {
  double nats = 0;         ///< next-token cross-entropy summed over every predicted token
  std::size_t tokens = 0;  ///< the tokens predicted
  /// Mean nats per predicted token.
  double nats_per_token() const { return tokens ? nats / static_cast<double>(tokens) : 0.0; }
  /// exp(nats_per_token()).
  double perplexity() const;
  /// Bits per byte: the summed loss in bits over `bytes`, the bytes of the predicted tokens' text,
  /// so that models with different tokenizers compare.
  double bits_per_byte(double bytes) const;
};

/// The model's next-token loss over tokens 0 .. num_tokens - 1, which `read(offset, n, out)` copies
/// into out[0, n): windows of seq_len tokens predict the seq_len tokens after their first, without
/// overlap (as perplexity with a stride of seq_len), so every token but the first is predicted once,
/// from at most seq_len tokens of context; the last window may be shorter. In eval mode (restored
/// after) and without recording. Fewer than 2 tokens, a seq_len past max_len and a batch of 0 are
/// Errors; an id outside the vocabulary is the forward's Error.
Evaluation evaluate(LanguageModel& model, std::size_t num_tokens,
                    const std::function<void(std::size_t offset, std::size_t n, std::int64_t* out)>& read,
                    const EvaluateOptions& options = {});

}  // namespace xgrad::nn
