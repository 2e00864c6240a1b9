/// @file
/// GPT-2's pre-tokenization: the text split into the pieces that byte-level BPE merges within
/// (contractions, words with their leading space, numbers, punctuation runs, whitespace), by
/// GPT-2's own pattern run in PCRE2 with Unicode classes.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

namespace xgrad::text {

/// GPT-2's pattern: @verbatim 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ @endverbatim
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer();   ///< compiles the pattern (JIT where PCRE2 has it)
  ~Gpt2Pretokenizer();  ///< frees the compiled pattern
  Gpt2Pretokenizer(const Gpt2Pretokenizer&) = delete;
  Gpt2Pretokenizer& operator=(const Gpt2Pretokenizer&) = delete;

  /// The pieces of `text`, in order, covering it exactly (their concatenation is `text`). Bytes
  /// that are not valid UTF-8 match no class: each run of them becomes a piece of its own.
  /// Safe to call from several threads at once.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xgrad::text
