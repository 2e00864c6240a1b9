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
  // Accuracy with one head ablated, over the heads: the mean and the worst overall, and the
  // worst on any one offset.
  double ablated_mean = 0, ablated_worst = 0, ablated_worst_offset = 0;
};

SweepRow sweep_row(std::size_t heads, const ExperimentResult& result);

std::string norm_name(xgrad::nn::Norm norm);

// One row per head: dominant offset, argmax fraction, mass, confidence, both entropies,
// specialized, accuracy drop when ablated.
std::string head_table(const ExperimentConfig& config, const ExperimentResult& result);
// Each head's attention on the first held-out sequence as a shaded grid.
std::string head_grids(const ExperimentResult& result);
// One row per head: the fraction of each offset's predictions restored by patching that head,
// then the rows without a patch (corrupted, clean).
std::string patching_table(const ExperimentConfig& config, const ExperimentResult& result);
std::string sweep_table(const std::vector<SweepRow>& rows);

// Writes the heatmaps (one per head, an overview and the patching table) and the loss curve
// into `folder`;
// returns the paths written.
// The names of the files write_images (or, for a sweep, write_sweep_plot) writes into its folder.
std::vector<std::string> image_names(const ExperimentConfig& c, bool sweep);

std::vector<std::string> write_images(const std::string& folder, const ExperimentConfig& config,
                                      const ExperimentResult& result);
std::string write_sweep_plot(const std::string& folder, const std::vector<SweepRow>& rows);

nlohmann::json config_json(const ExperimentConfig& config);
nlohmann::json report_json(const ExperimentConfig& config, const ExperimentResult& result);
nlohmann::json sweep_json(const std::vector<SweepRow>& rows);

}  // namespace headspec
