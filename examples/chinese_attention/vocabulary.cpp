// Vocabulary and batches.
#include "vocabulary.hpp"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/token_batches.hpp"

namespace zh {

Vocabulary::Vocabulary(const std::vector<Sentence>& sentences) : words_{"<pad>", "<s>", "</s>"} {
  std::set<std::string> words;
  for (const Sentence& s : sentences) words.insert(s.begin(), s.end());
  for (const std::string& w : words) {
    if (std::find(words_.begin(), words_.begin() + 3, w) != words_.begin() + 3) continue;
    words_.push_back(w);
  }
  for (std::size_t i = 0; i < words_.size(); ++i) ids_[words_[i]] = static_cast<std::int64_t>(i);
}

std::vector<std::int64_t> Vocabulary::encode(const Sentence& words) const {
  std::vector<std::int64_t> ids;
  for (const std::string& w : words) {
    auto it = ids_.find(w);
    if (it == ids_.end()) xgrad::fail("Vocabulary: the word '", w, "' is not in the vocabulary of ", size(), " words");
    ids.push_back(it->second);
  }
  return ids;
}

const std::string& Vocabulary::word(std::int64_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= words_.size()) {
    xgrad::fail("Vocabulary: id ", id, " is outside [0, ", words_.size(), ")");
  }
  return words_[static_cast<std::size_t>(id)];
}

xgrad::text::TokenIds Vocabulary::encode(std::string_view text, xgrad::text::SpecialText specials) const {
  const Sentence words = split_words(std::string(text));
  if (specials != xgrad::text::SpecialText::match) {
    for (const std::string& w : words) {
      if (w == words_[kPad] || w == words_[kBos] || w == words_[kEos])
        xgrad::fail("Vocabulary: '", w, "' is a special token, not a word of the text");
    }
  }
  return encode(words);
}

std::string Vocabulary::to_json() const { return nlohmann::json{{"kind", "words"}, {"words", words_}}.dump(); }

Sentence Vocabulary::words(const std::vector<std::int64_t>& ids) const {
  Sentence words;
  for (std::int64_t id : ids) words.push_back(word(id));
  return words;
}

Batch make_batch(const Vocabulary& vocab, const std::vector<const Sentence*>& sentences) {
  // Each sentence is the document <s> w1 .. wn </s>, which the library pads with next-word targets.
  // Cut to the longest sentence's n + 1 positions, the longest ends at wn (target </s>); a shorter
  // one's </s> sits where its target is ignored, which a causal model never lets the others see.
  std::vector<xgrad::text::TokenIds> documents;
  std::size_t longest = 0;
  for (const Sentence* s : sentences) {
    xgrad::text::TokenIds doc = {Vocabulary::kBos};
    for (const std::int64_t id : vocab.encode(*s)) doc.push_back(id);
    doc.push_back(Vocabulary::kEos);
    documents.push_back(std::move(doc));
    longest = std::max(longest, s->size());
  }
  xgrad::text::TokenBatch b = xgrad::text::padded_batch(documents, Vocabulary::kPad, longest + 1);
  return {std::move(b.ids), std::move(b.targets)};
}

xgrad::IndexArray model_input(const Vocabulary& vocab, const Sentence& words) {
  const std::vector<std::int64_t> ids = vocab.encode(words);
  xgrad::IndexArray input = xgrad::IndexArray::from_shape({std::size_t{1}, ids.size() + 1});
  input(0, 0) = Vocabulary::kBos;
  for (std::size_t t = 0; t < ids.size(); ++t) input(0, t + 1) = ids[t];
  return input;
}

}  // namespace zh
