// Tokens per second of LanguageModel::generate with the key/value cache against without it, for
// the default train_lm model (weights as initialized: speed does not depend on training), a
// prompt of --prompt tokens and --tokens new ones, greedy. The two runs alternate and the table
// quotes medians; both should give the same tokens, and the benchmark says if they did not.
// With --batch B > 1 it also times generate_batch of B prompts (of --prompt / 2 to --prompt
// tokens, left-padded) against generate on each prompt in turn, and checks their tokens agree.
// --model DIR runs a Hugging Face folder (weights::load_hf_model) instead of the default model;
// --bf16 times cached generate in fp32 against bf16 (the weights' bf16 copies held), alternating,
// and gives how far the first step's logits and the tokens of the two agree, and decoding's reads
// of the weights in GB/s against the read bandwidth measured in the same rounds on as many threads.
//     build/bench/bench_generate [--tokens 200] [--prompt 32] [--reps 7] [--window-keep 0] [--threads 1]
//                                [--batch 1] [--model DIR] [--bf16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "read_bandwidth.hpp"
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

// The bytes of weights one decoding step reads, with the products' weights in fp32 and in bf16:
// every parameter but the embedding tables, of which a step reads one row (a tied head reads the
// token table whole). Matrices are the products' weights (bf16 copies); the rest stays float32.
struct StepBytes {
  double fp32 = 0, bf16 = 0;
};
StepBytes step_bytes(const nn::LanguageModel& model) {
  StepBytes b;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool table =
        name.rfind("pos_emb.", 0) == 0 || (name == "tok_emb.weight" && !model.options().tie_embeddings());
    if (table) continue;
    const double n = static_cast<double>(p.size());
    b.fp32 += 4 * n;
    b.bf16 += (p.shape().size() == 2 ? 2 : 4) * n;
  }
  return b;
}

// Cached greedy generate in fp32 against bf16, alternating: the prompt (generate of one token) and
// decoding (generate of tokens + 1 less that) in tokens per second (medians), the speed-ups (medians
// of per-run ratios), the new tokens the two share before they first differ, and the largest
// difference of the prompt's next-token logits relative to their largest magnitude. Each round
// also reads a buffer of the fp32 step's bytes on the kernel threads: decoding's weight reads in
// GB/s (step_bytes times tokens/s) against that read bandwidth.
void time_precisions(nn::LanguageModel& model, const std::vector<std::int64_t>& prompt, std::size_t tokens,
                     std::size_t reps) {
  const std::size_t held = hold_bf16_copies(model.parameters());
  const StepBytes bytes = step_bytes(model);
  std::vector<float> buffer(static_cast<std::size_t>(bytes.fp32 / 4), 1.f);
  std::vector<double> read_rate;
  volatile float sink = 0.f;
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  greedy.past_max_len = nn::PastMaxLen::error;
  std::vector<double> prompt_rate[2], decode_rate[2], prompt_ratio, decode_ratio;
  std::vector<std::int64_t> out[2];
  const auto seconds = [&](std::size_t count, std::vector<std::int64_t>* kept) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::int64_t> got = model.generate(prompt, count, greedy);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (kept) *kept = std::move(got);
    return s;
  };
  for (std::size_t r = 0; r < reps + 1; ++r) {  // the first round warms up
    double first[2], decode[2];
    for (int q = 0; q < 2; ++q) {
      const AutocastGuard guard(q == 0 ? Precision::fp32 : Precision::bf16);
      first[q] = seconds(1, nullptr);
      decode[q] = seconds(tokens + 1, &out[q]) - first[q];
      if (r == 0) continue;
      prompt_rate[q].push_back(static_cast<double>(prompt.size()) / first[q]);
      decode_rate[q].push_back(static_cast<double>(tokens) / decode[q]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + bench::read_all_threads(buffer.data(), buffer.size());
    const double read = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) continue;
    read_rate.push_back(bytes.fp32 / read / 1e9);
    prompt_ratio.push_back(first[0] / first[1]);
    decode_ratio.push_back(decode[0] / decode[1]);
  }
  std::size_t same = prompt.size();
  while (same < out[0].size() && same < out[1].size() && out[0][same] == out[1][same]) ++same;
  IndexArray ids = IndexArray::from_shape({1, prompt.size()});
  std::copy(prompt.begin(), prompt.end(), ids.begin());
  Array logits[2];
  for (int q = 0; q < 2; ++q) {
    const NoGradGuard no_grad;
    const AutocastGuard guard(q == 0 ? Precision::fp32 : Precision::bf16);
    nn::LanguageModelCache cache;
    logits[q] = model.forward_cached(ids, cache, nn::Attentions::none).logits.value();
  }
  const double scale = xt::amax(xt::abs(logits[0]))(), worst = xt::amax(xt::abs(logits[1] - logits[0]))();
  std::printf("\nfp32 against bf16 (weights' bf16 copies held: %.0f MiB), greedy, cached; tokens/s, medians\n",
              static_cast<double>(held) / (1 << 20));
  std::printf("%-8s %10s %10s\n", "", "prompt", "decode");
  std::printf("%-8s %10.1f %10.1f\n", "fp32", median(prompt_rate[0]), median(decode_rate[0]));
  std::printf("%-8s %10.1f %10.1f\n", "bf16", median(prompt_rate[1]), median(decode_rate[1]));
  std::printf("%-8s %9.2fx %9.2fx   (medians of per-run ratios)\n", "speed-up", median(prompt_ratio),
              median(decode_ratio));
  const double read = median(read_rate);
  std::printf("decode's weight reads: %.1f MB per token in fp32, %.1f in bf16; read bandwidth %.1f GB/s (%s)\n",
              bytes.fp32 / 1e6, bytes.bf16 / 1e6, read, "a sum over the fp32 bytes, the same threads, medians");
  for (int q = 0; q < 2; ++q) {
    const double rate = (q == 0 ? bytes.fp32 : bytes.bf16) * median(decode_rate[q]) / 1e9;
    std::printf("%-8s %6.1f GB/s, %3.0f%% of the read bandwidth\n", q == 0 ? "fp32" : "bf16", rate, 100 * rate / read);
  }
  std::printf("same new tokens before the first difference: %zu of %zu\n", same - prompt.size(),
              out[0].size() - prompt.size());
  std::printf("prompt's next-token logits: largest |bf16 - fp32| %.3g, %.2g of the largest |logit| %.3g\n", worst,
              worst / scale, scale);
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
  std::string model_dir;
  bool bf16 = false;
  app.add_option("--model", model_dir, "a Hugging Face folder to run instead of the default train_lm model");
  app.add_flag("--bf16", bf16, "time generate in fp32 against bf16 instead of cached against uncached");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_generate", [&] {
    set_num_threads(threads);
    Generator init(0);
    const std::shared_ptr<nn::LanguageModel> loaded =
        model_dir.empty() ? std::make_shared<nn::LanguageModel>(lm::model_options(lm::TrainConfig{}), init)
                          : weights::load_hf_model(model_dir);
    nn::LanguageModel& model = *loaded;
    model.eval();
    const nn::LanguageModelOptions& options = model.options();
    std::vector<std::int64_t> prompt(prompt_len);
    for (std::size_t i = 0; i < prompt_len; ++i)
      prompt[i] = static_cast<std::int64_t>((i * 37 + 11) % options.vocab_size());
    if (bf16) {
      std::printf(
          "model: %s, vocab %zu, d_model %zu, layers %zu; prompt %zu, %zu new tokens, %zu thread(s), %zu runs\n",
          model_dir.empty() ? "train_lm's default" : model_dir.c_str(), options.vocab_size(), options.d_model(),
          options.num_layers(), prompt_len, tokens, threads, reps);
      return time_precisions(model, prompt, tokens, reps);
    }
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
