/// @file
/// GPT-2's tokenizer files: vocab.json + merges.txt (GPT-2's release, also what Hugging Face's
/// GPT2Tokenizer reads and writes) and Hugging Face's tokenizer.json, read into a BpeVocabulary
/// and written back. Tokens in these files are in GPT-2's printable byte form
/// (gpt2_byte_encoding.hpp); a BpeVocabulary holds raw bytes.
#pragma once

#include <memory>
#include <string>

#include "xgrad/text/bpe_vocabulary.hpp"
#include "xgrad/text/byte_level_bpe.hpp"

namespace xgrad::text {

/// Reads vocab.json (an object from printable token to id; the ids run 0..N-1 without holes or
/// repeats, each token once: a token given twice is named with both its ids) and merges.txt (an optional first line
/// "#version...", then one merge a line, two printable tokens separated by one space, lowest rank first). The special
/// tokens are the tokens that are neither a single byte nor made by a merge (GPT-2: only `<|endoftext|>`, id 50256); a
/// special token whose vocab.json key holds a character outside GPT-2's byte table is its UTF-8
/// text. Bad input is an Error starting "load_gpt2_vocabulary" that names the file and the entry,
/// the line or the JSON parser's line and column.
BpeVocabulary load_gpt2_vocabulary(const std::string& vocab_json, const std::string& merges_txt);

/// Reads a Hugging Face tokenizer.json of a byte-level BPE: "model" of type "BPE" (vocab, merges as
/// "a b" strings or ["a", "b"] pairs, ignore_merges), "pre_tokenizer" ByteLevel (add_prefix_space
/// false, use_regex true; alone or the one member of a Sequence), "normalizer" null.
///
/// The "added_tokens" (each {"id", "content", "special", "normalized", ...}, content as raw text)
/// are matched as Hugging Face's tokenizers match them, before the pre-tokenizer: those with
/// "special": false in any text (BpeVocabulary::added_tokens), the special ones with
/// SpecialText::match; those with "normalized": false first, then the others in the text between
/// (BpeVocabulary::matched_later). The special tokens are also, as in load_gpt2_vocabulary, the
/// vocab's tokens that are neither a single byte nor made by a merge (without ignore_merges; with
/// it, a piece can be such a token whole). An added token's "id" must be the one Hugging Face gives
/// it (its text's id in the vocab, else the next after the vocab and the added tokens before it);
/// "single_word", "lstrip" or "rstrip" true, which xgrad does not implement, is refused.
/// Another model type (WordPiece, Unigram, ...), or a normalizer or pre-tokenizer that would change
/// the ids, is an Error starting "load_hf_tokenizer_json" naming the file and the field.
BpeVocabulary load_hf_tokenizer_json(const std::string& path);

/// Writes `dir`/vocab.json (tokens in id order) and `dir`/merges.txt ("#version: 0.2" and the
/// merges by rank), each atomically, creating `dir` if needed. load_gpt2_vocabulary reads them back
/// to the same vocabulary (with the special ids in ascending order). Refused before anything is
/// written (an Error starting "save_gpt2_vocabulary"): a vocabulary check_bpe_vocabulary refuses;
/// one these files cannot hold (two tokens of one printable form, such as a special token with the
/// bytes of an ordinary one; an ordinary multi-byte token no merge makes, which would come back as
/// special; added tokens; ignore_merges); and a `dir` that already holds vocab.json or merges.txt
/// (this never writes over a vocabulary, such as the one being read).
void save_gpt2_vocabulary(const BpeVocabulary& vocabulary, const std::string& dir);

/// The tokenizer of `path`: a folder with vocab.json + merges.txt (or, without them, with a
/// tokenizer.json), or a tokenizer.json file.
std::unique_ptr<ByteLevelBpe> load_byte_level_bpe(const std::string& path);

}  // namespace xgrad::text
