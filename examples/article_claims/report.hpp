// The tables the article_claims program prints, as text, and its JSON report.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "configs.hpp"
#include "heads.hpp"

namespace claims {

std::string parameter_table(const std::vector<ConfigReport>& rows);
std::string flop_share_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& options);
std::string memory_share_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& options);
std::string step_time_table(const std::vector<ConfigReport>& rows, const ConfigsOptions& options);

// One row per run, then (with several seeds) the means per head count.
std::string heads_table(const std::vector<HeadsRun>& runs, const HeadsConfig& config);

nlohmann::json configs_json(const std::vector<ConfigReport>& rows, const ConfigsOptions& options);
nlohmann::json heads_json(const std::vector<HeadsRun>& runs, const HeadsConfig& config);

}  // namespace claims
