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
/// or added token's entry is its text. merges[r] = (left id, right id) is the merge of rank r (lower
/// merges first), and tokens[left] + tokens[right] is itself a token. special_tokens lists the ids
/// of the special tokens, which encode never builds from ordinary text.
///
/// added_tokens, matched_later and ignore_merges hold what a Hugging Face tokenizer.json may add to
/// a byte-level BPE (GPT-2's files and a trained vocabulary leave them empty and false):
/// - added_tokens: the ids of tokens whose text encode matches whole in any text before the BPE
///   sees it (tokenizer.json's added tokens that are not special). Such a token is also an
///   ordinary token of the BPE when it is a single byte or a merge makes it and no other ordinary
///   token has its bytes; otherwise, like a special token, no merge builds or uses it.
/// - matched_later: ids among special_tokens and added_tokens whose texts are matched only in the
///   text between the others' matches (Hugging Face matches the added tokens with "normalized":
///   false first, then those with true); empty when all are matched in one pass.
/// - ignore_merges: a piece of the pre-tokenizer that is itself an ordinary token gives that
///   token's id without merging (tokenizer.json's model.ignore_merges).
struct BpeVocabulary {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::int64_t, std::int64_t>> merges;
  std::vector<std::int64_t> special_tokens;
  std::vector<std::int64_t> added_tokens;
  std::vector<std::int64_t> matched_later;
  bool ignore_merges = false;
};

}  // namespace xgrad::text
