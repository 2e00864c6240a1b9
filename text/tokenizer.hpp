/// @file
/// The one interface of every tokenizer: text to ids and back, the bytes of each id (and the
/// readable `to_str_tokens` view of them), the vocabulary size, the special tokens, and an
/// identity that token files and checkpoints store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

/// Text in and out, the library xgrad::text: the tokenizer interface and its tokenizers (bytes,
/// GPT-2's byte-level BPE, a byte-level BPE trained on your files, SentencePiece models), token
/// files and the batch samplers.
namespace xgrad::text {

using TokenIds = std::vector<std::int64_t>;  ///< token ids, as every tokenizer gives them

/// The special tokens a tokenizer has; nullopt where it has none.
struct SpecialTokens {
  std::optional<std::int64_t> bos;  ///< beginning of sequence
  std::optional<std::int64_t> eos;  ///< end of sequence (end of text): separates documents in token files
  std::optional<std::int64_t> pad;
  std::optional<std::int64_t> unk;  ///< what text outside the vocabulary becomes
};

/// How encode treats the text of a special token (such as `<|endoftext|>`) inside its input.
enum class SpecialText {
  ordinary,  ///< as ordinary text, never giving a special id (user text cannot forge one)
  match,     ///< matched whole, giving the special token's id
  /// as the tokenizer's own reference does (the default): Hugging Face's tokenizers match
  /// (HfTokenizer); SentencePiece's library and GPT-2's files read as tiktoken's encode_ordinary do
  /// not (SentencePieceTokenizer, ByteLevelBpe); the bytes tokenizer has no special tokens.
  as_reference,
};

/// What a token file or a checkpoint records of the tokenizer that made its ids. Two tokenizers
/// with the same identity encode every text to the same ids.
struct TokenizerIdentity {
  std::string kind;              ///< "bytes", "byte_bpe", "sentencepiece" or "hf"
  std::uint64_t vocab_size = 0;  ///< ids are in [0, vocab_size)
  std::string digest;            ///< 16 hex digits: FNV-1a 64 of to_json()
};
bool operator==(const TokenizerIdentity& a, const TokenizerIdentity& b);  ///< kind, vocab_size and digest all equal
bool operator!=(const TokenizerIdentity& a, const TokenizerIdentity& b);  ///< not ==
/// "byte_bpe, 50257 ids, digest 0123456789abcdef", for messages.
std::string describe(const TokenizerIdentity& identity);

/// A tokenizer. Implementations are immutable after construction, so one tokenizer may encode on
/// several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// The ids of `text`. Text that is not valid UTF-8 is never refused: the bytes and byte-level
  /// BPE tokenizers encode it byte by byte where it is invalid (as GPT-2 does); SentencePiece
  /// reads such bytes as U+FFFD, as the SentencePiece library does.
  virtual TokenIds encode(std::string_view text, SpecialText specials = SpecialText::as_reference) const = 0;
  /// encode's ids with what the tokenizer adds around a text for a model (Hugging Face's
  /// `add_special_tokens=True`: the post-processor's template, such as Llama 3's
  /// `<|begin_of_text|>` before the text); the same as encode for a tokenizer that adds nothing.
  virtual TokenIds encode_for_model(std::string_view text, SpecialText specials = SpecialText::as_reference) const {
    return encode(text, specials);
  }
  /// The text of `ids` (bytes, which need not be UTF-8 when the ids cut a character). An id outside
  /// [0, vocab_size) is an Error naming the id and its position.
  virtual std::string decode(const TokenIds& ids) const;
  /// One token's bytes as decode gives them for it alone; an id out of range is an Error.
  virtual std::string token_bytes(std::int64_t id) const = 0;
  /// The `to_str_tokens` view: each id's bytes, where bytes that are not valid UTF-8 on their own
  /// are written as `\xNN` (and a backslash as `\\`), so every string is valid UTF-8 (control
  /// characters such as a newline or ESC are valid UTF-8 and kept as they are).
  virtual std::vector<std::string> token_strings(const TokenIds& ids) const;

  /// How many ids there are: every id is in [0, vocab_size).
  virtual std::size_t vocab_size() const = 0;
  /// The special tokens' ids (nullopt for a role the tokenizer has no token for).
  virtual SpecialTokens special_tokens() const = 0;
  /// "bytes", "byte_bpe", "sentencepiece" or "hf".
  virtual std::string kind() const = 0;
  /// Everything needed to rebuild this tokenizer, as one UTF-8 JSON document with a "kind" field;
  /// tokenizer_from_json reads it back.
  virtual std::string to_json() const = 0;

  /// kind, vocab_size and the digest of to_json().
  TokenizerIdentity identity() const;

 protected:
  /// Throws the Error decode and token_bytes give for an id outside [0, vocab_size).
  void check_id(std::int64_t id, std::size_t position, const char* who) const;
};

/// Bytes as readable UTF-8: valid UTF-8 sequences are kept, every other byte and a backslash are
/// written as `\xNN` and `\\` (token_strings' form).
std::string readable_bytes(std::string_view bytes);

/// Rebuilds a tokenizer from Tokenizer::to_json's document; an unknown "kind" or a malformed
/// document is an Error naming `who` and the field.
std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json, const std::string& who = "tokenizer_from_json");

}  // namespace xgrad::text
