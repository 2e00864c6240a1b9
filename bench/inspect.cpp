// The inspection tools' cost on the benchmark's `small` model (vocabulary 256, d_model 256, 4 heads,
// 4 layers, FFN 1024, T 64): caching every default point against a filtered cache, and a full
// head x position patching sweep against attribution patching. Prints one JSON line.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

template <class F>
double seconds_of(F f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("xgrad inspection benchmark: caches, a patching sweep and attribution patching on `small`.");
  std::size_t batch = 8, threads = 1;
  app.add_option("--batch", batch, "sequences per run")->check(CLI::Range(1, 256));
  app.add_option("--threads", threads, "xgrad's kernel threads")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  set_num_threads(static_cast<int>(threads));

  constexpr std::size_t V = 256, T = 64;
  Generator gen(0);
  nn::LanguageModel model(nn::LanguageModelOptions(V, 256, 4, 4).d_ff(1024).max_len(T).dropout(0.f), gen);
  model.eval();
  IndexArray clean = IndexArray::from_shape({batch, T});
  for (auto& id : clean) id = static_cast<std::int64_t>(gen.below(V));
  IndexArray corrupted = clean;
  std::vector<std::int64_t> answer, wrong;
  for (std::size_t b = 0; b < batch; ++b) {
    corrupted(b, T / 2) = (clean(b, T / 2) + 1) % static_cast<std::int64_t>(V);
    answer.push_back(clean(b, T - 1));
    wrong.push_back((clean(b, T - 1) + 1) % static_cast<std::int64_t>(V));
  }
  NoGradGuard no_grad;
  model.forward(clean);  // warm-up: buffers and kernels

  const double plain = seconds_of([&] { model.forward(clean); });
  inspect::ActivationCache all, some;
  const double everything = seconds_of([&] { all = inspect::cache_activations(model, [&] { model.forward(clean); }); });
  const double filtered = seconds_of([&] {
    some = inspect::cache_activations(
        model, [&] { model.forward(clean); }, inspect::points_ending_with({".attn.z"}));
  });

  inspect::ActivationCache first_z;
  const double first_z_stopped = seconds_of([&] {
    first_z = inspect::cache_activations(
        model, [&] { model.forward(clean); }, inspect::points_named({"blocks.0.attn.z"}), /*stop_after_last=*/true);
  });

  const inspect::Metric metric = inspect::logit_difference(T - 1, answer, wrong);
  auto clean_run = [&] { return model.forward(clean).logits; };
  auto corrupted_run = [&] { return model.forward(corrupted).logits; };
  const inspect::SweepSpec spec = inspect::every_head_position(model);
  const inspect::SweepResult real = inspect::patching_sweep(model, clean_run, corrupted_run, metric, spec);
  const inspect::SweepResult estimate = inspect::attribution_patching(model, clean_run, corrupted_run, metric, spec);

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const nlohmann::json out = {{"config", "small"},
                              {"batch", batch},
                              {"threads", threads},
                              {"forward_seconds", plain},
                              {"cache_everything_seconds", everything},
                              {"cache_everything_mb", static_cast<double>(all.bytes()) / (1 << 20)},
                              {"cache_everything_points", all.size()},
                              {"cache_z_seconds", filtered},
                              {"cache_z_mb", static_cast<double>(some.bytes()) / (1 << 20)},
                              {"cache_first_z_stopped_seconds", first_z_stopped},
                              {"sweep_cells", real.effect.size()},
                              {"sweep_seconds", real.seconds},
                              {"attribution_seconds", estimate.seconds},
                              {"speedup", real.seconds / estimate.seconds},
                              {"correlation", inspect::effect_correlation(real, estimate)},
                              {"peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
