// Seeded random numbers that are the same on every platform and standard library: the bits of
// std::mt19937 are fixed by the C++ standard, and every distribution here is our own code
// (no std::*_distribution, whose algorithms are implementation-defined).
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

// A Generator may be shared by threads (two threads training one module draw dropout masks
// from its Generator): every call below is one atomic step under the generator's mutex, so
// threads never race on the engine; which thread gets which numbers depends on timing.
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) { manual_seed(seed); }
  // Copies the engine's state (the copy is an independent stream continuing from it).
  Generator(const Generator& other);
  Generator& operator=(const Generator& other);
  void manual_seed(std::uint64_t seed);
  // A new generator seeded from this one's state and the number of spawns so far, without
  // drawing from it: what this generator draws next is unchanged (a module's own dropout
  // stream is spawned so, and the weights initialized after it stay the same). Deterministic:
  // manual_seed and set_state reset the spawn count, which is not part of state().
  Generator spawn();

  std::uint32_t next_u32();
  std::uint64_t next_u64();               // (first draw << 32) | second draw
  float uniform();                        // [0, 1), from the top 24 bits of one draw
  float uniform(float low, float high);   // [low, high)
  float normal();                         // N(0, 1) by Box-Muller
  float normal(float mean, float stddev);
  std::uint64_t below(std::uint64_t n);   // uniform integer in [0, n), without modulo bias

  Array uniform(const Shape& shape, float low, float high);
  Array normal(const Shape& shape, float mean, float stddev);

  // The engine's full state as text, to checkpoint and restore a run exactly.
  std::string state() const;
  void set_state(const std::string& state);

 private:
  // The draws themselves; callers hold mutex_.
  std::uint32_t draw() { return static_cast<std::uint32_t>(engine_()); }
  float draw_unit() { return static_cast<float>(draw() >> 8) * (1.0f / 16777216.0f); }  // [0, 1)
  float draw_uniform(float low, float high);
  float draw_normal();

  mutable std::mutex mutex_;
  std::mt19937 engine_;
  std::uint64_t spawned_ = 0;
};

// SplitMix64 of (base, index): base + index times the golden ratio, through SplitMix64's
// finalizer, so nearby bases and indices give unrelated 64-bit seeds (spawned generators,
// modules' dropout streams).
inline std::uint64_t mix_seed(std::uint64_t base, std::uint64_t index) {
  std::uint64_t z = base + 0x9E3779B97F4A7C15ull * index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The generator used when none is given; manual_seed resets it. Each thread has its own,
// seeded 0. nn::Dropout keeps a pointer to the generator it was given: one built with the
// default must not draw after the thread that built it has ended.
Generator& default_generator();
void manual_seed(std::uint64_t seed);

}  // namespace xgrad
