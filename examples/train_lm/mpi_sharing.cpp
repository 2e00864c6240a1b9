// Start-up agreement between the ranks of a train_lm job.
#include "mpi_sharing.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace lm {

namespace {

std::string shown(const nlohmann::json& v) {
  if (v.is_null()) return "not given";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

void MpiSharing::check_agreement(const nlohmann::json& settings) {
  std::string reference = settings.dump();
  group_.broadcast(reference, 0);
  const nlohmann::json theirs = nlohmann::json::parse(reference);
  std::string differ;
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    const nlohmann::json other = theirs.contains(it.key()) ? theirs.at(it.key()) : nlohmann::json();
    if (other != it.value())
      differ +=
          (differ.empty() ? "" : ", ") + it.key() + " " + shown(other) + " on rank 0, " + shown(it.value()) + " here";
  }
  // The lowest rank that differs, or size() when all agree.
  const auto first = static_cast<int>(group_.allreduce_min(differ.empty() ? static_cast<std::uint64_t>(group_.size())
                                                                          : static_cast<std::uint64_t>(group_.rank())));
  if (first == group_.size()) return;
  // Every rank fails with the first differing rank's list: whichever rank's message reaches the
  // terminal before the job is aborted names the settings.
  group_.broadcast(differ, first);
  xgrad::fail("train_lm: rank ", first, " was started with other settings than rank 0: ", differ);
}

void MpiSharing::check_command_line(const CLI::App& app, const std::set<std::string>& per_process) {
  nlohmann::json given = nlohmann::json::object();
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || per_process.count(name)) continue;
    std::string value;
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : " ") + r;
    if (opt->count() > 0) {
      given[name] = utf8_or_escaped(value);
    } else if (!opt->get_default_str().empty()) {
      given[name] = opt->get_default_str();
    } else {
      given[name] = nullptr;
    }
  }
  check_agreement(given);
}

std::string utf8_or_escaped(const std::string& s) { return xgrad::first_invalid_utf8(s) ? xgrad::escape_bytes(s) : s; }

}  // namespace lm
