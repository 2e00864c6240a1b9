// Times one full training step of the language model (forward, cross-entropy, backward, AdamW
// update) for the benchmark configurations, and the machine's measured GEMM peak through the
// same OpenBLAS, and prints one JSON line per configuration.
// Shapes: B batch, T length, C d_model, H heads, F FFN width, V vocabulary, L layers.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct BenchConfig {
  std::string name;
  std::size_t vocab, d_model, heads, layers, ffn, seq_len, batch;
};

const std::vector<BenchConfig> kConfigs = {
    {"tiny", 16, 64, 4, 2, 256, 32, 64},
    {"small", 256, 256, 4, 4, 1024, 64, 32},
    {"standard", 512, 512, 8, 2, 2048, 128, 8},
};

// Matmul FLOPs of one step: forward (per layer: Q, K, V, O projections 4 * 2BTC^2, scores and
// weighted sum 2 * 2BT^2C, FFN 2 * 2BTCF; head 2BTCV), times 3 for forward and backward.
double step_flops(const BenchConfig& c) {
  const double B = c.batch, T = c.seq_len, C = c.d_model, F = c.ffn, V = c.vocab;
  const double layer = 4 * 2 * B * T * C * C + 2 * 2 * B * T * T * C + 2 * 2 * B * T * C * F;
  return 3 * (c.layers * layer + 2 * B * T * C * V);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;

// The best GFLOP/s of a square sgemm of size n through OpenBLAS, over a few repetitions.
double gemm_peak(std::size_t n) {
  Generator gen(1);
  const Array a = gen.uniform({n, n}, -1.f, 1.f), b = gen.uniform({n, n}, -1.f, 1.f);
  Array c = xt::zeros<float>({n, n});
  double best = 0;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    blas::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

nlohmann::json run(const BenchConfig& c, int threads, std::size_t steps, std::size_t warmup) {
  Generator init(0), data(1);
  manual_seed(2);
  nn::LanguageModel model(nn::LanguageModelOptions(c.vocab, c.d_model, c.heads, c.layers)
                              .d_ff(c.ffn)
                              .max_len(c.seq_len)
                              .dropout(0.1f)
                              .norm(nn::Norm::pre)
                              .activation(nn::Activation::gelu),
                          init);
  model.train();
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(1e-3f).weight_decay(0.01f));
  std::vector<double> times;
  float first_loss = 0, last_loss = 0;
  for (std::size_t step = 0; step < warmup + steps; ++step) {
    // A fresh random batch, made outside the timed region: ids (B, T), next-token targets.
    IndexArray ids = IndexArray::from_shape({c.batch, c.seq_len}), targets = IndexArray::from_shape({c.batch, c.seq_len});
    std::vector<std::int64_t> row(c.seq_len + 1);
    for (std::size_t b = 0; b < c.batch; ++b) {
      for (auto& t : row) t = static_cast<std::int64_t>(data.below(c.vocab));
      for (std::size_t t = 0; t < c.seq_len; ++t) {
        ids(b, t) = row[t];
        targets(b, t) = row[t + 1];
      }
    }
    const auto t0 = Clock::now();
    const Tensor loss = model.loss(ids, targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step >= warmup) times.push_back(s);
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
  }
  const double sec = median(times);
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double gflops = step_flops(c) / sec / 1e9;
  const double peak = gemm_peak(512);
  return {{"impl", "xgrad"},
          {"config", c.name},
          {"threads", threads},
          {"ms_per_step", sec * 1e3},
          {"tokens_per_s", static_cast<double>(c.batch * c.seq_len) / sec},
          {"peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0},
          {"gflops", gflops},
          {"gemm_peak_gflops", peak},
          {"peak_fraction", gflops / peak},
          {"first_loss", first_loss},
          {"last_loss", last_loss}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad train-step benchmark: one JSON line per configuration.", "bench_train_step"};
  std::string config = "tiny";
  int threads = 1;
  std::size_t steps = 20, warmup = 3;
  app.add_option("--config", config, "tiny, small or standard")->check(CLI::IsMember({"tiny", "small", "standard"}))->capture_default_str();
  app.add_option("--threads", threads, "threads for OpenBLAS and the kernels")->transform(cli::count(1, 256))->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->transform(cli::count(1, 1000000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->transform(cli::count(0, 1000000))->capture_default_str();
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_train_step", [&] {
    set_num_threads(threads);
    for (const BenchConfig& c : kConfigs) {
      if (c.name == config) std::printf("%s\n", run(c, threads, steps, warmup).dump().c_str());
    }
  });
}
