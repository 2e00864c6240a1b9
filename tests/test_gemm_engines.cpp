// The two GEMM engines behind blas::sgemm (core/kernels/blas.hpp): both compute the same products to
// rounding on every shape, transpose, stride, alpha and beta; each repeats bit for bit; `auto`
// follows its size rule; XGRAD_GEMM and set_engine choose; oneDNN leaves no threads behind.
// The whole suite also runs once per engine in CI (scripts/run_tests.sh).
#include <dirent.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <xtensor/xmath.hpp>

#include "train_steps.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

// Sets the engine for one scope and restores the one before.
struct EngineScope {
  explicit EngineScope(blas::Engine e) : before(blas::engine()) { blas::set_engine(e); }
  ~EngineScope() { blas::set_engine(before); }
  blas::Engine before;
};

struct Product {
  std::size_t m, n, k;
  bool ta, tb;
  std::size_t pad;  // extra elements per stored row (leading dimension beyond the row length)
  float alpha, beta;
};

struct Operands {
  std::vector<float> a, b, c;
  std::size_t lda, ldb, ldc;
};

Operands operands(const Product& p) {
  Generator gen(11);
  Operands o;
  o.lda = (p.ta ? p.m : p.k) + p.pad;
  o.ldb = (p.tb ? p.k : p.n) + p.pad;
  o.ldc = p.n + p.pad;
  o.a.resize((p.ta ? p.k : p.m) * o.lda);
  o.b.resize((p.tb ? p.n : p.k) * o.ldb);
  o.c.resize(p.m * o.ldc);
  for (auto* v : {&o.a, &o.b, &o.c})
    for (float& x : *v) x = gen.uniform(-1.f, 1.f);
  return o;
}

// How the product is asked for: blas::sgemm, or blas::gemm in bf16 with A float32 and B held in bf16
// (a weight's copy under Precision::bf16).
enum class Form { fp32, bf16_b };

std::vector<float> run(blas::Engine e, const Product& p, Operands o, Form form = Form::fp32) {
  EngineScope scope(e);
  if (form == Form::bf16_b) {
    std::vector<std::uint16_t> b16(o.b.size());
    blas::to_bf16(o.b.data(), o.b.size(), b16.data());
    blas::gemm(Precision::bf16, p.ta, p.tb, p.m, p.n, p.k, p.alpha, o.a.data(), o.lda, b16.data(), o.ldb, p.beta,
               o.c.data(), o.ldc);
  } else {
    blas::sgemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, o.a.data(), o.lda, o.b.data(), o.ldb, p.beta, o.c.data(), o.ldc);
  }
  return o.c;
}

// C in double, and for each element the sum of |terms|, the scale of its rounding error.
void reference(const Product& p, const Operands& o, std::vector<double>& c, std::vector<double>& scale) {
  c.assign(o.c.size(), 0.0);
  scale.assign(o.c.size(), 0.0);
  for (std::size_t i = 0; i < p.m; ++i) {
    for (std::size_t j = 0; j < p.n; ++j) {
      double sum = 0, mag = 0;
      for (std::size_t l = 0; l < p.k; ++l) {
        const double x = p.ta ? o.a[l * o.lda + i] : o.a[i * o.lda + l];
        const double y = p.tb ? o.b[j * o.ldb + l] : o.b[l * o.ldb + j];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double old = o.c[i * o.ldc + j];
      c[i * o.ldc + j] = p.alpha * sum + (p.beta == 0.f ? 0.0 : p.beta * old);
      scale[i * o.ldc + j] = std::fabs(p.alpha) * mag + std::fabs(p.beta * old);
    }
  }
}

// Product p on engine e, over a C of NaN when beta is 0: every element within its rounding bound of
// the reference, the padding past each row of C untouched, and the kernel's counter `calls` moved
// exactly when `expect_kernel`.
// In bf16 form the reference multiplies A and B rounded to bf16.
void check_kernel_product(const Product& p, blas::Engine e, std::size_t (*calls)(), bool expect_kernel,
                          Form form = Form::fp32) {
  INFO(blas::engine_name(e) << ": " << p.m << " x " << p.n << " x " << p.k << (p.ta ? " T" : " N") << (p.tb ? "T" : "N")
                            << " pad " << p.pad << " alpha " << p.alpha << " beta " << p.beta
                            << (form == Form::bf16_b ? " bf16" : ""));
  Operands o = operands(p);
  if (p.beta == 0.f)
    for (std::size_t i = 0; i < p.m; ++i)
      for (std::size_t j = 0; j < p.n; ++j) o.c[i * o.ldc + j] = std::numeric_limits<float>::quiet_NaN();
  Operands rounded = o;
  if (form == Form::bf16_b) {
    blas::round_to_bf16(rounded.a.data(), rounded.a.size(), rounded.a.data());
    blas::round_to_bf16(rounded.b.data(), rounded.b.size(), rounded.b.data());
  }
  std::vector<double> ref, scale;
  reference(p, rounded, ref, scale);
  const std::size_t before = calls();
  const std::vector<float> got = run(e, p, o, form);
  CHECK((calls() > before) == expect_kernel);
  double worst = 0;
  for (std::size_t i = 0; i < p.m; ++i) {
    for (std::size_t j = 0; j < o.ldc; ++j) {
      const std::size_t at = i * o.ldc + j;
      if (j >= p.n) {  // the padding past each row of C is never written
        REQUIRE(got[at] == o.c[at]);
        continue;
      }
      const double bound = 4e-7 * (static_cast<double>(p.k) + 2) * scale[at] + 1e-30;
      worst = std::max(worst, std::fabs(got[at] - ref[at]) / bound);  // NaN fails
      if (!(worst <= 1.0)) break;
    }
  }
  CHECK(worst <= 1.0);
}

// A kernel's rule under auto, on one thread and on two: it computes every product of `taken` and
// none of `not_taken` (check_kernel_product), a forced engine computes `forced` itself, and
// `same_bits` gives the same bits on one thread and on two.
void check_kernel_rule(const std::vector<Product>& taken, const std::vector<Product>& not_taken, const Product& forced,
                       const Product& same_bits, std::size_t (*calls)(), Form form = Form::fp32) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Product& p : taken) check_kernel_product(p, blas::Engine::automatic, calls, true, form);
    for (const Product& p : not_taken) check_kernel_product(p, blas::Engine::automatic, calls, false, form);
    for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn})
      if (blas::has_engine(e)) check_kernel_product(forced, e, calls, false, form);
  }
  const Operands o = operands(same_bits);
  set_num_threads(1);
  const std::vector<float> one = run(blas::Engine::automatic, same_bits, o, form);
  set_num_threads(2);
  const std::vector<float> two = run(blas::Engine::automatic, same_bits, o, form);
  set_num_threads(1);
  CHECK(one == two);
}

std::size_t threads_of_this_process() {
  std::size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// CPU seconds (user + system) used so far by every thread of this process but the calling one.
double cpu_seconds_of_other_threads() {
  const std::string self = std::to_string(gettid());
  double ticks = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] == '.' || self == e->d_name) continue;
      std::ifstream stat(std::string("/proc/self/task/") + e->d_name + "/stat");
      std::string line;
      std::getline(stat, line);
      // fields after the ")" that closes the thread's name: state is field 3, utime 14, stime 15
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string field;
      for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14 || i == 15) ticks += std::stod(field);
      }
    }
    closedir(d);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

TEST_CASE("both engines compute every shape, transpose, stride, alpha and beta to rounding", "[gemm][engines]") {
  if (!blas::has_engine(blas::Engine::onednn)) {
    WARN("this build has OpenBLAS only");
    return;
  }
  std::vector<Product> products;
  for (std::size_t size : {1, 3, 16, 33, 70}) {
    for (int t = 0; t < 4; ++t) {
      products.push_back({size, size + 5, size + 2, (t & 1) != 0, (t & 2) != 0, 0, 1.f, 0.f});
      products.push_back({size + 4, size, 2 * size + 1, (t & 1) != 0, (t & 2) != 0, 3, -0.5f, 1.f});
    }
  }
  products.push_back({130, 257, 64, false, true, 0, 0.125f, 0.f});  // an attention-score shape
  products.push_back({7, 9, 0, false, false, 1, 1.f, 0.5f});        // K = 0: C = beta C
  // A^T B with C at least twice as tall as wide: oneDNN computes B^T A and blas.cpp transposes it
  products.push_back({70, 20, 33, true, false, 2, 0.75f, 1.f});
  products.push_back({64, 16, 300, true, false, 0, 1.f, 0.f});
  products.push_back({2100, 1000, 2, true, false, 0, 1.f, 0.5f});  // past the swap's size limit
  for (const Product& p : products) {
    INFO(p.m << " x " << p.n << " x " << p.k << (p.ta ? " T" : " N") << (p.tb ? "T" : "N") << " pad " << p.pad
             << " alpha " << p.alpha << " beta " << p.beta);
    const Operands o = operands(p);
    std::vector<double> ref, scale;
    reference(p, o, ref, scale);
    const std::vector<float> open = run(blas::Engine::openblas, p, o), dnnl = run(blas::Engine::onednn, p, o);
    double worst_open = 0, worst_dnnl = 0;
    for (std::size_t i = 0; i < p.m; ++i) {
      for (std::size_t j = 0; j < o.ldc; ++j) {
        const std::size_t at = i * o.ldc + j;
        if (j >= p.n) {  // the padding past each row of C is never written
          REQUIRE(open[at] == o.c[at]);
          REQUIRE(dnnl[at] == o.c[at]);
          continue;
        }
        // float32 sums of k terms: error within a few k ulps of the sum of magnitudes
        const double bound = 4e-7 * (static_cast<double>(p.k) + 2) * scale[at] + 1e-30;
        worst_open = std::max(worst_open, std::fabs(open[at] - ref[at]) / bound);
        worst_dnnl = std::max(worst_dnnl, std::fabs(dnnl[at] - ref[at]) / bound);
      }
    }
    CHECK(worst_open <= 1.0);
    CHECK(worst_dnnl <= 1.0);
  }
}

TEST_CASE("each engine repeats bit for bit, and the engines agree on training to rounding",
          "[gemm][engines][determinism]") {
  std::vector<blas::Engine> engines = {blas::Engine::openblas};
  if (blas::has_engine(blas::Engine::onednn)) engines.push_back(blas::Engine::onednn);
  std::vector<testing::StepResult> results;
  for (blas::Engine e : engines) {
    EngineScope scope(e);
    for (int threads : {1, 2}) {
      INFO("engine " << blas::engine_name(e) << ", threads " << threads);
      const testing::StepResult a = testing::train_steps(threads), b = testing::train_steps(threads);
      REQUIRE(a.losses == b.losses);
      for (std::size_t k = 0; k < a.params.size(); ++k) {
        INFO("parameter " << a.params[k].first);
        REQUIRE(a.params[k].second == b.params[k].second);
      }
      if (threads == 1) results.push_back(a);
    }
  }
  if (results.size() < 2) return;
  // Rounding only: three AdamW steps at lr 1e-3 move each weight by up to 3e-3, and the two runs'
  // weights differ by orders of magnitude less.
  const testing::StepResult &open = results[0], &dnnl = results[1];
  for (std::size_t s = 0; s < open.losses.size(); ++s) CHECK(dnnl.losses[s] == Approx(open.losses[s]).epsilon(1e-5));
  bool any_bit_differs = false;
  for (std::size_t k = 0; k < open.params.size(); ++k) {
    INFO("parameter " << open.params[k].first);
    const float diff = xt::amax(xt::abs(dnnl.params[k].second - open.params[k].second))();
    CHECK(diff < 1e-4f);
    any_bit_differs = any_bit_differs || diff > 0.f;
  }
  // The second run really used the other engine (their products round differently).
  CHECK(any_bit_differs);
}

TEST_CASE("auto sends small products to OpenBLAS and the rest to oneDNN, and a forced engine takes all",
          "[gemm][engines]") {
  {
    EngineScope scope(blas::Engine::automatic);
    REQUIRE(blas::engine_for(16, 16, 16) == blas::Engine::openblas);
    REQUIRE(blas::engine_for(512, 512, 512) ==
            (blas::has_engine(blas::Engine::onednn) ? blas::Engine::onednn : blas::Engine::openblas));
  }
  {
    EngineScope scope(blas::Engine::openblas);
    REQUIRE(blas::engine_for(512, 512, 512) == blas::Engine::openblas);
  }
  if (blas::has_engine(blas::Engine::onednn)) {
    EngineScope scope(blas::Engine::onednn);
    REQUIRE(blas::engine_for(2, 2, 2) == blas::Engine::onednn);
  }
}

TEST_CASE("engine names parse both ways and a wrong one is named", "[gemm][engines][bad_input]") {
  for (blas::Engine e : {blas::Engine::automatic, blas::Engine::openblas, blas::Engine::onednn})
    REQUIRE(blas::parse_engine(blas::engine_name(e)) == e);
  REQUIRE_THROWS_WITH(blas::parse_engine("mkl"), Catch::Contains("blas::parse_engine") && Catch::Contains("'mkl'"));
  REQUIRE_THROWS_WITH(blas::parse_engine(""), Catch::Contains("is not an engine"));
  if (!blas::has_engine(blas::Engine::onednn))
    REQUIRE_THROWS_WITH(blas::set_engine(blas::Engine::onednn), Catch::Contains("built without oneDNN"));
}

// CI runs the suite with XGRAD_GEMM unset, openblas and onednn: each run checks its own setting.
TEST_CASE("XGRAD_GEMM sets the engine every product starts with", "[gemm][engines]") {
  const char* env = std::getenv("XGRAD_GEMM");
  const blas::Engine expected = env && *env ? blas::parse_engine(env) : blas::Engine::automatic;
  REQUIRE(blas::engine() == expected);
}

// Run by ctest with XGRAD_GEMM=mkl (tests/CMakeLists.txt), not by test discovery.
TEST_CASE("an unknown XGRAD_GEMM is an error naming the variable and the value", "[.gemm_bad_env][gemm]") {
  REQUIRE(std::string(std::getenv("XGRAD_GEMM")) == "mkl");
  REQUIRE_THROWS_WITH(blas::engine(), Catch::Contains("XGRAD_GEMM") && Catch::Contains("'mkl'"));
  const float a = 1, b = 2;
  float c = 0;
  REQUIRE_THROWS_WITH(blas::sgemm(false, false, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1), Catch::Contains("XGRAD_GEMM"));
}

// ctest runs this case with OMP_NUM_THREADS=4: oneDNN's OpenMP must still run each call on the
// calling thread, from the main thread and from xgrad's kernel threads, and start no team.
TEST_CASE("oneDNN products start no threads of their own", "[gemm][engines][threads]") {
  if (!blas::has_engine(blas::Engine::onednn)) {
    WARN("this build has OpenBLAS only");
    return;
  }
  EngineScope scope(blas::Engine::onednn);
  set_num_threads(2);
  Generator gen(3);
  const std::size_t n = 256;  // 2^24 multiply-adds: split across both kernel threads
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (float& x : a) x = gen.uniform(-1.f, 1.f);
  for (float& x : b) x = gen.uniform(-1.f, 1.f);
  blas::sgemm(false, false, 64, 64, 64, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // main thread only
  const std::size_t before = threads_of_this_process();
  for (int rep = 0; rep < 20; ++rep) {
    blas::sgemm(false, false, 64, 64, 64, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    blas::sgemm(false, true, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  }
  const std::size_t after = threads_of_this_process();
  set_num_threads(1);
  REQUIRE(before > 0);
  REQUIRE(after == before);
}

// Kernel threads watch for the next job for 0.2 ms before they sleep (core/kernels/parallel.cpp); neither
// they, nor OpenBLAS's threads, nor oneDNN's may keep spinning after the work ends.
TEST_CASE("idle threads use no CPU after products on both engines and two kernel threads", "[gemm][engines][threads]") {
  set_num_threads(2);
  Generator gen(5);
  const std::size_t n = 256;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (float& x : a) x = gen.uniform(-1.f, 1.f);
  for (float& x : b) x = gen.uniform(-1.f, 1.f);
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn}) {
    if (!blas::has_engine(e)) continue;
    EngineScope scope(e);
    for (int rep = 0; rep < 20; ++rep)
      blas::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past any spin-then-sleep
  const double before = cpu_seconds_of_other_threads();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const double used = cpu_seconds_of_other_threads() - before;
  set_num_threads(1);
  // A spinning thread would use about 1 s here; clock ticks are 10 ms.
  CHECK(used < 0.05);
}

// blas::linear: the bias rows, then the product added by each engine.
TEST_CASE("linear with and without a bias agrees with the reference on both engines and many shapes",
          "[gemm][engines][long]") {
  Generator gen(13);
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn, blas::Engine::automatic}) {
    if (!blas::has_engine(e)) continue;
    EngineScope scope(e);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (std::size_t rows : {1, 5, 64, 300, 2048}) {
        for (std::size_t out : {1, 16, 64, 130}) {
          for (std::size_t in : {0, 1, 7, 64, 256}) {
            INFO(blas::engine_name(e) << ", threads " << threads << ": " << rows << " x " << out << " x " << in);
            std::vector<float> x(rows * in), w(out * in), bias(out), y(rows * out, 99.f), y_plain(rows * out, 99.f);
            for (float& v : x) v = gen.uniform(-1.f, 1.f);
            for (float& v : w) v = gen.uniform(-1.f, 1.f);
            for (float& v : bias) v = gen.uniform(-1.f, 1.f);
            blas::linear(rows, out, in, x.data(), w.data(), bias.data(), y.data());
            blas::linear(rows, out, in, x.data(), w.data(), nullptr, y_plain.data());
            double worst = 0;
            for (std::size_t r = 0; r < rows; ++r) {
              for (std::size_t o = 0; o < out; ++o) {
                double sum = 0, mag = 0;
                for (std::size_t i = 0; i < in; ++i) {
                  sum += static_cast<double>(x[r * in + i]) * w[o * in + i];
                  mag += std::fabs(static_cast<double>(x[r * in + i]) * w[o * in + i]);
                }
                const double bound = 4e-7 * (static_cast<double>(in) + 2) * (mag + 1) + 1e-30;
                worst = std::max(worst, std::fabs(y[r * out + o] - (sum + bias[o])) / bound);
                worst = std::max(worst, std::fabs(y_plain[r * out + o] - sum) / bound);
              }
            }
            REQUIRE(worst <= 1.0);
          }
        }
      }
    }
  }
  set_num_threads(1);
}

namespace {

// A batch of products laid out as attention lays them out: matrix (b, h) of an operand is the
// column block h of rows of batch entry b, heads side by side (row stride H cols + pad), or, for
// C when `blocks` is set, contiguous blocks one after another.
struct BatchedCase {
  std::size_t batches, heads, m, n, k;
  bool ta, tb;
  float alpha, beta;
  bool blocks;
  std::size_t pad;
};

struct BatchedOperand {
  std::vector<float> data;
  std::size_t rows, cols, ld, batch_stride, head_stride;
  float at(std::size_t b, std::size_t h, std::size_t r, std::size_t c) const {
    return data[b * batch_stride + h * head_stride + r * ld + c];
  }
};

BatchedOperand side_by_side(std::size_t batches, std::size_t heads, std::size_t rows, std::size_t cols, std::size_t pad,
                            Generator& gen) {
  BatchedOperand o{{}, rows, cols, heads * cols + pad, 0, cols};
  o.batch_stride = rows * o.ld;
  o.data.resize(batches * o.batch_stride);
  for (float& x : o.data) x = gen.uniform(-1.f, 1.f);
  return o;
}

BatchedOperand in_blocks(std::size_t batches, std::size_t heads, std::size_t rows, std::size_t cols, Generator& gen) {
  BatchedOperand o{{}, rows, cols, cols, heads * rows * cols, rows * cols};
  o.data.resize(batches * o.batch_stride);
  for (float& x : o.data) x = gen.uniform(-1.f, 1.f);
  return o;
}

}  // namespace

TEST_CASE("batched products agree with the reference on every engine, layout, transpose, alpha and beta",
          "[gemm][engines]") {
  const std::vector<BatchedCase> cases = {
      {3, 2, 5, 7, 4, false, true, 0.5f, 0.f, true, 0},
      {2, 4, 16, 16, 8, true, false, 1.f, 1.f, false, 3},
      {4, 4, 64, 64, 64, false, false, 0.125f, 0.f, false, 0},  // attention-sized: oneDNN's primitive
      {5, 4, 32, 32, 16, false, true, 0.25f, 0.f, true, 1},
      {2, 3, 33, 17, 9, true, true, -1.f, 0.5f, false, 2},
      {9, 2, 24, 40, 12, true, false, 1.f, 1.f, false, 0},
      {1, 1, 8, 8, 8, false, false, 1.f, 0.f, true, 0},        // too little work for one call
      {2, 1, 300, 300, 30, false, true, 1.f, 0.f, true, 0},    // products too large for it
      {2, 2, 3, 4, 0, false, false, 1.f, 0.5f, true, 0},       // K = 0: C = beta C
      {3, 4, 64, 32, 64, true, false, 0.125f, 1.f, false, 0},  // primitive with alpha and beta (attention's dK)
      {2, 2, 48, 40, 16, false, true, -2.f, 0.25f, false, 1},
      // the small-product kernel's edges: widths around its 16-float vectors, rows around its
      // blocks of 8, 6 and 4, one row, K = 1
      {2, 2, 13, 1, 5, false, false, 1.f, 0.f, true, 0},
      {2, 3, 7, 15, 16, true, true, 0.5f, 1.f, false, 1},
      {1, 2, 9, 17, 33, false, true, 1.f, 0.f, false, 2},
      {3, 1, 11, 31, 16, true, false, -1.f, 0.5f, true, 0},
      {2, 2, 5, 47, 17, false, true, 1.f, 1.f, false, 1},
      {1, 3, 1, 64, 20, true, true, 2.f, 0.f, false, 0},
      {2, 1, 4, 65, 8, false, false, 1.f, 0.f, false, 3},  // one wider: not the kernel's
      {1, 2, 31, 33, 1, false, true, 1.f, 0.5f, true, 0},
      {2, 2, 64, 48, 32, true, true, 0.125f, 0.f, false, 0},
  };
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn, blas::Engine::automatic}) {
    if (!blas::has_engine(e)) continue;
    EngineScope scope(e);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const BatchedCase& p : cases) {
        INFO(blas::engine_name(e) << ", threads " << threads << ": " << p.batches << " x " << p.heads << " of " << p.m
                                  << " x " << p.n << " x " << p.k << (p.ta ? " T" : " N") << (p.tb ? "T" : "N"));
        Generator gen(17);
        const BatchedOperand a = side_by_side(p.batches, p.heads, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.pad, gen);
        const BatchedOperand b = side_by_side(p.batches, p.heads, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.pad, gen);
        BatchedOperand c = p.blocks ? in_blocks(p.batches, p.heads, p.m, p.n, gen)
                                    : side_by_side(p.batches, p.heads, p.m, p.n, p.pad, gen);
        const std::vector<float> c_before = c.data;
        const std::size_t calls_before = blas::detail::onednn_batched_calls(),
                          small_before = blas::detail::small_kernel_products();
        blas::sgemm_batched(p.ta, p.tb, p.batches, p.heads, p.m, p.n, p.k, p.alpha,
                            {a.data.data(), a.ld, a.batch_stride, a.head_stride},
                            {b.data.data(), b.ld, b.batch_stride, b.head_stride}, p.beta,
                            {c.data.data(), c.ld, c.batch_stride, c.head_stride});
        std::vector<char> written(c.data.size(), 0);
        double worst = 0;
        for (std::size_t bi = 0; bi < p.batches; ++bi) {
          for (std::size_t h = 0; h < p.heads; ++h) {
            for (std::size_t i = 0; i < p.m; ++i) {
              for (std::size_t j = 0; j < p.n; ++j) {
                double sum = 0, mag = 0;
                for (std::size_t l = 0; l < p.k; ++l) {
                  const double x = p.ta ? a.at(bi, h, l, i) : a.at(bi, h, i, l);
                  const double y = p.tb ? b.at(bi, h, j, l) : b.at(bi, h, l, j);
                  sum += x * y;
                  mag += std::fabs(x * y);
                }
                const std::size_t at = bi * c.batch_stride + h * c.head_stride + i * c.ld + j;
                const double want = p.alpha * sum + p.beta * c_before[at];
                const double bound = 4e-7 * (static_cast<double>(p.k) + 2) * (std::fabs(p.alpha) * mag + 1) + 1e-30;
                worst = std::max(worst, std::fabs(c.data[at] - want) / bound);
                written[at] = 1;
              }
            }
          }
        }
        CHECK(worst <= 1.0);
        for (std::size_t i = 0; i < c.data.size(); ++i) {
          if (!written[i]) REQUIRE(c.data[i] == c_before[i]);  // padding between heads is never written
        }
        // Under auto the small-product kernel computes exactly the products with C at most 64
        // wide; oneDNN's primitive the rest of those of 2^12 to 2^21 multiply-adds.
        const std::size_t work = p.m * p.n * p.k;
        const bool small = e == blas::Engine::automatic && p.n <= 64 && work <= (1u << 21);
        const bool primitive = !small && blas::has_engine(blas::Engine::onednn) && e != blas::Engine::openblas &&
                               work >= (1u << 12) && work <= (1u << 21);
        CHECK((blas::detail::onednn_batched_calls() > calls_before) == primitive);
        CHECK(blas::detail::small_kernel_products() - small_before == (small ? p.batches * p.heads : 0));
      }
    }
  }
  set_num_threads(1);
}

TEST_CASE("two threads running oneDNN's batched products at once get the same bits as one alone",
          "[gemm][engines][threads]") {
  if (!blas::has_engine(blas::Engine::onednn)) {
    WARN("this build has OpenBLAS only");
    return;
  }
  EngineScope scope(blas::Engine::onednn);
  const std::size_t B = 8, H = 4, T = 64, D = 32;
  Generator gen(19);
  const BatchedOperand q = side_by_side(B, H, T, D, 0, gen), k = side_by_side(B, H, T, D, 0, gen);
  auto scores = [&](std::vector<float>& out) {
    out.assign(B * H * T * T, 0.f);
    blas::sgemm_batched(false, true, B, H, T, T, D, 0.125f, {q.data.data(), q.ld, q.batch_stride, q.head_stride},
                        {k.data.data(), k.ld, k.batch_stride, k.head_stride}, 0.f, {out.data(), T, H * T * T, T * T});
  };
  std::vector<float> alone;
  scores(alone);
  // Each thread repeats the product; with a scratchpad shared between them (oneDNN's own, in this
  // build) their results would mix.
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> mine;
      for (int rep = 0; rep < 200; ++rep) {
        scores(mine);
        if (mine != alone) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches[0] == 0);
  CHECK(mismatches[1] == 0);
}

TEST_CASE("the small-product kernel gives the same bits on one thread, two, and two callers at once",
          "[gemm][engines][threads]") {
  EngineScope scope(blas::Engine::automatic);
  const std::size_t B = 6, H = 4, T = 32, D = 16;
  Generator gen(29);
  const BatchedOperand q = side_by_side(B, H, T, D, 0, gen), k = side_by_side(B, H, T, D, 0, gen);
  // scores q k^T (B^T), then their product with k (plain) and their transpose's (A^T), each
  // accumulating into C
  auto attention = [&](std::vector<float>& out) {
    std::vector<float> scores(B * H * T * T);
    const blas::Strided<const float> qs{q.data.data(), q.ld, q.batch_stride, q.head_stride},
        ks{k.data.data(), k.ld, k.batch_stride, k.head_stride}, ss{scores.data(), T, H * T * T, T * T};
    blas::sgemm_batched(false, true, B, H, T, T, D, 0.25f, qs, ks, 0.f, {scores.data(), T, H * T * T, T * T});
    out.assign(B * T * H * D, 0.5f);
    const blas::Strided<float> os{out.data(), H * D, T * H * D, D};
    blas::sgemm_batched(false, false, B, H, T, D, T, 1.f, ss, ks, 1.f, os);
    blas::sgemm_batched(true, false, B, H, T, D, T, 1.f, ss, qs, 1.f, os);
  };
  const std::size_t before = blas::detail::small_kernel_products();
  std::vector<float> one, two;
  set_num_threads(1);
  attention(one);
  REQUIRE(blas::detail::small_kernel_products() - before == 3 * B * H);
  set_num_threads(2);
  attention(two);
  set_num_threads(1);
  CHECK(two == one);
  // two threads calling at once, each with its own copy of op(B)
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> mine;
      for (int rep = 0; rep < 50; ++rep) {
        attention(mine);
        if (mine != one) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches[0] == 0);
  CHECK(mismatches[1] == 0);
}

TEST_CASE("auto sends tall plain products with C at most 256 wide to the small-product kernel, in column blocks",
          "[gemm][engines][long]") {
  // {m, n, k, ta, tb, pad, alpha, beta}; beta 0 runs over a C of NaN
  const std::vector<Product> taken = {
      {1024, 64, 64, false, true, 0, 1.f, 0.f},      {1024, 64, 64, false, false, 0, 1.f, 0.f},
      {1500, 256, 37, false, true, 3, 0.5f, 0.f},    {1500, 256, 37, false, false, 3, 0.5f, 0.7f},
      {1025, 65, 1, false, true, 1, -1.f, 1.f},      {1024, 1, 1024, false, false, 2, 1.f, 0.f},
      {2048, 200, 256, false, true, 0, 0.25f, 0.5f}, {1031, 129, 70, false, false, 5, 1.f, 0.f}};
  const std::vector<Product> not_taken = {{1023, 64, 64, false, true, 0, 1.f, 0.f},     // too short
                                          {1024, 257, 64, false, true, 0, 1.f, 0.f},    // too wide
                                          {1024, 64, 1025, false, false, 0, 1.f, 0.f},  // K too long
                                          {1024, 64, 64, true, false, 0, 1.f, 0.f}};    // A^T
  // each row of C depends only on its row of A: taken[6] gives the same bits on one thread and two
  check_kernel_rule(taken, not_taken, taken[2], taken[6], blas::detail::small_kernel_plain_calls);
}

TEST_CASE("auto sends products A B^T of one to four rows to the few-rows kernel, on one thread or two",
          "[gemm][engines]") {
  // {m, n, k, ta, tb, pad, alpha, beta}; beta 0 runs over a C of NaN. K below, at and past 16
  // (the kernel's vector) and N past a multiple of 4 (its block of B's rows).
  const std::vector<Product> taken = {
      {1, 1, 1, false, true, 0, 1.f, 0.f},        {1, 7, 15, false, true, 2, 0.5f, 0.7f},
      {2, 9, 16, false, true, 0, 1.f, 0.f},       {3, 13, 17, false, true, 1, -1.f, 1.f},
      {4, 384, 384, false, true, 3, 0.25f, 0.f},  {1, 50257, 64, false, true, 0, 1.f, 0.f},
      {4, 1030, 1000, false, true, 0, 1.f, 0.5f}, {1, 5, 0, false, true, 0, 1.f, 0.5f}};
  const std::vector<Product> not_taken = {{5, 64, 64, false, true, 0, 1.f, 0.f},   // five rows
                                          {1, 64, 64, false, false, 0, 1.f, 0.f},  // B not transposed
                                          {64, 1, 64, true, true, 0, 1.f, 0.f}};   // A^T
  // each element of C is one row of B against one row of A: the head-sized taken[5] gives the same
  // bits on one thread and on two (its 50257 columns split between them; so are taken[4]'s 384 and
  // taken[6]'s 1030, each weight at least twice kGrainStream)
  check_kernel_rule(taken, not_taken, taken[4], taken[5], blas::detail::few_rows_products);
}

TEST_CASE("a bf16 product of one to four rows with B held in bf16 runs on the few-rows kernel, on one thread or two",
          "[gemm][engines][bf16]") {
  // As above, with K below, at and past 32 (the bf16 kernel's step).
  const std::vector<Product> taken = {
      {1, 1, 1, false, true, 0, 1.f, 0.f},       {1, 7, 31, false, true, 2, 0.5f, 0.7f},
      {2, 9, 32, false, true, 0, 1.f, 0.f},      {3, 13, 33, false, true, 1, -1.f, 1.f},
      {4, 384, 384, false, true, 3, 0.25f, 0.f}, {1, 50257, 64, false, true, 0, 1.f, 0.f},
      {4, 1030, 1000, false, true, 0, 1.f, 0.5f}};
  const std::vector<Product> not_taken = {{5, 64, 64, false, true, 0, 1.f, 0.f},   // five rows
                                          {1, 64, 64, false, false, 0, 1.f, 0.f},  // B not transposed
                                          {64, 1, 64, true, true, 0, 1.f, 0.f},    // A^T
                                          {1, 5, 0, false, true, 0, 1.f, 0.5f}};   // K 0: beta C, no product
  check_kernel_rule(taken, not_taken, taken[4], taken[5], blas::detail::few_rows_products, Form::bf16_b);
}

TEST_CASE("linear_activation on the small-product kernel's shapes agrees with the reference, each activation",
          "[gemm][engines]") {
  EngineScope scope(blas::Engine::automatic);
  Generator gen(31);
  const std::size_t rows = 1100, in = 48;
  for (std::size_t out : {64, 100, 256}) {
    for (blas::Epilogue act :
         {blas::Epilogue::none, blas::Epilogue::relu, blas::Epilogue::gelu, blas::Epilogue::gelu_tanh}) {
      for (bool with_bias : {true, false}) {
        INFO("out " << out << ", activation " << static_cast<int>(act) << (with_bias ? ", bias" : ", no bias"));
        std::vector<float> x(rows * in), w(out * in), bias(out), y(rows * out, 99.f);
        for (float& v : x) v = gen.uniform(-1.f, 1.f);
        for (float& v : w) v = gen.uniform(-1.f, 1.f);
        for (float& v : bias) v = gen.uniform(-1.f, 1.f);
        const std::size_t before = blas::detail::small_kernel_plain_calls();
        blas::linear_activation(rows, out, in, x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), act);
        CHECK(blas::detail::small_kernel_plain_calls() > before);
        double worst = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t o = 0; o < out; ++o) {
            double z = with_bias ? bias[o] : 0.0, mag = 1;
            for (std::size_t i = 0; i < in; ++i) {
              z += static_cast<double>(x[r * in + i]) * w[o * in + i];
              mag += std::fabs(static_cast<double>(x[r * in + i]) * w[o * in + i]);
            }
            double want = z;
            if (act == blas::Epilogue::relu) want = std::max(z, 0.0);
            if (act == blas::Epilogue::gelu) want = 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
            if (act == blas::Epilogue::gelu_tanh)
              want = 0.5 * z * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
            // the product's rounding, then the activation's (its slope is at most about 1.13)
            const double bound = 1.2 * 4e-7 * (static_cast<double>(in) + 2) * mag + 1e-6 * (std::fabs(want) + 1);
            worst = std::max(worst, std::fabs(y[r * out + o] - want) / bound);
          }
        }
        CHECK(worst <= 1.0);
      }
    }
  }
}

TEST_CASE("beta 0 ignores NaN in C, on the transposed tall product and on batches", "[gemm][engines]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn, blas::Engine::automatic}) {
    if (!blas::has_engine(e)) continue;
    EngineScope scope(e);
    INFO(blas::engine_name(e));
    // A^T B with C twice as tall as wide (oneDNN computes it transposed)
    const std::size_t m = 96, n = 24, k = 40;
    std::vector<float> a(k * m, 0.5f), b(k * n, 0.25f), c(m * n, nan);
    blas::sgemm(true, false, m, n, k, 1.f, a.data(), m, b.data(), n, 0.f, c.data(), n);
    for (float v : c) REQUIRE(v == Approx(0.5f * 0.25f * k));
    // a batch that oneDNN computes in one call
    const std::size_t B = 2, H = 3, T = 32, D = 16;
    std::vector<float> q(B * T * H * D, 0.5f), scores(B * H * T * T, nan);
    blas::sgemm_batched(false, true, B, H, T, T, D, 1.f, {q.data(), H * D, T * H * D, D},
                        {q.data(), H * D, T * H * D, D}, 0.f, {scores.data(), T, H * T * T, T * T});
    for (float v : scores) REQUIRE(v == Approx(0.25f * D));
  }
}

TEST_CASE("a batch whose operand repeats (batch stride 0) is computed right on every engine", "[gemm][engines]") {
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn, blas::Engine::automatic}) {
    if (!blas::has_engine(e)) continue;
    EngineScope scope(e);
    INFO(blas::engine_name(e));
    const std::size_t B = 3, H = 2, M = 32, N = 24, K = 16;
    Generator gen(23);
    std::vector<float> a(M * H * K), b(B * K * H * N), c(B * H * M * N, 0.f);
    for (float& v : a) v = gen.uniform(-1.f, 1.f);
    for (float& v : b) v = gen.uniform(-1.f, 1.f);
    // every entry b uses the same A (batch stride 0)
    blas::sgemm_batched(false, false, B, H, M, N, K, 1.f, {a.data(), H * K, 0, K}, {b.data(), H * N, K * H * N, N}, 0.f,
                        {c.data(), N, H * M * N, M * N});
    for (std::size_t bi = 0; bi < B; ++bi) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < M; ++i) {
          for (std::size_t j = 0; j < N; ++j) {
            double want = 0;
            for (std::size_t l = 0; l < K; ++l)
              want += static_cast<double>(a[i * H * K + h * K + l]) * b[bi * K * H * N + l * H * N + h * N + j];
            REQUIRE(c[bi * H * M * N + h * M * N + i * N + j] == Approx(want).margin(1e-5));
          }
        }
      }
    }
  }
}
