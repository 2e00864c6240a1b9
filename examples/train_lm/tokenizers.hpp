// The tokenizer of a run: named by --tokenizer (bytes, GPT-2's files, a byte-level BPE, a
// SentencePiece model), trained on the training text by --train-tokenizer, or the one a
// checkpoint stores; and sampling text through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/nn/transformer.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace lm {

struct TokenizerChoice {
  std::vector<std::string> spec;  // --tokenizer: a kind and, but for bytes, its path
  std::size_t train_vocab = 0;    // --train-tokenizer: a byte-level BPE of this many tokens (0: none)
  std::string save_dir;           // --save-tokenizer: where the trained one's vocab.json and merges.txt go

  bool given() const { return !spec.empty() || train_vocab > 0; }
};

// The tokenizer `choice` names: --tokenizer's, or one trained on `training_text`, or bytes when
// neither is given. Errors name the flag. A trained one is saved in --save-tokenizer's folder; when
// `resuming`, a folder that already holds that same tokenizer (the first run's save) is kept as it is.
std::shared_ptr<const xgrad::text::Tokenizer> make_tokenizer(const TokenizerChoice& choice,
                                                             std::string_view training_text, bool resuming = false);

// `count` tokens generated after `prompt` (encoded by `tokenizer`), decoded: the prompt and the
// continuation as text.
std::string sample_text(xgrad::nn::LanguageModel& model, const xgrad::text::Tokenizer& tokenizer,
                        const std::string& prompt, std::size_t count, float temperature, std::size_t top_k,
                        std::uint64_t seed);

}  // namespace lm
