/// @file
/// Seeded random numbers that are the same on every platform and standard library: the bits of
/// std::mt19937 are fixed by the C++ standard, and every distribution here is our own code
/// (no std::*_distribution, whose algorithms are implementation-defined).
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

/// A seeded stream of random numbers on std::mt19937, with xgrad's own uniform and normal draws.
/// A Generator may be shared by threads (two threads training one module draw dropout masks
/// from its Generator): every call below is one atomic step under the generator's mutex, so
/// threads never race on the engine; which thread gets which numbers depends on timing.
class Generator {
 public:
  /// A generator seeded as manual_seed(seed) seeds it.
  explicit Generator(std::uint64_t seed = 0) { manual_seed(seed); }
  /// A generator to build a model whose every weight a loader then overwrites: its array draws
  /// draw nothing, uniform(shape, ...) and normal(shape, ...) give zeros (zeroed_array: memory fresh
  /// from the system is not even written) and fill_normal leaves the array as it is, so a model of
  /// 150M weights costs neither 150M draws nor a pass over its memory; its other draws and its
  /// spawns are Generator(seed)'s. Copies keep the mode.
  static Generator for_loading(std::uint64_t seed = 0);
  /// Copies the engine's state (the copy is an independent stream continuing from it) and the
  /// spawn count.
  Generator(const Generator& other);
  /// Copies the engine's state and the spawn count, as the copy constructor does.
  Generator& operator=(const Generator& other);
  /// Restarts the stream from `seed`, folded to mt19937's 32-bit seed as (low 32 bits) ^ (high 32
  /// bits), and resets the spawn count.
  void manual_seed(std::uint64_t seed);
  /// A new generator seeded from this one's state and the number of spawns so far, without
  /// drawing from it: what this generator draws next is unchanged (a module's own dropout
  /// stream is spawned so, and the weights initialized after it stay the same). Deterministic:
  /// manual_seed and set_state reset the spawn count, which is not part of state().
  Generator spawn();

  std::uint32_t next_u32();                ///< One draw of the engine: 32 random bits.
  std::uint64_t next_u64();                ///< (first draw << 32) | second draw
  float uniform();                         ///< [0, 1), from the top 24 bits of one draw
  float uniform(float low, float high);    ///< [low, high)
  float normal();                          ///< N(0, 1) by Box-Muller
  float normal(float mean, float stddev);  ///< N(mean, stddev^2): mean + stddev * normal().
  /// Uniform integer in [0, n), without modulo bias; n must be in [1, 2^32] (else an Error).
  std::uint64_t below(std::uint64_t n);

  /// An array of `shape` with every element drawn as uniform(low, high), in row-major order
  /// (zeros from a for_loading generator). A shape whose size passes size_t or the memory left
  /// throws, naming the shape.
  Array uniform(const Shape& shape, float low, float high);
  /// An array of `shape` with every element drawn as normal(mean, stddev), in row-major order
  /// (zeros from a for_loading generator; a shape too large throws, as for uniform).
  Array normal(const Shape& shape, float mean, float stddev);
  /// Every element of `a` drawn as normal(mean, stddev) in row-major order, in place: the values
  /// of normal(a.shape(), mean, stddev), without a second array (a for_loading generator leaves
  /// `a` as it is).
  void fill_normal(Array& a, float mean, float stddev);

  /// The engine's full state as text, to checkpoint and restore a run exactly.
  std::string state() const;
  /// Restores a state() text and resets the spawn count; text that is no state is an Error.
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
  bool zero_arrays_ = false;  // for_loading
};

/// SplitMix64 of (base, index): base + index times the golden ratio, through SplitMix64's
/// finalizer, so nearby bases and indices give unrelated 64-bit seeds (spawned generators,
/// modules' dropout streams).
inline std::uint64_t mix_seed(std::uint64_t base, std::uint64_t index) {
  std::uint64_t z = base + 0x9E3779B97F4A7C15ull * index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The generator used when none is given; manual_seed resets it. Each thread has its own,
/// seeded 0. nn::Dropout keeps a pointer to the generator it was given: one built with the
/// default must not draw after the thread that built it has ended.
Generator& default_generator();
/// Reseeds the calling thread's default_generator() (Generator::manual_seed).
void manual_seed(std::uint64_t seed);

}  // namespace xgrad
