// Grammar text, splits and batches.
#include "corpus.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"

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

Corpus split(const std::string& text, double valid_fraction, std::size_t seq_len) {
  if (!(valid_fraction > 0 && valid_fraction < 1))
    xgrad::fail("train_lm: validation fraction ", valid_fraction, " is outside (0, 1)");
  const auto n_valid = static_cast<std::size_t>(static_cast<double>(text.size()) * valid_fraction);
  if (n_valid < seq_len + 1 || text.size() - n_valid < seq_len + 1) {
    xgrad::fail("train_lm: the text (", text.size(), " bytes) is too short for sequences of ", seq_len,
                " with a validation fraction of ", valid_fraction);
  }
  Corpus c;
  c.train.assign(text.begin(), text.end() - static_cast<std::ptrdiff_t>(n_valid));
  c.valid.assign(text.end() - static_cast<std::ptrdiff_t>(n_valid), text.end());
  return c;
}

Batch sample_batch(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                   xgrad::Generator& gen) {
  Batch b{xgrad::IndexArray::from_shape({batch, seq_len}), xgrad::IndexArray::from_shape({batch, seq_len})};
  for (std::size_t s = 0; s < batch; ++s) {
    const std::size_t at = gen.below(data.size() - seq_len);
    for (std::size_t t = 0; t < seq_len; ++t) {
      b.ids(s, t) = data[at + t];
      b.targets(s, t) = data[at + t + 1];
    }
  }
  return b;
}

std::vector<Batch> eval_batches(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                                std::size_t max_batches) {
  std::vector<Batch> out;
  std::size_t at = 0;
  while (out.size() < max_batches && at + batch * seq_len + 1 <= data.size()) {
    Batch b{xgrad::IndexArray::from_shape({batch, seq_len}), xgrad::IndexArray::from_shape({batch, seq_len})};
    for (std::size_t s = 0; s < batch; ++s, at += seq_len) {
      for (std::size_t t = 0; t < seq_len; ++t) {
        b.ids(s, t) = data[at + t];
        b.targets(s, t) = data[at + t + 1];
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace lm
