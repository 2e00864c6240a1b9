// Times one full training step of the language model (forward, cross-entropy, backward, AdamW
// update) for the benchmark configurations, and the machine's GEMM peak (the fastest engine's
// 512^3 sgemm; in bf16, the 512^3 bf16 product's), and prints one JSON line per configuration.
// Under mpirun (when xgrad has distributed/) the global batch is split across the ranks,
// DataParallel averages the gradients, and rank 0 reports the global tokens/s, the time a step
// waits for the reductions and the bytes each rank reduces per step.
// The classic configurations train GELU models with learned positions and LayerNorm; the llama_
// ones the same sizes as Llama-style models (RMSNorm, RoPE, SwiGLU, grouped-query attention).
// Shapes: B batch, T length, C d_model, H heads, KV key/value heads, D head size C / H, F FFN
// width, V vocabulary, L layers.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.hpp"
#include "xgrad/xgrad.hpp"
#ifdef XGRAD_HAS_DISTRIBUTED
#include "xgrad/distributed/data_parallel.hpp"
#endif

using namespace xgrad;

namespace {

struct BenchConfig {
  std::string name;
  std::size_t vocab, d_model, heads, layers, ffn, seq_len, batch;
  std::size_t kv_heads = 0;  // 0: a classic model; else a Llama-style one with this many key/value heads
  bool gpt2 = false;         // gpt2_style: tanh GELU, the head tied to the token embedding, GPT-2 init
};

const std::vector<BenchConfig> kConfigs = {
    {"tiny", 16, 64, 4, 2, 256, 32, 64},
    {"small", 256, 256, 4, 4, 1024, 64, 32},
    {"standard", 512, 512, 8, 2, 2048, 128, 8},
    {"long", 256, 256, 4, 2, 1024, 1024, 2},    // attention at length: T^2 scores per head
    {"long4k", 256, 256, 4, 2, 1024, 4096, 1},  // 16M scores per head: memory at length
    // small and standard as Llama-style models; F is llama_style's 8C/3 rounded up to a multiple
    // of 8, so the SwiGLU's three projections have about the parameters of the 4C MLP's two.
    {"llama_small", 256, 256, 4, 4, 688, 64, 32, 2},
    {"llama_standard", 512, 512, 8, 2, 1368, 128, 8, 2},
    // GPT-2 small (124M parameters) as gpt2_style: where the 50257-wide head and its loss weigh
    // about half as much as the blocks.
    {"gpt2_124m", 50257, 768, 12, 12, 3072, 256, 4, 0, true},
};

// Matmul FLOPs of one step: forward (per layer: Q and O projections 2 * 2BTC^2, K and V
// 2 * 2BTC(KV D), scores and weighted sum 2 * 2BT^2C, FFN 2 * 2BTCF, or 3 * 2BTCF gated; head
// 2BTCV), times 3 for forward and backward.
double step_flops(const BenchConfig& c) {
  const double B = c.batch, T = c.seq_len, C = c.d_model, F = c.ffn, V = c.vocab;
  const double kv_width = c.kv_heads ? static_cast<double>(c.kv_heads * (c.d_model / c.heads)) : C;
  const double ffn_products = c.kv_heads ? 3 : 2;
  const double layer =
      2 * 2 * B * T * C * C + 2 * 2 * B * T * C * kv_width + 2 * 2 * B * T * T * C + ffn_products * 2 * B * T * C * F;
  return 3 * (c.layers * layer + 2 * B * T * C * V);
}

// The classic model (Pre-Norm LayerNorm, learned positions, erf GELU, biases, untied head),
// gpt2_style's (the same with tanh GELU, the head tied and GPT-2 init), or
// llama_style's (RMSNorm, RoPE theta 10000, SwiGLU, grouped-query attention, no biases, untied
// head); dropout 0.1 on the attention weights and the FFN's hidden activation in both.
nn::LanguageModelOptions model_options(const BenchConfig& c, nn::AttentionKernel kernel, std::size_t tile) {
  if (c.kv_heads) {
    return nn::LanguageModelOptions::llama_style(c.vocab, c.d_model, c.heads, c.layers, c.kv_heads)
        .d_ff(c.ffn)
        .max_len(c.seq_len)
        .dropout(0.1f)
        .attention_kernel(kernel)
        .attention_tile(tile);
  }
  if (c.gpt2) {
    return nn::LanguageModelOptions::gpt2_style(c.vocab, c.d_model, c.heads, c.layers)
        .d_ff(c.ffn)
        .max_len(c.seq_len)
        .dropout(0.1f)
        .attention_kernel(kernel)
        .attention_tile(tile);
  }
  return nn::LanguageModelOptions(c.vocab, c.d_model, c.heads, c.layers)
      .d_ff(c.ffn)
      .max_len(c.seq_len)
      .dropout(0.1f)
      .norm(nn::Norm::pre)
      .activation(nn::Activation::gelu)
      .attention_kernel(kernel)
      .attention_tile(tile);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;

// The best GFLOP/s of `product` (an n x n x n product), over 50 calls: a busy neighbour can only
// slow a call down, and a low peak would flatter the step's fraction of it.
template <class Product>
double best_gflops(std::size_t n, Product product) {
  double best = 0;
  for (int rep = 0; rep < 50; ++rep) {
    const auto t0 = Clock::now();
    product();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

// The peak of a square sgemm of size n through one engine, at the current thread count
// (blas::sgemm splits it as it splits the step's products).
double gemm_peak(std::size_t n, blas::Engine engine) {
  const blas::Engine before = blas::engine();
  blas::set_engine(engine);
  Generator gen(1);
  const Array a = gen.uniform({n, n}, -1.f, 1.f), b = gen.uniform({n, n}, -1.f, 1.f);
  Array c = xt::zeros<float>({n, n});
  const double best =
      best_gflops(n, [&] { blas::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
  blas::set_engine(before);
  return best;
}

// The peak of a square bf16 product of size n (operands already bf16, accumulated in fp32:
// blas::gemm in bf16 on its current path).
double gemm_bf16_peak(std::size_t n) {
  Generator gen(1);
  const Array a = gen.uniform({n, n}, -1.f, 1.f), b = gen.uniform({n, n}, -1.f, 1.f);
  std::vector<std::uint16_t> a16(n * n), b16(n * n);
  blas::to_bf16(a.data(), a.size(), a16.data());
  blas::to_bf16(b.data(), b.size(), b16.data());
  Array c = xt::zeros<float>({n, n});
  return best_gflops(n, [&] {
    blas::gemm(Precision::bf16, false, false, n, n, n, 1.f, a16.data(), n, b16.data(), n, 0.f, c.data(), n);
  });
}

// How the step is shared: rank `rank` of `ranks` takes rows [rank B / ranks, (rank + 1) B / ranks).
struct Share {
  int rank = 0, ranks = 1;
#ifdef XGRAD_HAS_DISTRIBUTED
  distributed::ProcessGroup* group = nullptr;
#endif
};

nlohmann::json run(const BenchConfig& c, int threads, std::size_t steps, std::size_t warmup, const Share& share,
                   Precision precision, nn::AttentionKernel kernel, std::size_t tile, bool fused_loss) {
  Generator init(0), data(1);
  manual_seed(2);
  nn::LanguageModel model(model_options(c, kernel, tile), init);
  model.train();
  if (c.batch % static_cast<std::size_t>(share.ranks) != 0)
    fail("bench: batch ", c.batch, " does not divide among ", share.ranks, " ranks");
  const std::size_t rows = c.batch / static_cast<std::size_t>(share.ranks),
                    first_row = rows * static_cast<std::size_t>(share.rank);
#ifdef XGRAD_HAS_DISTRIBUTED
  std::unique_ptr<distributed::DataParallel> ddp;
  if (share.group) ddp = std::make_unique<distributed::DataParallel>(model, *share.group);
  std::vector<double> waits, reduces;
#endif
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(1e-3f).weight_decay(0.01f));
  std::vector<double> times;
  float first_loss = 0, last_loss = 0;
  for (std::size_t step = 0; step < warmup + steps; ++step) {
    // A fresh random batch, made outside the timed region: ids (B, T), next-token targets.
    // Every rank draws the whole global batch and keeps its rows.
    IndexArray ids = IndexArray::from_shape({rows, c.seq_len}), targets = IndexArray::from_shape({rows, c.seq_len});
    std::vector<std::int64_t> row(c.seq_len + 1);
    for (std::size_t b = 0; b < c.batch; ++b) {
      for (auto& t : row) t = static_cast<std::int64_t>(data.below(c.vocab));
      if (b < first_row || b >= first_row + rows) continue;
      for (std::size_t t = 0; t < c.seq_len; ++t) {
        ids(b - first_row, t) = row[t];
        targets(b - first_row, t) = row[t + 1];
      }
    }
    const auto t0 = Clock::now();
    AutocastGuard autocast(precision);  // forward, loss and backward; closed before the step
    // model.loss fuses the head and the loss where it can; --loss unfused forms the logits first
    const Tensor loss =
        fused_loss ? model.loss(ids, targets) : cross_entropy(model.forward(ids, nn::Attentions::none).logits, targets);
    opt.zero_grad();
    loss.backward();
    autocast.close();
    opt.step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step >= warmup) times.push_back(s);
#ifdef XGRAD_HAS_DISTRIBUTED
    if (ddp && step >= warmup) {
      waits.push_back(ddp->last_stats().wait_seconds);
      reduces.push_back(ddp->last_stats().reduce_seconds);
    }
#endif
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
  }
  const double sec = median(times);
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double gflops = step_flops(c) / sec / 1e9;
  // "Of peak" is against the fastest engine this build has in the step's precision: in bf16, the
  // bf16 product's peak (the fp32 engines' are reported too).
  nlohmann::json peaks;
  double peak = 0;
  for (blas::Engine e : {blas::Engine::openblas, blas::Engine::onednn}) {
    if (!blas::has_engine(e)) continue;
    const double p = gemm_peak(512, e);
    peaks[blas::engine_name(e)] = p;
    if (precision == Precision::fp32) peak = std::max(peak, p);
  }
  if (precision == Precision::bf16) {
    peak = gemm_bf16_peak(512);
    peaks["bf16"] = peak;
  }
  nlohmann::json out = {{"impl", "xgrad"},
                        {"config", c.name},
                        {"threads", threads},
                        {"ranks", share.ranks},
                        {"parameters", model.num_parameters()},
                        {"ms_per_step", sec * 1e3},
                        {"tokens_per_s", static_cast<double>(c.batch * c.seq_len) / sec},
                        {"peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0},
                        {"gflops", gflops},
                        {"precision", precision_name(precision)},
                        {"gemm_engine", blas::engine_name(blas::engine())},
                        {"gemm_peak_gflops", peak},
                        {"gemm_peak_gflops_by_engine", peaks},
                        {"peak_fraction", gflops / peak},
                        {"first_loss", first_loss},
                        {"last_loss", last_loss}};
#ifdef XGRAD_HAS_DISTRIBUTED
  if (ddp) {
    out["allreduce_wait_ms_per_step"] = median(waits) * 1e3;
    // From the first bucket's start to the end of backward; the rest of it overlapped backward.
    out["allreduce_span_ms_per_step"] = median(reduces) * 1e3;
    out["allreduce_bytes_per_step"] = ddp->last_stats().bytes;
    out["allreduce_buckets"] = ddp->last_stats().buckets;
  }
#endif
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad train-step benchmark: one JSON line per configuration.", "bench_train_step"};
  std::string config = "tiny";
  int threads = 1;
  std::size_t steps = 20, warmup = 3;
  app.add_option("--config", config, "tiny, small, standard, long, long4k, llama_small, llama_standard or gpt2_124m")
      ->check(
          CLI::IsMember({"tiny", "small", "standard", "long", "long4k", "llama_small", "llama_standard", "gpt2_124m"}))
      ->capture_default_str();
  cli::add_threads(app, threads);
  Precision precision = Precision::fp32;
  cli::add_precision(app, precision);
  std::string attention = "automatic";
  app.add_option("--attention", attention, "the attention kernel: automatic, tiled or full")
      ->check(CLI::IsMember({"automatic", "tiled", "full"}))
      ->capture_default_str();
  std::size_t tile = nn::MultiHeadAttentionOptions(1, 1).attention_tile();
  app.add_option("--attention-tile", tile, "the tiled attention kernel's query and key tile")
      ->transform(cli::count(1, 1024))
      ->capture_default_str();
  std::string loss = "fused";
  app.add_option("--loss", loss, "fused (LanguageModel::loss) or unfused (cross_entropy of forward's logits)")
      ->check(CLI::IsMember({"fused", "unfused"}))
      ->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->transform(cli::count(1, 1000000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->transform(cli::count(0, 1000000))->capture_default_str();
  Share share;
  std::function<void(int)> end_job;
#ifdef XGRAD_HAS_DISTRIBUTED
  if (distributed::launched_by_mpi()) {
    // MPI starts before the command line is read: a rank that stops at --help or a usage error
    // then ends the job instead of leaving the others waiting.
    if (const int code = cli::run("bench_train_step", [&] { share.group = &distributed::ProcessGroup::world(); }))
      return code;
    share.rank = share.group->rank();
    share.ranks = share.group->size();
    if (share.ranks > 1) end_job = [&share](int code) { share.group->abort(code); };
  }
#endif
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run(
      "bench_train_step",
      [&] {
    set_num_threads(threads);
    for (const BenchConfig& c : kConfigs) {
      if (c.name != config) continue;
      const nn::AttentionKernel kernel = attention == "tiled"  ? nn::AttentionKernel::tiled
                                         : attention == "full" ? nn::AttentionKernel::full
                                                               : nn::AttentionKernel::automatic;
      nlohmann::json result = run(c, threads, steps, warmup, share, precision, kernel, tile, loss == "fused");
      result["attention"] = attention;
      result["loss"] = loss;
      result["attention_tile"] = tile;
      if (precision == Precision::bf16) result["bf16_path"] = blas::bf16_path_name(blas::bf16_path());
      if (share.rank == 0) std::printf("%s\n", result.dump().c_str());
    }
      },
      end_job);
}
