// Start-up agreement between the ranks of a train_lm job.
#include "mpi_sharing.hpp"

#include "xgrad/core/error.hpp"

namespace lm {

void MpiSharing::check_agreement(const nlohmann::json& settings) {
  std::string reference = settings.dump();
  group_.broadcast(reference, 0);
  const nlohmann::json theirs = nlohmann::json::parse(reference);
  std::string differ;
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const nlohmann::json other = theirs.contains(it.key()) ? theirs.at(it.key()) : nlohmann::json();
    if (other != it.value()) differ += (differ.empty() ? "" : ", ") + it.key() + " " + other.dump() + " on rank 0, " + it.value().dump() + " here";
  }
  // The lowest rank that differs, or size() when all agree.
  const auto first = static_cast<int>(group_.allreduce_min(differ.empty() ? static_cast<std::uint64_t>(group_.size())
                                                                         : static_cast<std::uint64_t>(group_.rank())));
  if (first == group_.size()) return;
  if (!differ.empty()) xgrad::fail("train_lm: rank ", group_.rank(), " was started with other settings than rank 0: ", differ);
  xgrad::fail("train_lm: rank ", first, " was started with other settings than rank 0 (its message names them)");
}

}  // namespace lm
