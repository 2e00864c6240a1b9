// train_lm across the ranks of an MPI job: each rank trains on its share of every batch, and
// DataParallel averages the gradients during backward. Built only when xgrad::distributed is.
#pragma once

#include <memory>
#include <set>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "trainer.hpp"
#include "xgrad/distributed/data_parallel.hpp"

namespace lm {

// `s` as a JSON string can hold it: as it is when it is UTF-8, else with its bytes escaped
// (xgrad::escape_bytes), so that a file name that is not UTF-8 can be compared between ranks.
std::string utf8_or_escaped(const std::string& s);

class MpiSharing : public Sharing {
 public:
  explicit MpiSharing(xgrad::distributed::ProcessGroup& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  double mean(double v) override { return group_.allreduce_sum(v) / group_.size(); }
  void wrap(xgrad::nn::Module& model) override {
    parallel_ = std::make_unique<xgrad::distributed::DataParallel>(model, group_);
  }

  // Throws on every rank when a rank's settings differ from rank 0's: the rank that differs names
  // each differing key with both values, the others say which rank differs.
  void check_agreement(const nlohmann::json& settings);
  // The same for the whole command line, before anything else runs: every option as given (or
  // its default), but those in `per_process`, which change only this process's own work. An
  // option that picks another path (--sample on one rank) would otherwise leave the other ranks
  // waiting in collectives this one never makes.
  void check_command_line(const CLI::App& app, const std::set<std::string>& per_process);

  const xgrad::distributed::DataParallel* data_parallel() const { return parallel_.get(); }

 private:
  xgrad::distributed::ProcessGroup& group_;
  std::unique_ptr<xgrad::distributed::DataParallel> parallel_;
};

}  // namespace lm
