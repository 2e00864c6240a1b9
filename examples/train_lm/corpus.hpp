// Text for the language-model example: bytes of a file, or text generated from a small seeded
// grammar when no file is given, or a token file, split into training and validation parts and
// encoded by the run's tokenizer (bytes unless another is asked for).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/token_batches.hpp"
#include "xgrad/text/token_source.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace lm {

// About `bytes` bytes of English-like sentences from a fixed grammar (subjects, verbs, objects,
// places, times, numbers), drawn with `seed`.
std::string grammar_text(std::size_t bytes, std::uint64_t seed);

// The whole file; throws xgrad::Error naming the path if it is not a regular file, cannot be
// read, or is larger than max_bytes.
std::string read_text(const std::string& path, std::uint64_t max_bytes);

// Entropy in nats of the byte frequencies of `text`: the loss of the best model that ignores
// context, the bar a language model must go well below.
double unigram_entropy(const std::string& text);

// The tokens a run trains and validates on, and the tokenizer that made them (never null).
struct Corpus {
  std::shared_ptr<const xgrad::text::TokenSource> train, valid;
  std::shared_ptr<const xgrad::text::Tokenizer> tokenizer;
};

// The text before its last `valid_fraction` of bytes: what split() trains on.
std::string_view training_part(const std::string& text, double valid_fraction);

// The last `valid_fraction` of the text's bytes is the validation part; each part is encoded
// with `tokenizer` (the bytes tokenizer when null) and must hold a window of seq_len + 1 tokens.
Corpus split(const std::string& text, double valid_fraction, std::size_t seq_len,
             std::shared_ptr<const xgrad::text::Tokenizer> tokenizer = nullptr);

// A token file to train on, read a window at a time, with its validation part: `valid_path`'s file when
// given, else the last `valid_fraction` of the tokens. Both files must name `tokenizer`.
Corpus token_corpus(const std::string& train_path, const std::string& valid_path, double valid_fraction,
                    std::size_t seq_len, std::shared_ptr<const xgrad::text::Tokenizer> tokenizer);

// The tokens of `ids` in 2 bytes each when the vocabulary allows it (4 otherwise): a byte-level
// corpus held as int64 would take eight times its text.
std::shared_ptr<const xgrad::text::TokenSource> compact_tokens(const xgrad::text::TokenIds& ids,
                                                               std::size_t vocab_size);

// Tokens [begin, end) of `data`, without a copy.
std::shared_ptr<const xgrad::text::TokenSource> token_slice(std::shared_ptr<const xgrad::text::TokenSource> data,
                                                            std::size_t begin, std::size_t end);

// The bytes the target tokens of `batches` decode to (padding and ignored targets left out): the
// denominator of a validation loss in bits per byte.
double target_bytes(const std::vector<xgrad::text::TokenBatch>& batches, const xgrad::text::Tokenizer& tokenizer);

}  // namespace lm
