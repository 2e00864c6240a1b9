// A word vocabulary with three special tokens, behind the library's tokenizer interface (text
// in, words split at spaces; ids out, words joined), and sentences as model inputs and targets.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace zh {

class Vocabulary : public xgrad::text::Tokenizer {
 public:
  static constexpr std::int64_t kPad = 0, kBos = 1, kEos = 2;  // <pad>, <s>, </s>

  // The special tokens, then every word of the sentences in byte (code point) order.
  explicit Vocabulary(const std::vector<Sentence>& sentences);

  std::size_t size() const { return words_.size(); }
  bool contains(const std::string& word) const { return ids_.count(word) > 0; }
  // Throws xgrad::Error naming a word that is not in the vocabulary.
  std::vector<std::int64_t> encode(const Sentence& words) const;
  // Throws xgrad::Error naming an id outside [0, size()).
  Sentence words(const std::vector<std::int64_t>& ids) const;
  const std::string& word(std::int64_t id) const;

  // The tokenizer interface: text is split into words at spaces; an unknown word is an Error,
  // and so is a special token's text unless `specials` is match. Decoding joins the words
  // without spaces ("我昨天去了"), as the sentence is written.
  xgrad::text::TokenIds encode(
      std::string_view text, xgrad::text::SpecialText specials = xgrad::text::SpecialText::as_reference) const override;
  std::string token_bytes(std::int64_t id) const override { return word(id); }
  std::size_t vocab_size() const override { return size(); }
  xgrad::text::SpecialTokens special_tokens() const override { return {kBos, kEos, kPad, std::nullopt}; }
  std::string kind() const override { return "words"; }
  std::string to_json() const override;  // {"kind": "words", "words": [...]}, for its identity

 private:
  std::vector<std::string> words_;
  std::map<std::string, std::int64_t> ids_;
};

// Next-word prediction on whole sentences (text::padded_batch of <s> w1 .. wn </s>): ids (B, T)
// are <s> w1 .. wn, then </s> and <pad> for a shorter sentence; targets (B, T) are w1 .. wn </s>
// then kIgnoreIndex; T is the longest sentence's length + 1.
struct Batch {
  xgrad::IndexArray ids, targets;
};
Batch make_batch(const Vocabulary& vocab, const std::vector<const Sentence*>& sentences);

// The sentence as the model reads it: <s> w1 .. wn, shape (1, n + 1).
xgrad::IndexArray model_input(const Vocabulary& vocab, const Sentence& words);

}  // namespace zh
