// The tokenizer of a run: named by --tokenizer (bytes, GPT-2's files, a byte-level BPE, a
// SentencePiece model), trained on the training text by --train-tokenizer, or the one a
// checkpoint stores; and sampling text through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xgrad/core/autograd/precision.hpp"
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

// The sampling flags: --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --stop (each a
// string that ends the sample), --ignore-eos (without it the sample ends at the tokenizer's EOS), and
// --precision (bf16: the products read the weights' bf16 copies, half the bytes per token).
struct SampleOptions {
  float temperature = 0.8f;
  std::size_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  xgrad::Precision precision = xgrad::Precision::fp32;
};

// Writes to stdout, as it is generated, `prompt` (encoded by `tokenizer`) and at most `count` tokens
// after it, decoded, then a newline. Ends early at a --stop string (which is written) or the EOS
// (which is not). Draws from Generator(seed).
void sample_text(xgrad::nn::LanguageModel& model, const xgrad::text::Tokenizer& tokenizer, const std::string& prompt,
                 std::size_t count, const SampleOptions& options, std::uint64_t seed);

}  // namespace lm
