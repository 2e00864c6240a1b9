// The machine's read bandwidth as a decoding step meets it: a sum over a buffer larger than the
// caches, on xgrad's kernel threads (each sums its own contiguous part), timed beside the
// products it is compared with.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "xgrad/xgrad.hpp"

namespace bench {

// Streams `n` floats as a decode step streams a weight. Returns their sum, so that the reads are
// not optimized away.
inline float read_all(const float* x, std::size_t n) {
  typedef float Floats8 __attribute__((vector_size(32)));
  Floats8 acc[4] = {};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) {
      Floats8 v;
      std::memcpy(&v, x + i + 8 * j, sizeof v);
      acc[j] += v;
    }
  }
  float s = 0.f;
  for (; i < n; ++i) s += x[i];
  for (const Floats8& a : acc)
    for (int j = 0; j < 8; ++j) s += a[j];
  return s;
}

// read_all split into xgrad::num_threads() contiguous parts, one range of parts per thread.
inline float read_all_threads(const float* x, std::size_t n) {
  const std::size_t parts = static_cast<std::size_t>(xgrad::num_threads());
  std::vector<float> sums(parts);
  xgrad::parallel_for(parts, 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t p = lo; p < hi; ++p) sums[p] = read_all(x + n * p / parts, n * (p + 1) / parts - n * p / parts);
  });
  float s = 0.f;
  for (float v : sums) s += v;
  return s;
}

}  // namespace bench
