/// @file
/// A byte-level BPE vocabulary in raw bytes: what GPT-2's vocab.json + merges.txt and a trained
/// vocabulary both are, before any tokenizer is built on it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xgrad::text {

/// tokens[id] is the token's raw bytes (not GPT-2's printable byte-to-character form); a special
/// token's entry is its text. merges[r] = (left id, right id) is the merge of rank r (lower merges
/// first), and tokens[left] + tokens[right] is itself a token. special_tokens lists the ids of the
/// special tokens, which encode never builds from ordinary text.
struct BpeVocabulary {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::int64_t, std::int64_t>> merges;
  std::vector<std::int64_t> special_tokens;
};

}  // namespace xgrad::text
