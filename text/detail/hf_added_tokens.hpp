/// @file
/// tokenizer.json's added tokens, matched whole in a text before the normalizer and the
/// pre-tokenizer see it (an internal header of text/).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xgrad::text::detail {

/// One entry of tokenizer.json's "added_tokens".
struct HfAddedToken {
  std::int64_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = true;    ///< matched in the normalized text (with its normalized content)
  bool lstrip = false;       ///< the whitespace before a match is dropped
  bool rstrip = false;       ///< the whitespace after a match is dropped
  bool single_word = false;  ///< matched only where no word character touches it
};

/// A part of a text (a view into it): plain text, or the match of an added token (token >= 0, an
/// index into the matcher's list).
struct HfSection {
  std::string_view text;
  int token = -1;
};

/// Texts matched whole: at the earliest position, the longest text that starts there (Hugging
/// Face's leftmost-longest matching); a single_word text whose match touches a word character is
/// skipped (tokenizers' added_vocabulary.rs). A byte trie, read-only once built.
class HfAddedTokenMatcher {
 public:
  /// Adds `text` as the token of index `token` (its options in `tokens[token]`).
  void add(std::string_view text, int token);
  bool empty() const { return nodes_.size() == 1; }
  /// `text` cut into plain sections and matches (views into `text`), then the whitespace next to an lstrip / rstrip
  /// match removed from the plain sections beside it (JavaScript's trim, as Hugging Face's
  /// JavaScript tokenizers do).
  std::vector<HfSection> split(std::string_view text, const std::vector<HfAddedToken>& tokens) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;  // sorted by byte
    int token = -1;
  };
  int child(int node, unsigned char byte) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> starts_{};  // the first bytes of the texts: elsewhere no match can start
  std::vector<std::string> texts_;  // by token index, for lengths
};

}  // namespace xgrad::text::detail
