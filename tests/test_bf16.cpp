// bf16 mixed precision: rounding to bf16, blas::gemm and gemm_batched in bf16 against a double
// reference of the rounded operands and against fp32, linear, matmul and the attention ops under
// AutocastGuard (forward and backward, the backward's precision recorded at forward), fp32
// unchanged bit for bit, the guard's nesting and threads, the optimizer's refusal, the weight
// cache, and a small model trained under bf16.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "small_models.hpp"
#include "xgrad/core/autograd/detail/bf16_cache.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/sgd.hpp"

using namespace xgrad;
using namespace xgrad::optim;
using Catch::Contains;

namespace {

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

float rounded(float x) { return blas::from_bf16(blas::to_bf16(x)); }

// The paths this build and CPU can run: emulated always, hardware where it is available.
std::vector<blas::Bf16Path> runnable_paths() {
  std::vector<blas::Bf16Path> paths{blas::Bf16Path::emulated};
  if (blas::bf16_hardware_available()) paths.push_back(blas::Bf16Path::hardware);
  return paths;
}

struct PathScope {
  explicit PathScope(blas::Bf16Path p) : before(blas::bf16_path()) { blas::set_bf16_path(p); }
  ~PathScope() { blas::set_bf16_path(before); }
  blas::Bf16Path before;
};

struct ThreadScope {
  explicit ThreadScope(int n) : before(num_threads()) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(before); }
  int before;
};

Array random_array(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return gen.uniform(shape, -1.f, 1.f);
}

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |a - b| / max |b|: the error relative to the result's scale.
double relative_error(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a.data()[i]) - b.data()[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b.data()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// run(precision) gives an op's outputs and gradients, forward under a guard of that precision:
// on every runnable path, bf16 agrees with fp32 to bf16's rounding and is not fp32 in disguise.
template <class Run>
void check_follows_guard(Run run) {
  const std::vector<Array> fp32 = run(Precision::fp32);
  for (blas::Bf16Path path : runnable_paths()) {
    PathScope scope(path);
    CAPTURE(blas::bf16_path_name(path));
    const std::vector<Array> lo = run(Precision::bf16);
    for (std::size_t i = 0; i < lo.size(); ++i) {
      CAPTURE(i);
      CHECK(relative_error(lo[i], fp32[i]) < 3e-2);
      CHECK_FALSE(same_bits(lo[i], fp32[i]));
    }
  }
}

}  // namespace

TEST_CASE("to_bf16 rounds to nearest, ties to even, and keeps NaN, inf and subnormals", "[bf16]") {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (odd last bit): the tie goes to 1 (even)
  CHECK(rounded(1.f + std::ldexp(1.f, -8)) == 1.f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up
  CHECK(rounded(1.f + 3 * std::ldexp(1.f, -8)) == 1.f + std::ldexp(1.f, -6));
  // just past the tie rounds up, just before it down
  CHECK(rounded(1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20)) == 1.f + std::ldexp(1.f, -7));
  CHECK(rounded(1.f + std::ldexp(1.f, -8) - std::ldexp(1.f, -20)) == 1.f);
  CHECK(rounded(-1.f - std::ldexp(1.f, -8)) == -1.f);
  CHECK(blas::to_bf16(1.f) == 0x3f80);
  CHECK(blas::to_bf16(-2.f) == 0xc000);
  // NaN stays NaN, also one whose payload sits in the low bits only (truncating would give inf)
  for (std::uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const std::uint16_t h = blas::to_bf16(from_bits(nan_bits));
    CHECK(std::isnan(blas::from_bf16(h)));
    CHECK((h >> 15) == (nan_bits >> 31));  // the sign kept
  }
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(rounded(inf) == inf);
  CHECK(rounded(-inf) == -inf);
  CHECK(rounded(std::numeric_limits<float>::max()) == inf);  // past bf16's largest: overflows, as RNE does
  // subnormals: 2^-130 is a bf16 subnormal (kept exactly); 2^-149 rounds to 0; a tie among
  // subnormals goes to even
  CHECK(rounded(std::ldexp(1.f, -130)) == std::ldexp(1.f, -130));
  CHECK(rounded(std::ldexp(1.f, -149)) == 0.f);
  CHECK(bits(rounded(-std::ldexp(1.f, -149))) == 0x80000000u);  // -0
  CHECK(blas::to_bf16(from_bits(0x00018000u)) == 0x0002);       // 1.5 ulps of bf16: tie to even (2)
  CHECK(blas::to_bf16(from_bits(0x00028000u)) == 0x0002);       // 2.5 ulps: tie to even (2)
  CHECK(blas::to_bf16(from_bits(0x00038000u)) == 0x0004);       // 3.5 ulps: tie to even (4)

  // the array forms agree with the scalar one, over random values and every special case
  Generator gen(5);
  std::vector<float> x(100000);
  for (float& v : x) v = from_bits(static_cast<std::uint32_t>(gen.uniform() * 4294967296.0));
  x[0] = inf;
  x[1] = -inf;
  x[2] = from_bits(0x7f800001u);
  x[3] = 0.f;
  x[4] = -0.f;
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> back(x.size()), round(x.size());
  blas::to_bf16(x.data(), x.size(), h.data());
  blas::from_bf16(h.data(), h.size(), back.data());
  blas::round_to_bf16(x.data(), x.size(), round.data());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (h[i] != blas::to_bf16(x[i])) ++mismatches;
    if (bits(back[i]) != static_cast<std::uint32_t>(h[i]) << 16) ++mismatches;
    if (bits(round[i]) != bits(back[i])) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("gemm in bf16 is the product of the rounded operands accumulated in fp32", "[bf16][gemm]") {
  struct Case {
    std::size_t m, n, k;
    bool ta, tb;
    std::size_t pad;
    float alpha, beta;
    int threads;
  };
  // small (emulated even on the hardware path: below 2^18 multiply-adds), hardware-sized, and large enough to be split
  // across two kernel threads; every transpose; padded leading dimensions; alpha and beta
  const std::vector<Case> cases = {
      {5, 7, 3, false, false, 0, 1.f, 0.f, 1},    {64, 48, 40, false, true, 3, 1.f, 1.f, 1},
      {128, 64, 40, false, true, 3, 1.f, 1.f, 1}, {128, 96, 40, true, false, 0, 0.5f, 0.f, 1},
      {72, 80, 65, true, true, 2, -1.f, 2.f, 1},  {300, 200, 64, false, true, 0, 1.f, 0.f, 2},
      {96, 512, 64, true, false, 1, 1.f, 1.f, 2}, {256, 96, 64, false, false, 0, 1.f, 0.f, 2}};
  for (blas::Bf16Path path : runnable_paths()) {
    PathScope scope(path);
    for (const Case& p : cases) {
      ThreadScope threads(p.threads);
      CAPTURE(blas::bf16_path_name(path), p.m, p.n, p.k, p.ta, p.tb, p.pad, p.alpha, p.beta, p.threads);
      const std::size_t a_rows = p.ta ? p.k : p.m, a_cols = p.ta ? p.m : p.k;
      const std::size_t b_rows = p.tb ? p.n : p.k, b_cols = p.tb ? p.k : p.n;
      const std::size_t lda = a_cols + p.pad, ldb = b_cols + p.pad, ldc = p.n + p.pad;
      Generator gen(p.m * 1000 + p.k);
      std::vector<float> a(a_rows * lda), b(b_rows * ldb), c0(p.m * ldc);
      for (float& v : a) v = gen.uniform(-1.f, 1.f);
      for (float& v : b) v = gen.uniform(-1.f, 1.f);
      for (float& v : c0) v = gen.uniform(-1.f, 1.f);
      std::vector<std::uint16_t> a16(a.size()), b16(b.size());
      blas::to_bf16(a.data(), a.size(), a16.data());
      blas::to_bf16(b.data(), b.size(), b16.data());
      const auto at = [&](std::size_t i, std::size_t l) {
        return static_cast<double>(rounded(p.ta ? a[l * lda + i] : a[i * lda + l]));
      };
      const auto bt = [&](std::size_t l, std::size_t j) {
        return static_cast<double>(rounded(p.tb ? b[j * ldb + l] : b[l * ldb + j]));
      };
      // every operand form gives the same product
      std::vector<std::vector<float>> results;
      for (int form = 0; form < 5; ++form) {
        std::vector<float> c = c0;
        if (form == 4) {  // both forms of each operand
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, {a.data(), a16.data()}, lda,
                     {b.data(), b16.data()}, ldb, p.beta, c.data(), ldc);
        } else if (form == 0) {
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a16.data(), lda, b16.data(), ldb, p.beta,
                     c.data(), ldc);
        } else if (form == 1) {
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a.data(), lda, b.data(), ldb, p.beta,
                     c.data(), ldc);
        } else if (form == 2) {
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a.data(), lda, b16.data(), ldb, p.beta,
                     c.data(), ldc);
        } else {
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a16.data(), lda, b.data(), ldb, p.beta,
                     c.data(), ldc);
        }
        results.push_back(c);
      }
      for (int form = 1; form < 5; ++form) CHECK(results[form] == results[0]);
      const std::vector<float>& c = results[0];
      // against double of the rounded operands, to fp32 accumulation (tight), and against fp32
      // operands to bf16's rounding (about 2^-8 relative)
      std::vector<float> c32 = c0, c32_both = c0;
      blas::sgemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, a.data(), lda, b.data(), ldb, p.beta, c32.data(), ldc);
      // fp32 multiplies the float32 values even where a bf16 copy is at hand
      blas::gemm(Precision::fp32, p.ta, p.tb, p.m, p.n, p.k, p.alpha, {a.data(), a16.data()}, lda,
                 {b.data(), b16.data()}, ldb, p.beta, c32_both.data(), ldc);
      CHECK(c32_both == c32);
      double worst_tight = 0, worst_loose = 0;
      for (std::size_t i = 0; i < p.m; ++i) {
        for (std::size_t j = 0; j < p.n; ++j) {
          double ref = 0, scale = 0;
          for (std::size_t l = 0; l < p.k; ++l) {
            ref += at(i, l) * bt(l, j);
            scale += std::abs(at(i, l) * bt(l, j));
          }
          ref = p.alpha * ref + p.beta * c0[i * ldc + j];
          scale = std::abs(p.alpha) * scale + std::abs(p.beta * c0[i * ldc + j]) + 1e-30;
          worst_tight = std::max(worst_tight, std::abs(c[i * ldc + j] - ref) / scale);
          worst_loose = std::max(worst_loose, std::abs(c[i * ldc + j] - c32[i * ldc + j]) / scale);
        }
        // beyond the row's n columns, C is untouched
        for (std::size_t j = p.n; j < ldc; ++j) CHECK(c[i * ldc + j] == c0[i * ldc + j]);
      }
      CHECK(worst_tight < 1e-6 * static_cast<double>(p.k) + 1e-6);  // fp32 accumulation of k terms
      CHECK(worst_loose < 1e-2);                                    // bf16 operands against fp32
      CHECK(worst_loose > worst_tight);                             // the operands really were rounded
    }
  }
}

TEST_CASE("an fp32 product of an operand held only in bf16, and an operand with no values, are refused by name",
          "[bf16][gemm]") {
  const std::vector<float> x(6, 1.f);
  const std::vector<std::uint16_t> x16(6, blas::to_bf16(1.f));
  std::vector<float> c(4, 7.f);
  REQUIRE_THROWS_WITH(
      blas::gemm(Precision::fp32, false, true, 2, 2, 3, 1.f, x.data(), 3, x16.data(), 3, 0.f, c.data(), 2),
      Contains("blas::gemm: an fp32 product of B, which is held only in bf16"));
  REQUIRE_THROWS_WITH(blas::linear(Precision::fp32, 2, 2, 3, x16.data(), x.data(), nullptr, c.data()),
                      Contains("blas::linear: an fp32 product of X, which is held only in bf16"));
  REQUIRE_THROWS_WITH(blas::gemm_batched(Precision::fp32, false, true, 1, 1, 2, 2, 3, 1.f, {x16.data(), 3, 0, 0},
                                         {x.data(), 3, 0, 0}, 0.f, {c.data(), 2, 0, 0}),
                      Contains("blas::gemm_batched: an fp32 product of A"));
  // an operand with no values at all, in either precision, unless the product reads nothing
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    REQUIRE_THROWS_WITH(blas::gemm(p, false, true, 2, 2, 3, 1.f, x.data(), 3, blas::Operand(), 3, 0.f, c.data(), 2),
                        Contains("blas::gemm: B has no values"));
    REQUIRE_THROWS_WITH(blas::linear(p, 2, 2, 3, blas::Operand(), x.data(), nullptr, c.data()),
                        Contains("blas::linear: X has no values"));
    blas::gemm(p, false, true, 0, 2, 3, 1.f, blas::Operand(), 3, x.data(), 3, 0.f, c.data(), 2);
  }
  CHECK(c == std::vector<float>(4, 7.f));  // nothing written
}

TEST_CASE("gemm_batched in bf16 rounds an operand held in float32 as gemm does", "[bf16][gemm]") {
  // B (2 batches x 2 heads of 8 x 16) float32 only: each product is gemm's on the same numbers
  const Array a = random_array({2, 8, 32}, 71), b = random_array({2, 8, 32}, 72);
  std::vector<std::uint16_t> a16(a.size());
  blas::to_bf16(a.data(), a.size(), a16.data());
  std::vector<float> c(2 * 2 * 8 * 8), want(c.size());
  blas::gemm_batched(Precision::bf16, false, true, 2, 2, 8, 8, 16, 1.f, {a16.data(), 32, 8 * 32, 16},
                     {b.data(), 32, 8 * 32, 16}, 0.f, {c.data(), 8, 2 * 64, 64});
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t h = 0; h < 2; ++h) {
      blas::gemm(Precision::bf16, false, true, 8, 8, 16, 1.f, a16.data() + i * 8 * 32 + h * 16, 32,
                 b.data() + i * 8 * 32 + h * 16, 32, 0.f, want.data() + (i * 2 + h) * 64, 8);
    }
  }
  CHECK(c == want);
  CHECK(std::any_of(c.begin(), c.end(), [](float v) { return v != 0.f; }));
}

TEST_CASE("gemm in bf16 with beta 0 overwrites C, NaN included, and K = 0 scales C", "[bf16][gemm]") {
  for (blas::Bf16Path path : runnable_paths()) {
    PathScope scope(path);
    const std::size_t m = 64, n = 64, k = 64;
    std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n, std::numeric_limits<float>::quiet_NaN());
    blas::gemm(Precision::bf16, false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
    for (float v : c) REQUIRE(v == 8.f);
    blas::gemm(Precision::bf16, false, false, m, n, 0, 1.f, a.data(), k, b.data(), n, 0.5f, c.data(), n);
    for (float v : c) REQUIRE(v == 4.f);
  }
}

TEST_CASE("linear in bf16 adds the bias in fp32 to the bf16 product", "[bf16][gemm]") {
  // Small (emulated on every path), above kBf16MinWork (the hardware path adds the bias inside
  // oneDNN's primitive), and wide enough that two threads split it by columns (each piece with
  // its own part of the bias); X float32 and bf16, W float32 and bf16.
  struct Case {
    std::size_t rows, out, in;
    int threads;
  };
  for (const Case& c : {Case{40, 24, 36, 1}, Case{96, 80, 72, 1}, Case{64, 1024, 128, 2}, Case{256, 96, 128, 2}}) {
    const Array x = random_array({c.rows, c.in}, 1), w = random_array({c.out, c.in}, 2),
                bias = random_array({c.out}, 3);
    std::vector<std::uint16_t> w16(w.size()), x16(x.size());
    blas::to_bf16(w.data(), w.size(), w16.data());
    blas::to_bf16(x.data(), x.size(), x16.data());
    for (blas::Bf16Path path : runnable_paths()) {
      PathScope scope(path);
      ThreadScope threads(c.threads);
      CAPTURE(blas::bf16_path_name(path), c.rows, c.out, c.in, c.threads);
      const std::size_t n = c.rows * c.out;
      std::vector<float> y(n), y2(n), y3(n), y4(n), ref(n);
      blas::linear(Precision::bf16, c.rows, c.out, c.in, x.data(), w16.data(), bias.data(), y.data());
      blas::linear(Precision::bf16, c.rows, c.out, c.in, x.data(), w.data(), bias.data(), y2.data());
      blas::linear(Precision::bf16, c.rows, c.out, c.in, x16.data(), w16.data(), bias.data(), y3.data());
      blas::linear(Precision::bf16, c.rows, c.out, c.in, x16.data(), w.data(), bias.data(), y4.data());
      blas::gemm(Precision::bf16, false, true, c.rows, c.out, c.in, 1.f, x.data(), c.in, w16.data(), c.in, 0.f,
                 ref.data(), c.out);
      for (std::size_t r = 0; r < c.rows; ++r)
        for (std::size_t j = 0; j < c.out; ++j) ref[r * c.out + j] += bias[j];
      CHECK(y == ref);
      CHECK(y2 == ref);
      CHECK(y3 == ref);
      CHECK(y4 == ref);
    }
  }
}

TEST_CASE("parse_precision reads fp32 and bf16 and names anything else", "[bf16][precision]") {
  CHECK(parse_precision("fp32") == Precision::fp32);
  CHECK(parse_precision("bf16") == Precision::bf16);
  CHECK(precision_name(Precision::fp32) == "fp32");
  CHECK(precision_name(Precision::bf16) == "bf16");
  CHECK(parse_precision(precision_name(Precision::bf16)) == Precision::bf16);
  for (const char* bad : {"fp16", "BF16", "", " bf16", "float32"}) {
    CAPTURE(bad);
    REQUIRE_THROWS_AS(parse_precision(bad), Error);
    REQUIRE_THROWS_WITH(parse_precision(bad),
                        Contains("parse_precision") && Contains(std::string("'") + bad + "'") && Contains("fp32|bf16"));
  }
}

TEST_CASE("AutocastGuard nests, restores, and close() ends it early once", "[bf16][precision]") {
  REQUIRE(autocast_precision() == Precision::fp32);
  {
    AutocastGuard outer(Precision::bf16);
    CHECK(autocast_precision() == Precision::bf16);
    CHECK(outer.is_open());
    {
      AutocastGuard inner(Precision::fp32);
      CHECK(autocast_precision() == Precision::fp32);
      {
        AutocastGuard innermost(Precision::bf16);
        CHECK(autocast_precision() == Precision::bf16);
      }
      CHECK(autocast_precision() == Precision::fp32);
      inner.close();
      CHECK_FALSE(inner.is_open());
      CHECK(autocast_precision() == Precision::bf16);
      inner.close();  // idempotent
      CHECK(autocast_precision() == Precision::bf16);
    }
    CHECK(autocast_precision() == Precision::bf16);
    outer.close();
    CHECK(autocast_precision() == Precision::fp32);
  }
  CHECK(autocast_precision() == Precision::fp32);
  // closed out of order: the precision is always the innermost open guard's
  {
    auto a = std::make_unique<AutocastGuard>(Precision::bf16);
    auto b = std::make_unique<AutocastGuard>(Precision::fp32);
    CHECK(autocast_precision() == Precision::fp32);
    a->close();
    CHECK(autocast_precision() == Precision::fp32);
    b.reset();
    CHECK(autocast_precision() == Precision::fp32);
    a.reset();
  }
  CHECK(autocast_precision() == Precision::fp32);
}

TEST_CASE("AutocastGuard is per thread, and another thread may not end it", "[bf16][precision][threads]") {
  AutocastGuard guard(Precision::bf16);
  Precision seen = Precision::bf16, seen_inside = Precision::fp32;
  std::thread other([&] {
    seen = autocast_precision();
    AutocastGuard own(Precision::bf16);
    seen_inside = autocast_precision();
  });
  other.join();
  CHECK(seen == Precision::fp32);  // the main thread's guard does not reach it
  CHECK(seen_inside == Precision::bf16);
  CHECK(autocast_precision() == Precision::bf16);  // its guard did not change ours

  // close() on another thread is an Error that changes nothing
  std::string message;
  std::thread closer([&] {
    try {
      guard.close();
    } catch (const Error& e) {
      message = e.what();
    }
  });
  closer.join();
  CHECK_THAT(message, Contains("AutocastGuard::close") && Contains("belongs to the thread that opened it"));
  CHECK(guard.is_open());
  CHECK(autocast_precision() == Precision::bf16);
  guard.close();
  CHECK(autocast_precision() == Precision::fp32);

  // destroyed on another thread: one line on stderr, and the scope ends on the opening thread
  auto moved = std::make_unique<AutocastGuard>(Precision::bf16);
  CHECK(autocast_precision() == Precision::bf16);
  std::ostringstream captured;
  std::streambuf* before = std::cerr.rdbuf(captured.rdbuf());
  std::thread destroyer([&] { moved.reset(); });
  destroyer.join();
  std::cerr.rdbuf(before);
  CHECK_THAT(captured.str(), Contains("AutocastGuard(bf16)") && Contains("was destroyed on thread"));
  CHECK(autocast_precision() == Precision::fp32);
}

namespace {

// A linear layer's forward and backward; returns y, dx, dw, db.
std::vector<Array> linear_run(const Array& xv, const Array& wv, const Array& bv, const Array& seed) {
  Tensor x(xv, true), w(wv, true), b(bv, true);
  Tensor y = linear(x, w, b);
  y.backward(seed);
  return {y.value(), x.grad(), w.grad(), b.grad()};
}

// matmul of a (B, M, K) activation with a (K, N) parameter and a batched A^T B product.
std::vector<Array> matmul_run(const Array& av, const Array& bv, const Array& cv, const Array& seed) {
  Tensor a(av, true), b(bv, true), c(cv, true);
  Tensor y = matmul(matmul(a, b), c, true, false);  // (B, M, N)^T-batched with (B, M, P): (B, N, P)
  y.backward(seed);
  return {y.value(), a.grad(), b.grad(), c.grad()};
}

}  // namespace

TEST_CASE("linear and matmul under a bf16 guard agree with fp32 to bf16's rounding", "[bf16][ops][gemm]") {
  // every product at least 2^18 multiply-adds, so the hardware path (where there is one) runs them
  const Array x = random_array({3, 40, 96}, 11), w = random_array({80, 96}, 12), bias = random_array({80}, 13);
  const Array seed = random_array({3, 40, 80}, 14);
  const Array a = random_array({2, 64, 48}, 15), b = random_array({48, 96}, 16), c = random_array({2, 64, 56}, 17);
  const Array mseed = random_array({2, 96, 56}, 18);
  const auto fp32 = linear_run(x, w, bias, seed);
  const auto mfp32 = matmul_run(a, b, c, mseed);
  for (blas::Bf16Path path : runnable_paths()) {
    PathScope scope(path);
    CAPTURE(blas::bf16_path_name(path));
    AutocastGuard guard(Precision::bf16);
    const auto lo = linear_run(x, w, bias, seed);
    const auto mo = matmul_run(a, b, c, mseed);
    for (std::size_t i = 0; i < lo.size(); ++i) {
      CAPTURE(i);
      CHECK(relative_error(lo[i], fp32[i]) < 2e-2);
      CHECK(relative_error(mo[i], mfp32[i]) < 2e-2);
    }
    // rounded, not fp32 in disguise (the bias gradient is a sum of G in fp32: exact)
    CHECK_FALSE(same_bits(lo[0], fp32[0]));
    CHECK_FALSE(same_bits(lo[1], fp32[1]));
    CHECK_FALSE(same_bits(lo[2], fp32[2]));
    CHECK(same_bits(lo[3], fp32[3]));
    CHECK_FALSE(same_bits(mo[0], mfp32[0]));
    CHECK_FALSE(same_bits(mo[1], mfp32[1]));
    CHECK_FALSE(same_bits(mo[2], mfp32[2]));
    CHECK_FALSE(same_bits(mo[3], mfp32[3]));
  }
}

TEST_CASE("the linear and matmul forwards are the bf16 products of the rounded operands", "[bf16][ops][gemm]") {
  const Array x = random_array({20, 48}, 21), w = random_array({40, 48}, 22);
  std::vector<float> ref(20 * 40);
  blas::gemm(Precision::bf16, false, true, 20, 40, 48, 1.f, x.data(), 48, w.data(), 48, 0.f, ref.data(), 40);
  AutocastGuard guard(Precision::bf16);
  const Tensor y = linear(Tensor(x), Tensor(w, true));
  CHECK(std::vector<float>(y.value().begin(), y.value().end()) == ref);
  const Tensor z = matmul(Tensor(x), Tensor(w, true), false, true);
  CHECK(std::vector<float>(z.value().begin(), z.value().end()) == ref);
}

TEST_CASE("backward runs at the forward's precision, also after the guard closed", "[bf16][ops][gemm]") {
  const Array x = random_array({16, 32}, 31), w = random_array({24, 32}, 32), bias = random_array({24}, 33);
  const Array seed = random_array({16, 24}, 34);
  const Array a = random_array({2, 12, 16}, 35), b = random_array({16, 20}, 36), c = random_array({2, 12, 8}, 37);
  const Array mseed = random_array({2, 20, 8}, 38);
  std::vector<Array> inside, mi;
  {
    AutocastGuard guard(Precision::bf16);
    inside = linear_run(x, w, bias, seed);
    mi = matmul_run(a, b, c, mseed);
  }
  // forward in bf16, the guard closed, then backward
  Tensor tx(x, true), tw(w, true), tb(bias, true);
  Tensor ta(a, true), tbb(b, true), tc(c, true);
  Tensor y, my;
  {
    AutocastGuard guard(Precision::bf16);
    y = linear(tx, tw, tb);
    my = matmul(matmul(ta, tbb), tc, true, false);
  }
  REQUIRE(autocast_precision() == Precision::fp32);
  y.backward(seed);
  my.backward(mseed);
  CHECK(same_bits(tx.grad(), inside[1]));
  CHECK(same_bits(tw.grad(), inside[2]));
  CHECK(same_bits(ta.grad(), mi[1]));
  CHECK(same_bits(tbb.grad(), mi[2]));
  CHECK(same_bits(tc.grad(), mi[3]));
  // and the other way round: an fp32 forward keeps its backward in fp32 inside a bf16 guard
  const auto fp32 = linear_run(x, w, bias, seed);
  Tensor ux(x, true), uw(w, true), ub(bias, true);
  Tensor uy = linear(ux, uw, ub);
  {
    AutocastGuard guard(Precision::bf16);
    uy.backward(seed);
  }
  CHECK(same_bits(ux.grad(), fp32[1]));
  CHECK(same_bits(uw.grad(), fp32[2]));
  CHECK_FALSE(same_bits(fp32[1], inside[1]));
}

TEST_CASE("outside a bf16 guard linear and matmul are fp32 bit for bit", "[bf16][ops][gemm]") {
  const Array x = random_array({3, 20, 48}, 41), w = random_array({40, 48}, 42), bias = random_array({40}, 43);
  const Array seed = random_array({3, 20, 40}, 44);
  const Array a = random_array({2, 30, 24}, 45), b = random_array({24, 36}, 46), c = random_array({2, 30, 28}, 47);
  const Array mseed = random_array({2, 36, 28}, 48);
  // what the ops computed before autocast existed: sgemm and blas::linear
  std::vector<float> y_ref(60 * 40), dx_ref(60 * 48), dw_ref(40 * 48);
  blas::linear(60, 40, 48, x.data(), w.data(), bias.data(), y_ref.data());
  blas::sgemm(false, false, 60, 48, 40, 1.f, seed.data(), 40, w.data(), 48, 0.f, dx_ref.data(), 48);
  blas::sgemm(true, false, 40, 48, 60, 1.f, seed.data(), 40, x.data(), 48, 0.f, dw_ref.data(), 48);
  const auto none = linear_run(x, w, bias, seed);
  const auto mnone = matmul_run(a, b, c, mseed);
  CHECK(std::vector<float>(none[0].begin(), none[0].end()) == y_ref);
  CHECK(std::vector<float>(none[1].begin(), none[1].end()) == dx_ref);
  CHECK(std::vector<float>(none[2].begin(), none[2].end()) == dw_ref);
  std::vector<std::vector<Array>> runs;
  {
    AutocastGuard guard(Precision::fp32);
    runs.push_back(linear_run(x, w, bias, seed));
    runs.push_back(matmul_run(a, b, c, mseed));
  }
  {
    AutocastGuard outer(Precision::bf16);
    AutocastGuard inner(Precision::fp32);
    runs.push_back(linear_run(x, w, bias, seed));
    runs.push_back(matmul_run(a, b, c, mseed));
  }
  {
    AutocastGuard closed(Precision::bf16);
    closed.close();
    runs.push_back(linear_run(x, w, bias, seed));
    runs.push_back(matmul_run(a, b, c, mseed));
  }
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto& want = r % 2 == 0 ? none : mnone;
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(r, i);
      CHECK(same_bits(runs[r][i], want[i]));
    }
  }
}

TEST_CASE("Optimizer::step refuses inside a bf16 guard and changes nothing", "[bf16][optim][gemm]") {
  // two identical parameter sets: one optimizer meets the refusal first, the other never does
  const Array w_init = random_array({4, 3}, 51), v_init = random_array({3}, 52), x = random_array({2, 3}, 53);
  const auto make = [&](Tensor& w, Tensor& v) {
    w = Tensor(w_init, true);
    v = Tensor(v_init, true);
    AutocastGuard guard(Precision::bf16);
    Tensor loss = linear(Tensor(x), w, Tensor()).sum() + v.sum();
    loss.backward();
  };
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    Tensor w, v, w2, v2;
    make(w, v);
    make(w2, v2);
    std::unique_ptr<Optimizer> opt, clean;
    if (kind == 0) {
      opt = std::make_unique<SGD>(std::vector<Tensor>{w, v}, SGDOptions(0.1f).momentum(0.9f));
      clean = std::make_unique<SGD>(std::vector<Tensor>{w2, v2}, SGDOptions(0.1f).momentum(0.9f));
    } else {
      opt = std::make_unique<AdamW>(std::vector<Tensor>{w, v}, AdamW::defaults(0.1f));
      clean = std::make_unique<AdamW>(std::vector<Tensor>{w2, v2}, AdamW::defaults(0.1f));
    }
    const Array w0 = w.value(), v0 = v.value(), gw = w.grad();
    const std::uint64_t version = w.version();
    {
      AutocastGuard guard(Precision::bf16);
      REQUIRE_THROWS_WITH(opt->step(), Contains("Optimizer::step: called inside a bf16 AutocastGuard") &&
                                           Contains("close the guard after backward and before the step"));
      // nested: an fp32 guard inside the bf16 one makes the step fine again, but not here
    }
    CHECK(same_bits(w.value(), w0));
    CHECK(same_bits(v.value(), v0));
    CHECK(w.version() == version);
    CHECK(same_bits(w.grad(), gw));
    // no state was started: the next steps are those of an optimizer that never refused
    for (int s = 0; s < 2; ++s) {
      AutocastGuard fp32(Precision::fp32);  // an fp32 scope is fine
      opt->step();
      clean->step();
    }
    CHECK(same_bits(w.value(), w2.value()));
    CHECK(same_bits(v.value(), v2.value()));
    CHECK_FALSE(same_bits(w.value(), w0));
  }
}

TEST_CASE("a parameter is converted to bf16 once per update", "[bf16][cache][gemm]") {
  detail::clear_bf16_cache();
  Tensor w(random_array({32, 16}, 61), true), b(random_array({32}, 62), true);
  Tensor m(random_array({16, 8}, 63), true);
  SGD sgd({w, b, m}, SGDOptions(0.01f));
  const Array x = random_array({4, 16}, 64);
  const auto step = [&] {
    AutocastGuard guard(Precision::bf16);
    // w in two linear forwards and a matmul, each with a backward: one conversion of w, one of m
    Tensor h = linear(Tensor(x), w, b);
    Tensor h2 = linear(Tensor(x), w, b);
    Tensor loss = (h * h2).sum() + matmul(Tensor(x), m).sum() + matmul(linear(Tensor(x), w, b), w).sum();
    loss.backward();
  };
  const std::size_t before = detail::bf16_conversions();
  step();
  CHECK(detail::bf16_conversions() - before == 2);
  step();  // no update in between: the copies are reused
  CHECK(detail::bf16_conversions() - before == 2);
  sgd.step();  // every parameter written: both copies are stale
  step();
  CHECK(detail::bf16_conversions() - before == 4);
  // the new copy is of the new values
  AutocastGuard guard(Precision::bf16);
  std::vector<float> ref(4 * 32);
  blas::gemm(Precision::bf16, false, true, 4, 32, 16, 1.f, x.data(), 16, w.value().data(), 16, 0.f, ref.data(), 32);
  const Tensor y = linear(Tensor(x), w);
  CHECK(std::vector<float>(y.value().begin(), y.value().end()) == ref);
  // a write through a detach()ed handle (same storage) invalidates too
  w.detach().mutable_value() *= 2.f;
  const std::size_t n = detail::bf16_conversions();
  linear(Tensor(x), w);
  CHECK(detail::bf16_conversions() == n + 1);
  // activations are not cached; the cache stays bounded
  CHECK(detail::bf16_cache_entries() <= detail::kBf16CacheEntries);
  CHECK(detail::bf16_cache_bytes() <= detail::kBf16CacheBytes);
}

TEST_CASE("an activation is converted to bf16 once for the products that read it", "[bf16][cache][gemm]") {
  Tensor x(random_array({6, 16}, 71), true);
  Tensor w1(random_array({8, 16}, 72), true), w2(random_array({8, 16}, 73), true);
  AutocastGuard guard(Precision::bf16);
  const Tensor h = x * 2.f;  // an activation: q and k read it, and so do their dW in backward
  const std::size_t before = detail::activation_bf16_conversions();
  const Tensor q = linear(h, w1), k = linear(h, w2);
  CHECK(detail::activation_bf16_conversions() - before == 1);
  (q * k).sum().backward();
  CHECK(detail::activation_bf16_conversions() - before == 1);
  // the products read the copy of h's values: q = h w1^T, dW1 = (dq)^T h = k^T h, both rounded
  std::vector<float> ref(6 * 8), dw1(8 * 16, 0.f);
  blas::gemm(Precision::bf16, false, true, 6, 8, 16, 1.f, h.value().data(), 16, w1.value().data(), 16, 0.f, ref.data(),
             8);
  CHECK(std::vector<float>(q.value().begin(), q.value().end()) == ref);
  blas::gemm(Precision::bf16, true, false, 8, 16, 6, 1.f, k.value().data(), 8, h.value().data(), 16, 0.f, dw1.data(),
             16);
  CHECK(std::vector<float>(w1.grad().begin(), w1.grad().end()) == dw1);
  // an in-place write makes the copy stale: the next product converts the new values
  h.detach().mutable_value() *= 3.f;
  const Tensor q2 = linear(h, w1);
  CHECK(detail::activation_bf16_conversions() - before == 2);
  blas::gemm(Precision::bf16, false, true, 6, 8, 16, 1.f, h.value().data(), 16, w1.value().data(), 16, 0.f, ref.data(),
             8);
  CHECK(std::vector<float>(q2.value().begin(), q2.value().end()) == ref);
}

TEST_CASE("under bf16 a Linear's input that only its bf16 copy serves is freed, with the same gradients",
          "[bf16][memory][gemm]") {
  const auto run = [](Precision precision, bool keep_handle, bool& freed) {
    Tensor x(random_array({6, 16}, 91), true), w(random_array({8, 16}, 92), true);
    Tensor gamma(random_array({16}, 93), true), beta(random_array({16}, 94), true);
    AutocastGuard guard(precision);
    Tensor y, kept;
    {
      const Tensor h = layer_norm(x, gamma, beta, 1e-5f);  // its backward reads x, not h
      y = linear(h, w);                                    // in bf16 its backward reads h's bf16 copy
      if (keep_handle) kept = h;
    }
    freed = y.node()->creator.lock()->inputs[0].node->storage->freed;
    (y * y).sum().backward();
    return std::vector<Array>{x.grad(), w.grad(), gamma.grad(), beta.grad()};
  };
  bool freed = false;
  const auto bf16_freed = run(Precision::bf16, false, freed);
  CHECK(freed);
  const auto bf16_kept = run(Precision::bf16, true, freed);
  CHECK_FALSE(freed);
  CHECK(bf16_freed == bf16_kept);  // bit for bit: both read the same copy
  run(Precision::fp32, false, freed);
  CHECK_FALSE(freed);  // fp32's dW reads h's values
}

TEST_CASE("a language model's bf16 step frees the activations that only bf16 products read", "[bf16][memory][gemm]") {
  // Counts the freed values among the nodes the loss's graph holds.
  const auto freed_in_graph = [](const Tensor& loss) {
    std::vector<const Node*> todo{loss.node().get()};
    std::vector<const Node*> seen;
    std::size_t freed = 0;
    while (!todo.empty()) {
      const Node* n = todo.back();
      todo.pop_back();
      if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      freed += n->storage->freed;
      if (const auto entry = n->creator.lock()) {
        for (const SavedInput& in : entry->inputs) {
          if (in.node) todo.push_back(in.node.get());
        }
      }
    }
    return freed;
  };
  const auto step = [&](Precision precision) {
    Generator gen(7);
    nn::LanguageModel model(testing::small_lm(), gen);  // 2 layers, Pre-Norm, GELU, no dropout
    const IndexArray ids = {{1, 2, 3, 4}, {5, 6, 7, 8}}, targets = {{2, 3, 4, 5}, {6, 7, 8, 9}};
    AutocastGuard guard(precision);
    Tensor loss = model.loss(ids, targets);
    const std::size_t freed = freed_in_graph(loss);
    loss.backward();
    std::vector<Array> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
    return std::make_pair(freed, grads);
  };
  const auto [fp32_freed, fp32_grads] = step(Precision::fp32);
  const auto [bf16_freed, bf16_grads] = step(Precision::bf16);
  // fp32: the final norm's output, which the fused head and loss read only in forward, and per
  // layer the two Linear outputs that only a residual sum reads. bf16: per layer also the two
  // norms' outputs, the attention's output and the GELU's, which only Linears read; q, k and v
  // stay (attention's backward reads them).
  CHECK(fp32_freed == 1 + 2 * 2);
  CHECK(bf16_freed == 1 + 2 * 2 + 2 * 4);
  for (std::size_t i = 0; i < fp32_grads.size(); ++i) {
    CAPTURE(i);
    CHECK(xt::allclose(bf16_grads[i], fp32_grads[i], 0.05, 0.05));
  }
}

TEST_CASE("the bf16 copies are safe from several threads", "[bf16][cache][threads][gemm]") {
  detail::clear_bf16_cache();
  Tensor w(random_array({64, 32}, 81), true);
  const Array x = random_array({8, 32}, 82);
  const Tensor shared(x);  // one activation whose bf16 copy every thread reads (or makes)
  std::vector<float> ref(8 * 64);
  blas::gemm(Precision::bf16, false, true, 8, 64, 32, 1.f, x.data(), 32, w.value().data(), 32, 0.f, ref.data(), 64);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      AutocastGuard guard(Precision::bf16);
      for (int i = 0; i < 50; ++i) {
        const Tensor y = linear(Tensor(x), w), y_shared = linear(shared, w);
        ok[t] += std::vector<float>(y.value().begin(), y.value().end()) == ref &&
                 std::vector<float>(y_shared.value().begin(), y_shared.value().end()) == ref;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int v : ok) CHECK(v == 50);
  CHECK(detail::bf16_conversions() >= 1);
}

TEST_CASE("a small language model trains under bf16 as under fp32", "[bf16][training][gemm]") {
  const auto train = [](Precision precision) {
    Generator gen(7);
    nn::LanguageModel model(testing::small_lm(), gen);
    AdamW opt(model.parameters(), AdamW::defaults(3e-2f));
    Generator data(9);
    std::vector<float> losses;
    for (int step = 0; step < 60; ++step) {
      IndexArray ids = xt::zeros<std::int64_t>({4, 8}), targets = xt::zeros<std::int64_t>({4, 8});
      for (std::size_t b = 0; b < 4; ++b) {
        const auto start = static_cast<std::int64_t>(data.uniform() * 11);
        for (std::size_t t = 0; t < 8; ++t) {
          ids(b, t) = (start + static_cast<std::int64_t>(t)) % 11;  // count up modulo the vocabulary
          targets(b, t) = (start + static_cast<std::int64_t>(t) + 1) % 11;
        }
      }
      AutocastGuard guard(precision);
      Tensor loss = model.loss(ids, targets);
      opt.zero_grad();
      loss.backward();
      guard.close();
      opt.step();
      losses.push_back(loss.item());
    }
    return losses;
  };
  const auto fp32 = train(Precision::fp32), bf16 = train(Precision::bf16);
  CAPTURE(fp32.front(), fp32.back(), bf16.front(), bf16.back());
  CHECK(fp32.back() < 0.5f * fp32.front());  // it learns
  CHECK(bf16.back() < 0.5f * bf16.front());
  CHECK(std::abs(bf16.front() - fp32.front()) < 0.01f * fp32.front());
  CHECK(std::abs(bf16.back() - fp32.back()) < 0.05f * fp32.front());
  CHECK(bf16 != fp32);  // the bf16 run really rounded
}

TEST_CASE("decoding under bf16 converts each weight once, runs on the few-rows kernel and stays near fp32",
          "[bf16][generate][gemm]") {
  const blas::Engine engine = blas::engine();
  blas::set_engine(blas::Engine::automatic);
  const auto model = testing::eval_lm(nn::LanguageModelOptions(97, 64, 4, 2).d_ff(128).max_len(16), 5);
  NoGradGuard no_grad;
  nn::LanguageModelCache fp32_cache, bf16_cache;
  IndexArray ids = IndexArray::from_shape({1, 6});
  for (std::size_t t = 0; t < 6; ++t) ids(0, t) = static_cast<std::int64_t>(7 * t + 3) % 97;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const Array want = model->forward_cached(ids, fp32_cache, nn::Attentions::none).logits.value();
    const std::size_t conversions = detail::bf16_conversions(), products = blas::detail::few_rows_products();
    Array got;
    {
      AutocastGuard guard(Precision::bf16);
      got = model->forward_cached(ids, bf16_cache, nn::Attentions::none).logits.value();
    }
    if (step > 0) {
      CHECK(detail::bf16_conversions() == conversions);                  // the weights' copies are made once
      CHECK(blas::detail::few_rows_products() >= products + 2 * 6 + 1);  // each block's six products, the head
    }
    const float scale = xt::amax(xt::abs(want))(), worst = xt::amax(xt::abs(got - want))();
    CAPTURE(scale, worst);
    CHECK(worst > 0.f);  // rounded
    CHECK(worst < 0.02f * scale);
    ids = IndexArray::from_shape({1, 1});
    const float* row = want.data();
    ids(0, 0) = std::max_element(row, row + 97) - row;
  }
  blas::set_engine(engine);
}

TEST_CASE("hold_bf16_copies keeps each weight's copy with it, read before the cache until the weight changes",
          "[bf16][cache][gemm]") {
  const auto model = testing::eval_lm(nn::LanguageModelOptions(97, 64, 4, 2).d_ff(128).max_len(16), 5);
  IndexArray ids = IndexArray::from_shape({2, 5});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>(13 * i + 1) % 97;
  NoGradGuard no_grad;
  AutocastGuard guard(Precision::bf16);
  detail::clear_bf16_cache();
  const Array cached = model->forward(ids, nn::Attentions::none).logits.value();
  const std::size_t converted = detail::bf16_conversions();
  CHECK(detail::bf16_cache_entries() > 0);

  std::size_t weights = 0;
  for (const Tensor& p : model->parameters()) weights += p.size();
  CHECK(hold_bf16_copies(model->parameters()) == weights * sizeof(std::uint16_t));
  detail::clear_bf16_cache();
  const Array held = model->forward(ids, nn::Attentions::none).logits.value();
  CHECK(detail::bf16_conversions() == converted);  // nothing converted again
  CHECK(detail::bf16_cache_entries() == 0);        // nor cached
  CHECK(xt::all(xt::equal(held, cached)));         // the same bf16 values

  // An update leaves the held copy stale: the products convert the new value, and read it.
  for (auto& [name, w] : model->named_parameters()) {
    if (name.find("w_q.weight") != std::string::npos) w.mutable_value() *= 0.5f;
  }
  const Array updated = model->forward(ids, nn::Attentions::none).logits.value();
  CHECK(detail::bf16_conversions() > converted);
  CHECK_FALSE(xt::all(xt::equal(updated, cached)));
  CHECK_THROWS_WITH(hold_bf16_copies({Tensor()}), Catch::Contains("hold_bf16_copies"));
}

// ctest runs the next cases with XGRAD_BF16 set (tests/CMakeLists.txt).
TEST_CASE("an unknown XGRAD_BF16 is an Error naming the variable and the value", "[.bf16_env_unknown]") {
  REQUIRE(std::string(std::getenv("XGRAD_BF16")) == "fast");
  REQUIRE_THROWS_WITH(blas::bf16_path(), Contains("XGRAD_BF16") && Contains("'fast'") && Contains("hardware"));
  const float a = 1, b = 2;
  float c = 0;
  REQUIRE_THROWS_WITH(blas::gemm(Precision::bf16, false, false, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1),
                      Contains("XGRAD_BF16"));
  AutocastGuard guard(Precision::bf16);
  REQUIRE_THROWS_WITH(linear(Tensor::full({1, 1}, 1.f), Tensor::full({1, 1}, 2.f, true)), Contains("XGRAD_BF16"));
}

TEST_CASE("XGRAD_BF16=hardware runs where the hardware path exists and is an Error elsewhere",
          "[.bf16_env_hardware][gemm]") {
  REQUIRE(std::string(std::getenv("XGRAD_BF16")) == "hardware");
  const float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1};
  float c[4] = {};
  if (blas::bf16_hardware_available()) {
    CHECK(blas::bf16_path() == blas::Bf16Path::hardware);
    blas::gemm(Precision::bf16, false, false, 2, 2, 2, 1.f, a, 2, b, 2, 0.f, c, 2);
    CHECK(c[3] == 4.f);
  } else {
    REQUIRE_THROWS_WITH(blas::bf16_path(), Contains("XGRAD_BF16=hardware") && Contains("cannot run here"));
    REQUIRE_THROWS_WITH(blas::set_bf16_path(blas::Bf16Path::hardware), Contains("hardware"));
  }
}

// Run with ONEDNN_MAX_CPU_ISA=AVX2, which makes oneDNN behave as on an AVX2-only CPU (Zen 3):
// the hardware path is refused, products are emulated, and the notice comes once.
TEST_CASE("on a CPU without bf16 hardware the products are emulated, said once", "[.bf16_avx2_only]") {
  REQUIRE(std::string(std::getenv("ONEDNN_MAX_CPU_ISA")) == "AVX2");
  CHECK_FALSE(blas::bf16_hardware_available());
  CHECK(blas::bf16_path() == blas::Bf16Path::emulated);
  REQUIRE_THROWS_WITH(blas::set_bf16_path(blas::Bf16Path::hardware),
                      Contains("set_bf16_path(hardware)") && Contains("cannot run here"));
  std::ostringstream captured;
  std::streambuf* before = std::cerr.rdbuf(captured.rdbuf());
  const Array x = random_array({64, 64}, 91), w = random_array({64, 64}, 92);
  std::vector<float> c(64 * 64), ref(64 * 64);
  blas::gemm(Precision::bf16, false, true, 64, 64, 64, 1.f, x.data(), 64, w.data(), 64, 0.f, c.data(), 64);
  blas::gemm(Precision::bf16, false, true, 64, 64, 64, 1.f, x.data(), 64, w.data(), 64, 0.f, c.data(), 64);
  std::cerr.rdbuf(before);
  const std::string text = captured.str();
  CHECK_THAT(text, Contains("bf16 products are emulated on this CPU") && Contains("not faster"));
  CHECK(text.find("emulated") == text.rfind("emulated"));  // once
  std::vector<float> xr(x.size()), wr(w.size());
  blas::round_to_bf16(x.data(), x.size(), xr.data());
  blas::round_to_bf16(w.data(), w.size(), wr.data());
  blas::sgemm(false, true, 64, 64, 64, 1.f, xr.data(), 64, wr.data(), 64, 0.f, ref.data(), 64);
  CHECK(c == ref);  // exactly the rounded operands through sgemm
}

TEST_CASE("linear_activation under a bf16 guard takes linear's bf16 products, then the activation",
          "[bf16][ops][gemm]") {
  const Array x = random_array({4, 64, 96}, 31), w = random_array({80, 96}, 32), bias = random_array({80}, 33);
  for (LinearActivation a : {LinearActivation::relu, LinearActivation::gelu, LinearActivation::gelu_tanh}) {
    CAPTURE(static_cast<int>(a));
    AutocastGuard guard(Precision::bf16);
    Tensor x1(x, true), w1(w, true), b1(bias, true), x2(x, true), w2(w, true), b2(bias, true);
    const Tensor fused = linear_activation(x1, w1, b1, a);
    const Tensor z = linear(x2, w2, b2);
    const Tensor plain = a == LinearActivation::relu   ? relu(z)
                         : a == LinearActivation::gelu ? gelu(z)
                                                       : gelu(z, GeluApprox::tanh);
    CHECK(same_bits(fused.value(), plain.value()));
    sum(fused).backward();
    sum(plain).backward();
    guard.close();
    CHECK(same_bits(w1.grad(), w2.grad()));
    CHECK(same_bits(x1.grad(), x2.grad()));
  }
}

TEST_CASE("flash_attention's tile products follow a bf16 guard, forward and backward",
          "[bf16][ops][flash_attention][gemm]") {
  // tiles of 128 x 128 x 64 multiply-adds: 2^20, which the hardware path takes
  const Array q = random_array({2, 128, 128}, 41), k = random_array({2, 128, 128}, 42),
              v = random_array({2, 128, 128}, 43);
  const Array seed = random_array({2, 128, 128}, 44);
  auto run = [&](Precision precision) {
    Tensor q1(q, true), k1(k, true), v1(v, true);
    Tensor out;
    {
      AutocastGuard guard(precision);
      out = flash_attention(q1, k1, v1, 2, 0.125f, true);
    }
    out.backward(seed);  // after the guard closed: the forward's precision still holds
    return std::vector<Array>{out.value(), q1.grad(), k1.grad(), v1.grad()};
  };
  check_follows_guard(run);
}

TEST_CASE("flash_attention with a decoding step's few queries multiplies in fp32 under a bf16 guard",
          "[bf16][ops][flash_attention][gemm]") {
  // 1 and 8 queries per entry (one position; a grouped key/value head's query heads as rows)
  // against 40 keys: the bits of fp32, forward and backward. 9 queries take bf16 products.
  const Array k = random_array({2, 40, 32}, 45), v = random_array({2, 40, 32}, 46);
  for (const std::size_t T : {std::size_t{1}, std::size_t{8}, std::size_t{9}}) {
    CAPTURE(T);
    const Array q = random_array({2, T, 32}, 47);
    const Array seed = random_array({2, T, 32}, 48);
    auto run = [&](Precision precision) {
      Tensor q1(q, true), k1(k, true), v1(v, true);
      Tensor out;
      {
        AutocastGuard guard(precision);
        out = flash_attention(q1, k1, v1, 2, 0.25f);
      }
      out.backward(seed);
      return std::vector<Array>{out.value(), q1.grad(), k1.grad(), v1.grad()};
    };
    const std::vector<Array> bf16 = run(Precision::bf16), fp32 = run(Precision::fp32);
    for (std::size_t i = 0; i < bf16.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bits(bf16[i], fp32[i]) == (T <= 8));
    }
  }
}

TEST_CASE("gemm_batched in bf16 is each product's gemm, in one oneDNN call where it runs", "[bf16][gemm]") {
  // attention's layouts: heads side by side in (B, L, H D) rows, and (B, H, T, S) blocks
  struct Case {
    std::size_t batches, heads, m, n, k;
    bool ta, tb;
    float alpha, beta;
    int threads;
  };
  const std::vector<Case> cases = {{3, 2, 32, 32, 16, false, true, 0.25f, 0.f, 1},  // scores q k^T
                                   {3, 2, 32, 16, 32, false, false, 1.f, 0.f, 2},   // P v
                                   {4, 2, 32, 16, 32, true, false, 1.f, 1.f, 2},    // P^T dO, added
                                   {2, 3, 5, 4, 3, false, false, 1.f, 0.f, 1}};     // below the primitive's range
  for (blas::Bf16Path path : runnable_paths()) {
    PathScope scope(path);
    for (const Case& p : cases) {
      ThreadScope threads(p.threads);
      CAPTURE(blas::bf16_path_name(path), p.batches, p.heads, p.m, p.n, p.k, p.ta, p.tb, p.alpha, p.beta);
      // A and B with heads side by side (row stride heads * cols), C in blocks of m x n
      const std::size_t a_rows = p.ta ? p.k : p.m, a_cols = p.ta ? p.m : p.k;
      const std::size_t b_rows = p.tb ? p.n : p.k, b_cols = p.tb ? p.k : p.n;
      const Array a = random_array({p.batches, a_rows, p.heads * a_cols}, 51);
      const Array b = random_array({p.batches, b_rows, p.heads * b_cols}, 52);
      const Array c0 = random_array({p.batches, p.heads, p.m, p.n}, 53);
      std::vector<std::uint16_t> a16(a.size()), b16(b.size());
      blas::to_bf16(a.data(), a.size(), a16.data());
      blas::to_bf16(b.data(), b.size(), b16.data());
      const std::size_t lda = p.heads * a_cols, ldb = p.heads * b_cols;
      std::vector<float> c(c0.begin(), c0.end()), want = c;
      const std::size_t calls_before = blas::detail::onednn_batched_calls();
      blas::gemm_batched(Precision::bf16, p.ta, p.tb, p.batches, p.heads, p.m, p.n, p.k, p.alpha,
                         {a16.data(), lda, a_rows * lda, a_cols}, {b16.data(), ldb, b_rows * ldb, b_cols}, p.beta,
                         {c.data(), p.n, p.heads * p.m * p.n, p.m * p.n});
      const bool batched_call = blas::detail::onednn_batched_calls() > calls_before;
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < p.batches; ++i) {
        for (std::size_t h = 0; h < p.heads; ++h) {
          float* w = want.data() + (i * p.heads + h) * p.m * p.n;
          blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, a16.data() + i * a_rows * lda + h * a_cols,
                     lda, b16.data() + i * b_rows * ldb + h * b_cols, ldb, p.beta, w, p.n);
        }
      }
      for (std::size_t i = 0; i < c.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(c[i]) - want[i]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      }
      CHECK(worst <= 1e-6 * static_cast<double>(p.k) * scale);  // the same products, summed in fp32
      const bool in_range = p.m * p.n * p.k >= (1u << 12) && p.m * p.n * p.k <= (1u << 21);
      CHECK(batched_call == (path == blas::Bf16Path::hardware && in_range));
    }
  }
}

TEST_CASE("attention_weights, attention_scores and attend follow a bf16 guard, forward and backward",
          "[bf16][ops][attention][gemm]") {
  // heads of 32 x 32 x 32 multiply-adds (2^15): the batched primitive's range
  const Array q = random_array({2, 32, 64}, 61), k = random_array({2, 32, 64}, 62), v = random_array({2, 32, 64}, 63);
  const Array seed = random_array({2, 32, 64}, 64), scores_seed = random_array({2, 2, 32, 32}, 65);
  auto run = [&](Precision precision) {
    Tensor q1(q, true), k1(k, true), v1(v, true), q2(q, true), k2(k, true);
    Tensor out, scores;
    {
      AutocastGuard guard(precision);
      out = attend(attention_weights(q1, k1, 2, 0.17f, true), v1, 2);
      scores = attention_scores(q2, k2, 2, 0.17f);
    }
    out.backward(seed);  // after the guard closed: the forward's precision still holds
    scores.backward(scores_seed);
    return std::vector<Array>{out.value(), q1.grad(), k1.grad(), v1.grad(), scores.value(), q2.grad(), k2.grad()};
  };
  check_follows_guard(run);
}
