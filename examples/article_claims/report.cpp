// Plain-text tables and JSON for article_claims.
#include "report.hpp"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace claims {

namespace {

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }
double percent(double share) { return 100.0 * share; }

}  // namespace

std::string parameter_table(const std::vector<ConfigReport>& rows) {
  std::string s =
      "Parameters, counted from xgrad's modules (MultiHeadAttention with biases and LayerNorm;\n"
      "TransformerBlock with d_ff = 4 d_model) against the closed forms 4C^2+6C and 12C^2+13C:\n";
  s += format("%-9s %7s %5s %4s %12s %12s %12s %12s %12s %6s\n", "config", "d_model", "heads", "d_k", "Q,K,V W",
              "3 d_model^2", "MHA", "MHA 1 head", "block", "match");
  for (const ConfigReport& r : rows) {
    const BlockSize& z = r.config.size;
    const bool match = static_cast<double>(r.counts.attention) == attention_params(z) &&
                       static_cast<double>(r.counts.attention_one_head) == attention_params(z) &&
                       static_cast<double>(r.counts.qkv_weights) == qkv_weight_params(z) &&
                       static_cast<double>(r.counts.block) == block_params(z);
    s += format("%-9s %7zu %5zu %4zu %12zu %12.0f %12zu %12zu %12zu %6s\n", r.config.label.c_str(), z.d_model, z.heads,
                z.head_size(), r.counts.qkv_weights, 3.0 * static_cast<double>(z.d_model * z.d_model),
                r.counts.attention, r.counts.attention_one_head, r.counts.block, match ? "yes" : "NO");
  }
  return s;
}

std::string flop_share_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& o) {
  std::string s =
      "Forward FLOPs of one block per sequence (matrix products; backward is about twice, same shares):\n"
      "projections 8TC^2, scores+context 4T^2C, FFN 4TCF; attention = projections + scores+context\n";
  s += format("%-9s %5s %10s %12s %15s %8s %10s\n", "config", "T", "GFLOP", "projections", "scores+context", "FFN",
              "attention");
  for (const ConfigReport& r : rows) {
    for (std::size_t i = 0; i < o.share_lengths.size(); ++i) {
      const BlockFlops& f = r.flops[i];
      s += format("%-9s %5zu %10.2f %11.1f%% %14.1f%% %7.1f%% %9.1f%%\n", r.config.label.c_str(), o.share_lengths[i],
                  f.total() / 1e9, percent(f.projections / f.total()), percent(f.scores_context_share()),
                  percent(f.feed_forward / f.total()), percent(f.attention_share()));
    }
  }
  return s;
}

std::string memory_share_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& o) {
  std::string s = format(
      "Activation memory one block's forward keeps for backward, per sequence (dropout %g):\n"
      "formula: attention weights %s B H T^2 bytes, the rest B T (32 C + %s F); measured: heap bytes\n"
      "held after forward, with H heads and with 1 head (the difference grows with H)\n",
      static_cast<double>(o.step.dropout), o.step.dropout > 0 ? "9" : "4", o.step.dropout > 0 ? "9" : "8");
  s += format("%-9s %5s %11s %9s %12s %13s %12s %12s %12s\n", "config", "T", "weights MiB", "rest MiB", "formula MiB",
              "measured MiB", "1 head MiB", "share form.", "share meas.");
  for (const ConfigReport& r : rows) {
    for (std::size_t i = 0; i < o.share_lengths.size(); ++i) {
      const BlockActivations& a = r.memory_formula[i];
      const double measured = r.memory_measured[i], one = r.memory_measured_one_head[i];
      const double weights = measured_attention_weight_bytes(measured, one, r.config.size.heads);
      s += format("%-9s %5zu %11.2f %9.2f %12.2f %13.2f %12.2f %11.1f%% %11.1f%%\n", r.config.label.c_str(),
                  o.share_lengths[i], mib(a.attention_weights), mib(a.rest), mib(a.total()), mib(measured), mib(one),
                  percent(a.attention_weight_share()), percent(weights / measured));
    }
  }
  return s;
}

std::string step_time_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& o) {
  const StepOptions& p = o.step;
  std::string s = format(
      "Training step of one TransformerBlock, B %zu, T %zu, dropout %g, causal; medians of %zu steps\n"
      "(forward + backward of mean(block(x)); then the AdamW update):\n",
      p.batch, p.seq_len, static_cast<double>(p.dropout), p.steps);
  s += format("%-9s %7s %5s %14s %14s %8s %10s %9s\n", "config", "d_model", "heads", "fwd+bwd ms", "1 head ms", "ratio",
              "AdamW ms", "GFLOP/s");
  for (const ConfigReport& r : rows) {
    const BlockFlops f = block_flops(r.config.size, static_cast<double>(p.batch), static_cast<double>(p.seq_len));
    const double ms = r.times.forward_backward_ms;
    s += format("%-9s %7zu %5zu %14.1f %14.1f %7.2fx %10.1f %9.1f\n", r.config.label.c_str(), r.config.size.d_model,
                r.config.size.heads, ms, r.times_one_head.forward_backward_ms,
                ms / r.times_one_head.forward_backward_ms, r.times.optimizer_ms, 3 * f.total() / (ms * 1e6));
  }
  return s;
}

std::string heads_table(const std::vector<HeadsRun>& runs, const HeadsConfig& c) {
  std::string s = format(
      "Same d_model %zu, %zu layer(s), %zu offsets, %zu training sequences (%.0f epochs), %zu held out,\n"
      "%zu steps of %zu, AdamW lr %g; losses are mean cross-entropy per target (ln %zu = %.3f is chance):\n",
      c.d_model, c.layers, c.task.offsets.size(), c.train_size,
      static_cast<double>(c.steps * c.batch) / static_cast<double>(c.train_size), c.val_size, c.steps, c.batch,
      static_cast<double>(c.lr), c.task.vocab, std::log(static_cast<double>(c.task.vocab)));
  const char* header = "%5s %4s %5s %11s %10s %9s %9s %8s %8s\n";
  const char* line = "%5zu %4zu %5s %11.4f %10.4f %9.4f %9.4f %8.4f %7.1fs\n";
  s += format(header, "heads", "D", "seed", "train loss", "train acc", "val loss", "val acc", "gap", "time");
  for (const HeadsRun& r : runs) {
    s += format(line, r.heads, r.head_size, std::to_string(r.seed).c_str(), r.train_loss, r.train_accuracy, r.val_loss,
                r.val_accuracy, r.gap(), r.seconds);
  }
  if (c.seeds.size() < 2) return s;
  s += format("\nMeans over %zu seeds:\n", c.seeds.size());
  s += format(header, "heads", "D", "seeds", "train loss", "train acc", "val loss", "val acc", "gap", "time");
  for (std::size_t h : c.head_counts) {
    HeadsRun mean;
    double n = 0;
    for (const HeadsRun& r : runs) {
      if (r.heads != h) continue;
      mean.train_loss += r.train_loss;
      mean.train_accuracy += r.train_accuracy;
      mean.val_loss += r.val_loss;
      mean.val_accuracy += r.val_accuracy;
      mean.seconds += r.seconds;
      n += 1;
    }
    s += format(line, h, c.d_model / h, "all", mean.train_loss / n, mean.train_accuracy / n, mean.val_loss / n,
                mean.val_accuracy / n, (mean.val_loss - mean.train_loss) / n, mean.seconds / n);
  }
  return s;
}

nlohmann::json configs_json(const std::vector<ConfigReport>& rows, const ConfigsOptions& o) {
  nlohmann::json j = {{"step",
                       {{"batch", o.step.batch},
                        {"seq_len", o.step.seq_len},
                        {"steps", o.step.steps},
                        {"dropout", o.step.dropout},
                        {"causal", o.step.causal},
                        {"seed", o.step.seed}}},
                      {"share_lengths", o.share_lengths},
                      {"configs", nlohmann::json::array()}};
  for (const ConfigReport& r : rows) {
    const BlockSize& z = r.config.size;
    nlohmann::json lengths = nlohmann::json::array();
    for (std::size_t i = 0; i < o.share_lengths.size(); ++i) {
      const BlockFlops& f = r.flops[i];
      const BlockActivations& a = r.memory_formula[i];
      lengths.push_back({{"seq_len", o.share_lengths[i]},
                         {"flops",
                          {{"projections", f.projections},
                           {"scores_context", f.scores_context},
                           {"feed_forward", f.feed_forward},
                           {"attention_share", f.attention_share()}}},
                         {"memory_formula",
                          {{"attention_weights", a.attention_weights},
                           {"rest", a.rest},
                           {"attention_weight_share", a.attention_weight_share()}}},
                         {"memory_measured", r.memory_measured[i]},
                         {"memory_measured_one_head", r.memory_measured_one_head[i]}});
    }
    nlohmann::json row = {{"label", r.config.label},
                          {"article_use", r.config.article_use},
                          {"d_model", z.d_model},
                          {"heads", z.heads},
                          {"d_k", z.head_size()},
                          {"d_ff", z.ffn_width()},
                          {"params",
                           {{"attention", r.counts.attention},
                            {"attention_one_head", r.counts.attention_one_head},
                            {"qkv_weights", r.counts.qkv_weights},
                            {"block", r.counts.block},
                            {"attention_formula", attention_params(z)},
                            {"block_formula", block_params(z)}}},
                          {"lengths", lengths}};
    if (o.measure_time) {
      row["step_ms"] = {{"forward_backward", r.times.forward_backward_ms},
                        {"optimizer", r.times.optimizer_ms},
                        {"forward_backward_one_head", r.times_one_head.forward_backward_ms}};
    }
    j["configs"].push_back(row);
  }
  return j;
}

nlohmann::json heads_json(const std::vector<HeadsRun>& runs, const HeadsConfig& c) {
  nlohmann::json j = {{"config",
                       {{"d_model", c.d_model},
                        {"layers", c.layers},
                        {"head_counts", c.head_counts},
                        {"vocab", c.task.vocab},
                        {"seq_len", c.task.seq_len},
                        {"offsets", c.task.offsets},
                        {"train_size", c.train_size},
                        {"val_size", c.val_size},
                        {"steps", c.steps},
                        {"batch", c.batch},
                        {"lr", c.lr},
                        {"weight_decay", c.weight_decay},
                        {"seeds", c.seeds}}},
                      {"runs", nlohmann::json::array()}};
  for (const HeadsRun& r : runs) {
    j["runs"].push_back({{"heads", r.heads},
                         {"head_size", r.head_size},
                         {"seed", r.seed},
                         {"params", r.params},
                         {"train_loss", r.train_loss},
                         {"train_accuracy", r.train_accuracy},
                         {"val_loss", r.val_loss},
                         {"val_accuracy", r.val_accuracy},
                         {"gap", r.gap()},
                         {"seconds", r.seconds},
                         {"epochs", r.epochs},
                         {"losses", r.losses}});
  }
  return j;
}

}  // namespace claims
