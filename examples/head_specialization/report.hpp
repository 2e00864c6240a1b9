// What the head-specialization example shows: the terminal table and grids, the images and the
// JSON report.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiment.hpp"

namespace headspec {

struct SweepRow {
  std::size_t heads = 0;
  double accuracy = 0, seconds = 0;
  std::size_t specialized = 0;
  bool every_offset_owned = false;
};

std::string norm_name(xgrad::nn::Norm norm);

// One row per head: dominant offset, argmax fraction, mass, confidence, both entropies,
// specialized, accuracy drop when ablated.
std::string head_table(const ExperimentConfig& config, const ExperimentResult& result);
// Each head's attention on the first held-out sequence as a shaded grid.
std::string head_grids(const ExperimentResult& result);
std::string sweep_table(const std::vector<SweepRow>& rows);

// Writes the heatmaps (one per head and an overview) and the loss curve into `folder`;
// returns the paths written.
std::vector<std::string> write_images(const std::string& folder, const ExperimentConfig& config,
                                      const ExperimentResult& result);
std::string write_sweep_plot(const std::string& folder, const std::vector<SweepRow>& rows);

nlohmann::json config_json(const ExperimentConfig& config);
nlohmann::json report_json(const ExperimentConfig& config, const ExperimentResult& result);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows);

}  // namespace headspec
