// Platform-independent uniform and normal draws on top of std::mt19937.
#include "xgrad/core/random.hpp"

#include <cmath>
#include <sstream>

#include "xgrad/core/error.hpp"

namespace xgrad {

void Generator::manual_seed(std::uint64_t seed) {
  // Fold 64 bits into mt19937's 32-bit seed; the standard fixes the resulting sequence.
  engine_.seed(static_cast<std::uint32_t>(seed ^ (seed >> 32)));
}

float Generator::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

float Generator::uniform(float low, float high) {
  // low + (high - low) u can round up to high itself when low is large against the span.
  const float x = low + (high - low) * uniform();
  return x < high ? x : std::nextafter(high, low);
}

float Generator::normal() {
  // Box-Muller with u1 in (0, 1] so the log is finite; computed in double, rounded once.
  const double u1 = 1.0 - static_cast<double>(next_u32() >> 8) / 16777216.0;
  const double u2 = static_cast<double>(next_u32() >> 8) / 16777216.0;
  const double two_pi = 6.283185307179586476925;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
}

float Generator::normal(float mean, float stddev) { return mean + stddev * normal(); }

std::uint64_t Generator::below(std::uint64_t n) {
  if (n == 0) fail("Generator::below: n must be positive");
  if (n > 0x100000000ull) fail("Generator::below: n ", n, " exceeds 2^32");
  // Rejection sampling: accept only draws below the largest multiple of n.
  const std::uint64_t span = 0x100000000ull;
  const std::uint64_t limit = span - span % n;
  std::uint64_t x;
  do {
    x = next_u32();
  } while (x >= limit);
  return x % n;
}

Array Generator::uniform(const Shape& shape, float low, float high) {
  Array a = Array::from_shape(shape);
  for (float& v : a) v = uniform(low, high);
  return a;
}

Array Generator::normal(const Shape& shape, float mean, float stddev) {
  Array a = Array::from_shape(shape);
  for (float& v : a) v = normal(mean, stddev);
  return a;
}

std::string Generator::state() const {
  std::ostringstream os;
  os << engine_;
  return os.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream is(state);
  std::mt19937 e;
  is >> e;
  if (is.fail()) fail("Generator::set_state: not a generator state (", state.size(), " characters)");
  engine_ = e;
}

Generator& default_generator() {
  static thread_local Generator g(0);
  return g;
}

void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace xgrad
