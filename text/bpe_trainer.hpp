/// @file
/// Training a byte-level BPE vocabulary from texts: GPT-2's pre-tokenization, then the merges of
/// the most frequent adjacent pairs, counted incrementally, until the vocabulary is full or no
/// pair is frequent enough.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/text/bpe_vocabulary.hpp"

namespace xgrad::text {

/// What train_byte_level_bpe builds, e.g.\ BpeTrainerOptions(4096).min_frequency(2).special_tokens({"<|endoftext|>"}).
struct BpeTrainerOptions {
  /// vocab_size: the largest number of ids, counting the 256 byte tokens and the special tokens.
  explicit BpeTrainerOptions(std::size_t vocab_size) : vocab_size_(vocab_size) {}
  /// The largest number of ids: 256 + the merged tokens + the special tokens. At least 256 plus
  /// the number of special tokens, at most 2^31 - 1. The vocabulary is smaller when the texts run
  /// out of pairs that occur min_frequency times.
  XGRAD_REQUIRED_ARG(std::size_t, vocab_size);
  /// A pair is merged only when it occurs (counted over all words, with their frequencies) at
  /// least this often; at least 1.
  XGRAD_ARG(std::uint64_t, min_frequency, 2);
  /// The texts of the special tokens (e.g.\ "<|endoftext|>"): non-empty, UTF-8, distinct, and
  /// longer than one byte (a one-byte text is a byte token already). Where one occurs in the
  /// training texts it is cut out, and no merge spans it.
  XGRAD_ARG(std::vector<std::string>, special_tokens, {});
};

/// Trains a byte-level BPE vocabulary on `texts`.
///
/// Ids: 0..255 are the bytes in byte order (id b is the byte b); then the merged tokens, in the
/// order they were first made; then the special tokens, in the order of options.special_tokens
/// (GPT-2's layout, with the bytes in plain byte order).
///
/// Each text is cut at the special tokens' texts (at each position the leftmost occurrence, the
/// longest when several start there), each part is split by Gpt2Pretokenizer, and the distinct
/// pieces (words) are counted, but for the runs of bytes that are not UTF-8 (pieces of their own,
/// which ByteLevelBpe encodes byte by byte, never merged). Every step then merges, in every word, the adjacent pair of
/// tokens that occurs most often (each occurrence in a word counted with the word's frequency), its occurrences taken
/// left to right without overlap. Ties go to the pair whose left token's bytes come first in lexicographic order of
/// unsigned bytes, then the pair whose right token's bytes do: the same texts give the same vocabulary on every
/// platform.
///
/// Merge r gives the id 256 + r in every text tried (random searches included). Should a merge's
/// bytes be a token already (a·bc after ab·c), it would be recorded with that token's id and add
/// no id, so that ids stay distinct byte strings; should a merged pair form again, it would be
/// merged again in the words without a second entry in merges. Training stops when the
/// vocabulary has vocab_size ids or when the most frequent pair occurs fewer than min_frequency
/// times.
///
/// Bad options are an Error naming the function, the option and its value. Texts need not be
/// UTF-8: only their UTF-8 parts are learnt from.
BpeVocabulary train_byte_level_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options);

/// train_byte_level_bpe on the contents of the files at `paths` (each file one text), read with
/// xgrad::read_file: a missing file, a folder or an unreadable file is an Error naming the path.
/// The options are checked before any file is read.
BpeVocabulary train_byte_level_bpe_files(const std::vector<std::string>& paths, const BpeTrainerOptions& options);

}  // namespace xgrad::text
