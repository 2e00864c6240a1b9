// Optimizer bookkeeping: parameter groups, stepping over parameters, state dictionaries.
#include "xgrad/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>

#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::optim {

std::size_t Optimizer::state_bytes() const {
  std::size_t total = 0;
  for (const ParamState& st : state_) {
    for (const Array& slot : st.slots) total += slot.size() * sizeof(float);
  }
  return total;
}

void check_range(const char* who, const char* what, double value, double low, double high, bool high_open) {
  const bool ok = std::isfinite(value) && value >= low && (high_open ? value < high : value <= high);
  if (!ok) fail(who, ": ", what, " ", value, " is outside [", low, ", ", high, high_open ? ")" : "]");
}

ParamGroup& ParamGroup::set(const std::string& name, float value) {
  for (auto& [n, v] : overrides_) {
    if (n == name) {
      v = value;
      return *this;
    }
  }
  overrides_.emplace_back(name, value);
  return *this;
}

std::vector<ParamGroup> decay_groups(NamedTensors decay, NamedTensors no_decay, float weight_decay) {
  std::vector<ParamGroup> groups;
  if (!decay.empty()) groups.push_back(ParamGroup(std::move(decay)).weight_decay(weight_decay));
  if (!no_decay.empty()) groups.push_back(ParamGroup(std::move(no_decay)).weight_decay(0.f));
  return groups;
}

std::vector<ParamGroup> decay_groups(std::pair<NamedTensors, NamedTensors> split, float weight_decay) {
  return decay_groups(std::move(split.first), std::move(split.second), weight_decay);
}

namespace {
// "<type>:parameters": how many parameters the state's optimizer had (not a hyperparameter);
// "<type>:groups" how many groups; "<type>:group<g>:<name>" group g's hyperparameters;
// "<type>:group_of:<param>" the group of a parameter.
constexpr const char* kParameterCount = "parameters";
constexpr const char* kGroupCount = "groups";
constexpr const char* kGroupOf = "group_of:";
constexpr const char* kLrFactor = "lr_factor";

NamedTensors number(const std::vector<Tensor>& params) {
  NamedTensors named;
  for (std::size_t i = 0; i < params.size(); ++i) named.emplace_back(std::to_string(i), params[i]);
  return named;
}

std::vector<ParamGroup> one_group(NamedTensors params) { return {ParamGroup(std::move(params))}; }

std::string group_who(const char* who, std::size_t g) { return std::string(who) + ": group " + std::to_string(g); }

// "group<digits>:<name>" -> (g, name); nothing for any other text. Digits without a leading 0.
std::optional<std::pair<std::size_t, std::string>> parse_group_key(const std::string& rest) {
  if (rest.compare(0, 5, "group") != 0) return std::nullopt;
  std::size_t i = 5, g = 0;
  while (i < rest.size() && rest[i] >= '0' && rest[i] <= '9' && i < 5 + 9) g = g * 10 + (rest[i++] - '0');
  if (i == 5 || i >= rest.size() || rest[i] != ':' || (rest[5] == '0' && i > 6)) return std::nullopt;
  return std::make_pair(g, rest.substr(i + 1));
}

// A count stored as one float: a whole number in [0, 2^24].
std::optional<std::size_t> as_count(const Array& value) {
  if (value.size() != 1) return std::nullopt;
  const float v = value.data()[0];
  if (!(v >= 0.f && v <= 16777216.f) || v != std::floor(v)) return std::nullopt;
  return static_cast<std::size_t>(v);
}
}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, float lr, std::vector<std::string> slots, const char* who)
    : who_(who), slot_names_(std::move(slots)) {
  if (groups.empty()) fail(who, ": no parameter groups to optimize");
  std::vector<std::size_t> group_of;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].params().empty()) {
      fail(who,
           groups.size() == 1 ? ": no parameters to optimize" : ": group " + std::to_string(g) + " has no parameters");
    }
    Group range;
    range.begin = params_.size();
    for (const auto& np : groups[g].params()) {
      params_.push_back(np);
      group_of.push_back(g);
    }
    range.end = params_.size();
    groups_.push_back(range);
    overrides_.push_back(groups[g].overrides());
  }
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
      const std::string& other = params_[j].first;
      const std::size_t gi = group_of[i], gj = group_of[j];
      // The same tensor twice would be updated twice per step; one name twice breaks state_dict.
      if (params_[j].second.is_same(p)) {
        if (gi == gj) fail(who, ": parameter '", name, "' is the same tensor as '", other, "'");
        if (other == name)
          fail(who, ": parameter '", name, "' is in group ", gj, " and in group ", gi,
               " (a parameter belongs to one group)");
        fail(who, ": parameter '", name, "' of group ", gi, " is the same tensor as '", other, "' of group ", gj,
             " (a parameter belongs to one group)");
      }
      if (other == name) {
        if (gi == gj) fail(who, ": two parameters are named '", name, "' (a name may appear only once, not twice)");
        fail(who, ": two parameters are named '", name, "', in group ", gj, " and in group ", gi,
             " (a name may appear only once)");
      }
    }
  }
  state_.resize(params_.size());
  set_lr(lr);
}

Optimizer::Optimizer(NamedTensors params, float lr, std::vector<std::string> slots, const char* who)
    : Optimizer(one_group(std::move(params)), lr, std::move(slots), who) {}

Optimizer::Optimizer(const std::vector<Tensor>& params, float lr, std::vector<std::string> slots, const char* who)
    : Optimizer(number(params), lr, std::move(slots), who) {}

void Optimizer::init_groups() {
  const Hyperparameters base = hyperparameters();
  const std::map<std::string, float> options(base.begin(), base.end());
  std::vector<std::map<std::string, float>> resolved(groups_.size(), options);
  std::vector<float> factors(groups_.size(), 1.f);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::string who = group_who(who_, g);
    for (const auto& [name, v] : overrides_[g]) {
      if (!options.count(name)) {
        std::string names;
        for (const auto& [n, x] : base) names += (names.empty() ? "" : ", ") + n;
        fail(who, " sets ", name, ", which ", who_, " does not have (it has ", names, ")");
      }
      resolved[g][name] = v;
      if (name != "lr") continue;
      if (!(std::isfinite(v) && v >= 0.f)) fail(who, ": learning rate ", v, " must be finite and >= 0");
      if (v > 0.f && lr_ == 0.f) {
        fail(who, ": learning rate ", v, " cannot be a multiple of the optimizer's learning rate 0 (set_lr scales ",
             "every group's rate by its factor, the group's rate over the optimizer's)");
      }
      factors[g] = v == 0.f ? 0.f : v / lr_;
      check_factor(who, v, factors[g]);
    }
    check_hyperparameters(resolved[g], who);
  }
  adopt_hyperparameters(options, resolved);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = resolved[g].at("lr");
    groups_[g].lr_factor = factors[g];
  }
  overrides_.clear();
}

const Optimizer::Group& Optimizer::group(std::size_t g) const {
  if (g >= groups_.size()) fail(who_, ": there is no group ", g, " (the optimizer has ", groups_.size(), ")");
  return groups_[g];
}

NamedTensors Optimizer::group_params(std::size_t g) const {
  const Group& r = group(g);
  return NamedTensors(params_.begin() + static_cast<std::ptrdiff_t>(r.begin),
                      params_.begin() + static_cast<std::ptrdiff_t>(r.end));
}

void Optimizer::check_slot(const std::string& key, std::size_t, const Array& value) const {
  for (float v : value) {
    if (!std::isfinite(v)) fail(who_, ": state '", key, "' holds ", v, "; optimizer state must be finite");
  }
}

void Optimizer::set_lr(float lr) {
  if (!(std::isfinite(lr) && lr >= 0.f)) fail(who_, ": learning rate ", lr, " must be finite and >= 0");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!std::isfinite(lr * groups_[g].lr_factor)) {
      fail(group_who(who_, g), ": learning rate ", lr, " times the group's factor ", groups_[g].lr_factor, " is ",
           lr * groups_[g].lr_factor, ", past float32");
    }
  }
  lr_ = lr;
  for (Group& g : groups_) g.lr = lr * g.lr_factor;  // exactly lr for the factor 1
}

void Optimizer::set_group_lr(std::size_t g, float lr) {
  group(g);
  const std::string who = group_who(who_, g);
  if (!(std::isfinite(lr) && lr >= 0.f)) fail(who, ": learning rate ", lr, " must be finite and >= 0");
  if (lr > 0.f && lr_ == 0.f) {
    fail(who, ": learning rate ", lr, " cannot be a multiple of the optimizer's learning rate 0 (set_lr scales ",
         "every group's rate by its factor, the group's rate over the optimizer's)");
  }
  const float factor = lr == 0.f ? 0.f : lr / lr_;
  check_factor(who, lr, factor);
  groups_[g].lr = lr;
  groups_[g].lr_factor = factor;
}

// A factor load_state_dict would refuse (or an infinite one) is refused when it is made.
void Optimizer::check_factor(const std::string& who, float lr, float factor) const {
  if (!(factor <= 1e30f)) {
    fail(who, ": learning rate ", lr, " over the optimizer's ", lr_, " is a factor past 1e30 (", factor, ")");
  }
}

void Optimizer::step() {
  // Parameters stay fp32 and are updated in fp32; a step inside a bf16 scope is a misplaced guard.
  if (autocast_precision() == Precision::bf16) {
    fail("Optimizer::step: called inside a bf16 AutocastGuard; close the guard after backward and before the step");
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t i = groups_[g].begin; i < groups_[g].end; ++i) {
      Tensor& p = params_[i].second;
      if (!p.has_grad()) continue;
      ParamState& s = state_[i];
      if (s.slots.empty()) {
        for (std::size_t k = 0; k < slot_names_.size(); ++k) s.slots.push_back(xt::zeros<float>(p.shape()));
      }
      ++s.step;
      update(p.mutable_value(), p.grad(), s, g);
    }
  }
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

bool Optimizer::writes_groups() const {
  return groups_.size() > 1 || groups_[0].lr_factor != 1.f || group_hyperparameters(0) != hyperparameters();
}

NamedArrays Optimizer::state_dict() const {
  const std::string type = std::string(who_) + ":";
  NamedArrays out;
  for (const auto& [name, v] : hyperparameters()) out.emplace_back(type + name, Array(v));
  out.emplace_back(type + kParameterCount, Array(static_cast<float>(params_.size())));
  if (writes_groups()) {
    out.emplace_back(type + kGroupCount, Array(static_cast<float>(groups_.size())));
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const std::string prefix = type + "group" + std::to_string(g) + ":";
      for (const auto& [name, v] : group_hyperparameters(g)) out.emplace_back(prefix + name, Array(v));
      out.emplace_back(prefix + kLrFactor, Array(groups_[g].lr_factor));
    }
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      for (std::size_t i = groups_[g].begin; i < groups_[g].end; ++i)
        out.emplace_back(type + kGroupOf + params_[i].first, Array(static_cast<float>(g)));
    }
  }
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
  // Hyperparameters and groups first: "<type>:<name>", which no parameter name can spell.
  std::map<std::string, float> hyper;
  std::map<std::size_t, std::map<std::string, float>> group_hyper;
  std::map<std::string, std::size_t> saved_group_of;
  std::string first_group_key;  // a group entry, to name when the state has no group count
  std::set<std::string> known;
  for (const auto& [name, v] : hyperparameters()) known.insert(name);
  std::string foreign;
  std::optional<float> saved_count;
  std::optional<std::size_t> saved_groups;
  auto once = [&](bool fresh, const std::string& key) {
    if (!fresh) fail(who_, ": state entry '", key, "' appears twice");
  };
  auto one_value = [&](const std::string& key, const Array& value) {
    if (value.size() != 1 || !std::isfinite(value.data()[0])) {
      fail(who_, ": hyperparameter '", key, "' is not one finite value (shape ", shape_str(value.shape()), ")");
    }
    return value.data()[0];
  };
  for (const auto& [key, value] : state) {
    const std::size_t colon = key.find(':');
    if (colon == std::string::npos) continue;
    const std::string type = key.substr(0, colon), name = key.substr(colon + 1);
    if (type != who_) {
      if (foreign.empty()) foreign = "'" + type + "' (entry '" + key + "')";
      continue;
    }
    if (name == kParameterCount) {
      once(!saved_count, key);
      if (value.size() != 1)
        fail(who_, ": state entry '", key, "' is not one count (shape ", shape_str(value.shape()), ")");
      saved_count = value.data()[0];
      continue;
    }
    if (name == kGroupCount) {
      once(!saved_groups, key);
      const auto n = as_count(value);
      if (!n || *n == 0) fail(who_, ": state entry '", key, "' is not a count of groups (one whole number >= 1)");
      saved_groups = *n;
      continue;
    }
    if (name.compare(0, std::char_traits<char>::length(kGroupOf), kGroupOf) == 0) {
      const std::string param = name.substr(std::char_traits<char>::length(kGroupOf));
      const auto g = as_count(value);
      if (!g) fail(who_, ": state entry '", key, "' is not a group index (one whole number >= 0)");
      once(saved_group_of.emplace(param, *g).second, key);
      if (first_group_key.empty()) first_group_key = key;
      continue;
    }
    if (const auto parsed = parse_group_key(name)) {
      const auto& [g, hname] = *parsed;
      if (!known.count(hname) && hname != kLrFactor)
        fail(who_, ": unexpected hyperparameter '", key, "' (", who_, " has no ", hname, ")");
      once(group_hyper[g].emplace(hname, one_value(key, value)).second, key);
      if (first_group_key.empty()) first_group_key = key;
      continue;
    }
    if (!known.count(name)) fail(who_, ": unexpected hyperparameter '", key, "' (", who_, " has no ", name, ")");
    once(hyper.emplace(name, one_value(key, value)).second, key);
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
  auto require_complete = [&](const std::map<std::string, float>& got, const std::string& prefix, bool factor) {
    for (const auto& name : known) {
      if (!got.count(name)) fail(who_, ": the state's hyperparameters are incomplete: no '", prefix, name, "'");
    }
    if (factor && !got.count(kLrFactor))
      fail(who_, ": the state's hyperparameters are incomplete: no '", prefix, kLrFactor, "'");
  };
  if (!hyper.empty() && hyper.size() != known.size()) require_complete(hyper, std::string(who_) + ":", false);
  const std::string type = std::string(who_) + ":";
  if (saved_groups) {
    if (*saved_groups != groups_.size()) {
      fail(who_, ": the state has ", *saved_groups, " parameter groups ('", type, kGroupCount,
           "'); this optimizer has ", groups_.size());
    }
    require_complete(hyper, type, false);
    for (const auto& [g, values] : group_hyper) {
      if (g >= groups_.size()) {
        fail(who_, ": the state holds hyperparameters of group ", g, " ('", type, "group", g, ":",
             values.begin()->first, "'), but it has ", groups_.size(), " groups");
      }
    }
    for (std::size_t g = 0; g < groups_.size(); ++g)
      require_complete(group_hyper[g], type + "group" + std::to_string(g) + ":", true);
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      for (std::size_t i = groups_[g].begin; i < groups_[g].end; ++i) {
        const std::string& pname = params_[i].first;
        const auto it = saved_group_of.find(pname);
        if (it == saved_group_of.end()) {
          fail(who_, ": the state names no group for parameter '", pname, "' (no '", type, kGroupOf, pname, "')");
        }
        if (it->second != g) {
          fail(who_, ": the state puts parameter '", pname, "' in group ", it->second,
               "; this optimizer has it in group ", g);
        }
      }
    }
    for (const auto& [pname, g] : saved_group_of) {
      const bool ours = std::any_of(params_.begin(), params_.end(), [&](const auto& np) { return np.first == pname; });
      if (!ours) {
        fail(who_, ": the state puts parameter '", pname, "' in group ", g, ", but this optimizer has no parameter '",
             pname, "'");
      }
    }
  } else {
    if (!first_group_key.empty()) {
      fail(who_, ": state entry '", first_group_key, "' belongs to parameter groups, but the state has no '", type,
           kGroupCount, "'");
    }
    if (!hyper.empty() && groups_.size() != 1) {
      fail(who_, ": the state holds one parameter group (no '", type, kGroupCount, "'); this optimizer has ",
           groups_.size());
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
    if (key.find(':') != std::string::npos) continue;  // a hyperparameter or group entry, read above
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
    // The last checks: they throw before anything changes.
    std::vector<std::map<std::string, float>> groups(groups_.size(), hyper);
    std::vector<float> factors(groups_.size(), 1.f);
    try {
      check_range(who_, "lr", hyper.at("lr"), 0.0, 1e30);
      check_hyperparameters(hyper, who_);
      if (saved_groups) {
        for (std::size_t g = 0; g < groups_.size(); ++g) {
          const std::string who = group_who(who_, g);
          factors[g] = group_hyper[g].at(kLrFactor);
          check_range(who.c_str(), "lr_factor", factors[g], 0.0, 1e30);
          group_hyper[g].erase(kLrFactor);
          groups[g] = group_hyper[g];
          check_range(who.c_str(), "lr", groups[g].at("lr"), 0.0, 1e30);
          check_hyperparameters(groups[g], who);
        }
      }
    } catch (const Error& e) {
      fail(who_, ": the state's hyperparameters are invalid (", e.what(), ")");
    }
    adopt_hyperparameters(hyper, groups);
    lr_ = hyper.at("lr");
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      groups_[g].lr = groups[g].at("lr");
      groups_[g].lr_factor = factors[g];
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
