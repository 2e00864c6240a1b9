// The trained model's attention over one sentence, and a reading of each head's pattern computed
// from its weights. Shapes: L layers, H heads, T tokens (queries), S = T keys.
#pragma once

#include <string>
#include <vector>

#include "vocabulary.hpp"
#include "xgrad/nn/transformer.hpp"

namespace zh {

// One (H, T, T) array of attention weights per layer for <s> w1 .. wn (T = n + 1): row t is query
// t's distribution over keys 0 .. t. Runs without recording; the model's mode is unchanged.
std::vector<xgrad::Array> attention_on(const xgrad::nn::LanguageModel& model, const Vocabulary& vocab,
                                       const Sentence& words);

// <s> w1 .. wn: the row and column labels.
std::vector<std::string> token_labels(const Sentence& words);

struct HeadReading {
  std::size_t layer = 0, head = 0;
  // Mean weight over the queries t = 2 .. T-1 (where the previous token, the first token and the
  // query itself are three different keys) on key t-1, key 0 and key t.
  double previous = 0, first = 0, self = 0;
  std::vector<std::size_t> strongest_key;  // per query t = 0 .. T-1: the key with the largest weight
  std::vector<double> strongest_weight;    // and that weight
  std::string pattern;                     // "previous token", "first token", "itself" (mean >= 0.7), else "mixed"
};

std::vector<HeadReading> read_heads(const std::vector<xgrad::Array>& attention);

// "previous 0.81  first 0.10  self 0.05  previous token   我→<s> 0.97  昨天→我 0.88 ...": the three
// means, the pattern, then each query from t = 1 with its strongest key and that key's weight.
std::string describe(const HeadReading& reading, const std::vector<std::string>& labels);

}  // namespace zh
