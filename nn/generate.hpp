// What LanguageModel::generate takes and gives: its options and the result with attention weights.
// Shapes: H heads, Q the positions that ran as queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::nn {

/// What generate does when the sequence outgrows max_len.
enum class PastMaxLen {
  slide,  ///< the context drops its oldest tokens (see window_keep) and goes on
  /// Generate refuses, before any work, a prompt and count that need more than max_len
  /// positions (every token but the last runs: prompt + count - 1 positions).
  error,
};

/// How LanguageModel::generate picks tokens and treats its context.
struct GenerateOptions {
  float temperature = 1.f;  ///< 0 picks the most likely token (greedy); must be >= 0
  std::size_t top_k = 0;    ///< sample among the k most likely tokens; 0 means all
  /// With the cache the prompt runs once and then each new token runs alone, attending to the
  /// cached keys and values of the context; without it the whole context runs for every token.
  /// Both give the same tokens (up to float rounding). A model with hooks attached runs without
  /// the cache: its hook points then see whole contexts, as without one.
  bool use_cache = true;
  PastMaxLen past_max_len = PastMaxLen::slide;  ///< what happens past max_len
  /// The context is the tokens the model sees, at most max_len. When it is full and a new token
  /// must be fed, the context becomes its last window_keep tokens and the new one (window_keep 0:
  /// max_len / 2; must be less than max_len), and the cache is rebuilt from them.
  /// window_keep = max_len - 1 slides the context by one token, which recomputes all of it for
  /// every token past max_len (no faster than without the cache).
  std::size_t window_keep = 0;
};

/// What LanguageModel::generate_with_attention returns.
struct Generation {
  std::vector<std::int64_t> tokens;  ///< the prompt, then the generated tokens
  /// attention[l] (H, Q, Q), Q = tokens.size() - 1: block l's weights for every token but the last.
  /// Row p holds query p's weights over the absolute key positions it saw (zero outside its
  /// context), from the first context it ran in; rows of prompt tokens that never ran (a prompt
  /// longer than max_len) are zero. Empty when count is 0.
  std::vector<Array> attention;
};

}  // namespace xgrad::nn
