// Tokens per second of LanguageModel::generate with the key/value cache against without it, for
// the default train_lm model (weights as initialized: speed does not depend on training), a
// prompt of --prompt tokens and --tokens new ones, greedy. The two runs alternate and the table
// quotes medians; both should give the same tokens, and the benchmark says if they did not.
// With --batch B > 1 it also times generate_batch of B prompts (of --prompt / 2 to --prompt
// tokens, left-padded) against generate on each prompt in turn, and checks their tokens agree.
//     build/bench/bench_generate [--tokens 200] [--prompt 32] [--reps 7] [--window-keep 0] [--threads 1]
//                                [--batch 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "trainer.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// generate_batch of `batch` prompts (lengths prompt_len / 2 .. prompt_len) against generate on each
// in turn, alternating, greedy with the cache: tokens per second over all rows, medians. A batch
// does not slide its context, so at most max_len - prompt_len + 1 new tokens.
void time_batch(nn::LanguageModel& model, std::size_t batch, std::size_t prompt_len, std::size_t asked,
                std::size_t reps) {
  const std::size_t V = model.options().vocab_size(), max_len = model.options().max_len();
  if (prompt_len > max_len) xgrad::fail("--prompt ", prompt_len, " is longer than max_len ", max_len);
  const std::size_t tokens = std::min(asked, max_len - prompt_len + 1);
  std::vector<std::vector<std::int64_t>> prompts(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t n = std::max<std::size_t>(1, prompt_len / 2 + (prompt_len - prompt_len / 2) * b / (batch - 1));
    for (std::size_t i = 0; i < n; ++i) prompts[b].push_back(static_cast<std::int64_t>((i * 37 + b * 11 + 5) % V));
  }
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  std::vector<double> together, alone, ratio;
  std::size_t differing = 0;
  for (std::size_t r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<nn::Generation> rows = model.generate_batch(prompts, tokens, greedy);
    const double batched = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    for (std::size_t b = 0; b < batch; ++b) {
      if (model.generate(prompts[b], tokens, greedy) != rows[b].tokens) ++differing;
    }
    const double one_by_one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    together.push_back(static_cast<double>(batch * tokens) / batched);
    alone.push_back(static_cast<double>(batch * tokens) / one_by_one);
    ratio.push_back(one_by_one / batched);
  }
  std::printf("\nbatch of %zu prompts (%zu to %zu tokens), %zu new tokens each, greedy, cached\n", batch,
              prompts.front().size(), prompts.back().size(), tokens);
  std::printf("%-22s %14s\n", "", "tokens/s (median)");
  std::printf("%-22s %14.0f\n", "generate_batch", median(together));
  std::printf("%-22s %14.0f\n", "one prompt at a time", median(alone));
  std::printf("speed-up (median of per-run ratios): %.2fx\n", median(ratio));
  if (differing > 0) std::printf("note: %zu rows gave other tokens in the batch than alone\n", differing);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t tokens = 200, prompt_len = 32, reps = 7, threads = 1, keep = 0, batch = 1;
  CLI::App app{"tokens per second of generate, with and without the key/value cache", "bench_generate"};
  app.add_option("--tokens", tokens, "new tokens per run")->transform(cli::count(1, 100000))->capture_default_str();
  app.add_option("--prompt", prompt_len, "prompt tokens")->transform(cli::count(1, 100000))->capture_default_str();
  app.add_option("--reps", reps, "runs of each")->transform(cli::count(1, 1000))->capture_default_str();
  app.add_option("--window-keep", keep, "GenerateOptions::window_keep (0: max_len / 2)")
      ->transform(cli::count(0, 100000))
      ->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")->transform(cli::count(1, 256))->capture_default_str();
  app.add_option("--batch", batch, "prompts for generate_batch against one at a time (1: not timed)")
      ->transform(cli::count(1, 1024))
      ->capture_default_str();
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_generate", [&] {
    set_num_threads(threads);
    const nn::LanguageModelOptions options = lm::model_options(lm::TrainConfig{});
    Generator init(0);
    nn::LanguageModel model(options, init);
    std::vector<std::int64_t> prompt(prompt_len);
    for (std::size_t i = 0; i < prompt_len; ++i)
      prompt[i] = static_cast<std::int64_t>((i * 37 + 11) % options.vocab_size());
    nn::GenerateOptions cached, uncached;
    cached.temperature = uncached.temperature = 0.f;
    cached.window_keep = uncached.window_keep = keep;
    uncached.use_cache = false;
    std::vector<double> with, without, ratio;
    std::size_t differing = 0;
    for (std::size_t r = 0; r < reps; ++r) {
      std::vector<std::int64_t> out[2];
      double secs[2];
      for (int c = 0; c < 2; ++c) {
        const auto t0 = std::chrono::steady_clock::now();
        out[c] = model.generate(prompt, tokens, c == 0 ? cached : uncached);
        secs[c] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (out[0] != out[1]) ++differing;  // a near tie decided the other way by rounding
      with.push_back(static_cast<double>(tokens) / secs[0]);
      without.push_back(static_cast<double>(tokens) / secs[1]);
      ratio.push_back(secs[1] / secs[0]);
    }
    std::printf(
        "model: vocab %zu, d_model %zu, heads %zu, layers %zu, d_ff %zu, max_len %zu; prompt %zu, %zu new tokens, "
        "greedy, window_keep %zu, %zu thread(s), %zu runs each (alternating)\n",
        options.vocab_size(), options.d_model(), options.num_heads(), options.num_layers(), options.d_ff(),
        options.max_len(), prompt_len, tokens, cached.window_keep, threads, reps);
    std::printf("%-12s %14s\n", "", "tokens/s (median)");
    std::printf("%-12s %14.0f\n", "cached", median(with));
    std::printf("%-12s %14.0f\n", "uncached", median(without));
    std::printf("speed-up (median of per-run ratios): %.1fx\n", median(ratio));
    if (differing > 0)
      std::printf("note: %zu of %zu runs gave different tokens with and without the cache\n", differing, reps);
    if (batch > 1) time_batch(model, batch, prompt_len, tokens, reps);
  });
}
