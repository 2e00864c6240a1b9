// Training a byte-level LanguageModel: AdamW with warm-up and cosine decay, gradient clipping,
// periodic validation, and checkpoints that resume exactly (model, optimizer state, step, and
// the states of the data and dropout generators).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corpus.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/schedule.hpp"

namespace lm {

struct TrainConfig {
  // model
  std::size_t layers = 2, d_model = 128, heads = 4, d_ff = 0, seq_len = 64;  // d_ff 0: 4 * d_model
  float dropout = 0.1f;
  xgrad::nn::Norm norm = xgrad::nn::Norm::pre;
  // optimization
  std::size_t batch = 16, steps = 600, warmup = 60;
  float lr = 3e-3f, min_lr = 3e-4f, weight_decay = 0.1f, clip = 1.f;  // clip 0: none
  // data and evaluation
  double valid_fraction = 0.1;
  std::size_t eval_interval = 100, eval_batches = 8;
  std::uint64_t seed = 0;

  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j);
};

// Throws xgrad::Error naming an impossible setting.
void validate(const TrainConfig& config);

struct LogEntry {
  std::size_t step = 0;  // 1-based: the step just taken
  float train_loss = 0, lr = 0;
  std::optional<float> valid_loss;
  double seconds = 0;
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, Corpus corpus);

  // Continues from a checkpoint written by save(); the model options must match.
  void resume(const std::string& checkpoint);
  // Trains until `step` steps have been taken in all (including resumed ones). `on_step` sees
  // every log entry; a checkpoint is written every `checkpoint_interval` steps when both are set.
  void run(std::size_t step, const std::function<void(const LogEntry&)>& on_step = {},
           const std::string& checkpoint = "", std::size_t checkpoint_interval = 0);
  float validation_loss();
  void save(const std::string& path);

  std::size_t step() const { return step_; }
  const std::vector<LogEntry>& log() const { return log_; }
  xgrad::nn::LanguageModel& model() { return *model_; }
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Corpus corpus_;
  std::vector<Batch> valid_;
  xgrad::Generator init_, data_;
  std::unique_ptr<xgrad::nn::LanguageModel> model_;
  std::unique_ptr<xgrad::optim::AdamW> optimizer_;
  xgrad::optim::LrSchedule schedule_;
  std::size_t step_ = 0;
  std::vector<LogEntry> log_;
};

xgrad::nn::LanguageModelOptions model_options(const TrainConfig& config);

// Reads the training config stored in a checkpoint (to rebuild its model for sampling).
TrainConfig checkpoint_config(const std::string& checkpoint);

}  // namespace lm
