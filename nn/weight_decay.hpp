// The usual weight-decay rule as a split of a model's parameters: no decay on norms, biases,
// embeddings and 1-D parameters (optim::decay_groups turns the split into parameter groups).
#pragma once

#include <utility>

#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

/// Splits the parameters of `model` into (decay, no_decay), each named as named_parameters()
/// names it and in its order. By module type (through named_modules()): a Linear's weight
/// decays; a Linear's bias, the weight and bias of LayerNorm and RMSNorm, the tables of
/// Embedding and LearnedPositionalEncoding do not. Any parameter of fewer than 2 axes does not
/// decay either; any other (a matrix of another module type) decays. A tensor reached under two
/// names (tied embeddings, a module under two parents) appears once, under its first name, and
/// does not decay if any module owning it says so. Every trainable parameter is in exactly one of
/// the two; a frozen one (requires_grad false: nn::freeze, nn::apply_lora) in neither, since no
/// optimizer takes it.
/// The one-line use with an optimizer:
///
///     optim::AdamW opt(optim::decay_groups(nn::split_for_weight_decay(model), 0.1f), optim::AdamOptions(3e-4f));
std::pair<NamedTensors, NamedTensors> split_for_weight_decay(Module& model);

}  // namespace xgrad::nn
