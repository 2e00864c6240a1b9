// The seeded generator: the same seed gives the same numbers on every platform. Checks the bits
// against std::mt19937 (fixed by the standard), the uniform/normal/below algorithms, state
// round-trips, and pins the first values for seed 42.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

// The uniform() formula recomputed from raw engine bits: the top 24 bits over 2^24.
float uniform_from_bits(std::uint32_t u) { return static_cast<float>(u >> 8) / 16777216.0f; }

}  // namespace

TEST_CASE("std::mt19937 is the engine fixed by the standard", "[random]") {
  // [rand.predef]: the 10000th consecutive invocation of a default-constructed mt19937
  // produces 4123659995.
  std::mt19937 e;
  e.discard(9999);
  REQUIRE(e() == 4123659995u);
  // the generator seeded with mt19937's default seed 5489 gives the same 10000th value
  Generator g(5489);
  for (int i = 0; i < 9999; ++i) g.next_u32();
  REQUIRE(g.next_u32() == 4123659995u);
}

TEST_CASE("next_u32 equals std::mt19937's output for the same 32-bit seed", "[random]") {
  for (std::uint32_t seed : {0u, 1u, 42u, 0xdeadbeefu, 0xffffffffu}) {
    INFO("seed " << seed);
    Generator g(seed);
    std::mt19937 ref(seed);
    for (int i = 0; i < 1000; ++i) REQUIRE(g.next_u32() == ref());
  }
}

TEST_CASE("a fixed seed reproduces the sequence, different seeds differ", "[random]") {
  auto draws = [](std::uint64_t seed) {
    Generator g(seed);
    std::vector<float> v;
    for (int i = 0; i < 64; ++i) v.push_back(i % 2 ? g.uniform() : g.normal());
    return v;
  };
  REQUIRE(draws(7) == draws(7));
  REQUIRE(draws(7) != draws(8));
  REQUIRE(draws(0) != draws(1));
  // seeds that differ only in their upper 32 bits give different sequences too
  REQUIRE(draws(0) != draws(std::uint64_t{1} << 32));

  // manual_seed on an existing generator restarts the sequence
  Generator g(7);
  const float first = g.uniform();
  g.uniform();
  g.manual_seed(7);
  REQUIRE(g.uniform() == first);
}

TEST_CASE("uniform() is the top 24 bits of one draw divided by 2^24", "[random]") {
  Generator g(1234);
  std::mt19937 ref(1234);
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t u = ref();
    const float want = static_cast<float>(u >> 8) * (1.0f / 16777216.0f);
    REQUIRE(g.uniform() == want);
  }
  // one draw per uniform(): the engines are still in step
  REQUIRE(g.next_u32() == ref());
}

TEST_CASE("uniform() lies in 0 <= u < 1 and covers it", "[random]") {
  Generator g(99);
  float lo = 1.f, hi = 0.f;
  double total = 0;
  const int n = 200000;
  int outside = 0, off_grid = 0;
  for (int i = 0; i < n; ++i) {
    const float u = g.uniform();
    outside += !(u >= 0.f && u < 1.f);
    off_grid += std::floor(u * 16777216.0f) != u * 16777216.0f;  // not a multiple of 2^-24
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    total += u;
  }
  REQUIRE(outside == 0);
  REQUIRE(off_grid == 0);
  CHECK(lo < 1e-4f);
  CHECK(hi > 1.f - 1e-4f);
  // mean of U(0,1) is 1/2 with standard error 1/sqrt(12 n) ~ 0.00065; allow ~8 of them
  CHECK(total / n == Approx(0.5).margin(0.005));
  // the largest possible draw (all 24 bits set) still maps below 1
  REQUIRE(uniform_from_bits(0xffffffffu) < 1.f);
  REQUIRE(uniform_from_bits(0x000000ffu) == 0.f);
}

TEST_CASE("uniform(low, high) lies in low <= u < high", "[random]") {
  Generator g(5);
  int outside = 0;
  for (int i = 0; i < 100000; ++i) {
    const float u = g.uniform(-0.25f, 0.75f);
    outside += !(u >= -0.25f && u < 0.75f);
  }
  REQUIRE(outside == 0);
  Generator h(6);
  std::mt19937 ref(6);
  for (int i = 0; i < 100; ++i) REQUIRE(h.uniform(2.f, 6.f) == Approx(2.f + 4.f * uniform_from_bits(ref())));
}

TEST_CASE("uniform(low, high) stays below high on the largest draw", "[random][boundary]") {
  // Seed 0's draw number 6541537 (0-based) has its top 24 bits all set: uniform() returns
  // 1 - 2^-24, the largest value below 1. For [low, high) = [1, 2) the float result of
  // low + (high - low) * u must still be below 2.
  Generator g(0);
  for (int i = 0; i < 6541537; ++i) g.next_u32();
  Generator probe(0);
  probe.set_state(g.state());
  REQUIRE((probe.next_u32() >> 8) == 0xffffffu);  // the test is set up at the right draw

  Generator a(0), b(0), c(0);
  a.set_state(g.state());
  b.set_state(g.state());
  c.set_state(g.state());
  REQUIRE(a.uniform() < 1.f);
  CHECK(b.uniform(1.f, 2.f) < 2.f);
  CHECK(c.uniform(0.5f, 1.f) < 1.f);
}

TEST_CASE("normal() is Box-Muller on two draws with mean 0 and std 1", "[random]") {
  SECTION("recomputed from the engine's bits") {
    Generator g(2024);
    std::mt19937 ref(2024);
    for (int i = 0; i < 1000; ++i) {
      // u1 in (0, 1] keeps the log finite; u2 in [0, 1)
      const double u1 = 1.0 - static_cast<double>(ref() >> 8) / 16777216.0;
      const double u2 = static_cast<double>(ref() >> 8) / 16777216.0;
      const double want = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
      REQUIRE(g.normal() == Approx(want).margin(1e-6));
    }
    REQUIRE(g.next_u32() == ref());  // exactly two draws per normal()
  }

  SECTION("moments over 200k draws") {
    Generator g(31337);
    const int n = 200000;
    double s = 0, s2 = 0, s4 = 0;
    int beyond3 = 0;
    for (int i = 0; i < n; ++i) {
      const double z = g.normal();
      if (!std::isfinite(z)) FAIL("normal() returned " << z);
      s += z;
      s2 += z * z;
      s4 += z * z * z * z;
      beyond3 += std::abs(z) > 3.0;
    }
    const double mean = s / n;
    const double var = s2 / n - mean * mean;
    // standard errors: mean 1/sqrt(n) ~ 0.0022, std 1/sqrt(2n) ~ 0.0016; tolerances ~4-6 of them
    CHECK(mean == Approx(0.0).margin(0.01));
    CHECK(std::sqrt(var) == Approx(1.0).margin(0.01));
    // a normal, not just any unit-variance law: kurtosis 3, P(|z| > 3) = 0.0027
    CHECK(s4 / n == Approx(3.0).margin(0.1));
    CHECK(beyond3 == Approx(0.0027 * n).margin(0.0008 * n));
  }

  SECTION("normal(mean, stddev) is mean + stddev * normal()") {
    Generator a(8), b(8);
    for (int i = 0; i < 100; ++i) REQUIRE(a.normal(3.f, 0.5f) == Approx(3.f + 0.5f * b.normal()));
  }
}

TEST_CASE("below(n) stays below n, is roughly uniform and has no modulo bias", "[random]") {
  Generator g(77);
  for (std::uint64_t n : {1ull, 2ull, 3ull, 7ull, 1000ull, 0xffffffffull}) {
    int outside = 0;
    for (int i = 0; i < 2000; ++i) outside += g.below(n) >= n;
    INFO("n = " << n);
    REQUIRE(outside == 0);
  }
  REQUIRE(g.below(1) == 0);

  // 100k draws over 10 buckets: each expects 10000 with sd ~95; allow +-500
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 100000; ++i) ++counts[g.below(10)];
  for (int c : counts) CHECK(c == Approx(10000).margin(500));

  // n = 3 * 2^30: a 32-bit draw taken modulo n would put 1/2 of the mass below 2^30
  // (draws in [n, 2^32) fold onto [0, 2^30)); rejection sampling gives 1/3.
  const std::uint64_t n = 3ull << 30;
  int low = 0;
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) low += g.below(n) < (1ull << 30);
  CHECK(static_cast<double>(low) / draws == Approx(1.0 / 3.0).margin(0.02));

  // and the accepted draws are the engine's own: x < n is kept as is, x >= n is redrawn
  Generator h(11);
  std::mt19937 ref(11);
  for (int i = 0; i < 1000; ++i) {
    std::uint32_t x;
    do x = ref();
    while (x >= n);
    REQUIRE(h.below(n) == x);
  }

  REQUIRE_THROWS_AS(g.below(0), Error);
  REQUIRE_THROWS_AS(g.below((1ull << 32) + 1), Error);
}

TEST_CASE("state() and set_state() round-trip and continue the same sequence", "[random]") {
  Generator g(123);
  for (int i = 0; i < 7; ++i) g.normal();
  const std::string saved = g.state();
  auto draw_mix = [](Generator& gen) {
    std::vector<double> v;
    for (int i = 0; i < 20; ++i) {
      v.push_back(gen.uniform());
      v.push_back(gen.normal());
      v.push_back(gen.next_u32());
      v.push_back(static_cast<double>(gen.below(17)));
    }
    return v;
  };
  const std::vector<double> first = draw_mix(g);
  g.set_state(saved);
  REQUIRE(draw_mix(g) == first);
  // restoring into another generator continues the same sequence there
  Generator other(999);
  other.set_state(saved);
  REQUIRE(draw_mix(other) == first);
  REQUIRE(other.state() == g.state());
}

TEST_CASE("set_state on garbage throws and leaves the generator unchanged", "[random]") {
  Generator g(4);
  Generator twin(4);
  for (const std::string& bad : {std::string(), std::string("not a state"), std::string("1 2 3")}) {
    INFO("state '" << bad << "'");
    REQUIRE_THROWS_AS(g.set_state(bad), Error);
    REQUIRE_THROWS_WITH(g.set_state(bad), Catch::Contains("set_state"));
  }
  for (int i = 0; i < 10; ++i) REQUIRE(g.next_u32() == twin.next_u32());
}

TEST_CASE("manual_seed resets the default generator", "[random]") {
  manual_seed(2718);
  std::vector<float> a;
  for (int i = 0; i < 5; ++i) a.push_back(default_generator().uniform());
  default_generator().normal();  // move it along
  manual_seed(2718);
  std::vector<float> b;
  for (int i = 0; i < 5; ++i) b.push_back(default_generator().uniform());
  REQUIRE(a == b);
  Generator fresh(2718);
  for (float v : a) REQUIRE(fresh.uniform() == v);
  REQUIRE(&default_generator() == &default_generator());
}

TEST_CASE("array draws fill in row-major order from the scalar sequence", "[random]") {
  Generator g(55), ref(55);
  const Array u = g.uniform({2, 3}, -1.f, 1.f);
  REQUIRE(shape_str(u.shape()) == "(2, 3)");
  for (float v : u) REQUIRE(v == ref.uniform(-1.f, 1.f));
  const Array z = g.normal({4, 1, 2}, 0.f, 2.f);
  REQUIRE(shape_str(z.shape()) == "(4, 1, 2)");
  for (float v : z) REQUIRE(v == ref.normal(0.f, 2.f));
  Array in_place = Array::from_shape({3, 2});
  g.fill_normal(in_place, 1.f, 0.5f);
  for (float v : in_place) REQUIRE(v == ref.normal(1.f, 0.5f));
}

TEST_CASE("pinned: the first uniform() and normal() values for seed 42", "[random][pinned]") {
  // These literals are pinned on purpose: the promise is "same seed, same weights on every
  // platform and standard library", so any change of platform, compiler, library or algorithm
  // that alters the sequence must fail here. The uniform values are exact (integer bits scaled
  // by 2^-24). As an outside check, the 1st, 3rd and 5th agree to 7 digits with numpy's
  // RandomState(42).random_sample(3) = 0.3745401, 0.9507143, 0.7319939, which reads the top bits
  // of the same mt19937 draws (two per double). The normal values go through std::log and
  // std::cos, which are not bit-specified, so they get 1e-6 (a few float ulps) of slack; any
  // real change of the sequence is far larger.
  Generator g(42);
  const float uniforms[5] = {0.374540091f, 0.796542943f, 0.95071429f, 0.183434784f, 0.731993914f};
  for (float want : uniforms) REQUIRE(g.uniform() == want);

  Generator h(42);
  const float normals[5] = {0.279287368f, 0.996547401f, 0.300987422f, -1.10869062f, -0.549042165f};
  for (float want : normals) REQUIRE(h.normal() == Approx(want).margin(1e-6));
}

TEST_CASE("spawn draws nothing from its parent, is deterministic, and its children differ", "[random]") {
  Generator g(77), untouched(77);
  Generator a = g.spawn(), b = g.spawn();
  for (int i = 0; i < 8; ++i) REQUIRE(g.next_u32() == untouched.next_u32());  // the parent's stream is as it was
  Generator g2(77);
  Generator a2 = g2.spawn(), b2 = g2.spawn();
  std::vector<std::uint32_t> da, db;
  for (int i = 0; i < 8; ++i) {
    da.push_back(a.next_u32());
    db.push_back(b.next_u32());
    REQUIRE(da.back() == a2.next_u32());  // the same parent state and count, the same child
    REQUIRE(db.back() == b2.next_u32());
  }
  REQUIRE(da != db);  // the first and the second child are different streams
  Generator c = Generator(78).spawn();
  REQUIRE(c.next_u32() != Generator(77).spawn().next_u32());  // and other parents, other children

  // The child's seed spelled out (SplitMix64's finalizer over the parent's next two draws, high
  // first, plus the golden ratio times the spawn count), so a change of the formula or of the
  // order of the draws fails here.
  std::mt19937 parent(77);
  const std::uint64_t high = parent(), low = parent();
  std::uint64_t z = (high << 32 | low) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  Generator want(z ^ (z >> 31));
  REQUIRE(Generator(77).spawn().next_u32() == want.next_u32());
  // Reseeding starts the spawn count again: the same seed, the same children.
  Generator r(77);
  r.spawn();
  r.manual_seed(77);
  REQUIRE(r.spawn().next_u32() == Generator(77).spawn().next_u32());
  r.set_state(Generator(77).state());
  r.spawn();
  r.set_state(Generator(77).state());
  REQUIRE(r.spawn().next_u32() == Generator(77).spawn().next_u32());
}

TEST_CASE("zeroed_array gives zeros, on memory fresh from the system and on memory freed by another array",
          "[random]") {
  for (int round = 0; round < 3; ++round) {
    {
      Array used = Array::from_shape({1000, 257});
      used.fill(7.f);
    }  // freed: its chunk may be reused below
    const Array z = zeroed_array({1000, 257});
    REQUIRE(shape_str(z.shape()) == "(1000, 257)");
    for (float v : z) REQUIRE(v == 0.f);
  }
  REQUIRE(zeroed_array({0, 3}).size() == 0);
}

// What a loader builds its model with: the weights' arrays cost an allocation, not a draw each.
TEST_CASE(
    "a for_loading generator's arrays are zeros, fill_normal leaves an array alone, nothing is drawn, the rest is "
    "Generator(seed)'s",
    "[random]") {
  Generator loading = Generator::for_loading(9), ref(9);
  const Array u = loading.uniform({2, 3}, -1.f, 1.f), n = loading.normal({4}, 1.f, 2.f);
  REQUIRE(shape_str(u.shape()) == "(2, 3)");
  REQUIRE(shape_str(n.shape()) == "(4)");
  for (float v : u) REQUIRE(v == 0.f);
  for (float v : n) REQUIRE(v == 0.f);
  Array filled = Array::from_shape({2});
  filled.fill(7.f);
  loading.fill_normal(filled, 0.f, 1.f);
  REQUIRE((filled(0) == 7.f && filled(1) == 7.f));
  REQUIRE(loading.next_u32() == ref.next_u32());  // the engine did not move
  REQUIRE(loading.uniform(-1.f, 1.f) == ref.uniform(-1.f, 1.f));
  REQUIRE(loading.spawn().next_u32() == ref.spawn().next_u32());
  REQUIRE(loading.spawn().uniform({1}, 0.f, 1.f)(0) != 0.f);  // a spawn draws as usual
  Generator copy = loading;
  REQUIRE(copy.normal({2}, 5.f, 1.f)(1) == 0.f);  // a copy keeps the mode
  REQUIRE(Generator(9).uniform({1}, 5.f, 6.f)(0) >= 5.f);
}
