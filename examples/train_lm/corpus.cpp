// Grammar text, splits and batches.
#include "corpus.hpp"

#include <algorithm>
#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"

namespace lm {

namespace {

const std::vector<std::string> kSubjects = {"the cat",     "the old dog",    "a small bird", "my neighbour",
                                            "the teacher", "a tired farmer", "the children", "our captain",
                                            "the baker",   "a young fox"};
const std::vector<std::string> kVerbs = {"saw",      "found",      "painted", "carried",
                                         "followed", "remembered", "built",   "washed"};
const std::vector<std::string> kObjects = {"a red boat",    "the green door", "two apples",       "an empty basket",
                                           "the long road", "a quiet house",  "the broken clock", "three letters"};
const std::vector<std::string> kPlaces = {"near the river",   "in the garden", "at the market",
                                          "under the bridge", "on the hill",   "behind the school"};
const std::vector<std::string> kTimes = {"in the morning", "before dinner", "every sunday", "last winter", "at noon"};

const std::string& pick(const std::vector<std::string>& words, xgrad::Generator& gen) {
  return words[gen.below(words.size())];
}

}  // namespace

std::string grammar_text(std::size_t bytes, std::uint64_t seed) {
  xgrad::Generator gen(seed);
  std::string text;
  while (text.size() < bytes) {
    std::string s = pick(kSubjects, gen) + " " + pick(kVerbs, gen) + " " + pick(kObjects, gen);
    const std::uint64_t form = gen.below(4);
    if (form == 1) s += " " + pick(kPlaces, gen);
    if (form == 2) s += " " + pick(kTimes, gen);
    if (form == 3) s += " " + pick(kPlaces, gen) + " " + pick(kTimes, gen);
    if (gen.below(5) == 0) s += " and counted " + std::to_string(2 + gen.below(8)) + " of them";
    s[0] = static_cast<char>(s[0] - 'a' + 'A');
    text += s + (gen.below(6) == 0 ? "!\n" : ".\n");
  }
  return text;
}

std::string read_text(const std::string& path, std::uint64_t max_bytes) {
  return xgrad::read_file(path, "train_lm: the text file", max_bytes);
}

double unigram_entropy(const std::string& text) {
  std::vector<double> count(256, 0.0);
  for (unsigned char c : text) count[c] += 1;
  double h = 0;
  for (double n : count) {
    if (n > 0) h -= n / static_cast<double>(text.size()) * std::log(n / static_cast<double>(text.size()));
  }
  return h;
}

namespace {

// Tokens in T-byte slots (uint16_t or uint32_t).
template <class T>
class CompactTokens : public xgrad::text::TokenSource {
 public:
  explicit CompactTokens(const xgrad::text::TokenIds& ids) : tokens_(ids.begin(), ids.end()) {}
  std::size_t size() const override { return tokens_.size(); }
  void read(std::size_t offset, std::size_t n, std::int64_t* out) const override {
    if (offset > tokens_.size() || n > tokens_.size() - offset)
      xgrad::fail("train_lm: tokens [", offset, ", ", offset + n, ") are past the end of ", tokens_.size());
    for (std::size_t i = 0; i < n; ++i) out[i] = tokens_[offset + i];
  }

 private:
  std::vector<T> tokens_;
};

class TokenSlice : public xgrad::text::TokenSource {
 public:
  TokenSlice(std::shared_ptr<const xgrad::text::TokenSource> data, std::size_t begin, std::size_t end)
      : data_(std::move(data)), begin_(begin), end_(end) {}
  std::size_t size() const override { return end_ - begin_; }
  void read(std::size_t offset, std::size_t n, std::int64_t* out) const override {
    if (offset > size() || n > size() - offset)
      xgrad::fail("train_lm: tokens [", offset, ", ", offset + n, ") are past the end of ", size());
    data_->read(begin_ + offset, n, out);
  }

 private:
  std::shared_ptr<const xgrad::text::TokenSource> data_;
  std::size_t begin_, end_;
};

void check_window(const xgrad::text::TokenSource& part, const char* what, std::size_t seq_len, const std::string& of) {
  if (part.size() < seq_len + 1)
    xgrad::fail("train_lm: the ", what, " part of ", of, " holds ", part.size(), " tokens, fewer than one window of ",
                seq_len + 1, " (--seq-len ", seq_len, " + 1)");
}

}  // namespace

std::shared_ptr<const xgrad::text::TokenSource> compact_tokens(const xgrad::text::TokenIds& ids,
                                                               std::size_t vocab_size) {
  if (vocab_size <= 65536) return std::make_shared<CompactTokens<std::uint16_t>>(ids);
  return std::make_shared<CompactTokens<std::uint32_t>>(ids);
}

std::shared_ptr<const xgrad::text::TokenSource> token_slice(std::shared_ptr<const xgrad::text::TokenSource> data,
                                                            std::size_t begin, std::size_t end) {
  if (begin > end || end > data->size())
    xgrad::fail("train_lm: tokens [", begin, ", ", end, ") are not within the ", data->size(), " tokens");
  return std::make_shared<TokenSlice>(std::move(data), begin, end);
}

std::string_view training_part(const std::string& text, double valid_fraction) {
  const auto n_valid = static_cast<std::size_t>(static_cast<double>(text.size()) * valid_fraction);
  return std::string_view(text).substr(0, text.size() - std::min(n_valid, text.size()));
}

Corpus split(const std::string& text, double valid_fraction, std::size_t seq_len,
             std::shared_ptr<const xgrad::text::Tokenizer> tokenizer) {
  if (!(valid_fraction > 0 && valid_fraction < 1))
    xgrad::fail("train_lm: validation fraction ", valid_fraction, " is outside (0, 1)");
  if (!tokenizer) tokenizer = std::make_shared<xgrad::text::BytesTokenizer>();
  const auto n_valid = static_cast<std::size_t>(static_cast<double>(text.size()) * valid_fraction);
  if (n_valid < seq_len + 1 || text.size() - n_valid < seq_len + 1) {
    xgrad::fail("train_lm: the text (", text.size(), " bytes) is too short for sequences of ", seq_len,
                " with a validation fraction of ", valid_fraction);
  }
  const std::string_view all(text);
  Corpus c;
  c.tokenizer = tokenizer;
  c.train = compact_tokens(tokenizer->encode(all.substr(0, text.size() - n_valid)), tokenizer->vocab_size());
  c.valid = compact_tokens(tokenizer->encode(all.substr(text.size() - n_valid)), tokenizer->vocab_size());
  const std::string of = "the text encoded by the " + tokenizer->kind() + " tokenizer";
  check_window(*c.train, "training", seq_len, of);
  check_window(*c.valid, "validation", seq_len, of);
  return c;
}

Corpus token_corpus(const std::string& train_path, const std::string& valid_path, double valid_fraction,
                    std::size_t seq_len, std::shared_ptr<const xgrad::text::Tokenizer> tokenizer) {
  if (!tokenizer) xgrad::fail("train_lm: a token file needs its tokenizer");
  Corpus c;
  c.tokenizer = tokenizer;
  auto train = std::make_shared<xgrad::text::TokenFile>(train_path);
  train->check_tokenizer(tokenizer->identity());
  if (!valid_path.empty()) {
    auto valid = std::make_shared<xgrad::text::TokenFile>(valid_path);
    valid->check_tokenizer(tokenizer->identity());
    valid->check_ids();  // before any step: an id past the vocabulary is named now, not at a validation
    c.train = train;
    c.valid = valid;
  } else {
    if (!(valid_fraction > 0 && valid_fraction < 1))
      xgrad::fail("train_lm: validation fraction ", valid_fraction, " is outside (0, 1)");
    const std::size_t n = train->size();
    const auto n_valid = static_cast<std::size_t>(static_cast<double>(n) * valid_fraction);
    c.train = token_slice(train, 0, n - n_valid);
    c.valid = token_slice(train, n - n_valid, n);
  }
  check_window(*c.train, "training", seq_len, "'" + train_path + "'");
  check_window(*c.valid, "validation", seq_len, "'" + (valid_path.empty() ? train_path : valid_path) + "'");
  return c;
}

double target_bytes(const std::vector<xgrad::text::TokenBatch>& batches, const xgrad::text::Tokenizer& tokenizer) {
  std::vector<std::size_t> length(tokenizer.vocab_size(), 0);
  for (std::size_t id = 0; id < length.size(); ++id)
    length[id] = tokenizer.token_bytes(static_cast<std::int64_t>(id)).size();
  double bytes = 0;
  for (const auto& b : batches) {
    for (const std::int64_t t : b.targets) {
      if (t >= 0 && static_cast<std::size_t>(t) < length.size()) bytes += static_cast<double>(length[t]);
    }
  }
  return bytes;
}

}  // namespace lm
