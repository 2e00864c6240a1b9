// Gradient flow through residual paths, Pre-Norm against Post-Norm: per-layer gradient norms at
// initialization, the split of each residual connection's gradient into skip and branch, a
// depth sweep, head importance, and (with --train) training with and without warm-up.
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "common/terminal.hpp"
#include "flow.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/inspect/svg.hpp"

using namespace gradflow;
using xgrad::nn::Norm;

namespace {

FlowResult run(const FlowConfig& c, Norm norm) {
  xgrad::Generator weights(c.seed), data(c.seed + 1);
  auto model = make_model(c, norm, weights);
  return measure(*model, shift_batches(c, c.batches, data));
}

nlohmann::json layers_json(const FlowResult& r) {
  nlohmann::json j = nlohmann::json::array();
  for (const LayerFlow& l : r.layers) {
    auto flow = [](const xgrad::inspect::ResidualFlow& f) {
      return nlohmann::json{{"out", f.out}, {"skip", f.skip}, {"branch", f.branch}, {"total", f.total}};
    };
    j.push_back({{"layer", l.layer},
                 {"ffn_weight_grad_norm", l.ffn_weight_grad_norm},
                 {"residual_grad_norm", l.residual_grad_norm},
                 {"attention_residual", flow(l.attention)},
                 {"ffn_residual", flow(l.feed_forward)}});
  }
  return j;
}

nlohmann::json heads_json(const FlowResult& r) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& h : r.heads) j.push_back({{"module", h.module}, {"head", h.head}, {"importance", h.importance}});
  return j;
}

// A training step of the language model of `c` (measure() keeps one batch's graph at a time).
double training_bytes(const FlowConfig& c, std::size_t layers) {
  cli::TransformerSize s;
  s.layers = static_cast<double>(layers);
  s.d_model = static_cast<double>(c.d_model);
  s.heads = static_cast<double>(c.heads);
  s.d_ff = static_cast<double>(c.d_ff ? c.d_ff : 4 * c.d_model);
  s.vocab = static_cast<double>(c.vocab);
  s.batch = static_cast<double>(c.batch);
  s.seq_len = static_cast<double>(c.seq_len);
  return cli::transformer_training_bytes(s);
}

std::vector<double> layer_axis(std::size_t n) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad gradient flow: Pre-Norm against Post-Norm, at initialization and in training.", "gradient_flow"};
  FlowConfig c;
  std::vector<std::size_t> depths;
  bool train = false, quiet = false;
  std::size_t steps = 200, warmup = 50;
  float lr = 1e-3f;
  int threads = 1;
  std::string out = "gradient_flow_out", report_path;
  const auto size = cli::count(1, 1 << 16), layers = cli::count(1, 1024);
  app.add_option("--layers", c.layers, "transformer blocks")->transform(layers)->capture_default_str();
  app.add_option("--d-model", c.d_model, "model width")->transform(size)->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->transform(size)->capture_default_str();
  app.add_option("--vocab", c.vocab, "vocabulary size")->transform(size)->capture_default_str();
  app.add_option("--seq-len", c.seq_len, "sequence length")->transform(size)->capture_default_str();
  app.add_option("--batches", c.batches, "batches averaged at initialization")->transform(size)->capture_default_str();
  app.add_option("--batch", c.batch, "sequences per batch")->transform(cli::count(1, 1 << 20))->capture_default_str();
  app.add_option("--seed", c.seed, "seed for weights and data")->transform(cli::seed())->capture_default_str();
  app.add_option("--depths", depths, "also measure these depths, e.g. 6,8,10,12")->delimiter(',')->transform(layers);
  app.add_flag("--train", train, "also train both placements with and without warm-up");
  CLI::Option* steps_flag = app.add_option("--steps", steps, "training steps (--train)")
                                ->transform(cli::count(1, cli::kMaxSteps))
                                ->capture_default_str();
  CLI::Option* lr_flag = app.add_option("--lr", lr, "AdamW learning rate (--train)")
                             ->check(cli::real(0, 1e6, true))
                             ->capture_default_str();
  CLI::Option* warmup_flag =
      app.add_option("--warmup", warmup, "warm-up steps of the warm-up runs, fewer than --steps (--train)")
          ->transform(cli::count(0, cli::kMaxSteps))
          ->capture_default_str();
  cli::add_threads(app, threads);
  app.add_option("--out", out, "folder for the plots")->capture_default_str();
  app.add_option("--report", report_path, "write the JSON report here")->check(cli::not_empty());
  app.add_flag("--quiet", quiet, "print only the tables");
  if (const auto code = cli::parse(app, argc, argv)) return *code;

  return cli::run("gradient_flow", [&] {
    for (const CLI::Option* o : {steps_flag, lr_flag, warmup_flag}) {
      if (o->count() > 0 && !train)
        cli::usage_error(o->get_name(), " is a setting of --train; without --train nothing is trained");
    }
    cli::as_usage([&] {
      validate(c);
      if (train) cli::check_warmup(warmup, steps);
      std::size_t deepest = c.layers;
      for (std::size_t d : depths) deepest = std::max(deepest, d);
      // The --batches measured at initialization are made up front: ids and targets, int64.
      const double batches =
          static_cast<double>(c.batches) * static_cast<double>(c.batch) * static_cast<double>(c.seq_len) * 16;
      // --train keeps four loss curves of --steps, drawn and written into the report.
      const double curves = train ? cli::per_step_bytes(static_cast<double>(steps), 4 * 96) : 0;
      cli::check_memory(training_bytes(c, deepest) + batches + curves,
                        "a training step of the deepest model with its --batches " + std::to_string(c.batches) +
                            " batches" +
                            (train ? " and the curves of --steps " + std::to_string(steps) : std::string()));
      std::vector<cli::RunFile> outputs;
      for (const char* name : {"ffn_grad_norm.svg", "residual_grad_norm.svg", "depth_sweep.svg", "training.svg"}) {
        outputs.push_back({std::string("--out's ") + name, out + "/" + name});
      }
      std::vector<cli::RunFile> files = {{"--out (a folder)", out}};
      files.insert(files.end(), outputs.begin(), outputs.end());
      if (!report_path.empty()) files.push_back({"--report", report_path});
      cli::check_distinct_files("gradient_flow", {}, files);
      xgrad::prepare_output_dir(out, "gradient_flow: --out");
      cli::check_output_files(outputs);  // the report's own check is check_writable_file's, below
      if (!report_path.empty()) xgrad::check_writable_file(report_path, "gradient_flow: --report");
    });
    xgrad::set_num_threads(threads);
    if (!quiet) {
      std::printf("models: %zu layers, d_model %zu, %zu heads, FFN %zu, vocabulary %zu, T %zu; %zu batches of %zu\n",
                  c.layers, c.d_model, c.heads, c.d_ff ? c.d_ff : 4 * c.d_model, c.vocab, c.seq_len, c.batches,
                  c.batch);
    }
    const FlowResult pre = run(c, Norm::pre), post = run(c, Norm::post);

    std::printf("\nAt initialization (mean loss %.3f Pre-Norm, %.3f Post-Norm):\n", pre.loss, post.loss);
    std::printf("%5s  %16s %16s  %16s %16s\n", "layer", "Pre |E dL/dW2|", "Pre |dL/dx_in|", "Post |E dL/dW2|",
                "Post |dL/dx_in|");
    for (std::size_t l = 0; l < c.layers; ++l) {
      std::printf("%5zu  %16.4f %16.4f  %16.4f %16.4f\n", l, pre.layers[l].ffn_weight_grad_norm,
                  pre.layers[l].residual_grad_norm, post.layers[l].ffn_weight_grad_norm,
                  post.layers[l].residual_grad_norm);
    }
    auto ratio = [](const FlowResult& r) {
      return r.layers.back().ffn_weight_grad_norm / r.layers.front().ffn_weight_grad_norm;
    };
    std::printf("last/first layer FFN-weight gradient: Pre-Norm %.3f, Post-Norm %.3f\n", ratio(pre), ratio(post));

    std::printf(
        "\nResidual connections (gradient norms, mean over batches): arriving at the output, reaching x\n"
        "through the skip path, through the sublayer branch, and their sum (= |dL/dx|):\n");
    for (const auto* r : {&pre, &post}) {
      std::printf("%s\n%-28s %10s %10s %10s %10s\n", r == &pre ? "Pre-Norm" : "Post-Norm", "connection", "out", "skip",
                  "branch", "sum");
      for (const LayerFlow& l : r->layers) {
        for (const auto* f : {&l.attention, &l.feed_forward}) {
          std::printf("%-28s %10.4f %10.4f %10.4f %10.4f\n", f->name.c_str(), f->out, f->skip, f->branch, f->total);
        }
      }
    }
    if (!quiet) {
      std::printf("\nHead importance (Michel et al. 2019, mean |dL/dgate|), Pre-Norm:\n");
      for (const auto& h : pre.heads) std::printf("  %s head %zu: %.4g\n", h.module.c_str(), h.head, h.importance);
    }

    nlohmann::json report = {{"config",
                              {{"layers", c.layers},
                               {"d_model", c.d_model},
                               {"heads", c.heads},
                               {"d_ff", c.d_ff ? c.d_ff : 4 * c.d_model},
                               {"vocab", c.vocab},
                               {"seq_len", c.seq_len},
                               {"batches", c.batches},
                               {"batch", c.batch},
                               {"seed", c.seed}}},
                             {"pre", layers_json(pre)},
                             {"post", layers_json(post)},
                             {"pre_loss", pre.loss},
                             {"post_loss", post.loss},
                             {"head_importance", {{"pre", heads_json(pre)}, {"post", heads_json(post)}}}};

    xgrad::inspect::LinePlot ffn{
        "|E dL/dW2| of each layer's second FFN weight, at initialization", "layer", "gradient norm", {}, true, true};
    ffn.series = {{"Pre-Norm", layer_axis(c.layers), {}}, {"Post-Norm", layer_axis(c.layers), {}}};
    xgrad::inspect::LinePlot stream{
        "|dL/dx| of the residual stream entering each layer", "layer", "gradient norm", {}, true, true};
    stream.series = {{"Pre-Norm", layer_axis(c.layers), {}}, {"Post-Norm", layer_axis(c.layers), {}}};
    for (std::size_t l = 0; l < c.layers; ++l) {
      ffn.series[0].y.push_back(pre.layers[l].ffn_weight_grad_norm);
      ffn.series[1].y.push_back(post.layers[l].ffn_weight_grad_norm);
      stream.series[0].y.push_back(pre.layers[l].residual_grad_norm);
      stream.series[1].y.push_back(post.layers[l].residual_grad_norm);
    }
    xgrad::inspect::write_text_file(out + "/ffn_grad_norm.svg", xgrad::inspect::line_plot_svg(ffn));
    xgrad::inspect::write_text_file(out + "/residual_grad_norm.svg", xgrad::inspect::line_plot_svg(stream));

    if (!depths.empty()) {
      std::printf("\nDepth sweep: the last layer's |E dL/dW2| (and last/first)\n%6s %14s %10s %14s %10s\n", "depth",
                  "Pre-Norm", "ratio", "Post-Norm", "ratio");
      nlohmann::json sweep = nlohmann::json::array();
      xgrad::inspect::LinePlot plot{"last layer's |E dL/dW2| against depth", "layers", "gradient norm", {}, true, true};
      plot.series = {{"Pre-Norm", {}, {}}, {"Post-Norm", {}, {}}};
      for (std::size_t d : depths) {
        FlowConfig cd = c;
        cd.layers = d;
        const FlowResult p = run(cd, Norm::pre), q = run(cd, Norm::post);
        const double pl = p.layers.back().ffn_weight_grad_norm, ql = q.layers.back().ffn_weight_grad_norm;
        std::printf("%6zu %14.4f %10.3f %14.4f %10.3f\n", d, pl, ratio(p), ql, ratio(q));
        sweep.push_back(
            {{"layers", d}, {"pre_last", pl}, {"pre_ratio", ratio(p)}, {"post_last", ql}, {"post_ratio", ratio(q)}});
        plot.series[0].x.push_back(static_cast<double>(d));
        plot.series[0].y.push_back(pl);
        plot.series[1].x.push_back(static_cast<double>(d));
        plot.series[1].y.push_back(ql);
      }
      report["depth_sweep"] = sweep;
      xgrad::inspect::write_text_file(out + "/depth_sweep.svg", xgrad::inspect::line_plot_svg(plot));
    }

    if (train) {
      std::printf("\nTraining, AdamW lr %g, %zu steps (shift task), mean loss of the last 20 steps:\n",
                  static_cast<double>(lr), steps);
      char title[64];
      std::snprintf(title, sizeof title, "training loss, AdamW lr %g", static_cast<double>(lr));
      xgrad::inspect::LinePlot curves{title, "step", "loss", {}, true, false};
      nlohmann::json runs = nlohmann::json::array();
      viz::ProgressLine line(quiet, std::max<std::size_t>(steps / 4, 1));
      for (Norm norm : {Norm::pre, Norm::post}) {
        for (std::size_t w : {std::size_t{0}, warmup}) {
          const TrainCurve curve = train_curve(c, norm, lr, w, steps, [&](std::size_t s, float loss) {
            char text[120];
            std::snprintf(text, sizeof text, "%s%s step %zu/%zu loss %.4f",
                          norm == Norm::pre ? "Pre-Norm" : "Post-Norm", w ? " warm-up" : "", s, steps,
                          static_cast<double>(loss));
            line.update(s, steps, text);
          });
          line.finish();
          double tail = 0;
          const std::size_t n = std::min<std::size_t>(20, curve.losses.size());
          for (std::size_t i = curve.losses.size() - n; i < curve.losses.size(); ++i)
            tail += curve.losses[i] / static_cast<double>(n);
          std::printf("  %-26s %s\n", curve.name.c_str(),
                      curve.diverged ? ("diverged: " + curve.divergence).c_str() : std::to_string(tail).c_str());
          std::vector<double> x, y;
          for (std::size_t i = 0; i < curve.losses.size(); ++i) {
            x.push_back(static_cast<double>(i + 1));
            y.push_back(curve.losses[i]);
          }
          curves.series.push_back({curve.name, x, y});
          runs.push_back({{"name", curve.name},
                          {"warmup", w},
                          {"losses", curve.losses},
                          {"diverged", curve.diverged},
                          {"divergence", curve.divergence},
                          {"final_loss", tail}});
        }
      }
      report["training"] = {{"lr", lr}, {"steps", steps}, {"runs", runs}};
      xgrad::inspect::write_text_file(out + "/training.svg", xgrad::inspect::line_plot_svg(curves));
    }
    std::printf("\nplots in %s/\n", out.c_str());
    if (!report_path.empty()) {
      xgrad::write_file_atomically(report_path, report.dump(2) + "\n", "gradient_flow: the report");
      std::printf("report: %s\n", report_path.c_str());
    }
  });
}
