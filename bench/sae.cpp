// Training a sparse autoencoder, step by step: train_sae on rows as wide as the `small` model's
// residual stream (d_in 256), ReLU + L1 and TopK, against the same step in PyTorch
// (bench/torch_sae.py prints the same JSON fields). Prints one JSON line per architecture.
#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "xgrad/xgrad.hpp"

using namespace xgrad;

int main(int argc, char** argv) {
  CLI::App app("xgrad SAE training benchmark: milliseconds per train_sae step.");
  std::size_t d_in = 256, d_sae = 2048, rows = 4096, k = 32, steps = 20, threads = 1;
  app.add_option("--d-in", d_in, "activation width")->check(CLI::Range(1, 65536));
  app.add_option("--d-sae", d_sae, "features")->check(CLI::Range(1, 1 << 20));
  app.add_option("--rows", rows, "rows per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--k", k, "TopK's k")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", steps, "timed steps (after 3 untimed)")->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads, "xgrad's kernel threads")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  set_num_threads(static_cast<int>(threads));

  // One buffer of rows drawn once: the source costs a copy, not a model's forward.
  Generator data(1);
  const Array pool = data.normal({8 * rows, d_in}, 0.f, 1.f);
  const inspect::ActivationSource source = [&] { return pool; };
  for (const bool topk : {false, true}) {
    inspect::SaeConfig c;
    c.d_in = d_in;
    c.d_sae = d_sae;
    if (topk) {
      c.architecture = inspect::SaeArchitecture::topk;
      c.k = k;
    }
    Generator init(2);
    inspect::SparseAutoencoder sae(c, init);
    const auto options = inspect::SaeTrainOptions().batch_rows(rows).buffer_rows(8 * rows);
    inspect::train_sae(sae, source, inspect::SaeTrainOptions(options).steps(3));  // warm-up
    // Two runs: the second minus the first is `steps` steps without the buffer's first fill.
    const inspect::SaeTrainingReport one = inspect::train_sae(sae, source, inspect::SaeTrainOptions(options).steps(1));
    const inspect::SaeTrainingReport many =
        inspect::train_sae(sae, source, inspect::SaeTrainOptions(options).steps(steps + 1));
    const double ms = 1e3 * (many.seconds - one.seconds) / static_cast<double>(steps);
    const nlohmann::json out = {{"framework", "xgrad"},
                                {"architecture", topk ? "topk" : "relu"},
                                {"d_in", d_in},
                                {"d_sae", d_sae},
                                {"rows", rows},
                                {"k", topk ? k : 0},
                                {"threads", threads},
                                {"ms_per_step", ms},
                                {"final_mse", many.mse.back()}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}
