/// @file
/// GPT-2's byte-level BPE tokenizer: the text split into GPT-2's pieces, each piece's bytes merged
/// pair by pair in the order of the merges' ranks (the ids GPT-2 and tiktoken give), special
/// tokens matched whole when asked.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "xgrad/text/bpe_vocabulary.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text {

/// Throws an Error starting with `who` unless `vocabulary` can make a tokenizer: the special,
/// added and matched-later ids are in range and distinct, no id both special and added, each
/// matched-later id special or added; no added token has the text of another added or special
/// token; no token is empty; no two ordinary tokens (neither special nor added outside the BPE,
/// see BpeVocabulary) have the same bytes; each of the 256 single bytes is an ordinary token; every
/// merge's parts are ordinary tokens, made by a single byte or by a merge of lower rank, whose
/// concatenation is an ordinary token; no merge repeats another. The message names the id or the
/// rank.
void check_bpe_vocabulary(const BpeVocabulary& vocabulary, const std::string& who);

/// Byte-level BPE over a BpeVocabulary (GPT-2's, or one trained the same way).
///
/// encode splits the text at the added tokens' texts first, and with SpecialText::match at the
/// special tokens' too (matched whole, the earliest occurrence first and the longest at one
/// position; the vocabulary's matched_later ones in a second pass, in the text between the others'
/// matches), then into GPT-2's pieces (Gpt2Pretokenizer), and merges each piece's bytes: the
/// adjacent pair of lowest merge rank first (the leftmost of equals), until no pair is a merge
/// (with ignore_merges, a piece that is an ordinary token is that token at once). Bytes that are
/// not UTF-8 are pieces of their own and give one byte token each, never merged (as the Tokenizer
/// interface says: byte by byte where the text is invalid). Immutable: encode may run on several
/// threads at once.
///
/// special_tokens() gives roles by the special tokens' texts: bos `<s>`, `<bos>`, `<|bos|>`,
/// `<|startoftext|>`, `<|begin_of_text|>`, `[BOS]`; eos `</s>`, `<eos>`, `<|eos|>`, `<|end_of_text|>`,
/// `[EOS]`; pad `<pad>`, `<|pad|>`, `<|padding|>`, `[PAD]`; unk `<unk>`, `<|unk|>`, `[UNK]` (the
/// first text of a list that is present); `<|endoftext|>` is bos and eos where no text above gave
/// them (GPT-2: bos = eos = 50256, no pad, no unk). Only special tokens take roles.
class ByteLevelBpe : public Tokenizer {
 public:
  /// Checks the vocabulary (check_bpe_vocabulary, Errors starting "ByteLevelBpe") and builds the
  /// tables encode uses.
  explicit ByteLevelBpe(BpeVocabulary vocabulary);
  ~ByteLevelBpe() override;
  ByteLevelBpe(const ByteLevelBpe&) = delete;
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  TokenIds encode(std::string_view text, SpecialText specials = SpecialText::as_reference) const override;
  std::string token_bytes(std::int64_t id) const override;
  std::size_t vocab_size() const override;
  SpecialTokens special_tokens() const override;
  std::string kind() const override { return "byte_bpe"; }
  /// {"kind":"byte_bpe","tokens":[...],"merges":[[left,right],...],"special_tokens":[...]}: tokens
  /// by id in GPT-2's printable form (gpt2_byte_encoding.hpp), merges by rank; then
  /// "added_tokens":[...], "matched_later":[...] and "ignore_merges":true only where the vocabulary
  /// has them (so a vocabulary without them keeps its document and identity).
  std::string to_json() const override;

  /// The vocabulary this tokenizer was built from.
  const BpeVocabulary& vocabulary() const;

  /// Rebuilds the tokenizer of to_json's document; a malformed document or vocabulary is an Error
  /// starting with `who` and naming the field.
  static std::unique_ptr<ByteLevelBpe> from_json(std::string_view json, const std::string& who);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xgrad::text
