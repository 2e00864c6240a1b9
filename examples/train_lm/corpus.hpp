// Text for the language-model example: bytes of a file, or text generated from a small seeded
// grammar when no file is given, split into training and validation parts, and random
// (B, T) windows of it as next-byte prediction batches. Tokens are bytes (vocabulary 256).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"

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

struct Corpus {
  std::vector<std::uint8_t> train, valid;
};

// The last `valid_fraction` of the text becomes the validation part.
Corpus split(const std::string& text, double valid_fraction, std::size_t seq_len);

struct Batch {
  xgrad::IndexArray ids;      // (B, T)
  xgrad::IndexArray targets;  // (B, T): the next byte of each position
};

// B windows of length T + 1 at uniform random offsets.
Batch sample_batch(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                   xgrad::Generator& gen);

// Consecutive windows covering (up to) `max_batches` batches of the data, for a fixed evaluation.
std::vector<Batch> eval_batches(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                                std::size_t max_batches);

}  // namespace lm
