// Platform-independent uniform and normal draws on top of std::mt19937.
#include "xgrad/core/random.hpp"

#include <cmath>
#include <sstream>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"

namespace xgrad {

namespace {

// An array of `shape` to fill, refused (naming `who`) when its size passes size_t or the memory
// left: a count that wrapped around would give an array of that shape with too few elements.
// Zeros for a loader's model (zeroed_array: fresh memory is not written).
Array array_of(const Shape& shape, const char* who, bool zeros = false) {
  double n = 1;
  for (const std::size_t d : shape) n *= static_cast<double>(d);
  check_available_memory(n * sizeof(float), who, "an array of shape " + shape_str(shape));
  return zeros ? zeroed_array(shape) : Array::from_shape(shape);
}

}  // namespace

Generator::Generator(const Generator& other) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  engine_ = other.engine_;
  spawned_ = other.spawned_;
  zero_arrays_ = other.zero_arrays_;
}

Generator& Generator::operator=(const Generator& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mutex_, other.mutex_);
  engine_ = other.engine_;
  spawned_ = other.spawned_;
  zero_arrays_ = other.zero_arrays_;
  return *this;
}

Generator Generator::for_loading(std::uint64_t seed) {
  Generator g(seed);
  g.zero_arrays_ = true;
  return g;
}

Generator Generator::spawn() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::mt19937 ahead = engine_;                       // draws from a copy leave this generator's stream as it was
  const std::uint64_t high = ahead(), low = ahead();  // two statements: the order is fixed
  return Generator(mix_seed(high << 32 | low, ++spawned_));
}

void Generator::manual_seed(std::uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Fold 64 bits into mt19937's 32-bit seed; the standard fixes the resulting sequence.
  engine_.seed(static_cast<std::uint32_t>(seed ^ (seed >> 32)));
  spawned_ = 0;
}

std::uint32_t Generator::next_u32() {
  std::lock_guard<std::mutex> lock(mutex_);
  return draw();
}

std::uint64_t Generator::next_u64() {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t first = draw();
  return first << 32 | draw();
}

float Generator::uniform() {
  std::lock_guard<std::mutex> lock(mutex_);
  return draw_unit();
}

float Generator::draw_uniform(float low, float high) {
  // low + (high - low) u can round up to high itself when low is large against the span.
  const float x = low + (high - low) * draw_unit();
  return x < high ? x : std::nextafter(high, low);
}

float Generator::uniform(float low, float high) {
  std::lock_guard<std::mutex> lock(mutex_);
  return draw_uniform(low, high);
}

float Generator::draw_normal() {
  // Box-Muller with u1 in (0, 1] so the log is finite; computed in double, rounded once.
  const double u1 = 1.0 - static_cast<double>(draw() >> 8) / 16777216.0;
  const double u2 = static_cast<double>(draw() >> 8) / 16777216.0;
  const double two_pi = 6.283185307179586476925;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
}

float Generator::normal() {
  std::lock_guard<std::mutex> lock(mutex_);
  return draw_normal();
}

float Generator::normal(float mean, float stddev) {
  std::lock_guard<std::mutex> lock(mutex_);
  return mean + stddev * draw_normal();
}

std::uint64_t Generator::below(std::uint64_t n) {
  if (n == 0) fail("Generator::below: n must be positive");
  if (n > 0x100000000ull) fail("Generator::below: n ", n, " exceeds 2^32");
  // Rejection sampling: accept only draws below the largest multiple of n.
  const std::uint64_t span = 0x100000000ull;
  const std::uint64_t limit = span - span % n;
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t x;
  do {
    x = draw();
  } while (x >= limit);
  return x % n;
}

Array Generator::uniform(const Shape& shape, float low, float high) {
  if (zero_arrays_) return array_of(shape, "Generator::uniform", true);
  Array a = array_of(shape, "Generator::uniform");
  std::lock_guard<std::mutex> lock(mutex_);
  for (float& v : a) v = draw_uniform(low, high);
  return a;
}

Array Generator::normal(const Shape& shape, float mean, float stddev) {
  if (zero_arrays_) return array_of(shape, "Generator::normal", true);
  Array a = array_of(shape, "Generator::normal");
  fill_normal(a, mean, stddev);
  return a;
}

void Generator::fill_normal(Array& a, float mean, float stddev) {
  if (zero_arrays_) return;  // a loader's array: left as it is, so its memory stays untouched
  std::lock_guard<std::mutex> lock(mutex_);
  for (float& v : a) v = mean + stddev * draw_normal();
}

std::string Generator::state() const {
  std::ostringstream os;
  std::lock_guard<std::mutex> lock(mutex_);
  os << engine_;
  return os.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream is(state);
  std::mt19937 e;
  is >> e;
  if (is.fail()) fail("Generator::set_state: not a generator state (", state.size(), " characters)");
  std::lock_guard<std::mutex> lock(mutex_);
  engine_ = e;
  spawned_ = 0;
}

Generator& default_generator() {
  static thread_local Generator g(0);
  return g;
}

void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace xgrad
