// Seeded random leaves for the op tests: the same values on every platform (xgrad's own draws).
#pragma once

#include <cstdint>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad::testing {

// N(0, scale^2) values from a fixed seed, as a leaf that requires grad.
inline Tensor randn(const Shape& shape, std::uint64_t seed, float scale = 1.f) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, scale), true);
}

}  // namespace xgrad::testing
