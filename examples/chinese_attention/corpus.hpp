// The built-in corpus: short word-segmented Chinese sentences (words separated by one space)
// from a small fixed grammar, and their deterministic split into training and held-out sets.
// The grammar ties words together so that context matters: a past time word (昨天) is followed
// by 去 了, a future one (明天) by 要 去; a city goes with 出差, 旅游, 开会 or 学习, a place with its
// own purpose (医院 看病); a verb with its objects (喝 咖啡).
#pragma once

#include <string>
#include <vector>

namespace zh {

using Sentence = std::vector<std::string>;  // words

// The sentence whose attention the example shows.
const Sentence& probe_sentence();  // 我 昨天 去 了 北京 出差

// `count` distinct sentences, always the same ones in the same order (the grammar's generator
// has a fixed seed). Throws xgrad::Error when the grammar has fewer than `count` sentences.
std::vector<Sentence> grammar_sentences(std::size_t count);

struct CorpusSplit {
  std::vector<Sentence> train, held_out;
};

// Every `held_out_every`-th sentence (the 10th, 20th, ... for 10) is held out.
CorpusSplit split_corpus(const std::vector<Sentence>& sentences, std::size_t held_out_every = 10);

// The sentences the example trains and measures on: 2000 from the grammar, 1 in 10 held out.
CorpusSplit builtin_corpus();

// "我 昨天 去" -> {"我", "昨天", "去"}; runs of spaces count as one.
Sentence split_words(const std::string& text);
std::string join_words(const Sentence& words);

}  // namespace zh
