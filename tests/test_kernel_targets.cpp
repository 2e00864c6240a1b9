// The vector kernels give the same bits whichever copy the CPU runs: core/kernels/vector_kernels.cpp is
// compiled here once for AVX-512, once for AVX2 with FMA and once for the baseline (kernel_target_copy.cpp),
// and every kernel's output is compared bit for bit on inputs with awkward lengths (tails of 1 to
// 15 elements), masks, and values from -8 to 8. The small-product kernel (core/kernels/small_gemm.cpp)
// fuses its multiply-adds where the target has FMA, so its copies are each checked against a
// double reference instead.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_table.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;
using testing::KernelTable;

namespace {

struct Target {
  std::string name;
  KernelTable table;
};

std::vector<Target> targets() {
  std::vector<Target> t = {{"baseline", testing::kernels_baseline_table()}};
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v3")) t.push_back({"x86-64-v3", testing::kernels_avx2_table()});
  if (__builtin_cpu_supports("x86-64-v4")) t.push_back({"x86-64-v4", testing::kernels_avx512_table()});
#endif
  return t;
}

std::vector<float> randoms(std::size_t n, std::uint64_t seed, float scale = 8.f) {
  Generator gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = gen.uniform(-scale, scale);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs `run(table)` for every target and requires each result to match the baseline's bits.
template <class Run>
void require_same_bits(const char* kernel, Run run) {
  const std::vector<Target> all = targets();
  const std::vector<std::vector<float>> base = run(all[0].table);
  for (std::size_t i = 1; i < all.size(); ++i) {
    INFO(kernel << ": " << all[i].name << " against the baseline");
    const std::vector<std::vector<float>> got = run(all[i].table);
    REQUIRE(got.size() == base.size());
    for (std::size_t k = 0; k < got.size(); ++k) REQUIRE(same_bits(got[k], base[k]));
  }
}

const std::size_t kLengths[] = {1, 7, 8, 15, 16, 17, 31, 32, 64, 100, 128, 1023};

}  // namespace

TEST_CASE("this CPU runs more than the baseline copy, so the comparison compares something", "[kernels][targets]") {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v3")) REQUIRE(targets().size() >= 2);
#endif
  REQUIRE(!targets().empty());
}

TEST_CASE("GELU forward and backward give the same bits on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> x = randoms(n, n), g = randoms(n, n + 1, 1.f);
    require_same_bits("gelu", [&](const KernelTable& k) {
      std::vector<float> y(n), dx(n);
      k.gelu_forward(x.data(), y.data(), n);
      k.gelu_backward(x.data(), g.data(), dx.data(), n);
      return std::vector<std::vector<float>>{y, dx};
    });
  }
}

TEST_CASE("the gated units (SiLU, GELU, tanh GELU) and their backward give the same bits on every target",
          "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    std::vector<float> gate = randoms(n, n + 20, 20.f);
    const std::vector<float> up = randoms(n, n + 21, 2.f), g = randoms(n, n + 22, 1.f);
    if (n > 4) {  // the tails: sigmoid's cut at -87, tanh's at 43.5, and non-finite gates
      gate[0] = -90.f, gate[1] = 1e4f, gate[2] = -std::numeric_limits<float>::infinity();
      gate[3] = std::numeric_limits<float>::quiet_NaN();
    }
    for (int act = 0; act < 3; ++act) {
      require_same_bits("gated", [&](const KernelTable& k) {
        std::vector<float> y(n), dgate(n), dup(n);
        k.gated_forward(gate.data(), up.data(), y.data(), n, act);
        k.gated_backward(gate.data(), up.data(), g.data(), dgate.data(), dup.data(), n, act);
        return std::vector<std::vector<float>>{y, dgate, dup};
      });
    }
  }
}

TEST_CASE("the tanh GELU and its backward give the same bits on every target, and agree with gated code 2",
          "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    std::vector<float> x = randoms(n, n + 30, 20.f);
    const std::vector<float> g = randoms(n, n + 31, 1.f), ones(n, 1.f);
    if (n > 4) x[0] = -90.f, x[1] = 1e4f, x[2] = -std::numeric_limits<float>::infinity(), x[3] = 1e-30f;
    require_same_bits("gelu_tanh", [&](const KernelTable& k) {
      std::vector<float> y(n), dx(n), gated(n), dgate(n), dup(n);
      k.gelu_tanh_forward(x.data(), y.data(), n);
      k.gelu_tanh_backward(x.data(), g.data(), dx.data(), n);
      // act(x) * 1 and g * 1 * act'(x): the gated unit's tanh GELU, bit for bit
      k.gated_forward(x.data(), ones.data(), gated.data(), n, 2);
      k.gated_backward(x.data(), ones.data(), g.data(), dgate.data(), dup.data(), n, 2);
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(std::memcmp(&y[i], &gated[i], sizeof(float)) == 0);
        REQUIRE(std::memcmp(&dx[i], &dgate[i], sizeof(float)) == 0);
      }
      return std::vector<std::vector<float>>{y, dx};
    });
  }
}

TEST_CASE("dropout, alone and after GELU, gives the same flags and values on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> x = randoms(n, n + 2), g = randoms(n, n + 3);
    require_same_bits("dropout", [&](const KernelTable& k) {
      std::vector<float> y(n), dx(n), flags(n);
      std::vector<std::uint8_t> keep(n);
      k.dropout_forward(x.data(), y.data(), keep.data(), 12345, n, 0xdeadbeefu, 0x1234567u, 1u << 30, 1.f / 0.75f);
      k.dropout_backward(g.data(), keep.data(), dx.data(), n, 1.f / 0.75f);
      for (std::size_t i = 0; i < n; ++i) flags[i] = keep[i];
      std::vector<float> gy(n), gdx(n);
      k.gelu_dropout_forward(x.data(), gy.data(), keep.data(), 77, n, 0xdeadbeefu, 0x1234567u, 1u << 30, 1.f / 0.75f);
      k.gelu_dropout_backward(x.data(), g.data(), keep.data(), gdx.data(), n, 1.f / 0.75f);
      return std::vector<std::vector<float>>{y, dx, flags, gy, gdx};
    });
  }
}

TEST_CASE("masked softmax and its backward give the same bits on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> z = randoms(n, n + 4), g = randoms(n, n + 5, 1.f);
    std::vector<std::uint8_t> keep(n);
    for (std::size_t i = 0; i < n; ++i) keep[i] = (i * 7) % 3 != 0;
    require_same_bits("softmax", [&](const KernelTable& k) {
      std::vector<float> all = z, causal = z, masked = z, dz(n), with_nan = z;
      with_nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
      k.masked_softmax_row(with_nan.data(), n, n, nullptr);
      k.masked_softmax_row(all.data(), n, n, nullptr);
      k.masked_softmax_row(causal.data(), n, (n + 1) / 2, nullptr);
      k.masked_softmax_row(masked.data(), n, n, keep.data());
      k.softmax_row_backward(all.data(), g.data(), dz.data(), n);
      return std::vector<std::vector<float>>{all, causal, masked, dz, with_nan};
    });
  }
}

TEST_CASE("softmax rows of 32, 64 and 128 (each a fixed-length path) give the general path's bits",
          "[kernels][targets]") {
  // A row one longer, its last key masked, takes the general path: the masked key adds +0 to the
  // first partial sum, which changes no bit, so the first n weights must match exactly.
  for (std::size_t n : {32, 64, 128}) {
    const std::vector<float> z = randoms(n + 1, n + 20), g = randoms(n + 1, n + 21, 1.f);
    for (const Target& t : targets()) {
      INFO(t.name << ", rows of " << n);
      for (std::size_t end : {n, n / 2 + 1, std::size_t{1}}) {
        std::vector<float> fixed(z.begin(), z.begin() + n), general = z;
        t.table.masked_softmax_row(fixed.data(), n, end, nullptr);
        t.table.masked_softmax_row(general.data(), n + 1, end, nullptr);
        general.resize(n);
        REQUIRE(same_bits(fixed, general));
      }
      std::vector<float> p = z, dz_fixed(n), dz_general(n + 1);
      t.table.masked_softmax_row(p.data(), n + 1, n, nullptr);  // p[n] is 0: it adds +0 to the dot
      t.table.softmax_row_backward(p.data(), g.data(), dz_fixed.data(), n);
      t.table.softmax_row_backward(p.data(), g.data(), dz_general.data(), n + 1);
      dz_general.resize(n);
      REQUIRE(same_bits(dz_fixed, dz_general));
    }
  }
}

TEST_CASE("cross-entropy's log-sum-exp and softmax gradient give the same bits on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> x = randoms(n, n + 12, 8.f), d0 = randoms(n, n + 13, 1.f);
    require_same_bits("log_sum_exp", [&](const KernelTable& k) {
      float m = 0, l = 0;
      std::vector<float> out(3), d = d0;
      out[0] = k.log_sum_exp_finite(x.data(), n, &m, &l) ? 1.f : 0.f;
      out[1] = m;
      out[2] = l;
      k.add_scaled_softmax(x.data(), n, m, l, -0.25f, d.data());
      std::vector<float> with_inf = x;
      with_inf[n / 2] = -std::numeric_limits<float>::infinity();
      float unused = 0;
      out.push_back(k.log_sum_exp_finite(with_inf.data(), n, &unused, &unused) ? 1.f : 0.f);
      REQUIRE(out[0] == 1.f);  // finite rows take the vector path
      REQUIRE(out[3] == 0.f);  // an infinite logit is left to exact arithmetic
      return std::vector<std::vector<float>>{out, d};
    });
  }
}

TEST_CASE("the tiled attention's online softmax rows give the same bits on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> x = randoms(n, n + 14, 8.f);
    require_same_bits("online_softmax_row", [&](const KernelTable& k) {
      std::vector<float> first = x, again = x, shifted = x, with_nan = x;
      float m = -std::numeric_limits<float>::infinity();
      bool nan = false;
      float c1 = -1.f, c2 = -1.f, c3 = -1.f;
      const float sum = k.online_softmax_row(first.data(), n, (n + 1) / 2, &m, &nan, &c1);
      REQUIRE_FALSE(nan);
      REQUIRE(c1 == 0.f);            // nothing was summed before
      const float before = m + 1.f;  // a running max above this row's: every exp below 1
      float m2 = before;
      const float sum2 = k.online_softmax_row(again.data(), n, n, &m2, &nan, &c2);
      REQUIRE(c2 == Approx(std::exp(static_cast<double>(before) - m2)).epsilon(1e-6));
      k.exp_shifted_row(shifted.data(), n, n - n / 3, 2.f);
      with_nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
      float m3 = -std::numeric_limits<float>::infinity();
      k.online_softmax_row(with_nan.data(), n, n, &m3, &nan, &c3);
      REQUIRE(nan);
      return std::vector<std::vector<float>>{first, again, shifted, {sum, m, sum2, m2, c1, c2}};
    });
  }
}

TEST_CASE("layer norm forward and backward give the same bits on every target", "[kernels][targets]") {
  for (std::size_t C : kLengths) {
    const std::size_t rows = 3;
    const std::vector<float> x = randoms(rows * C, C + 6), g = randoms(rows * C, C + 7, 1.f);
    const std::vector<float> gamma = randoms(C, C + 8, 2.f), beta = randoms(C, C + 9, 1.f);
    require_same_bits("layer_norm", [&](const KernelTable& k) {
      std::vector<float> y(rows * C), mean(rows), rstd(rows), dx(rows * C, 0.25f), y_plain(rows * C);
      std::vector<float> dgamma(C, 0.5f), dbeta(C, -0.5f);
      k.layer_norm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows, C, 1e-5f);
      k.layer_norm_forward(x.data(), nullptr, nullptr, y_plain.data(), mean.data(), rstd.data(), rows, C, 1e-5f);
      k.layer_norm_backward(x.data(), g.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dgamma.data(),
                            dbeta.data(), rows, C);
      return std::vector<std::vector<float>>{y, y_plain, mean, rstd, dx, dgamma, dbeta};
    });
  }
}

TEST_CASE("rms norm forward and backward give the same bits on every target", "[kernels][targets][rms_norm]") {
  for (std::size_t C : kLengths) {
    const std::size_t rows = 3;
    const std::vector<float> x = randoms(rows * C, C + 16), g = randoms(rows * C, C + 17, 1.f);
    const std::vector<float> gamma = randoms(C, C + 18, 2.f);
    require_same_bits("rms_norm", [&](const KernelTable& k) {
      std::vector<float> y(rows * C), rstd(rows), y_plain(rows * C), rstd_plain(rows);
      std::vector<float> dx(rows * C, 0.25f), dx_plain(rows * C, -0.25f), dgamma(C, 0.5f);
      k.rms_norm_forward(x.data(), gamma.data(), y.data(), rstd.data(), rows, C, 1e-6f);
      k.rms_norm_forward(x.data(), nullptr, y_plain.data(), rstd_plain.data(), rows, C, 1e-6f);
      k.rms_norm_backward(x.data(), g.data(), gamma.data(), rstd.data(), dx.data(), dgamma.data(), rows, C);
      k.rms_norm_backward(x.data(), g.data(), nullptr, rstd_plain.data(), dx_plain.data(), nullptr, rows, C);
      REQUIRE(rstd == rstd_plain);  // gamma scales y only
      return std::vector<std::vector<float>>{y, y_plain, rstd, dx, dx_plain, dgamma};
    });
  }
}

TEST_CASE("column sums give the same bits on every target", "[kernels][targets]") {
  for (std::size_t cols : kLengths) {
    const std::size_t rows = 5;
    const std::vector<float> x = randoms(rows * cols, cols + 14), start = randoms(cols, cols + 15, 1.f);
    require_same_bits("column_sums", [&](const KernelTable& k) {
      std::vector<float> sums = start;
      k.add_column_sums(x.data(), rows, cols, sums.data());
      return std::vector<std::vector<float>>{sums};
    });
  }
}

TEST_CASE("the Adam and AdamW update gives the same bits on every target", "[kernels][targets]") {
  for (std::size_t n : kLengths) {
    const std::vector<float> p0 = randoms(n, n + 10, 1.f), grad = randoms(n, n + 11, 1.f);
    for (bool decoupled : {false, true}) {
      require_same_bits("adam", [&](const KernelTable& k) {
        std::vector<float> p = p0, m(n, 0.01f), v(n, 0.001f);
        const optim::AdamStep s{0.9f, 0.999f, 1e-8f, 0.01f, decoupled ? 0.99999f : 1.f, 1e-3f, 0.0447f, decoupled};
        for (int step = 0; step < 3; ++step) k.adam_update(p.data(), grad.data(), m.data(), v.data(), n, s);
        return std::vector<std::vector<float>>{p, m, v};
      });
    }
  }
}

// C (m x n, row stride ldc) against alpha A B + beta C_before in double: the largest error over
// its rounding bound (NaN when an element is NaN); the padding past each row of C must be unchanged.
// a(i, l) and b(l, j) give the operands' elements.
template <class A, class B>
double worst_error(std::size_t m, std::size_t n, std::size_t k, std::size_t ldc, float alpha, float beta,
                   const std::vector<float>& c, const std::vector<float>& before, A a, B b) {
  double worst = 0;
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < ldc; ++j) {
      const std::size_t at = i * ldc + j;
      if (j >= n) {  // past C's columns: never written
        REQUIRE(same_bits({c[at]}, {before[at]}));
        continue;
      }
      double sum = 0, mag = 0;
      for (std::size_t l = 0; l < k; ++l) {
        const double x = a(i, l), y = b(l, j);
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double want = alpha * sum + (beta == 0.f ? 0.0 : beta * before[at]);
      const double bound = 4e-7 * (static_cast<double>(k) + 2) * (std::fabs(alpha) * mag + 1);
      const double error = std::fabs(c[at] - want) / bound;
      if (std::isnan(error)) return error;
      worst = std::max(worst, error);
    }
  }
  return worst;
}

TEST_CASE("the small-product kernel agrees with a double reference on every target", "[kernels][targets][gemm]") {
  struct Copy {
    std::string name;
    testing::SmallGemm gemm;
  };
  std::vector<Copy> copies = {{"baseline", testing::small_gemm_baseline()}};
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v3")) copies.push_back({"x86-64-v3", testing::small_gemm_avx2()});
  if (__builtin_cpu_supports("x86-64-v4")) copies.push_back({"x86-64-v4", testing::small_gemm_avx512()});
#endif
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Copy& copy : copies) {
    for (int form = 0; form < 4; ++form) {
      const bool ta = form & 1, tb = form & 2;
      for (std::size_t n : {1, 15, 16, 17, 33, 48, 64}) {
        for (std::size_t m : {1, 5, 8, 13}) {
          for (std::size_t k : {0, 1, 16, 37}) {
            for (float beta : {0.f, 0.5f}) {
              INFO(copy.name << ": " << m << " x " << n << " x " << k << (ta ? " T" : " N") << (tb ? "T" : "N")
                             << ", beta " << beta);
              const std::size_t pad = 3, lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
              const std::vector<float> a = randoms((ta ? k : m) * lda, m * 100 + k, 1.f),
                                       b = randoms((tb ? n : k) * ldb, n * 100 + k + 1, 1.f);
              std::vector<float> c = randoms(m * ldc, m + n + k, 1.f);
              if (beta == 0.f) {
                for (std::size_t i = 0; i < m; ++i) c[i * ldc] = nan;  // beta 0 ignores what C held
              }
              const std::vector<float> before = c;
              const float alpha = -0.75f;
              copy.gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
              CHECK(worst_error(
                        m, n, k, ldc, alpha, beta, c, before,
                        [&](std::size_t i, std::size_t l) { return ta ? a[l * lda + i] : a[i * lda + l]; },
                        [&](std::size_t l, std::size_t j) { return tb ? b[j * ldb + l] : b[l * ldb + j]; }) <= 1.0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the few-rows kernel with B in bf16 agrees with a double reference on every target",
          "[kernels][targets][gemm][bf16]") {
  struct Copy {
    std::string name;
    testing::FewRowsBf16 gemm;
  };
  std::vector<Copy> copies = {{"baseline", testing::small_gemm_baseline_few_rows_bf16()}};
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v3")) copies.push_back({"x86-64-v3", testing::small_gemm_avx2_few_rows_bf16()});
  if (__builtin_cpu_supports("x86-64-v4")) copies.push_back({"x86-64-v4", testing::small_gemm_avx512_few_rows_bf16()});
#endif
  for (const Copy& copy : copies) {
    for (std::size_t m : {1, 2, 3, 4}) {
      for (std::size_t n : {1, 5, 8, 13}) {
        for (std::size_t k : {0, 1, 31, 32, 33, 70}) {
          for (float beta : {0.f, 0.5f}) {
            INFO(copy.name << ": " << m << " x " << n << " x " << k << ", beta " << beta);
            const std::size_t pad = 3, lda = k + pad, ldb = k + pad, ldc = n + pad;
            const std::vector<float> a = randoms(m * lda, m * 100 + k, 1.f), b = randoms(n * ldb, n * 100 + k + 1, 1.f);
            std::vector<std::uint16_t> b16(b.size());
            for (std::size_t i = 0; i < b.size(); ++i) b16[i] = blas::to_bf16(b[i]);
            std::vector<float> c = randoms(m * ldc, m + n + k, 1.f);
            if (beta == 0.f) c[0] = std::numeric_limits<float>::quiet_NaN();  // beta 0 ignores what C held
            const std::vector<float> before = c;
            const float alpha = -0.75f;
            copy.gemm(m, n, k, alpha, a.data(), lda, b16.data(), ldb, beta, c.data(), ldc);
            CHECK(worst_error(
                      m, n, k, ldc, alpha, beta, c, before,
                      [&](std::size_t i, std::size_t l) { return a[i * lda + l]; },
                      [&](std::size_t l, std::size_t j) { return blas::from_bf16(b16[j * ldb + l]); }) <= 1.0);
          }
        }
      }
    }
  }
}
