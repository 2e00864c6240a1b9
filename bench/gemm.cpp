// GFLOP/s of one product through each GEMM engine behind blas::sgemm, on the calling thread
// (xgrad's pool at one thread), for the product shapes of the train-step benchmark and a few
// small ones, and under `auto` (which may run xgrad's small-product kernel instead). Engines
// alternate within each shape and the table quotes medians; this is the measurement behind
// blas.cpp's rule for `auto`. A second table times attention's per-head
// products of each benchmark configuration as one blas::sgemm_batched call (with oneDNN forced,
// and under `auto`) against a loop of blas::sgemm, the measurement behind blas.cpp's rules for
// batches. A third
// table times bf16 products (blas::gemm at Precision::bf16) against fp32 ones: oneDNN's bf16 matmul alone on
// bf16 operands, blas::gemm from fp32 operands (rounding included) on each path, the measurement
// behind blas_bf16.cpp's rule for small products (--bf16-only prints this table alone). A fourth
// table gives decode's matrix-vector products in GB/s against the read bandwidth measured in the
// same run (--matvec-only prints it alone).
//     build/bench/bench_gemm [--reps 15] [--bf16-only] [--matvec-only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "read_bandwidth.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct Product {
  std::size_t m, n, k;
  bool ta, tb;
};

// M x N x K, transposes; the comment names where the benchmark's step meets it.
// clang-format off
const std::vector<Product> kShapes = {
    {2048, 64, 64, false, true},     // tiny: Q/K/V/O projections (B T, C, C)
    {2048, 256, 64, false, true},    // tiny: FFN up
    {64, 256, 2048, true, false},    // tiny: FFN weight gradient
    {32, 32, 16, false, true},       // tiny: one head's scores (T, T, D)
    {32, 16, 32, false, false},      // tiny: one head's weighted sum
    {2048, 192, 64, false, true},
    {2048, 1024, 256, false, true},  // small: FFN up
    {1024, 256, 2048, true, false},
    {64, 64, 64, false, true},       // small: one head's scores
    {512, 512, 512, false, false},
    {1024, 2048, 512, false, true},  // standard: FFN up
    {128, 128, 64, false, true},     // standard: one head's scores
    {1024, 512, 512, false, false},  // standard: a projection's input gradient (B T, C, C)
    {512, 512, 1024, true, false},   // standard: a projection's weight gradient (C, C, B T)
    {2048, 512, 1024, true, false},  // standard: FFN up's weight gradient
    {512, 2048, 1024, true, false},  // standard: FFN down's weight gradient
    {1024, 512, 2048, false, false}, // standard: FFN up's input gradient
    {256, 256, 2048, true, false},   // small: a projection's weight gradient
    {1024, 1024, 64, false, true},   // long: one head's scores (T 1024)
    {1024, 64, 1024, false, false},  // long: one head's weighted sum
    {16, 16, 16, false, false},
    {24, 24, 24, false, false},
    {32, 32, 32, false, false},
};
// clang-format on

double seconds_of(const Product& s, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c) {
  // Repeat small products so one timing covers at least ~0.2 ms.
  const std::size_t calls = std::max<std::size_t>(1, (1u << 18) / (s.m * s.n * s.k / 64 + 1));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < calls; ++i)
    blas::sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), s.ta ? s.m : s.k, b.data(), s.tb ? s.k : s.n, 0.f, c.data(),
                s.n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(calls);
}

// Attention's per-head products for one batch: B entries, H heads of width D, length T (keys S =
// T); q, k, v and the output are (B, T, H D), the scores (B, H, T, T).
struct HeadBatch {
  const char* what;
  std::size_t B, H, T, D;
};

const std::vector<HeadBatch> kHeadBatches = {
    {"tiny", 64, 4, 32, 16}, {"small", 32, 4, 64, 64}, {"standard", 8, 8, 128, 64}, {"long", 2, 4, 1024, 64}};

// Three of attention's product forms: scores q k^T (NT), weighted sum P v (NN), and the gradient
// P^T dO (TN; dZ^T q has the same shape).
struct HeadForm {
  const char* name;
  bool ta, tb;
};
const HeadForm kHeadForms[] = {{"scores (NT)", false, true}, {"P v (NN)", false, false}, {"P^T dO (TN)", true, false}};

// How one batch of heads runs: a loop of sgemm, one sgemm_batched call, or one gemm_batched (bf16)
// call on operands already in bf16 (as attention's are under a bf16 guard).
enum class HeadRun { loop, batched, batched_bf16 };

// Seconds of one batch of form f run as `run`; x16 and scores16 are x and scores in bf16.
double head_seconds(const HeadBatch& h, const HeadForm& f, HeadRun run, const std::vector<float>& x,
                    const std::vector<float>& scores, const std::vector<std::uint16_t>& x16,
                    const std::vector<std::uint16_t>& scores16, std::vector<float>& out) {
  const std::size_t C = h.H * h.D, TT = h.T * h.T;
  // NT: (T x D) (T x D)^T -> T x T;  NN: (T x T) (T x D) -> T x D;  TN: (T x T)^T (T x D) -> T x D
  const bool to_scores = f.tb;
  const std::size_t m = h.T, n = to_scores ? h.T : h.D, k = to_scores ? h.D : h.T;
  const blas::Strided<const float> heads{x.data(), C, h.T * C, h.D}, blocks{scores.data(), h.T, h.H * TT, TT};
  const blas::Strided<const float> a = to_scores ? heads : blocks;
  const blas::Strided<const std::uint16_t> heads16{x16.data(), C, h.T * C, h.D},
      blocks16{scores16.data(), h.T, h.H * TT, TT};
  const blas::Strided<float> c = to_scores ? blas::Strided<float>{out.data(), h.T, h.H * TT, TT}
                                           : blas::Strided<float>{out.data(), C, h.T * C, h.D};
  const auto t0 = std::chrono::steady_clock::now();
  if (run == HeadRun::batched) {
    blas::sgemm_batched(f.ta, f.tb, h.B, h.H, m, n, k, 1.f, a, heads, 0.f, c);
  } else if (run == HeadRun::batched_bf16) {
    const blas::Strided<const std::uint16_t> a16 = to_scores ? heads16 : blocks16;
    blas::gemm_batched(Precision::bf16, f.ta, f.tb, h.B, h.H, m, n, k, 1.f,
                       {a16.data, a16.ld, a16.batch_stride, a16.head_stride},
                       {heads16.data, heads16.ld, heads16.batch_stride, heads16.head_stride}, 0.f, c);
  } else {
    for (std::size_t b = 0; b < h.B; ++b) {
      for (std::size_t i = 0; i < h.H; ++i) {
        blas::sgemm(f.ta, f.tb, m, n, k, 1.f, a.data + b * a.batch_stride + i * a.head_stride, a.ld,
                    heads.data + b * heads.batch_stride + i * heads.head_stride, heads.ld, 0.f,
                    c.data + b * c.batch_stride + i * c.head_stride, c.ld);
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// bf16 against fp32: the shapes the bf16 rule was measured on (small ones for its threshold) and
// larger products.
// clang-format off
const std::vector<Product> kBf16Shapes = {
    {16, 16, 16, false, false},   {32, 32, 16, false, true},    {32, 32, 32, false, false},
    {64, 64, 32, false, false},   {64, 64, 64, false, false},   {128, 128, 64, false, true},
    {256, 256, 256, false, false}, {2048, 256, 64, false, true}, {1024, 256, 2048, true, false},
    {2048, 256, 1024, false, false}, {1024, 1024, 1024, false, false}, {1024, 1024, 1024, false, true},
    {1024, 1024, 1024, true, false},
};
// clang-format on

// Seconds of one product of `s` by `run` (repeated for small products as in seconds_of).
template <class F>
double seconds_by(const Product& s, F run) {
  const std::size_t calls = std::max<std::size_t>(1, (1u << 18) / (s.m * s.n * s.k / 64 + 1));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < calls; ++i) run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(calls);
}

void bf16_table(std::size_t reps, Generator& gen) {
  const bool hardware = blas::bf16_hardware_available();
  std::printf("\nbf16 products, one thread (hardware path %s on this CPU)\n", hardware ? "available" : "not available");
  std::printf("%-22s %9s %11s %11s %11s %7s %7s\n", "M x N x K (op)", "fp32", "oneDNN bf16", "gemm bf16 hw", "emulated",
              "hw/fp32", "gb/fp32");
  const blas::Bf16Path before = blas::bf16_path();
  for (const Product& s : kBf16Shapes) {
    const std::size_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
    for (auto& x : a) x = gen.uniform(-1.f, 1.f);
    for (auto& x : b) x = gen.uniform(-1.f, 1.f);
    std::vector<std::uint16_t> a16(a.size()), b16(b.size());
    blas::to_bf16(a.data(), a.size(), a16.data());
    blas::to_bf16(b.data(), b.size(), b16.data());
    std::vector<double> t32, tdirect, thw, temu;
    for (std::size_t r = 0; r < reps + 2; ++r) {
      const double f = seconds_by(
          s, [&] { blas::sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), s.n); });
      double d = 0, h = 0;
#ifdef XGRAD_BENCH_HAS_ONEDNN
      if (hardware) {
        // oneDNN's bf16 matmul on bf16 operands, whatever the size (no rule, no rounding)
        d = seconds_by(s, [&] {
          blas::detail::onednn_gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.f, a16.data(), lda, b16.data(), ldb, 0.f,
                                         c.data(), s.n);
        });
        blas::set_bf16_path(blas::Bf16Path::hardware);
        h = seconds_by(s, [&] {
          blas::gemm(Precision::bf16, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), s.n);
        });
      }
#endif
      blas::set_bf16_path(blas::Bf16Path::emulated);
      const double e = seconds_by(s, [&] {
        blas::gemm(Precision::bf16, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), s.n);
      });
      if (r >= 2) t32.push_back(f), tdirect.push_back(d), thw.push_back(h), temu.push_back(e);
    }
    const double flop = 2.0 * s.m * s.n * s.k;
    const auto rate = [&](const std::vector<double>& t) { return median(t) > 0 ? flop / median(t) / 1e9 : 0.0; };
    const double g32 = rate(t32), gd = rate(tdirect), gh = rate(thw), ge = rate(temu);
    char name[64];
    std::snprintf(name, sizeof name, "%zu x %zu x %zu (%c%c)", s.m, s.n, s.k, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N');
    std::printf("%-22s %9.1f %11.1f %11.1f %11.1f %6.2fx %6.2fx\n", name, g32, gd, gh, ge, gd / g32, gh / g32);
  }
  blas::set_bf16_path(before);
}

// Decode's products: a Linear layer on 1 to 4 positions, X (m x K) W^T with W (N x K), for the
// 45M-parameter Llama of the llama.cpp comparison (d_model 384, FFN 1024, vocabulary 50257).
// clang-format off
const std::vector<Product> kMatvecShapes = {
    {1, 384, 384, false, true},     // a projection
    {1, 1024, 384, false, true},    // FFN gate or up
    {1, 384, 1024, false, true},    // FFN down
    {1, 50257, 384, false, true},   // the head
    {4, 50257, 384, false, true},   // the head, four rows
};
// clang-format on

// GB/s of the weight read by each engine and under auto (xgrad's few-rows kernel), against the read
// bandwidth measured in the same rounds (alternating, medians); then the same weight held in bf16
// (blas::gemm in bf16 with a bf16 B, as a model's weights under Precision::bf16): oneDNN's bf16 matmul
// (engine forced) and auto, in GB/s of the bf16 bytes, and auto's speed-up over its fp32 product.
void matvec_table(std::size_t reps, Generator& gen) {
  std::printf(
      "\nDecode's products X W^T (m x N x K), weight read in GB/s, one thread; read: a sum over the "
      "weight's bytes\n");
  std::printf("%-22s %9s %9s %9s %9s %11s\n", "m x N x K", "OpenBLAS", "oneDNN", "auto", "read", "auto/read");
  struct Row {
    double rate[6];
  };
  std::vector<Row> rows;
  volatile float sink = 0.f;
  const blas::Bf16Path path = blas::bf16_path();
  for (const Product& s : kMatvecShapes) {
    std::vector<float> a(s.m * s.k), b(s.n * s.k), c(s.m * s.n);
    for (auto& x : a) x = gen.uniform(-1.f, 1.f);
    for (auto& x : b) x = gen.uniform(-1.f, 1.f);
    std::vector<std::uint16_t> b16(b.size());
    blas::to_bf16(b.data(), b.size(), b16.data());
    // 0 OpenBLAS, 1 oneDNN, 2 auto, 3 read (fp32); 4 bf16 with oneDNN forced, 5 bf16 under auto
    std::vector<double> times[6];
    const blas::Engine engines[] = {blas::Engine::openblas, blas::Engine::onednn, blas::Engine::automatic};
    for (std::size_t r = 0; r < reps + 2; ++r) {
      for (int e = 0; e < 3; ++e) {
        blas::set_engine(engines[e]);
        const double t = seconds_by(
            s, [&] { blas::sgemm(false, true, s.m, s.n, s.k, 1.f, a.data(), s.k, b.data(), s.k, 0.f, c.data(), s.n); });
        if (r >= 2) times[e].push_back(t);
      }
      const double t = seconds_by(s, [&] { sink = sink + bench::read_all(b.data(), b.size()); });
      if (r >= 2) times[3].push_back(t);
      for (int e = 1; e < 3; ++e) {
        blas::set_engine(engines[e]);
        const double t16 = seconds_by(s, [&] {
          blas::gemm(Precision::bf16, false, true, s.m, s.n, s.k, 1.f, a.data(), s.k, b16.data(), s.k, 0.f, c.data(),
                     s.n);
        });
        if (r >= 2) times[3 + e].push_back(t16);
      }
    }
    blas::set_engine(blas::Engine::automatic);
    const double bytes = static_cast<double>(b.size()) * sizeof(float);
    Row row;
    for (int e = 0; e < 6; ++e) row.rate[e] = (e < 4 ? bytes : bytes / 2) / median(times[e]) / 1e9;
    rows.push_back(row);
    char name[64];
    std::snprintf(name, sizeof name, "%zu x %zu x %zu", s.m, s.n, s.k);
    std::printf("%-22s %9.1f %9.1f %9.1f %9.1f %10.0f%%\n", name, row.rate[0], row.rate[1], row.rate[2], row.rate[3],
                100 * row.rate[2] / row.rate[3]);
  }
  std::printf(
      "\nThe same products with W held in bf16 (blas::gemm in bf16, %s path), GB/s of the bf16 bytes; speed-up: "
      "auto's time in fp32 over its time in bf16\n",
      blas::bf16_path_name(path).c_str());
  std::printf("%-22s %9s %9s %11s %9s\n", "m x N x K", "oneDNN", "auto", "auto/read", "speed-up");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Product& s = kMatvecShapes[i];
    const Row& row = rows[i];
    char name[64];
    std::snprintf(name, sizeof name, "%zu x %zu x %zu", s.m, s.n, s.k);
    std::printf("%-22s %9.1f %9.1f %10.0f%% %8.2fx\n", name, row.rate[4], row.rate[5], 100 * row.rate[5] / row.rate[3],
                2 * row.rate[5] / row.rate[2]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "GFLOP/s of OpenBLAS and oneDNN on the benchmark's product shapes, and of attention's heads as one "
      "batched call against a loop, one thread.",
      "bench_gemm"};
  std::size_t reps = 15;
  app.add_option("--reps", reps, "timings per engine and shape")
      ->transform(cli::count(1, 10000))
      ->capture_default_str();
  bool bf16_only = false, matvec_only = false;
  app.add_flag("--bf16-only", bf16_only, "print the bf16 table alone");
  app.add_flag("--matvec-only", matvec_only, "print the table of decode's products alone");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_gemm", [&] {
    set_num_threads(1);
    if (!blas::has_engine(blas::Engine::onednn)) fail("this xgrad was built without oneDNN: nothing to compare");
    const blas::Engine before = blas::engine();
    Generator gen(1);
    if (bf16_only) return bf16_table(reps, gen);
    if (matvec_only) return matvec_table(reps, gen);
    // `auto`: what the default rule runs (an engine, or "small": xgrad's small-product kernel) and
    // its GFLOP/s
    std::printf("%-22s %10s %10s %7s %8s %8s\n", "M x N x K (op)", "OpenBLAS", "oneDNN", "ratio", "auto", "GFLOP/s");
    for (const Product& s : kShapes) {
      std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
      for (auto& x : a) x = gen.uniform(-1.f, 1.f);
      for (auto& x : b) x = gen.uniform(-1.f, 1.f);
      std::vector<double> t_open, t_dnnl, t_auto;
      for (std::size_t r = 0; r < reps + 2; ++r) {
        blas::set_engine(blas::Engine::openblas);
        const double o = seconds_of(s, a, b, c);
        blas::set_engine(blas::Engine::onednn);
        const double d = seconds_of(s, a, b, c);
        blas::set_engine(blas::Engine::automatic);
        const double u = seconds_of(s, a, b, c);
        if (r >= 2) t_open.push_back(o), t_dnnl.push_back(d), t_auto.push_back(u);  // two warm-up rounds
      }
      const double flop = 2.0 * s.m * s.n * s.k;
      const double go = flop / median(t_open) / 1e9, gd = flop / median(t_dnnl) / 1e9, gu = flop / median(t_auto) / 1e9;
      char name[64];
      std::snprintf(name, sizeof name, "%zu x %zu x %zu (%c%c)", s.m, s.n, s.k, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N');
      // `auto`: the engine the rule picks, or "small" for xgrad's small-product kernel
      const std::string chosen = blas::small_kernel_takes_plain(s.ta, s.m, s.n, s.k)
                                     ? "small"
                                     : blas::engine_name(blas::engine_for(s.m, s.n, s.k));
      std::printf("%-22s %10.1f %10.1f %6.2fx %8s %8.1f\n", name, go, gd, gd / go, chosen.c_str(), gu);
    }
    // Attention's heads: the loop of sgemm under auto; one sgemm_batched call with oneDNN forced
    // (its matmul primitive, for products of 2^12 to 2^21 multiply-adds); one sgemm_batched call
    // under auto (the small-product kernel for C at most 64 wide, else as forced), which `ratio`
    // compares with the loop; and one gemm_batched call (bf16 operands: the products under a
    // bf16 guard; "n/a" without the hardware path).
    const bool bf16_hardware = blas::bf16_path() == blas::Bf16Path::hardware;
    const bool onednn = blas::has_engine(blas::Engine::onednn);
    std::printf("\n%-9s %-4s %-16s %-12s %10s %10s %10s %7s %10s %9s\n", "config", "B H", "T x D", "product", "loop",
                "primitive", "batched", "ratio", "bf16", "bf16/fp32");
    blas::set_engine(blas::Engine::automatic);
    for (const HeadBatch& h : kHeadBatches) {
      std::vector<float> x(h.B * h.T * h.H * h.D), scores(h.B * h.H * h.T * h.T), out(scores.size());
      for (auto& v : x) v = gen.uniform(-1.f, 1.f);
      for (auto& v : scores) v = gen.uniform(0.f, 1.f);
      std::vector<std::uint16_t> x16(x.size()), scores16(scores.size());
      blas::to_bf16(x.data(), x.size(), x16.data());
      blas::to_bf16(scores.data(), scores.size(), scores16.data());
      for (const HeadForm& f : kHeadForms) {
        std::vector<double> t_loop, t_primitive, t_batched, t_bf16;
        for (std::size_t r = 0; r < reps + 2; ++r) {
          double p = 0;
          if (onednn) {
            blas::set_engine(blas::Engine::onednn);
            p = head_seconds(h, f, HeadRun::batched, x, scores, x16, scores16, out);
            blas::set_engine(blas::Engine::automatic);
          }
          const double l = head_seconds(h, f, HeadRun::loop, x, scores, x16, scores16, out),
                       b = head_seconds(h, f, HeadRun::batched, x, scores, x16, scores16, out),
                       b16 = bf16_hardware ? head_seconds(h, f, HeadRun::batched_bf16, x, scores, x16, scores16, out)
                                           : 0.0;
          if (r >= 2) t_loop.push_back(l), t_primitive.push_back(p), t_batched.push_back(b), t_bf16.push_back(b16);
        }
        const double flop = 2.0 * h.B * h.H * h.T * h.T * h.D;
        const double gl = flop / median(t_loop) / 1e9, gb = flop / median(t_batched) / 1e9;
        char bh[32], td[32], g16[32], r16[32], gp[32];
        if (onednn) {
          std::snprintf(gp, sizeof gp, "%.1f", flop / median(t_primitive) / 1e9);
        } else {
          std::snprintf(gp, sizeof gp, "n/a");
        }
        std::snprintf(bh, sizeof bh, "%zu %zu", h.B, h.H);
        std::snprintf(td, sizeof td, "%zu x %zu", h.T, h.D);
        if (bf16_hardware) {
          const double gh = flop / median(t_bf16) / 1e9;
          std::snprintf(g16, sizeof g16, "%.1f", gh);
          std::snprintf(r16, sizeof r16, "%.2fx", gh / gb);
        } else {
          std::snprintf(g16, sizeof g16, "n/a");
          std::snprintf(r16, sizeof r16, "n/a");
        }
        std::printf("%-9s %-4s %-16s %-12s %10.1f %10s %10.1f %6.2fx %10s %9s\n", h.what, bh, td, f.name, gl, gp, gb,
                    gb / gl, g16, r16);
      }
    }
    blas::set_engine(before);
    bf16_table(reps, gen);
    matvec_table(reps, gen);
    blas::set_engine(before);
  });
}
