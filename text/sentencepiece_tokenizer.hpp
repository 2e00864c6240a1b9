/// @file
/// SentencePiece models (Llama's, T5's, ones trained here) behind the Tokenizer interface, through
/// the SentencePiece library itself: loading a .model file, and training a model on text files.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace xgrad::text {

/// A SentencePiece model (BPE or unigram). encode and decode are SentencePiece's Encode and Decode,
/// so ids are those Python's `sentencepiece` gives for the same model; which means the model's
/// normalization applies (nmt_nfkc folds whitespace runs and newlines into one space, identity
/// keeps them) and bytes that are not UTF-8 are encoded as U+FFFD, as SentencePiece does (not
/// byte by byte: decode(encode(x)) gives U+FFFD where x was not UTF-8).
///
/// Special tokens: the model's control pieces (`<s>`, `</s>`, `<pad>`, any control_symbols) and its
/// unknown piece (`<unk>`). With SpecialText::ordinary (the default) their text is ordinary text, as
/// SentencePiece has it: no control id or unk id ever comes from the text `<s>`. With
/// SpecialText::match, the text of each of them (at each position the longest one, leftmost
/// first) gives its id, and the text between them is encoded as a whole text of its own (each part
/// gets the model's dummy-prefix space, as Meta's Llama code and Hugging Face's slow Llama
/// tokenizer encode the parts around special tokens). User-defined symbols are matched in both
/// modes: SentencePiece always encodes their text as their id.
///
/// Immutable after construction: SentencePieceProcessor's Encode and Decode are const and touch no
/// shared state, so one tokenizer may encode on several threads at once.
class SentencePieceTokenizer : public Tokenizer {
 public:
  /// From a serialized model (the bytes of a .model file). Bytes that are not a SentencePiece
  /// model (empty, cut short, another format) are an Error that starts with `who` and names
  /// `source` (where the bytes came from) and what is wrong.
  explicit SentencePieceTokenizer(std::string serialized_model, const std::string& who = "SentencePieceTokenizer",
                                  const std::string& source = "the serialized model");
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  /// SentencePiece's Encode of `text`; `specials` as the class comment says. A long text goes to
  /// SentencePiece in parts (which holds 100 to 200 bytes of memory for each byte it encodes at
  /// once): encode_in_parts with PartSizes().
  TokenIds encode(std::string_view text, SpecialText specials = SpecialText::as_reference) const override;

  /// How encode cuts a long text: into parts of about `part` bytes, each ending before a space
  /// between two ASCII letters or digits (the next part starting after it, with the model's ▁ for
  /// it); a run of `max_run` bytes without such a space is cut inside (at a character boundary).
  struct PartSizes {
    std::size_t part = std::size_t{1} << 16;
    std::size_t max_run = std::size_t{1} << 18;
  };
  /// encode with these part sizes (encode: PartSizes()). Cut at spaces, the ids are those of the
  /// whole text when the model's pieces and normalization rules never join such a space to a
  /// letter or digit next to it and ▁ alone is a piece (true of models trained with
  /// split_by_whitespace, SentencePiece's default, and its built-in rules: Llama's, T5's); next to
  /// a cut inside a run they may differ.
  /// With a model whose pieces or rules do join them (or that puts ▁ after words), a text (between
  /// special tokens) longer than `max_run` is an Error naming the piece or rule; shorter ones are
  /// encoded whole. Part sizes of 0, or runs shorter than parts, are an Error.
  TokenIds encode_in_parts(std::string_view text, SpecialText specials, const PartSizes& sizes) const;
  /// SentencePiece's Decode of `ids`: the dummy-prefix space of the first piece is dropped, a
  /// control id gives nothing, the unknown id gives its surface (" ⁇ " by default), and byte pieces
  /// that do not form UTF-8 give U+FFFD each. An id outside [0, vocab_size) is an Error naming the
  /// id and its position.
  std::string decode(const TokenIds& ids) const override;
  /// One id's bytes: the piece with each ▁ (U+2581) written as a space (so "▁the" is " the"); a
  /// byte-fallback piece `<0xNN>` is the byte NN itself; a control piece is empty; the unknown
  /// piece is what Decode gives for it (" ⁇ "). So token_bytes of a text's ids, joined, differ from
  /// decode where decode drops the leading space or replaces bytes by U+FFFD.
  std::string token_bytes(std::int64_t id) const override;
  /// The readable view: readable_bytes(token_bytes(id)) (▁ shown as a space, as TransformerLens
  /// shows decoded strings; lone bytes as `\xNN`), except control and unknown pieces, which are
  /// shown as their piece text (`<s>`, `</s>`, `<unk>`) rather than as nothing.
  std::vector<std::string> token_strings(const TokenIds& ids) const override;

  std::size_t vocab_size() const override { return pieces_.size(); }
  /// bos, eos, pad and unk as the model's bos_id, eos_id, pad_id and unk_id (a negative id: none).
  SpecialTokens special_tokens() const override { return specials_; }
  std::string kind() const override { return "sentencepiece"; }
  /// {"kind":"sentencepiece","model":"<the serialized model, base64>"}.
  std::string to_json() const override;
  /// Reads to_json's document back; a malformed document, a "kind" other than "sentencepiece", a
  /// "model" field missing, not base64 or not a model is an Error naming `who` and the field.
  static std::unique_ptr<SentencePieceTokenizer> from_json(std::string_view json, const std::string& who);

  /// The serialized model this tokenizer was built from (what a .model file holds).
  const std::string& serialized_model() const { return serialized_model_; }
  /// The piece of `id` as the model spells it ("▁the", "<0x0A>", "<s>"); an id out of range is an Error.
  const std::string& piece(std::int64_t id) const;

 private:
  struct Piece {
    std::string text;      // the model's piece
    std::string bytes;     // token_bytes
    bool special = false;  // control or unknown
  };
  std::string serialized_model_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<std::string, std::int64_t>> special_texts_;  // longest first
  std::array<bool, 256> special_first_bytes_{};                      // the first bytes of special_texts_
  SpecialTokens specials_;
  // Why a text cannot be cut at spaces with this model without changing ids, or "".
  std::string cut_problem_;
  // The model with add_dummy_prefix flipped, and the processors for a part that starts after a
  // cut space (with the dummy prefix) or inside a run (without); processor_ or flipped_.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> flipped_;
  const sentencepiece::SentencePieceProcessor* with_prefix_ = nullptr;
  const sentencepiece::SentencePieceProcessor* without_prefix_ = nullptr;

  void find_cuts();  // sets cut_problem_, or flipped_ and the two processors
  void encode_ordinary(std::string_view text, const PartSizes& sizes, TokenIds& out) const;
  void encode_part(const sentencepiece::SentencePieceProcessor& processor, std::string_view part, TokenIds& out) const;
};

/// Reads the SentencePiece .model file at `path`. A missing file, a folder, an empty file, a cut
/// short one or another format is an Error that starts with "load_sentencepiece" and names the file.
std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& path);

/// The options of train_sentencepiece: SentencePiece's trainer options of the same names (see its
/// docs/options.md), checked before training. Defaults are SentencePiece's, except num_threads (1,
/// so that training is deterministic).
struct SentencePieceTrainerOptions {
  /// The options for `vocab_size` pieces, every other option at its default.
  explicit SentencePieceTrainerOptions(std::size_t vocab_size) : vocab_size_(vocab_size) {}

  /// The number of pieces, specials and byte pieces included; at least 1. SentencePiece refuses
  /// one the text is too small for (its message is passed on).
  XGRAD_REQUIRED_ARG(std::size_t, vocab_size);
  XGRAD_ARG(std::string, model_type, "unigram");  ///< "bpe" or "unigram"
  /// The share of the text's characters the pieces must cover, in [0.98, 1]; the rarest others
  /// are unknown (or, with byte_fallback, bytes).
  XGRAD_ARG(double, character_coverage, 0.9995);
  XGRAD_ARG(bool, byte_fallback, false);  ///< 256 pieces <0x00>..<0xFF> for characters not in the vocabulary
  /// The ids of the unknown piece (required: in [0, vocab_size)) and of bos, eos and pad (a
  /// negative id: the model has none). Those given must differ.
  XGRAD_ARG(int, unk_id, 0);
  XGRAD_ARG(int, bos_id, 1);
  XGRAD_ARG(int, eos_id, 2);
  XGRAD_ARG(int, pad_id, -1);
  XGRAD_ARG(std::string, unk_piece, "<unk>");
  XGRAD_ARG(std::string, bos_piece, "<s>");
  XGRAD_ARG(std::string, eos_piece, "</s>");
  XGRAD_ARG(std::string, pad_piece, "<pad>");
  /// Pieces always matched whole in text (user-defined) or never produced from text (control);
  /// each non-empty, without NUL bytes, different from each other and from the four pieces above.
  XGRAD_ARG(std::vector<std::string>, user_defined_symbols, {});
  XGRAD_ARG(std::vector<std::string>, control_symbols, {});
  XGRAD_ARG(int, num_threads, 1);  ///< in [1, 128]; another count may train another model
  /// How many lines to train on (0: all); when fewer than the text has, a sample (seeded, so
  /// deterministic) if shuffle_input_sentence, else the first ones. 0 or more than 100.
  XGRAD_ARG(std::uint64_t, input_sentence_size, 0);
  XGRAD_ARG(bool, shuffle_input_sentence, true);
  XGRAD_ARG(std::size_t, max_sentence_length, 4192);     ///< longer lines (bytes) are skipped; in [10, 2^30]
  XGRAD_ARG(std::size_t, max_sentencepiece_length, 16);  ///< in characters, in [1, 512]
  XGRAD_ARG(bool, split_digits, false);                  ///< every digit a piece of its own
  XGRAD_ARG(bool, split_by_whitespace, true);
  XGRAD_ARG(bool, allow_whitespace_only_pieces, false);
  /// "nmt_nfkc" (NFKC, whitespace and control characters folded), "nfkc", "nmt_nfkc_cf", "nfkc_cf"
  /// (case-folded) or "identity" (the text as written, as Llama's model has it).
  XGRAD_ARG(std::string, normalization_rule_name, "nmt_nfkc");
  XGRAD_ARG(bool, add_dummy_prefix, true);          ///< a ▁ before each text, so a first word is like the others
  XGRAD_ARG(bool, remove_extra_whitespaces, true);  ///< strip and fold runs of spaces
  XGRAD_ARG(bool, hard_vocab_limit, true);          ///< false: vocab_size is a ceiling, not a demand
  /// SentencePiece's training log (many lines) on stderr; otherwise only its error lines (its refusals
  /// come back in the Error anyway).
  XGRAD_ARG(bool, verbose, false);
};

/// Trains a SentencePiece model on the lines of `input_files` (read by xgrad, each line one
/// sentence, as SentencePiece's `--input` reads them) and writes it to `model_path` atomically;
/// SentencePiece writes no file of its own. An option out of range, an input that is not a
/// readable file, or a model_path that cannot be written is an Error naming the option and its
/// value, or the file, before training; SentencePiece's own refusal (vocab_size too large for the
/// text) is passed on with the files named. Sets SentencePiece's process-wide log level.
void train_sentencepiece(const std::vector<std::string>& input_files, const SentencePieceTrainerOptions& options,
                         const std::string& model_path);

}  // namespace xgrad::text
