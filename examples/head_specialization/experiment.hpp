// One run of the head-specialization experiment: train the multi-head model, measure its heads,
// and (optionally) train the one-head model of the same width for contrast.
#pragma once

#include <functional>
#include <string>

#include "analysis.hpp"
#include "patching.hpp"
#include "trainer.hpp"
#include "xgrad/inspect/activation_cache.hpp"

namespace headspec {

struct ExperimentConfig {
  ShiftTask task;
  std::size_t d_model = 64, heads = 4, layers = 1;
  xgrad::nn::Norm norm = xgrad::nn::Norm::pre;
  float dropout = 0.f;
  TrainOptions train;
  std::uint64_t seed = 0;
  std::size_t eval_batches = 8;  // held-out batches of train.batch sequences
  bool single_head = true;       // also train the one-head contrast
};

// Throws xgrad::Error for impossible settings (naming the option and value).
void validate(const ExperimentConfig& config);

struct ExperimentResult {
  TrainResult training;
  Accuracy accuracy;
  std::vector<HeadStats> heads;
  bool every_offset_owned = false;
  PatchingTable patching;             // one head's output restored at a time
  bool each_offset_restored = false;  // by its own head only
  AttributionAgreement attribution;   // attribution patching against the head x position sweep
  // The attention patterns of the first held-out sequence, and its tokens as "t<pos> <token>".
  xgrad::inspect::ActivationCache first_sequence;
  std::vector<std::string> first_tokens;
  TrainResult single_training;  // empty when the contrast was not run
  Accuracy single_accuracy;
  std::vector<std::string> position_labels;  // "t0", "t1", ...
};

// `label` prefixes progress reports ("multi-head", "single-head").
using ProgressFn = std::function<void(const std::string& label, const Progress&)>;

ExperimentResult run_experiment(const ExperimentConfig& config, const ProgressFn& on_progress = {});

// The model options a config implies for a given head count.
OffsetModelOptions model_options(const ExperimentConfig& config, std::size_t heads);

}  // namespace headspec
