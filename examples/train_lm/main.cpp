// Train a byte-level transformer language model on any text file (or on text from a built-in
// grammar), with validation, checkpoints, --resume, and sampling from a checkpoint.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>

#include "common/svg.hpp"
#include "common/terminal.hpp"
#include "trainer.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/parallel.hpp"
#include "xgrad/nn/checkpoint.hpp"

using namespace lm;

namespace {

std::string sample_text(xgrad::nn::LanguageModel& model, const std::string& prompt, std::size_t count, float temperature,
                        std::size_t top_k, std::uint64_t seed) {
  std::vector<std::int64_t> ids(prompt.begin(), prompt.end());
  for (auto& id : ids) id = static_cast<unsigned char>(id);
  xgrad::Generator gen(seed);
  const std::vector<std::int64_t> out = model.generate(ids, count, {temperature, top_k}, gen);
  std::string text;
  for (std::int64_t id : out) text += static_cast<char>(id);
  return text;
}

void write_log(const std::string& folder, const std::vector<LogEntry>& log, double unigram) {
  std::ofstream csv(folder + "/log.csv");
  csv << "step,train_loss,valid_loss,lr,seconds\n";
  viz::LinePlot plot{"byte-level language model", "step", "loss (nats per byte)", {}, false, false};
  viz::Series train{"train", {}, {}}, valid{"validation", {}, {}}, uni{"unigram entropy", {}, {}};
  for (const LogEntry& e : log) {
    csv << e.step << ',' << e.train_loss << ',' << (e.valid_loss ? std::to_string(*e.valid_loss) : "") << ',' << e.lr << ','
        << e.seconds << '\n';
    train.x.push_back(static_cast<double>(e.step));
    train.y.push_back(e.train_loss);
    if (e.valid_loss) {
      valid.x.push_back(static_cast<double>(e.step));
      valid.y.push_back(*e.valid_loss);
    }
  }
  if (!log.empty()) uni = {"unigram entropy", {1.0, static_cast<double>(log.back().step)}, {unigram, unigram}};
  plot.series = {train, valid, uni};
  viz::write_text_file(folder + "/loss.svg", viz::line_plot_svg(plot));
  if (!csv) xgrad::fail("cannot write ", folder, "/log.csv");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad train_lm: a byte-level transformer language model, trained from C++."};
  TrainConfig c;
  std::string text_path, norm = "pre", checkpoint, out = "train_lm_out", prompt = "The ";
  std::size_t checkpoint_interval = 0, text_bytes = 200000, sample = 0, top_k = 0;
  float temperature = 0.8f;
  bool resume = false, quiet = false;
  int threads = 1;
  app.add_option("text", text_path, "a text file to train on (default: text from a built-in grammar)");
  app.add_option("--layers", c.layers, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", c.d_model, "model width")->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads")->capture_default_str();
  app.add_option("--d-ff", c.d_ff, "feed-forward width (0: 4 x d-model)")->capture_default_str();
  app.add_option("--seq-len", c.seq_len, "context length in bytes")->capture_default_str();
  app.add_option("--batch", c.batch, "sequences per step")->capture_default_str();
  app.add_option("--steps", c.steps, "training steps")->capture_default_str();
  app.add_option("--lr", c.lr, "peak AdamW learning rate")->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup", c.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--clip", c.clip, "clip the global gradient norm (0: off)")->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout")->capture_default_str();
  app.add_option("--norm", norm, "LayerNorm placement")->check(CLI::IsMember({"pre", "post"}))->capture_default_str();
  app.add_option("--seed", c.seed, "seed")->capture_default_str();
  app.add_option("--threads", threads, "threads for the GEMMs and the other kernels")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--valid-fraction", c.valid_fraction, "share of the text held out")->capture_default_str();
  app.add_option("--eval-interval", c.eval_interval, "steps between validations")->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "validation batches")->capture_default_str();
  app.add_option("--text-bytes", text_bytes, "size of the built-in text")->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "checkpoint file (.safetensors) to write, resume or sample from");
  app.add_option("--checkpoint-interval", checkpoint_interval, "steps between checkpoints (0: at the end only)");
  app.add_flag("--resume", resume, "continue training from --checkpoint");
  app.add_option("--sample", sample, "generate this many bytes from --checkpoint, without training");
  app.add_option("--prompt", prompt, "prompt for sampling")->capture_default_str();
  app.add_option("--temperature", temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", top_k, "sample among the k most likely bytes (0: all)")->capture_default_str();
  app.add_option("--out", out, "folder for the log and the loss curve")->capture_default_str();
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);
  c.norm = norm == "pre" ? xgrad::nn::Norm::pre : xgrad::nn::Norm::post;

  try {
    xgrad::set_num_threads(threads);
    if (sample > 0) {
      if (checkpoint.empty()) xgrad::fail("--sample needs --checkpoint");
      const TrainConfig saved = checkpoint_config(checkpoint);
      xgrad::Generator init(0);
      xgrad::nn::LanguageModel model(model_options(saved), init);
      xgrad::nn::load_checkpoint(checkpoint, model);
      std::printf("%s\n", sample_text(model, prompt, sample, temperature, top_k, c.seed).c_str());
      return 0;
    }
    if (resume && checkpoint.empty()) xgrad::fail("--resume needs --checkpoint");
    validate(c);
    const std::string text = text_path.empty() ? grammar_text(text_bytes, 12345) : read_text(text_path);
    const double unigram = unigram_entropy(text);
    Trainer trainer(c, split(text, c.valid_fraction, c.seq_len));
    if (resume) trainer.resume(checkpoint);
    std::printf("text: %s, %zu bytes, unigram entropy %.3f nats/byte\n", text_path.empty() ? "built-in grammar" : text_path.c_str(),
                text.size(), unigram);
    std::printf("model: %zu layers, d_model %zu, %zu heads, %zu parameters; %zu steps of %zu x %zu bytes%s\n", c.layers,
                c.d_model, c.heads, trainer.model().num_parameters(), c.steps, c.batch, c.seq_len,
                resume ? (", resuming at step " + std::to_string(trainer.step())).c_str() : "");

    viz::ProgressLine line(quiet, c.eval_interval);
    float last_valid = -1;
    const std::size_t first = trainer.step();
    trainer.run(c.steps, [&](const LogEntry& e) {
      if (e.valid_loss) last_valid = *e.valid_loss;
      const double done = static_cast<double>(e.step - first);
      const double left = e.seconds / std::max(done, 1.0) * static_cast<double>(c.steps - e.step);
      char text_line[200];
      std::snprintf(text_line, sizeof text_line, "step %5zu/%zu  train %.3f  valid %s  %6.0f tokens/s  %s left", e.step, c.steps,
                    static_cast<double>(e.train_loss), last_valid < 0 ? "  -  " : std::to_string(last_valid).substr(0, 5).c_str(),
                    done * static_cast<double>(c.batch * c.seq_len) / std::max(e.seconds, 1e-9), viz::duration(left).c_str());
      line.update(e.step, c.steps, text_line);
    }, checkpoint, checkpoint_interval);
    line.finish();
    if (!checkpoint.empty()) trainer.save(checkpoint);

    const float valid = trainer.validation_loss();
    std::printf("validation loss %.3f nats/byte (unigram entropy %.3f)\n", static_cast<double>(valid), unigram);
    std::filesystem::create_directories(out);
    write_log(out, trainer.log(), unigram);
    std::printf("log: %s/log.csv, curve: %s/loss.svg%s%s\n", out.c_str(), out.c_str(), checkpoint.empty() ? "" : ", checkpoint: ",
                checkpoint.c_str());
    std::printf("sample: %s\n", sample_text(trainer.model(), prompt, 120, temperature, top_k, c.seed).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
