// The engine's support for checkpoint (ops_checkpoint.cpp): a forward recorded and swept on a
// tape and pass of their own, inside another pass's backward. Internal to core/autograd.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::detail {

/// Runs `forward` with grad mode on, recording onto a tape of its own that is dropped when it
/// returns (this thread's tape, pass and grad mode are set aside and restored, also on an
/// exception), and returns its output's value: the value a recorded forward computes (ops may take
/// other kernels without grad mode), without keeping its activations.
Array run_isolated(const std::function<Tensor()>& forward);

/// Runs `forward` with grad mode on, recording onto a tape of its own (this thread's tape and
/// pass are set aside and restored afterwards, also on an exception), then sweeps it back from
/// its output seeded with `seed`. The gradients that reach leaves are returned, not added to them:
/// no hook or listener of a leaf runs, so the caller hands them on as an op's input gradients.
std::vector<std::pair<std::shared_ptr<Node>, Array>> recompute_gradients(const std::function<Tensor()>& forward,
                                                                         const Array& seed);

}  // namespace xgrad::detail
