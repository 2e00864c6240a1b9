// Training a small word-level LanguageModel on the built-in corpus: AdamW with warm-up and
// cosine decay, global-norm clipping, and the losses that say whether it learned anything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "corpus.hpp"
#include "vocabulary.hpp"
#include "xgrad/nn/transformer.hpp"

namespace zh {

struct TrainOptions {
  std::size_t layers = 2, d_model = 64, heads = 4;     // Pre-Norm, learned positions, no dropout
  std::size_t steps = 500, batch = 32;                 // sentences per step
  float lr = 3e-3f, weight_decay = 0.01f, clip = 1.f;  // warm-up: the first steps / 10; cosine to lr / 10
  std::uint64_t seed = 0;                              // weights and the order of the batches
};

// Throws xgrad::Error naming the option (by its flag) that cannot work.
void validate(const TrainOptions& options);

xgrad::nn::LanguageModelOptions model_options(const TrainOptions& options, std::size_t vocab_size);

// The estimated bytes of a training step (parameters, AdamW state, activations and gradients).
double training_bytes(const TrainOptions& options, std::size_t vocab_size);

// Losses in nats per predicted token (every word and the final </s>), token-weighted.
struct Losses {
  double unigram = 0;              // held-out loss of training-set word frequencies (add-one smoothed)
  double held_out_before = 0;      // the untrained model
  double held_out = 0, train = 0;  // after training
};

struct TrainResult {
  CorpusSplit corpus;
  Vocabulary vocab;
  std::unique_ptr<xgrad::nn::LanguageModel> model;  // in eval mode
  std::vector<float> step_losses;                   // the training batch's loss at each step
  Losses losses;
  double seconds = 0;  // training steps only
};

// on_step(step, steps, batch loss) after every step. A NaN or infinite loss or gradient stops the
// run with an Error naming the step.
TrainResult train(const TrainOptions& options, const CorpusSplit& corpus,
                  const std::function<void(std::size_t, std::size_t, float)>& on_step = {});

// Mean next-word loss of the model over all the sentences, in one batch, without recording.
double sentence_loss(const xgrad::nn::LanguageModel& model, const Vocabulary& vocab,
                     const std::vector<Sentence>& sentences);

// The loss on `evaluated` of word frequencies counted on `counted`.
double unigram_loss(const Vocabulary& vocab, const std::vector<Sentence>& counted,
                    const std::vector<Sentence>& evaluated);

}  // namespace zh
