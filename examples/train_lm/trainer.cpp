// The language-model training loop and its checkpoints.
#include "trainer.hpp"

#include <chrono>
#include <cmath>

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"
#include "xgrad/core/safetensors.hpp"
#include "xgrad/core/tape.hpp"
#include "xgrad/nn/checkpoint.hpp"
#include "xgrad/optim/clip.hpp"

namespace lm {

using namespace xgrad;

namespace {
constexpr const char* kFormat = "xgrad-train-lm-1";
}

nlohmann::json TrainConfig::to_json() const {
  return {{"layers", layers},   {"d_model", d_model},       {"heads", heads},
          {"d_ff", d_ff},       {"seq_len", seq_len},       {"dropout", dropout},
          {"norm", norm == nn::Norm::pre ? "pre" : "post"}, {"batch", batch},
          {"steps", steps},     {"warmup", warmup},         {"lr", lr},
          {"min_lr", min_lr},   {"weight_decay", weight_decay}, {"clip", clip},
          {"valid_fraction", valid_fraction}, {"eval_interval", eval_interval},
          {"eval_batches", eval_batches},     {"seed", seed}};
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  TrainConfig c;
  try {
    c.layers = j.at("layers");
    c.d_model = j.at("d_model");
    c.heads = j.at("heads");
    c.d_ff = j.at("d_ff");
    c.seq_len = j.at("seq_len");
    c.dropout = j.at("dropout");
    c.norm = j.at("norm") == "pre" ? nn::Norm::pre : nn::Norm::post;
    c.batch = j.at("batch");
    c.steps = j.at("steps");
    c.warmup = j.at("warmup");
    c.lr = j.at("lr");
    c.min_lr = j.at("min_lr");
    c.weight_decay = j.at("weight_decay");
    c.clip = j.at("clip");
    c.valid_fraction = j.at("valid_fraction");
    c.eval_interval = j.at("eval_interval");
    c.eval_batches = j.at("eval_batches");
    c.seed = j.at("seed");
  } catch (const nlohmann::json::exception& e) {
    fail("train_lm: the checkpoint's config is incomplete (", e.what(), ")");
  }
  return c;
}

void validate(const TrainConfig& c) {
  if (c.layers == 0) fail("layers must be at least 1");
  if (c.heads == 0 || c.d_model % c.heads != 0) fail("d-model ", c.d_model, " is not divisible by heads ", c.heads);
  if (c.seq_len == 0) fail("sequence length must be at least 1");
  if (c.batch == 0) fail("batch must be at least 1");
  if (!(std::isfinite(c.lr) && c.lr > 0.f)) fail("learning rate ", c.lr, " must be positive");
  if (!(c.min_lr >= 0.f && c.min_lr <= c.lr)) fail("min-lr ", c.min_lr, " must be between 0 and the learning rate ", c.lr);
  if (c.steps <= c.warmup) fail("steps (", c.steps, ") must exceed warm-up steps (", c.warmup, ")");
  if (!(c.weight_decay >= 0.f)) fail("weight decay ", c.weight_decay, " must be >= 0");
  if (!(c.clip >= 0.f)) fail("clip ", c.clip, " must be >= 0");
  if (!(c.dropout >= 0.f && c.dropout < 1.f)) fail("dropout ", c.dropout, " is outside [0, 1)");
  if (c.eval_batches == 0) fail("eval batches must be at least 1");
}

nn::LanguageModelOptions model_options(const TrainConfig& c) {
  return nn::LanguageModelOptions(256, c.d_model, c.heads, c.layers)
      .d_ff(c.d_ff ? c.d_ff : 4 * c.d_model)
      .max_len(c.seq_len)
      .dropout(c.dropout)
      .norm(c.norm);
}

Trainer::Trainer(const TrainConfig& c, Corpus corpus)
    : config_((validate(c), c)),
      corpus_(std::move(corpus)),
      init_(c.seed),
      data_(c.seed + 1),
      schedule_(optim::ScheduleOptions(c.lr).warmup_steps(c.warmup).total_steps(c.steps).decay(optim::Decay::cosine).min_lr(c.min_lr)) {
  valid_ = eval_batches(corpus_.valid, c.batch, c.seq_len, c.eval_batches);
  if (valid_.empty()) fail("train_lm: the validation text is shorter than one batch of ", c.batch, " x ", c.seq_len + 1, " bytes");
  model_ = std::make_unique<nn::LanguageModel>(model_options(c), init_);
  optimizer_ = std::make_unique<optim::AdamW>(model_->named_parameters(), optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  manual_seed(c.seed + 2);  // dropout masks
}

float Trainer::validation_loss() {
  NoGradGuard no_grad;
  model_->eval();
  double total = 0;
  for (const Batch& b : valid_) total += model_->loss(b.ids, b.targets).item();
  model_->train();
  return static_cast<float>(total / static_cast<double>(valid_.size()));
}

void Trainer::run(std::size_t until, const std::function<void(const LogEntry&)>& on_step, const std::string& checkpoint,
                  std::size_t checkpoint_interval) {
  if (until > config_.steps) fail("train_lm: cannot train to step ", until, " of a ", config_.steps, "-step schedule");
  model_->train();
  const auto start = std::chrono::steady_clock::now();
  while (step_ < until) {
    const Batch b = sample_batch(corpus_.train, config_.batch, config_.seq_len, data_);
    const Tensor loss = model_->loss(b.ids, b.targets);
    optimizer_->zero_grad();
    loss.backward();
    if (config_.clip > 0.f) optim::clip_grad_norm(optimizer_->params(), config_.clip);
    const float lr = schedule_.lr(step_);
    optimizer_->set_lr(lr);
    optimizer_->step();
    ++step_;
    LogEntry e;
    e.step = step_;
    e.train_loss = loss.item();
    e.lr = lr;
    if (step_ % config_.eval_interval == 0 || step_ == config_.steps) e.valid_loss = validation_loss();
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log_.push_back(e);
    if (on_step) on_step(e);
    if (!checkpoint.empty() && checkpoint_interval && step_ % checkpoint_interval == 0) save(checkpoint);
  }
}

void Trainer::save(const std::string& path) {
  const Metadata meta = {{"format", kFormat},
                         {"step", std::to_string(step_)},
                         {"config", config_.to_json().dump()},
                         {"data_rng", data_.state()},
                         {"dropout_rng", default_generator().state()}};
  nn::save_checkpoint(path, *model_, optimizer_->state_dict(), meta);
}

TrainConfig checkpoint_config(const std::string& checkpoint) {
  const SafetensorsContents file = load_safetensors(checkpoint);
  auto it = file.metadata.find("format");
  if (it == file.metadata.end() || it->second != kFormat) {
    fail("train_lm: '", checkpoint, "' is not a train_lm checkpoint (no format \"", kFormat, "\" in its metadata)");
  }
  try {
    return TrainConfig::from_json(nlohmann::json::parse(file.metadata.at("config")));
  } catch (const nlohmann::json::exception& e) {
    fail("train_lm: '", checkpoint, "' has an unreadable config (", e.what(), ")");
  }
}

void Trainer::resume(const std::string& checkpoint) {
  const TrainConfig saved = checkpoint_config(checkpoint);
  if (saved.to_json() != config_.to_json()) {
    fail("train_lm: --resume with different settings than the checkpoint's: ", saved.to_json().dump(), " vs ",
         config_.to_json().dump());
  }
  // Read everything first, so a bad file changes nothing.
  const SafetensorsContents file = load_safetensors(checkpoint);
  const Metadata& meta = file.metadata;
  const std::size_t step = std::stoul(meta.at("step"));
  Generator data = data_;
  data.set_state(meta.at("data_rng"));
  Generator dropout;
  dropout.set_state(meta.at("dropout_rng"));
  const nn::Checkpoint ck = nn::load_checkpoint(checkpoint, *model_);
  optimizer_->load_state_dict(ck.optimizer_state);
  data_ = data;
  default_generator() = dropout;
  step_ = step;
}

}  // namespace lm
