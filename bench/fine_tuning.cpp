// Fine-tuning's costs on one model, the variants alternated in one run (medians of --repeats):
// a training step (forward, cross-entropy, backward) with and without activation checkpointing,
// its time and its peak memory above the resident size before it, and the AdamW update; and a
// full fine-tune against LoRA on q and v (every layer): trainable parameters, optimizer state,
// step time. The default model is GPT-2 124M's size (12 layers, C 768, 12 heads, F 3072, V 50257,
// tied) at T 1024, B 1. Prints one JSON line per variant.
// Shapes: B batch, T length, C d_model, F FFN width, V vocabulary.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.hpp"
#include "peak_memory.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct Variant {
  std::string name;
  bool checkpoint = false, lora = false;
};

struct Measured {
  double seconds, peak_mib;
};

// One step: gradients from zero, forward and backward, the optimizer's update.
Measured step(nn::LanguageModel& model, optim::AdamW& opt, const IndexArray& ids) {
  opt.zero_grad();
  malloc_trim(0);
  const bool measured = bench::reset_peak();
  const long base = bench::status_kib("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  {
    const Tensor loss = model.loss(ids, ids);
    loss.backward();
  }
  opt.step();
  const auto t1 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(),
          measured ? (bench::status_kib("VmHWM") - base) / 1024.0 : -1.0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fine-tuning's costs: activation checkpointing's memory and time, LoRA's parameters and state."};
  std::size_t layers = 12, d_model = 768, heads = 12, vocab = 50257, seq_len = 1024, batch = 1, repeats = 3, rank = 8;
  int threads = 1;
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--d-model", d_model)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--seq-len", seq_len)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--repeats", repeats, "timed steps of each variant, alternated")->capture_default_str();
  app.add_option("--rank", rank, "the LoRA rank")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return cli::run("bench_fine_tuning", [&] {
    set_num_threads(threads);
    const auto options =
        nn::LanguageModelOptions::gpt2_style(vocab, d_model, heads, layers).max_len(seq_len).dropout(0.f);
    Generator gen(1);
    IndexArray ids = IndexArray::from_shape({batch, seq_len});
    for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>(gen.below(vocab));
    // Two models: the same weights, one with adapters (the base frozen).
    nn::LanguageModel full(options, gen), adapted(options, gen);
    nn::apply_lora(adapted, nn::LoraOptions().rank(rank).alpha(2.f * static_cast<float>(rank)).targets({"w_q", "w_v"}),
                   gen);
    optim::AdamW full_opt(full.named_trainable_parameters(), optim::AdamOptions(1e-5f));
    optim::AdamW lora_opt(adapted.named_trainable_parameters(), optim::AdamOptions(1e-5f));
    const std::vector<Variant> variants = {{"full", false, false},
                                           {"full_checkpointed", true, false},
                                           {"lora", false, true},
                                           {"lora_checkpointed", true, true}};
    std::vector<std::vector<double>> seconds(variants.size()), peaks(variants.size());
    for (std::size_t r = 0; r <= repeats; ++r) {  // round 0 warms up (first touch of every buffer)
      for (std::size_t v = 0; v < variants.size(); ++v) {
        nn::LanguageModel& model = variants[v].lora ? adapted : full;
        model.set_checkpoint_activations(variants[v].checkpoint);
        const Measured m = step(model, variants[v].lora ? lora_opt : full_opt, ids);
        if (r == 0) continue;
        seconds[v].push_back(m.seconds);
        peaks[v].push_back(m.peak_mib);
      }
    }
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const nn::LanguageModel& model = variants[v].lora ? adapted : full;
      std::size_t trained = 0;
      for (const auto& [n, p] : model.named_trainable_parameters()) trained += p.size();
      const nlohmann::json line = {
          {"variant", variants[v].name},
          {"layers", layers},
          {"d_model", d_model},
          {"vocab", vocab},
          {"seq_len", seq_len},
          {"batch", batch},
          {"threads", threads},
          {"parameters", model.num_parameters()},
          {"trained", trained},
          {"optimizer_state_mib",
           static_cast<double>((variants[v].lora ? lora_opt : full_opt).state_bytes()) / (1 << 20)},
          {"step_seconds", median(seconds[v])},
          {"step_peak_mib", median(peaks[v])},
          {"step_seconds_vs_full", median(seconds[v]) / median(seconds[0])},
          {"step_peak_vs_full", median(peaks[v]) / median(peaks[0])}};
      std::printf("%s\n", line.dump().c_str());
    }
  });
}
