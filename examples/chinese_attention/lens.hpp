// The logit lens on the sentence: the word the model would predict after each position if it
// stopped after the embedding, after block 0, ... (inspect/logit_lens.hpp).
#pragma once

#include <string>

#include "vocabulary.hpp"
#include "xgrad/nn/transformer.hpp"

namespace zh {

// One row per read-out point: its loss on the sentence's next words (</s> last) and the top
// word with its probability after each position.
std::string lens_table(xgrad::nn::LanguageModel& model, const Vocabulary& vocab, const Sentence& words);

}  // namespace zh
