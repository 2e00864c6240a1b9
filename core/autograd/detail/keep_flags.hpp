// A boolean mask as the byte flags the masking kernels read (masked_softmax, masked_fill,
// attention_weights).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

// The mask broadcast to `shape`, as 1 where it is false (keep) and 0 where it is true. Throws,
// naming `op`, if the mask does not broadcast to `shape`.
std::shared_ptr<std::vector<std::uint8_t>> keep_flags(const Mask& mask, const Shape& shape, const char* op);

}  // namespace xgrad
