// article_claims: the article's claims about multi-head attention, counted and measured.
//   article_claims configs   parameters, FLOP and memory shares, and step times of its four sizes
//   article_claims heads     1 to 32 heads at one d_model on a finite training set
#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "common/memory.hpp"
#include "report.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/kernels/parallel.hpp"

using namespace claims;

namespace {

// A training step of one block of the largest configuration, at the timed shape and at the
// longest share length (the memory measurement runs B = 1 there).
void check_configs_memory(const ConfigsOptions& o) {
  std::size_t longest = o.step.seq_len;
  for (std::size_t T : o.share_lengths) longest = std::max(longest, T);
  for (const ArticleConfig& a : article_configs()) {
    cli::TransformerSize s;
    s.layers = 1;
    s.d_model = static_cast<double>(a.size.d_model);
    s.heads = static_cast<double>(a.size.heads);
    s.d_ff = static_cast<double>(a.size.ffn_width());
    s.batch = static_cast<double>(o.step.batch);
    s.seq_len = static_cast<double>(o.step.seq_len);
    cli::check_memory(cli::transformer_training_bytes(s), "a training step of the timed block (--batch " +
                                                              std::to_string(o.step.batch) + ", --seq-len " +
                                                              std::to_string(o.step.seq_len) + ")");
    s.batch = 1;
    s.seq_len = static_cast<double>(longest);
    cli::check_memory(cli::transformer_training_bytes(s),
                      "the memory measurement at --share-lengths " + std::to_string(longest));
  }
}

void check_heads_memory(const HeadsConfig& c) {
  std::size_t most_heads = 1;
  for (std::size_t h : c.head_counts) most_heads = std::max(most_heads, h);
  cli::TransformerSize s;
  s.layers = static_cast<double>(c.layers);
  s.d_model = static_cast<double>(c.d_model);
  s.heads = static_cast<double>(most_heads);
  s.d_ff = 4.0 * static_cast<double>(c.d_model);
  s.vocab = static_cast<double>(c.task.vocab);
  s.outputs_per_position = static_cast<double>(c.task.offsets.size());
  s.batch = static_cast<double>(std::max<std::size_t>(c.batch, 256));  // evaluation runs 256 at a time
  s.seq_len = static_cast<double>(c.task.seq_len);
  const double data = 8.0 * static_cast<double>(c.train_size + c.val_size) * s.seq_len * (1 + s.outputs_per_position);
  cli::check_memory(cli::transformer_training_bytes(s) + data,
                    "a training step of the largest head count (--d-model, --layers, --batch, --seq-len)");
}

void write_report(const std::string& path, const nlohmann::json& report) {
  if (path.empty()) return;
  xgrad::write_file_atomically(path, report.dump(2) + "\n", "article_claims: the report");
  std::printf("\nreport: %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The article's claims about multi-head attention, measured with xgrad.", "article_claims"};
  app.require_subcommand(0, 1);
  int threads = 1;
  std::string report_path;
  const auto size = cli::count(1, 1 << 16);

  ConfigsOptions co;
  bool no_time = false;
  CLI::App* configs =
      app.add_subcommand("configs", "parameters, FLOP and memory shares, step times of the article's four sizes");
  configs->add_option("--batch", co.step.batch, "sequences per timed step")
      ->transform(cli::count(1, 4096))
      ->capture_default_str();
  configs->add_option("--seq-len", co.step.seq_len, "length of the timed step")->transform(size)->capture_default_str();
  CLI::Option* timed_steps =
      configs->add_option("--steps", co.step.steps, "timed steps (the median is printed), after one warm-up")
          ->transform(cli::count(1, 1000))
          ->capture_default_str();
  configs->add_option("--share-lengths", co.share_lengths, "T of the FLOP and memory shares, e.g. 128,1024")
      ->delimiter(',')
      ->transform(size)
      ->capture_default_str();
  configs->add_option("--dropout", co.step.dropout, "dropout of the block")
      ->check(cli::real(0, 1))
      ->capture_default_str();
  configs->add_option("--seed", co.step.seed, "seed of weights and input")
      ->transform(cli::seed())
      ->capture_default_str();
  configs->add_flag("--no-time", no_time, "skip the timed steps (counts and shares only)");
  cli::add_threads(*configs, threads);
  configs->add_option("--report", report_path, "write the JSON report here")->check(cli::not_empty());

  HeadsConfig hc;
  std::size_t offsets = hc.task.offsets.size();
  bool quiet = false;
  CLI::App* heads = app.add_subcommand("heads", "1 to 32 heads at one d_model, on a finite training set");
  heads->add_option("--d-model", hc.d_model, "model width (the head size is d_model / heads)")
      ->transform(cli::count(1, 4096))
      ->capture_default_str();
  heads->add_option("--heads", hc.head_counts, "head counts, e.g. 1,2,4,8,16,32")
      ->delimiter(',')
      ->transform(cli::count(1, 4096))
      ->capture_default_str();
  heads->add_option("--layers", hc.layers, "transformer blocks")->transform(cli::count(1, 64))->capture_default_str();
  heads->add_option("--offsets", offsets, "relations: the task asks for the tokens 1 .. K positions back")
      ->transform(cli::count(1, 4096))
      ->capture_default_str();
  heads->add_option("--vocab", hc.task.vocab, "vocabulary size")
      ->transform(cli::count(2, 1 << 16))
      ->capture_default_str();
  heads->add_option("--seq-len", hc.task.seq_len, "sequence length")
      ->transform(cli::count(2, 4096))
      ->capture_default_str();
  heads->add_option("--train-size", hc.train_size, "training sequences (the finite set)")
      ->transform(cli::count(1, 1 << 20))
      ->capture_default_str();
  heads->add_option("--val-size", hc.val_size, "held-out sequences")
      ->transform(cli::count(1, 1 << 20))
      ->capture_default_str();
  heads->add_option("--steps", hc.steps, "training steps per model")
      ->transform(cli::count(1, cli::kMaxSteps))
      ->capture_default_str();
  heads->add_option("--batch", hc.batch, "sequences per step")
      ->transform(cli::count(1, 1 << 16))
      ->capture_default_str();
  heads->add_option("--lr", hc.lr, "AdamW learning rate")->check(cli::real(0, 1e6, true))->capture_default_str();
  heads->add_option("--weight-decay", hc.weight_decay, "AdamW weight decay")
      ->check(cli::real(0, 1e6))
      ->capture_default_str();
  heads->add_option("--seeds", hc.seeds, "one run per seed and head count, e.g. 0,1")
      ->delimiter(',')
      ->transform(cli::seed())
      ->capture_default_str();
  cli::add_threads(*heads, threads);
  heads->add_option("--report", report_path, "write the JSON report here")->check(cli::not_empty());
  heads->add_flag("--quiet", quiet, "print only the table");
  if (const auto code = cli::parse(app, argc, argv)) return *code;

  return cli::run("article_claims", [&] {
    if (!configs->parsed() && !heads->parsed()) cli::usage_error("a subcommand is required: configs or heads");
    if (configs->parsed()) {
      co.measure_time = !no_time;
      if (no_time && timed_steps->count() > 0)
        cli::usage_error("--steps counts timed steps; with --no-time nothing is timed");
      cli::as_usage([&] {
        if (co.share_lengths.empty()) xgrad::fail("--share-lengths: no lengths given");
        if (co.step.dropout >= 1) xgrad::fail("--dropout ", co.step.dropout, " must be less than 1");
        check_configs_memory(co);
        if (!report_path.empty()) xgrad::check_writable_file(report_path, "article_claims: --report");
      });
      xgrad::set_num_threads(threads);
      std::vector<ConfigReport> rows;
      for (const ArticleConfig& a : article_configs()) rows.push_back(report_config(a, co));
      std::printf("%s\n%s\n%s", parameter_table(rows).c_str(), flop_share_table(rows, co).c_str(),
                  memory_share_table(rows, co).c_str());
      if (co.measure_time) std::printf("\n%s", step_time_table(rows, co).c_str());
      write_report(report_path, configs_json(rows, co));
      return;
    }
    hc.task.offsets.clear();
    for (std::size_t k = 1; k <= offsets; ++k) hc.task.offsets.push_back(k);
    cli::as_usage([&] {
      validate(hc);
      check_heads_memory(hc);
      if (!report_path.empty()) xgrad::check_writable_file(report_path, "article_claims: --report");
    });
    xgrad::set_num_threads(threads);
    const std::vector<HeadsRun> runs = run_head_sweep(hc, [&](const HeadsRun& r) {
      if (!quiet)
        std::fprintf(stderr, "heads %zu, seed %llu: val acc %.4f (%.1fs)\n", r.heads,
                     static_cast<unsigned long long>(r.seed), r.val_accuracy, r.seconds);
    });
    std::printf("%s", heads_table(runs, hc).c_str());
    write_report(report_path, heads_json(runs, hc));
  });
}
