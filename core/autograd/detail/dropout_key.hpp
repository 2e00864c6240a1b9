// Dropout's mask is a keyed hash of each element's flat index (kernels::dropout_forward), keyed by
// one 64-bit draw from a Generator: the same generator state gives the same mask on every platform
// and thread count, and a kernel can regenerate any part of it from the key alone (the tiled
// attention's backward does, so the mask is never stored).
#pragma once

#include <cstdint>

#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad::detail {

struct DropoutKey {
  std::uint32_t k0, k1, threshold;  // keep an element when its hash is >= threshold
  float scale;                      // 1 / (1 - p)
};

inline DropoutKey draw_dropout_key(float p, Generator& gen) {
  // One locked draw of both halves, so threads sharing gen never interleave inside a key.
  const std::uint64_t key = gen.next_u64();
  return {static_cast<std::uint32_t>(key >> 32), static_cast<std::uint32_t>(key),
          static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0),  // P(h < t) = p
          1.f / (1.f - p)};
}

inline void check_dropout_probability(const char* op, float p) {
  if (!(p >= 0.f && p < 1.f)) fail(op, ": probability ", p, " is outside [0, 1)");
}

}  // namespace xgrad::detail
