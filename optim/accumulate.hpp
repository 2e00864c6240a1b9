// Gradient accumulation: several micro-batches' backward passes that add up to one larger batch's.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::optim {

/// Runs backward on micro-batch k's mean loss, loss_of(k), scaled by its share of all targets,
/// targets[k] / sum(targets), for k = 0 .. targets.size() - 1, one at a time (each graph is
/// released before the next forward). The gradients so add up to those of the mean loss over every
/// target of all micro-batches, as one batch that large would give them (to rounding), with the
/// activations of one micro-batch at a time. Returns that mean loss. The gradients add to those the
/// parameters hold: zero them first. No micro-batch, a total of 0 targets, and a loss that is not
/// one value are Errors.
///
///     optimizer.zero_grad();
///     optim::accumulate_gradients({rows * T, rows * T}, [&](std::size_t k) { return model.loss(ids[k], targets[k]);
///     }); optimizer.step();
double accumulate_gradients(const std::vector<std::size_t>& targets, const std::function<Tensor(std::size_t)>& loss_of);

}  // namespace xgrad::optim
