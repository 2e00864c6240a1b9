// A word vocabulary with three special tokens, and sentences as model inputs and targets.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "xgrad/core/autograd/tensor.hpp"

namespace zh {

class Vocabulary {
 public:
  static constexpr std::int64_t kPad = 0, kBos = 1, kEos = 2;  // <pad>, <s>, </s>

  // The special tokens, then every word of the sentences in byte (code point) order.
  explicit Vocabulary(const std::vector<Sentence>& sentences);

  std::size_t size() const { return words_.size(); }
  bool contains(const std::string& word) const { return ids_.count(word) > 0; }
  // Throws xgrad::Error naming a word that is not in the vocabulary.
  std::vector<std::int64_t> encode(const Sentence& words) const;
  // Throws xgrad::Error naming an id outside [0, size()).
  Sentence decode(const std::vector<std::int64_t>& ids) const;
  const std::string& word(std::int64_t id) const;

 private:
  std::vector<std::string> words_;
  std::map<std::string, std::int64_t> ids_;
};

// Next-word prediction on whole sentences: ids (B, T) are <s> w1 .. wn then <pad>, targets (B, T)
// are w1 .. wn </s> then kIgnoreIndex; T is the longest sentence's length + 1.
struct Batch {
  xgrad::IndexArray ids, targets;
};
Batch make_batch(const Vocabulary& vocab, const std::vector<const Sentence*>& sentences);

// The sentence as the model reads it: <s> w1 .. wn, shape (1, n + 1).
xgrad::IndexArray model_input(const Vocabulary& vocab, const Sentence& words);

}  // namespace zh
