// Optimizer bookkeeping: stepping over parameters, state dictionaries.
#include "xgrad/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::optim {

void check_range(const char* who, const char* what, double value, double low, double high, bool high_open) {
  const bool ok = std::isfinite(value) && value >= low && (high_open ? value < high : value <= high);
  if (!ok) fail(who, ": ", what, " ", value, " is outside [", low, ", ", high, high_open ? ")" : "]");
}

namespace {
// "<type>:parameters": how many parameters the state's optimizer had (not a hyperparameter).
constexpr const char* kParameterCount = "parameters";

NamedTensors number(const std::vector<Tensor>& params) {
  NamedTensors named;
  for (std::size_t i = 0; i < params.size(); ++i) named.emplace_back(std::to_string(i), params[i]);
  return named;
}
}  // namespace

Optimizer::Optimizer(NamedTensors params, float lr, std::vector<std::string> slots, const char* who)
    : who_(who), params_(std::move(params)), state_(params_.size()), slot_names_(std::move(slots)) {
  if (params_.empty()) fail(who, ": no parameters to optimize");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    check_utf8(name, who, "parameter name");
    if (name.find(':') != std::string::npos) {
      fail(who, ": parameter name '", name, "' holds ':', which state_dict keeps for the hyperparameters (\"", who,
           ":lr\")");
    }
    if (!p.defined()) fail(who, ": parameter '", name, "' is undefined");
    if (!p.is_leaf() || !p.requires_grad()) fail(who, ": parameter '", name, "' must be a leaf that requires grad");
    for (std::size_t j = 0; j < i; ++j) {
      // The same tensor twice would be updated twice per step; one name twice breaks state_dict.
      if (params_[j].second.is_same(p))
        fail(who, ": parameter '", name, "' is the same tensor as '", params_[j].first, "'");
      if (params_[j].first == name)
        fail(who, ": two parameters are named '", name, "' (a name may appear only once, not twice)");
    }
  }
  set_lr(lr);
}

void Optimizer::check_slot(const std::string& key, std::size_t, const Array& value) const {
  for (float v : value) {
    if (!std::isfinite(v)) fail(who_, ": state '", key, "' holds ", v, "; optimizer state must be finite");
  }
}

Optimizer::Optimizer(const std::vector<Tensor>& params, float lr, std::vector<std::string> slots, const char* who)
    : Optimizer(number(params), lr, std::move(slots), who) {}

void Optimizer::set_lr(float lr) {
  if (!(std::isfinite(lr) && lr >= 0.f)) fail(who_, ": learning rate ", lr, " must be finite and >= 0");
  lr_ = lr;
}

void Optimizer::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].second;
    if (!p.has_grad()) continue;
    ParamState& s = state_[i];
    if (s.slots.empty()) {
      for (std::size_t k = 0; k < slot_names_.size(); ++k) s.slots.push_back(xt::zeros<float>(p.shape()));
    }
    ++s.step;
    update(p.mutable_value(), p.grad(), s);
  }
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

void Optimizer::set_hyperparameters(const std::map<std::string, float>& values) { set_lr(values.at("lr")); }

NamedArrays Optimizer::state_dict() const {
  NamedArrays out;
  for (const auto& [name, v] : hyperparameters()) out.emplace_back(std::string(who_) + ":" + name, Array(v));
  out.emplace_back(std::string(who_) + ":" + kParameterCount, Array(static_cast<float>(params_.size())));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.step == 0) continue;
    out.emplace_back(params_[i].first + ".step", Array(static_cast<float>(s.step)));
    for (std::size_t k = 0; k < slot_names_.size(); ++k)
      out.emplace_back(params_[i].first + "." + slot_names_[k], s.slots[k]);
  }
  return out;
}

void Optimizer::load_state_dict(const NamedArrays& state) {
  // Hyperparameters first: "<type>:<name>", which no parameter name can spell.
  std::map<std::string, float> hyper;
  std::set<std::string> known;
  for (const auto& [name, v] : hyperparameters()) known.insert(name);
  std::string foreign;
  std::optional<float> saved_count;
  for (const auto& [key, value] : state) {
    const std::size_t colon = key.find(':');
    if (colon == std::string::npos) continue;
    const std::string type = key.substr(0, colon), name = key.substr(colon + 1);
    if (type != who_) {
      if (foreign.empty()) foreign = "'" + type + "' (entry '" + key + "')";
      continue;
    }
    if (name == kParameterCount) {
      if (saved_count) fail(who_, ": state entry '", key, "' appears twice");
      if (value.size() != 1)
        fail(who_, ": state entry '", key, "' is not one count (shape ", shape_str(value.shape()), ")");
      saved_count = value.data()[0];
      continue;
    }
    if (!known.count(name)) fail(who_, ": unexpected hyperparameter '", key, "' (", who_, " has no ", name, ")");
    if (value.size() != 1 || !std::isfinite(value.data()[0])) {
      fail(who_, ": hyperparameter '", key, "' is not one finite value (shape ", shape_str(value.shape()), ")");
    }
    if (!hyper.emplace(name, value.data()[0]).second) fail(who_, ": state entry '", key, "' appears twice");
  }
  if (!foreign.empty()) {
    fail(who_, ": the state was saved by another optimizer type, ", foreign, ", not ", who_);
  }
  // A state of fewer parameters would otherwise load as if the rest had never been updated (the
  // entries of a parameter appear after its first update only), as torch.optim refuses it too.
  if (saved_count && *saved_count != static_cast<float>(params_.size())) {
    fail(who_, ": the state was saved by an optimizer of ", *saved_count, " parameters ('", who_, ":", kParameterCount,
         "'); this one has ", params_.size());
  }
  if (!hyper.empty() && hyper.size() != known.size()) {
    for (const auto& name : known) {
      if (!hyper.count(name)) fail(who_, ": the state's hyperparameters are incomplete: no '", who_, ":", name, "'");
    }
  }
  std::vector<ParamState> fresh(params_.size());
  // seen[i][k] for slot k, seen[i][slots] for the step: each entry exactly once.
  std::vector<std::vector<bool>> seen(params_.size(), std::vector<bool>(slot_names_.size() + 1, false));
  auto mark = [&](std::size_t i, std::size_t k, const std::string& key) {
    if (seen[i][k]) fail(who_, ": state entry '", key, "' appears twice");
    seen[i][k] = true;
  };
  for (const auto& [key, value] : state) {
    if (key.find(':') != std::string::npos) continue;  // a hyperparameter, read above
    bool matched = false;
    for (std::size_t i = 0; i < params_.size() && !matched; ++i) {
      const std::string& pname = params_[i].first;
      if (key.size() <= pname.size() + 1 || key.compare(0, pname.size(), pname) != 0 || key[pname.size()] != '.')
        continue;
      const std::string slot = key.substr(pname.size() + 1);
      ParamState& s = fresh[i];
      if (slot == "step") {
        // Step counts are stored as float32, exact up to 2^24.
        const float v = value.size() == 1 ? value.data()[0] : -1.f;
        if (!(v >= 1.f && v <= 16777216.f) || v != std::floor(v)) {
          fail(who_, ": state '", key, "' is not a positive step count (an integer up to 2^24)");
        }
        mark(i, slot_names_.size(), key);
        s.step = static_cast<std::size_t>(v);
        matched = true;
        continue;
      }
      for (std::size_t k = 0; k < slot_names_.size(); ++k) {
        if (slot != slot_names_[k]) continue;
        if (value.shape() != params_[i].second.shape()) {
          fail(who_, ": state '", key, "' has shape ", shape_str(value.shape()), " but the parameter has ",
               shape_str(params_[i].second.shape()));
        }
        mark(i, k, key);
        check_slot(key, k, value);
        if (s.slots.empty()) s.slots.resize(slot_names_.size());
        s.slots[k] = value;
        matched = true;
      }
    }
    if (!matched) fail(who_, ": unexpected state entry '", key, "'");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto present = static_cast<std::size_t>(std::count(seen[i].begin(), seen[i].end(), true));
    if (present != 0 && present != seen[i].size()) {
      fail(who_, ": incomplete state for parameter '", params_[i].first, "' (", present, " of ", seen[i].size(),
           " entries)");
    }
  }
  if (!hyper.empty()) {
    try {
      set_hyperparameters(hyper);  // the last check: it throws before changing anything
    } catch (const Error& e) {
      fail(who_, ": the state's hyperparameters are invalid (", e.what(), ")");
    }
  } else if (!state.empty()) {
    std::string kept;
    for (const auto& [name, v] : hyperparameters()) {
      char value[32];
      std::snprintf(value, sizeof value, "%g", static_cast<double>(v));
      kept += (kept.empty() ? "" : ", ") + name + " " + value;
    }
    std::fprintf(stderr,
                 "xgrad: %s::load_state_dict: the state holds no hyperparameters (saved before xgrad stored them); "
                 "keeping this optimizer's %s\n",
                 who_, kept.c_str());
  }
  state_ = std::move(fresh);
}

}  // namespace xgrad::optim
