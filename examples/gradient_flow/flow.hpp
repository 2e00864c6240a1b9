// The gradient-flow measurements: Pre-Norm and Post-Norm language models at initialization
// (the setting of Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"),
// and short training runs with and without warm-up.
// Shapes: B batch, T length, V vocabulary, L layers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xgrad/inspect/head_importance.hpp"
#include "xgrad/inspect/probe.hpp"
#include "xgrad/nn/transformer.hpp"

namespace gradflow {

struct FlowConfig {
  std::size_t layers = 6, d_model = 256, heads = 4, d_ff = 0;  // d_ff 0: 4 * d_model
  std::size_t vocab = 64, seq_len = 32;
  std::size_t batches = 16, batch = 16;
  std::uint64_t seed = 0;
};

// Throws xgrad::Error naming the setting that is impossible.
void validate(const FlowConfig& config);

struct LmBatch {
  xgrad::IndexArray ids;      // (B, T), uniform tokens
  xgrad::IndexArray targets;  // (B, T): the previous token (-100 at t = 0), a shift task
};

std::vector<LmBatch> shift_batches(const FlowConfig& config, std::size_t count, xgrad::Generator& gen);

// A language model as in the paper's setting: Xavier-uniform linear weights (zero biases),
// N(0, 1) embeddings, LayerNorm 1 and 0, no dropout.
std::unique_ptr<xgrad::nn::LanguageModel> make_model(const FlowConfig& config, xgrad::nn::Norm norm,
                                                     xgrad::Generator& gen);

struct LayerFlow {
  std::size_t layer = 0;
  // |E[dL/dW2]|: Frobenius norm of the second feed-forward weight's gradient averaged over
  // the batches (the quantity of the paper's Fig. 3).
  double ffn_weight_grad_norm = 0;
  // E|dL/dx|: norm of the gradient of the residual stream entering the layer, averaged.
  double residual_grad_norm = 0;
  xgrad::inspect::ResidualFlow attention, feed_forward;  // averaged over batches
};

struct FlowResult {
  std::vector<LayerFlow> layers;
  std::vector<xgrad::inspect::HeadScore> heads;  // Michel et al. head importance
  double loss = 0;                               // mean loss over the batches
};

// Backward over every batch at the model's current weights (nothing is updated).
FlowResult measure(xgrad::nn::LanguageModel& model, const std::vector<LmBatch>& batches);

struct TrainCurve {
  std::string name;
  std::vector<float> losses;
  bool diverged = false;   // a loss or gradient became NaN or infinite (training stops there)
  std::string divergence;  // which, and at what step: "step 37: the loss is inf"
};

// AdamW at `lr` (linear warm-up over `warmup` steps, then constant) on fresh shift batches.
TrainCurve train_curve(const FlowConfig& config, xgrad::nn::Norm norm, float lr, std::size_t warmup, std::size_t steps,
                       const std::function<void(std::size_t step, float loss)>& on_step = {});

}  // namespace gradflow
