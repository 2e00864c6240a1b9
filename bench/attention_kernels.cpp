// The tiled attention kernel against the full one, in a whole training step (loss, backward) of a
// language model: time per step (the two alternate; medians) and how far each step raises the
// process's peak resident size (the (B, H, T, T) weights and their gradient are what the tiled
// kernel does not keep). Shapes are bench_train_step's, with T stepping up from small's 64 to
// long4k's 4096 at long's widths; nn::kTiledFromKeys, where automatic switches, comes from here.
//     build/bench/bench_attention_kernels [--reps 7] [--threads 1]
#include <malloc.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "peak_memory.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct BenchShape {
  const char* name;
  std::size_t C, H, L, F, T, B;
};

struct Step {
  double ms;
  double peak_mib;
};

// One step; with `measure`, freed pages go back to the system first (malloc_trim) so that the
// peak counts this step's memory (timed steps skip that: it would make them fault pages in).
Step step(nn::LanguageModel& model, const IndexArray& ids, const IndexArray& targets, bool measure = false) {
  if (measure) malloc_trim(0);
  const bool measured = measure && bench::reset_peak();
  const long base = bench::status_kib("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  {
    const Tensor loss = model.loss(ids, targets);
    loss.backward();
  }
  const auto t1 = std::chrono::steady_clock::now();
  model.zero_grad();
  return {std::chrono::duration<double, std::milli>(t1 - t0).count(),
          measured ? (bench::status_kib("VmHWM") - base) / 1024.0 : -1.0};
}

// The attention alone, forward and backward: flash_attention against the full kernel's ops.
double op_ms(bool tiled, const Tensor& q, const Tensor& k, const Tensor& v, std::size_t H, std::size_t tile) {
  FlashAttentionOptions o;
  o.query_tile = o.key_tile = tile;
  const float scale = 1.f / std::sqrt(static_cast<float>(q.shape()[2] / H));
  const auto t0 = std::chrono::steady_clock::now();
  {
    const Tensor out =
        tiled ? flash_attention(q, k, v, H, scale, true, o) : attend(attention_weights(q, k, H, scale, true), v, H);
    sum(out).backward();
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t reps = 7, threads = 1, tile = 128;
  std::string only;
  CLI::App app{"a training step with the tiled attention kernel against the full one", "bench_attention_kernels"};
  app.add_option("--reps", reps, "steps of each")->transform(cli::count(1, 10000))->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")->transform(cli::count(1, 256))->capture_default_str();
  app.add_option("--tile", tile, "the tiled kernel's tile")->transform(cli::count(1, 1024))->capture_default_str();
  app.add_option("--shape", only, "one step shape only (its name; \"none\": the op table alone)");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_attention_kernels", [&] {
    set_num_threads(static_cast<int>(threads));
    const std::vector<BenchShape> shapes = {
        {"small", 256, 4, 4, 1024, 64, 32},   {"standard", 512, 8, 2, 2048, 128, 8},
        {"T 256", 256, 4, 2, 1024, 256, 8},   {"T 512", 256, 4, 2, 1024, 512, 4},
        {"long", 256, 4, 2, 1024, 1024, 2},   {"T 2048", 256, 4, 2, 1024, 2048, 1},
        {"long4k", 256, 4, 2, 1024, 4096, 1},
    };
    std::printf("%d thread(s), tile %zu; the attention op alone (causal, forward and backward), medians of %zu\n",
                num_threads(), tile, reps);
    std::printf("%-22s %10s %10s %8s\n", "B x T (C 256, 4 heads)", "full ms", "tiled ms", "speedup");
    for (const auto& [B, T] :
         std::vector<std::pair<std::size_t, std::size_t>>{{8, 128}, {4, 512}, {2, 1024}, {1, 4096}}) {
      Generator g(1);
      const Tensor q(g.normal({B, T, 256}, 0.f, 1.f), true), k(g.normal({B, T, 256}, 0.f, 1.f), true),
          v(g.normal({B, T, 256}, 0.f, 1.f), true);
      std::vector<double> tf, tt;
      op_ms(false, q, k, v, 4, tile), op_ms(true, q, k, v, 4, tile);
      for (std::size_t r = 0; r < reps; ++r) {
        tf.push_back(op_ms(false, q, k, v, 4, tile));
        tt.push_back(op_ms(true, q, k, v, 4, tile));
      }
      std::printf("%zu x %-18zu %10.2f %10.2f %7.2fx\n", B, T, median(tf), median(tt), median(tf) / median(tt));
    }
    std::printf("\nmedians of %zu training steps (loss + backward), dropout 0.1\n", reps);
    std::printf("%-10s %10s %10s %8s %12s %12s\n", "shape", "full ms", "tiled ms", "speedup", "full MiB", "tiled MiB");
    for (const BenchShape& s : shapes) {
      if (!only.empty() && only != s.name) continue;
      const std::size_t V = 256;
      auto options = [&](nn::AttentionKernel k) {
        return nn::LanguageModelOptions(V, s.C, s.H, s.L)
            .d_ff(s.F)
            .max_len(s.T)
            .dropout(0.1f)
            .attention_kernel(k)
            .attention_tile(tile);
      };
      Generator g1(0), g2(0);
      nn::LanguageModel full(options(nn::AttentionKernel::full), g1);
      nn::LanguageModel tiled(options(nn::AttentionKernel::tiled), g2);
      IndexArray ids = IndexArray::from_shape({s.B, s.T}), targets = IndexArray::from_shape({s.B, s.T});
      for (std::size_t i = 0; i < ids.size(); ++i) {
        ids.data()[i] = static_cast<std::int64_t>((i * 37) % V);
        targets.data()[i] = static_cast<std::int64_t>((i * 37 + 11) % V);
      }
      step(full, ids, targets);  // warm-up: first-touch pages, engine primitives
      step(tiled, ids, targets);
      std::vector<double> tf, tt;
      for (std::size_t r = 0; r < reps; ++r) {
        tf.push_back(step(full, ids, targets).ms);
        tt.push_back(step(tiled, ids, targets).ms);
      }
      const double mf = step(full, ids, targets, true).peak_mib, mt = step(tiled, ids, targets, true).peak_mib;
      std::printf("%-10s %10.1f %10.1f %7.2fx %12.1f %12.1f\n", s.name, median(tf), median(tt), median(tf) / median(tt),
                  mf, mt);
      std::fflush(stdout);
    }
  });
}
