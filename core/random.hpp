// Seeded random numbers that are the same on every platform and standard library: the bits of
// std::mt19937 are fixed by the C++ standard, and every distribution here is our own code
// (no std::*_distribution, whose algorithms are implementation-defined).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(std::uint64_t seed);

  std::uint32_t next_u32() { return static_cast<std::uint32_t>(engine_()); }
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
  std::mt19937 engine_;
};

// The generator used when none is given; manual_seed resets it.
Generator& default_generator();
void manual_seed(std::uint64_t seed);

}  // namespace xgrad
