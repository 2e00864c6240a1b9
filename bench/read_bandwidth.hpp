// The machine's read bandwidth as a decoding step meets it: a sum over a buffer of as many bytes
// as the weights it is compared with, on xgrad's kernel threads (each sums its own contiguous
// part), timed beside the products.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "xgrad/xgrad.hpp"

namespace bench {

// Streams `n` floats as a decode step streams a weight: four contiguous quarters read side by
// side, a 64-byte vector of each per step, each fetched 1 KB ahead. Of the sums tried over 400 MB
// on one thread, this read fastest (30-33 GB/s, where one stream of 32-byte vectors read 24-27 and
// xgrad's fp32 few-rows kernel streamed the 77 MB head at up to 35). Returns the sum, so that the
// reads are not optimized away.
inline float read_all(const float* x, std::size_t n) {
  typedef float Floats16 __attribute__((vector_size(64)));
  constexpr std::size_t kStreams = 4, kLine = 16, kAhead = 256;  // floats
  const std::size_t part = n / kStreams / kLine * kLine;
  Floats16 acc[kStreams] = {};
  for (std::size_t i = 0; i < part; i += kLine) {
    for (std::size_t s = 0; s < kStreams; ++s) {
      __builtin_prefetch(x + s * part + i + kAhead, 0, 3);
      Floats16 v;
      std::memcpy(&v, x + s * part + i, sizeof v);
      acc[s] += v;
    }
  }
  float sum = 0.f;
  for (std::size_t i = kStreams * part; i < n; ++i) sum += x[i];
  for (const Floats16& a : acc)
    for (std::size_t j = 0; j < kLine; ++j) sum += a[j];
  return sum;
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
