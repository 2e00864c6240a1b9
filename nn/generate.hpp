// What LanguageModel::generate takes and gives: the sampling, stopping and streaming options, the
// logit processing as a free function (next_token_probabilities), and the result with its reason.
// Shapes: V vocabulary, H heads, Q the positions that ran as queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
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

/// How LanguageModel::generate picks tokens, when it stops, what it streams, and how it treats its
/// context. The next token's logits go through Hugging Face's processors in Hugging Face's order
/// (next_token_probabilities): repetition_penalty on the raw logits, then temperature, top_k, top_p
/// and min_p; the defaults leave the distribution as softmax(logits).
struct GenerateOptions {
  float temperature = 1.f;  ///< logits / temperature; 0 picks the most likely token (greedy); must be >= 0
  /// Sample among the k most likely tokens (equal logits: the lower id first); 0 means all.
  std::size_t top_k = 0;
  /// Nucleus sampling: the smallest set of most likely tokens whose probability reaches top_p
  /// (at least one token); in (0, 1], 1 means all.
  float top_p = 1.f;
  /// Keeps the tokens whose probability is at least min_p times the most likely token's; in
  /// [0, 1], 0 means all.
  float min_p = 0.f;
  /// For every id in the sequence so far (the prompt and the tokens generated, also those a
  /// sliding context has dropped), a positive logit is divided by it and a negative one
  /// multiplied: > 1 discourages repeating, < 1 encourages it. Finite and > 0; 1 means none.
  /// Greedy decoding takes the argmax after it.
  float repetition_penalty = 1.f;
  /// Only the ids [0, vocab_limit) can be drawn (greedy included): a tokenizer with fewer tokens
  /// than the model's embedding has rows (padded to a multiple, as many imported models are).
  /// At most the vocabulary; 0 means all.
  std::size_t vocab_limit = 0;
  /// When set, the call draws from its own Generator(*seed), not from the Generator it is given
  /// (which is then left as it was): the same seed gives the same tokens whatever ran before.
  std::optional<std::uint64_t> seed = std::nullopt;

  /// Generation ends after emitting one of these ids (it is kept in the output). Each must be in
  /// [0, vocab_size).
  std::vector<std::int64_t> stop_tokens = {};
  /// Generation ends when decode(new tokens), the text of the tokens generated so far, contains
  /// one of these (matched across token boundaries); the output keeps the tokens up to and
  /// including the one that completed the match. None may be empty; they need decode.
  std::vector<std::string> stop_strings = {};
  /// The text of the generated ids (the prompt's are not given), e.g. a tokenizer's decode; nn
  /// knows no tokenizer (text/ is not among its dependencies), hence a function. With stop_strings
  /// or on_token it runs on all the new ids after every token (n calls over n tokens, each on the
  /// whole new text); otherwise once, for Generation::text. Needed by stop_strings.
  std::function<std::string(const std::vector<std::int64_t>& ids)> decode = nullptr;
  /// Called after every new token with its id and its piece, the text it adds: decode's new bytes,
  /// whole UTF-8 characters only. Bytes that end inside a character, or a trailing U+FFFD (how
  /// Hugging Face's and SentencePiece's decoders show a partial character), are held back until
  /// the next token, and the last token's piece (count reached, a stop token or string) holds
  /// everything left, so the pieces concatenate to the decoded text (Generation::text). A decode
  /// that changes bytes it gave before (not only completing a character) gets empty pieces until
  /// its text begins again with what was given. Without decode every piece is empty. Returning
  /// false stops generation after this token; bytes held back then are in Generation::text only.
  std::function<bool(std::int64_t id, const std::string& piece)> on_token = nullptr;

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

/// Why generation ended. When several hold on the same token, the first listed here is given.
enum class StopReason {
  stop_token,   ///< the last token is one of stop_tokens
  stop_string,  ///< the decoded new text contains one of stop_strings
  callback,     ///< on_token returned false
  length,       ///< count tokens were generated (also for a count of 0)
};

/// What LanguageModel::generate_with_details and generate_with_attention return.
struct Generation {
  std::vector<std::int64_t> tokens;      ///< the prompt, then the generated tokens
  std::size_t prompt_size = 0;           ///< the prompt's length: tokens[prompt_size ..] are new
  StopReason stop = StopReason::length;  ///< why generation ended
  /// The index in stop_strings of the one the decoded new text contains (the first listed, if
  /// several); empty when none does.
  std::optional<std::size_t> stop_string;
  /// decode(the new tokens) when GenerateOptions::decode is given, else empty.
  std::string text;
  /// attention[l] (H, Q, Q), Q = tokens.size() - 1: block l's weights for every token but the last.
  /// Row p holds query p's weights over the absolute key positions it saw (zero outside its
  /// context), from the first context it ran in; rows of prompt tokens that never ran (a prompt
  /// longer than max_len) are zero. Empty when no token was generated, and from
  /// generate_with_details.
  std::vector<Array> attention;
};

/// The distribution generate draws the next token from: `logits` (V values) through vocab_limit,
/// repetition_penalty (over the ids of `context`, the sequence so far), temperature, top_k, top_p
/// and min_p of `options` (the others are not read), as V probabilities that sum to 1 (0 for the
/// tokens the filters removed). Greedy (temperature 0): 1 for the most likely token after the
/// penalty (the lowest id of equal maxima). A NaN or +inf logit, a context id outside [0, V), a
/// sampling option out of its range, and logits that are all -inf throw.
std::vector<double> next_token_probabilities(const std::vector<float>& logits, const std::vector<std::int64_t>& context,
                                             const GenerateOptions& options);

}  // namespace xgrad::nn
