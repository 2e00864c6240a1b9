// Fused products against the ops they replace, each op alone (forward and backward, the variants
// alternating, medians), on the benchmark configurations' shapes (bench_train_step's small,
// standard and long: rows = B T):
//   1. linear_activation(x, W, b, act) against act(linear(x, W, b)), and with the feed-forward
//      layer's dropout 0.1 after it (the unfused FFN's GELU is gelu_dropout, one op);
//      and the forward alone (evaluation: no grad, the GELU fused in the product too);
//   2. self-attention's q, k and v as one (3C x C) product on the packed [W_q; W_k; W_v] (packed
//      in the step, as training must: the weights change every step) and split, against three;
//   3. the head and loss, linear_cross_entropy against cross_entropy(linear), on small's,
//      standard's and gpt2_124m's (tied, no bias) shapes: time and the memory each adds at its peak.
//     build/bench/bench_fused_products [--reps 21] [--threads 1]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "peak_memory.hpp"
#include "xgrad/core/autograd/detail/linear_activation.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct BenchShape {
  const char* name;
  std::size_t rows, in, out;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;

// Milliseconds of f() (forward and backward).
double time_ms(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Medians of `reps` alternating runs of each variant, after one warm-up run of each.
std::vector<double> alternate(const std::vector<std::function<void()>>& variants, std::size_t reps) {
  for (const auto& f : variants) f();
  std::vector<std::vector<double>> t(variants.size());
  for (std::size_t r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < variants.size(); ++i) t[i].push_back(time_ms(variants[i]));
  }
  std::vector<double> m;
  for (auto& v : t) m.push_back(median(v));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t reps = 21, threads = 1;
  CLI::App app{"fused linear + activation, packed q/k/v products and the fused head and loss against the unfused ops",
               "bench_fused_products"};
  app.add_option("--reps", reps, "runs of each variant")->transform(cli::count(1, 10000))->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")->transform(cli::count(1, 256))->capture_default_str();
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_fused_products", [&] {
    set_num_threads(static_cast<int>(threads));
    const std::vector<BenchShape> shapes = {
        {"small", 32 * 64, 256, 1024}, {"standard", 8 * 128, 512, 2048}, {"long", 2 * 1024, 256, 1024}};
    std::printf("%d thread(s), GEMM engine %s; forward + backward of one op, ms, medians of %zu alternating runs\n",
                num_threads(), blas::engine_name(blas::engine()).c_str(), reps);
    std::printf("\nlinear_activation against act(linear); ffn: with dropout 0.1 after it (training)\n");
    std::printf("%-9s %-20s %-10s %9s %9s %8s %12s %9s %9s %9s %9s\n", "shape", "rows x in -> out", "act", "unfused",
                "fused", "speedup", "gelu recomp", "ffn unf.", "ffn fus.", "fwd unf.", "fwd fus.");
    for (const BenchShape& s : shapes) {
      Generator g(1);
      const Tensor x(g.normal({s.rows, s.in}, 0.f, 1.f), true);
      const Tensor w(g.uniform({s.out, s.in}, -0.05f, 0.05f), true), b(g.uniform({s.out}, -0.05f, 0.05f), true);
      const Array seed = g.normal({s.rows, s.out}, 0.f, 1.f);
      Generator drop(2);
      for (const LinearActivation a : {LinearActivation::relu, LinearActivation::gelu, LinearActivation::gelu_tanh}) {
        auto unfused = [&](const Tensor& z) {
          return a == LinearActivation::relu   ? relu(z)
                 : a == LinearActivation::gelu ? gelu(z)
                                               : gelu(z, GeluApprox::tanh);
        };
        const std::vector<std::function<void()>> variants = {
            [&] { unfused(linear(x, w, b)).backward(seed); },
            [&] { linear_activation(x, w, b, a).backward(seed); },
            [&] { detail::linear_activation(x, w, b, a, detail::GeluKeeps::recompute).backward(seed); },
            [&] {
          const Tensor z = linear(x, w, b);
          (a == LinearActivation::gelu ? gelu_dropout(z, 0.1f, true, drop) : dropout(unfused(z), 0.1f, true, drop))
              .backward(seed);
            },
            [&] { dropout(linear_activation(x, w, b, a), 0.1f, true, drop).backward(seed); },
            [&] {
          const NoGradGuard off;
          unfused(linear(x, w, b));
        },
                                                 [&] {
          const NoGradGuard off;
          linear_activation(x, w, b, a);
        },
            };
        const std::vector<double> m = alternate(variants, reps);
        const char* name = a == LinearActivation::relu ? "relu" : a == LinearActivation::gelu ? "gelu" : "gelu_tanh";
        char dims[64];
        std::snprintf(dims, sizeof dims, "%zu x %zu -> %zu", s.rows, s.in, s.out);
        char recompute[32] = "-";
        if (a != LinearActivation::relu) std::snprintf(recompute, sizeof recompute, "%.2f", m[2]);
        std::printf("%-9s %-20s %-10s %9.2f %9.2f %7.2fx %12s %9.2f %9.2f %9.2f %9.2f\n", s.name, dims, name, m[0],
                    m[1], m[0] / m[1], recompute, m[3], m[4], m[5], m[6]);
        std::fflush(stdout);
      }
    }
    std::printf("\nq, k, v of self-attention: three (C x C) products against one packed (3C x C) product and split\n");
    std::printf("%-9s %-16s %10s %10s %8s %12s %12s %8s\n", "shape", "rows x C", "three ms", "packed ms", "speedup",
                "fwd three", "fwd packed", "speedup");
    for (const BenchShape& s : shapes) {
      const std::size_t C = s.in;
      Generator g(3);
      const Tensor x(g.normal({s.rows, C}, 0.f, 1.f), true);
      std::vector<Tensor> ws, bs;
      for (int i = 0; i < 3; ++i) {
        ws.emplace_back(g.uniform({C, C}, -0.05f, 0.05f), true);
        bs.emplace_back(g.uniform({C}, -0.05f, 0.05f), true);
      }
      const Array seed = g.normal({s.rows, C}, 0.f, 1.f);
      // the same use of q, k and v downstream in both (their sum), so that backward reaches each
      auto three = [&] { return add(add(linear(x, ws[0], bs[0]), linear(x, ws[1], bs[1])), linear(x, ws[2], bs[2])); };
      auto packed_with = [&](const Tensor& w, const Tensor& b) {
        const std::vector<Tensor> qkv = split(linear(x, w, b), {C, C, C}, -1);
        return add(add(qkv[0], qkv[1]), qkv[2]);
      };
      auto packed = [&] { return packed_with(concat(ws, 0), concat(bs, 0)); };
      const std::vector<double> train =
          alternate({[&] { three().backward(seed); }, [&] { packed().backward(seed); }}, reps);
      // Forward alone (evaluation), the packed weight made once beforehand, as between updates.
      Tensor wp, bp;
      {
        const NoGradGuard off;
        wp = concat(ws, 0);
        bp = concat(bs, 0);
      }
      const std::vector<double> eval = alternate({[&] {
        const NoGradGuard off;
        three();
                                                  },
                                                  [&] {
        const NoGradGuard off;
        packed_with(wp, bp);
      }},
                                reps);
      char dims[64];
      std::snprintf(dims, sizeof dims, "%zu x %zu", s.rows, C);
      std::printf("%-9s %-16s %10.2f %10.2f %7.2fx %12.2f %12.2f %7.2fx\n", s.name, dims, train[0], train[1],
                  train[0] / train[1], eval[0], eval[1], eval[0] / eval[1]);
      std::fflush(stdout);
    }
    std::printf("\nthe head and loss: linear_cross_entropy against cross_entropy(linear), forward + backward\n");
    std::printf("%-9s %-22s %10s %10s %8s %12s %12s\n", "shape", "rows x C -> V", "unfused ms", "fused ms", "speedup",
                "unfused MiB", "fused MiB");
    const std::vector<BenchShape> heads = {
        {"small", 32 * 64, 256, 256}, {"standard", 8 * 128, 512, 512}, {"gpt2_124m", 4 * 256, 768, 50257}};
    for (const BenchShape& s : heads) {
      Generator g(4);
      Tensor x(g.normal({s.rows, s.in}, 0.f, 1.f), true);
      Tensor w(g.normal({s.out, s.in}, 0.f, 0.02f), true);
      Tensor b = s.out == 50257 ? Tensor() : Tensor(g.uniform({s.out}, -0.05f, 0.05f), true);
      IndexArray targets = IndexArray::from_shape({s.rows});
      for (std::size_t r = 0; r < s.rows; ++r) targets(r) = static_cast<std::int64_t>(g.below(s.out));
      const std::vector<std::function<void()>> variants = {[&] { cross_entropy(linear(x, w, b), targets).backward(); },
                                                           [&] { linear_cross_entropy(x, w, b, targets).backward(); }};
      const std::vector<double> m = alternate(variants, reps);
      // The resident peak each adds over what is resident before it (the gradients' buffers included).
      double mib[2];
      for (int i = 0; i < 2; ++i) {
        x.zero_grad(), w.zero_grad();
        if (b.defined()) b.zero_grad();
        malloc_trim(0);  // freed memory back to the system: only what this variant allocates counts
        const long before = bench::status_kib("VmRSS");
        bench::reset_peak();
        variants[i]();
        mib[i] = static_cast<double>(bench::status_kib("VmHWM") - before) / 1024.0;
      }
      char dims[64];
      std::snprintf(dims, sizeof dims, "%zu x %zu -> %zu", s.rows, s.in, s.out);
      std::printf("%-9s %-22s %10.2f %10.2f %7.2fx %12.1f %12.1f\n", s.name, dims, m[0], m[1], m[0] / m[1], mib[0],
                  mib[1]);
      std::fflush(stdout);
    }
  });
}
