// What a LanguageModel of given options holds and takes, from the options alone: the checks before
// a model is built (LanguageModel's constructor, weights::load_language_model) use it.
#pragma once

#include "xgrad/nn/transformer.hpp"

namespace xgrad::nn::detail {

// The values and tensors a LanguageModel's state saves (every parameter; no buffers), and the
// bytes it takes when built, which add the sinusoidal table (max_len x d_model, not saved) and the
// bookkeeping of each block's modules and tensors (about 34 KiB, measured at d_model 1: a model of
// 100000 tiny blocks takes 3.4 GB). In double, so no count wraps around.
struct ModelSize {
  double values = 0, tensors = 0, bytes = 0;
  void add(double n, bool present = true) {
    if (!present) return;
    values += n;
    tensors += 1;
  }
};

ModelSize model_size(const LanguageModelOptions& o);

}  // namespace xgrad::nn::detail
