// The head-specialization example: a one-layer attention model learns to name the tokens 1, 2,
// 3 and 4 positions back at once, and its heads divide the work, each attending at one offset;
// a single head of the same width cannot. docs/studies/head-specialization.md describes the task
// and how to read the output.
#include <cstdio>
#include <map>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "common/terminal.hpp"
#include "report.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/kernels/parallel.hpp"

using namespace headspec;

namespace {

std::string progress_text(const std::string& label, const Progress& p) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%-11s step %5zu/%zu  loss %.4f  accuracy %.3f  %7.0f tokens/s  %s left",
                label.c_str(), p.step, p.steps, p.loss, p.accuracy, p.tokens_per_s,
                viz::duration(p.seconds_left).c_str());
  return buf;
}

void print_accuracy(const char* what, const ExperimentConfig& c, const Accuracy& a) {
  std::printf("%s accuracy %.4f  (", what, a.overall);
  for (std::size_t k = 0; k < c.task.offsets.size(); ++k) {
    std::printf("%st-%zu: %.3f", k ? ", " : "", c.task.offsets[k], a.per_offset[k]);
  }
  std::printf(")\n");
}

void write_json(const std::string& path, const nlohmann::json& j) {
  xgrad::write_file_atomically(path, j.dump(2) + "\n", "head_specialization: the report");
}

// A training step of the model with `heads` heads: attention-only layers, K offsets' logits per
// position.
double training_bytes(const ExperimentConfig& c, std::size_t heads) {
  cli::TransformerSize s;
  s.layers = static_cast<double>(c.layers);
  s.d_model = static_cast<double>(c.d_model);
  s.heads = static_cast<double>(heads);
  s.vocab = static_cast<double>(c.task.vocab);
  s.outputs_per_position = static_cast<double>(c.task.offsets.size());
  s.batch = static_cast<double>(c.train.batch);
  s.seq_len = static_cast<double>(c.task.seq_len);
  return cli::transformer_training_bytes(s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad head specialization: heads of one attention layer each learn a different offset.",
               "head_specialization"};
  ExperimentConfig c;
  c.train.steps = 600;
  std::string norm = "pre", out = "head_specialization_out", report_path;
  int threads = 1;
  bool quiet = false, no_single = false;
  std::vector<std::size_t> sweep;
  const auto size = cli::count(1, 1 << 16);
  CLI::Option* heads_flag =
      app.add_option("--heads", c.heads, "attention heads")->transform(size)->capture_default_str();
  app.add_option("--d-model", c.d_model, "model width (divisible by heads)")->transform(size)->capture_default_str();
  app.add_option("--layers", c.layers, "attention layers")->transform(cli::count(1, 1024))->capture_default_str();
  app.add_option("--offsets", c.task.offsets, "offsets to copy, e.g. 1,2,3,4")
      ->delimiter(',')
      ->transform(size)
      ->capture_default_str();
  app.add_option("--vocab", c.task.vocab, "vocabulary size")->transform(size)->capture_default_str();
  app.add_option("--seq-len", c.task.seq_len, "sequence length")->transform(size)->capture_default_str();
  app.add_option("--norm", norm, "LayerNorm placement")->check(CLI::IsMember({"pre", "post"}))->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout on attention weights")
      ->check(cli::real(0, 0.999))
      ->capture_default_str();
  app.add_option("--steps", c.train.steps, "training steps")
      ->transform(cli::count(1, cli::kMaxSteps))
      ->capture_default_str();
  app.add_option("--batch", c.train.batch, "sequences per step")
      ->transform(cli::count(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", c.train.lr, "AdamW learning rate")->check(cli::real(0, 1e6, true))->capture_default_str();
  app.add_option("--weight-decay", c.train.weight_decay, "AdamW weight decay")
      ->check(cli::real(0, 1e6))
      ->capture_default_str();
  app.add_option("--warmup", c.train.warmup, "linear warm-up steps (fewer than --steps)")
      ->transform(cli::count(0, cli::kMaxSteps))
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed for weights and data")->transform(cli::seed())->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "held-out batches for the measurements")
      ->transform(cli::count(1, 1 << 16))
      ->capture_default_str();
  cli::add_threads(app, threads);
  cli::add_precision(app, c.train.precision);
  app.add_option("--out", out, "folder for the images")->capture_default_str();
  app.add_option("--report", report_path, "write the JSON report here")->check(cli::not_empty());
  app.add_option("--sweep-heads", sweep, "instead: train each head count, e.g. 1,2,4,8")
      ->delimiter(',')
      ->transform(size);
  app.add_flag("--no-single-head", no_single, "skip the one-head contrast");
  app.add_flag("--quiet", quiet, "print only the results");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  c.norm = norm == "pre" ? xgrad::nn::Norm::pre : xgrad::nn::Norm::post;
  c.single_head = !no_single;

  return cli::run("head_specialization", [&] {
    if (!sweep.empty() && heads_flag->count() > 0)
      cli::usage_error("--heads is for one run; --sweep-heads gives the head counts");
    if (!sweep.empty() && no_single)
      cli::usage_error("--no-single-head is for one run; --sweep-heads trains no one-head contrast");
    cli::as_usage([&] {
      validate(c);
      cli::check_warmup(c.train.warmup, c.train.steps);
      std::size_t most_heads = c.heads;
      for (std::size_t h : sweep) {
        if (c.d_model % h != 0) xgrad::fail("--sweep-heads: d-model ", c.d_model, " is not divisible by ", h);
        most_heads = std::max(most_heads, h);
      }
      // The held-out batches are kept for the measurements: ids and K targets per position, and
      // the measurements keep about two attention patterns (B, H, T, T) per batch and layer
      // (measured: 508 KiB a batch at the defaults, where this gives 565 KiB).
      const double B = static_cast<double>(c.train.batch), T = static_cast<double>(c.task.seq_len);
      const double per_batch = B * T * static_cast<double>(1 + c.task.offsets.size()) * 8 +
                               2 * B * static_cast<double>(c.layers * most_heads) * T * T * 4;
      const double held_out = static_cast<double>(c.eval_batches) * per_batch;
      // Each step keeps a loss per run (two, with the one-head contrast) and its point of loss.svg.
      const double losses = cli::per_step_bytes(static_cast<double>(c.train.steps), 2 * 64);
      cli::check_memory(training_bytes(c, most_heads) + held_out + losses,
                        "a training step of this model with --eval-batches " + std::to_string(c.eval_batches) +
                            " held-out batches and the losses of --steps " + std::to_string(c.train.steps));
      std::vector<cli::RunFile> images;
      for (const std::string& name : image_names(c, !sweep.empty()))
        images.push_back({"--out's " + name, out + "/" + name});
      std::vector<cli::RunFile> files = {{"--out (a folder)", out}};
      files.insert(files.end(), images.begin(), images.end());
      if (!report_path.empty()) files.push_back({"--report", report_path});
      cli::check_distinct_files("head_specialization", {}, files);
      xgrad::prepare_output_dir(out, "head_specialization: --out");
      cli::check_output_files(images);  // the report's own check is check_writable_file's, below
      if (!report_path.empty()) xgrad::check_writable_file(report_path, "head_specialization: --report");
    });
    xgrad::set_num_threads(threads);
    viz::ProgressLine line(quiet, std::max<std::size_t>(c.train.steps / 5, 1));
    auto progress = [&](const std::string& label, const Progress& p) {
      line.update(p.step, p.steps, progress_text(label, p));
    };

    if (!sweep.empty()) {
      std::vector<SweepRow> rows;
      for (std::size_t h : sweep) {
        ExperimentConfig one = c;
        one.heads = h;
        one.single_head = false;
        const ExperimentResult r = run_experiment(one, progress);
        line.finish();
        rows.push_back(sweep_row(h, r));
      }
      std::printf("\nSame task, same d_model %zu, %zu steps each:\n%s", c.d_model, c.train.steps,
                  sweep_table(rows).c_str());
      std::printf("plot: %s\n", write_sweep_plot(out, rows).c_str());
      if (!report_path.empty()) {
        write_json(report_path, {{"config", config_json(c)}, {"sweep", sweep_json(rows)}});
        std::printf("report: %s\n", report_path.c_str());
      }
      return;
    }

    if (!quiet) {
      std::printf("task: vocabulary %zu, length %zu, offsets", c.task.vocab, c.task.seq_len);
      for (std::size_t k : c.task.offsets) std::printf(" %zu", k);
      std::printf("\nmodel: %zu attention layer(s), %zu heads, d_model %zu, %s-norm; AdamW lr %g, %zu steps of %zu\n",
                  c.layers, c.heads, c.d_model, norm.c_str(), static_cast<double>(c.train.lr), c.train.steps,
                  c.train.batch);
    }
    const ExperimentResult r = run_experiment(c, progress);
    line.finish();

    std::printf("\n");
    print_accuracy(("held-out, " + std::to_string(c.heads) + " heads:").c_str(), c, r.accuracy);
    if (!r.single_training.losses.empty() && c.heads != 1) {
      print_accuracy("held-out, 1 head:  ", c, r.single_accuracy);
    }
    std::printf("training time %s (%zu heads)", viz::duration(r.training.seconds).c_str(), c.heads);
    if (!r.single_training.losses.empty() && c.heads != 1) {
      std::printf(", %s (1 head)", viz::duration(r.single_training.seconds).c_str());
    }
    std::printf("\n\n%s", head_table(c, r).c_str());
    std::printf("every offset owned by its own specialized head: %s\n", r.every_offset_owned ? "yes" : "no");
    std::printf("\n%s", patching_table(c, r).c_str());
    std::printf("each offset restored by its own head only: %s\n", r.each_offset_restored ? "yes" : "no");
    std::printf("attribution patching against the head x position sweep: correlation %.3f, %.3f s against %.3f s\n",
                r.attribution.correlation, r.attribution.attribution_seconds, r.attribution.sweep_seconds);
    if (!quiet) std::printf("\n%s", head_grids(r).c_str());
    const std::vector<std::string> images = write_images(out, c, r);
    std::printf(
        "\nimages: %s/heads.svg (all heads), %s/patching.svg, %s/loss.svg, one heatmap per head in %s/, and the\n"
        "attention viewer %s/attention.html\n",
        out.c_str(), out.c_str(), out.c_str(), out.c_str(), out.c_str());
    if (!report_path.empty()) {
      write_json(report_path, report_json(c, r));
      std::printf("report: %s\n", report_path.c_str());
    }
  });
}
