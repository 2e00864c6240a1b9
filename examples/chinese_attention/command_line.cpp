// Options and their checks.
#include "command_line.hpp"

#include "common/cli.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace zh {

void add_options(CLI::App& app, CommandLine& c) {
  app.add_option("--steps", c.train.steps, "training steps")
      ->transform(cli::count(1, cli::kMaxSteps))
      ->capture_default_str();
  app.add_option("--batch", c.train.batch, "sentences per step")
      ->transform(cli::count(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--lr", c.train.lr, "peak AdamW learning rate")->check(cli::real(0, 1e6, true))->capture_default_str();
  app.add_option("--seed", c.train.seed, "seed for the weights and the batches")
      ->transform(cli::seed())
      ->capture_default_str();
  cli::add_threads(app, c.threads);
  app.add_option("--out", c.out, "folder for the SVG heatmaps")->capture_default_str();
  app.add_flag("--quiet", c.quiet, "no progress line and no terminal grids");
}

void check_before_run(const CommandLine& c) {
  cli::as_usage([&] {
    validate(c.train);
    const CorpusSplit corpus = builtin_corpus();
    std::vector<Sentence> every = corpus.train;
    every.insert(every.end(), corpus.held_out.begin(), corpus.held_out.end());
    cli::check_memory(
        training_bytes(c.train, Vocabulary(every).size()) + cli::per_step_bytes(static_cast<double>(c.train.steps), 4),
        "a training step of --batch " + std::to_string(c.train.batch) + " sentences with the losses of --steps " +
            std::to_string(c.train.steps));
    xgrad::prepare_output_dir(c.out, "chinese_attention: --out");
    std::vector<cli::RunFile> outputs = {{"--out's heads.svg", c.out + "/heads.svg"},
                                         {"--out's attention.html", c.out + "/attention.html"}};
    for (std::size_t l = 0; l < c.train.layers; ++l) {
      for (std::size_t h = 0; h < c.train.heads; ++h) {
        const std::string name = "head_l" + std::to_string(l) + "_h" + std::to_string(h) + ".svg";
        outputs.push_back({"--out's " + name, c.out + "/" + name});
      }
    }
    cli::check_output_files(outputs);
  });
}

}  // namespace zh
