// Module state dictionaries and checkpoint files.
#include "xgrad/nn/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "xgrad/core/error.hpp"

namespace xgrad::nn {

namespace {
const std::string kOptimizerPrefix = "optimizer.";

// Names from before a TransformerBlock's feed-forward sublayer owned its norm:
// "blocks.<i>.ffn_norm.<p>" is now "blocks.<i>.ffn.norm.<p>". Returns the current name, or the
// name unchanged.
std::string current_name(const std::string& name) {
  const std::string old_part = "ffn_norm.", new_part = "ffn.norm.";
  const std::size_t at = name.find(old_part);
  if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) return name;
  return name.substr(0, at) + new_part + name.substr(at + old_part.size());
}

// Renames old entries whose current name the module expects (and the state does not hold
// under that name already); returns how many.
template <class IsExpected>
std::size_t rename_old_entries(NamedArrays& state, IsExpected is_expected) {
  std::set<std::string> names;
  for (const auto& [name, a] : state) names.insert(name);
  std::size_t renamed = 0;
  for (auto& [name, a] : state) {
    const std::string now = current_name(name);
    if (now == name || names.count(now) || !is_expected(now)) continue;
    name = now;
    ++renamed;
  }
  return renamed;
}

std::size_t rename_old_parameters(const Module& module, NamedArrays& state) {
  std::set<std::string> params;
  for (const auto& [name, p] : module.named_parameters()) params.insert(name);
  return rename_old_entries(state, [&](const std::string& n) { return params.count(n) != 0; });
}

void say_renamed(const std::string& who, std::size_t renamed) {
  if (!renamed) return;
  std::fprintf(stderr,
               "xgrad: %s: %zu tensor(s) use the names from before the rename of blocks.N.ffn_norm to "
               "blocks.N.ffn.norm; loaded under the new names (save again to update the file)\n",
               who.c_str(), renamed);
}
}  // namespace

NamedArrays state_dict(const Module& module) {
  NamedArrays out;
  for (const auto& [name, p] : module.named_parameters()) out.emplace_back(name, p.value());
  return out;
}

void load_state_dict(Module& module, const NamedArrays& state_in, const LoadOptions& options) {
  NamedTensors params = module.named_parameters();
  // Only a state with old names is copied (to rename it); others are read in place.
  NamedArrays renamed;
  const bool old_names = std::any_of(state_in.begin(), state_in.end(), [](const auto& e) { return current_name(e.first) != e.first; });
  if (old_names) {
    renamed = state_in;
    say_renamed("load_state_dict", rename_old_parameters(module, renamed));
  }
  std::map<std::string, const Array*> given;
  for (const auto& [name, a] : old_names ? renamed : state_in) {
    if (!given.emplace(name, &a).second) fail("load_state_dict: '", name, "' appears twice");
  }
  for (const auto& [name, p] : params) {
    auto it = given.find(name);
    if (it == given.end()) fail("load_state_dict: missing parameter '", name, "'");
    if (it->second->shape() != p.shape()) {
      fail("load_state_dict: parameter '", name, "' has shape ", shape_str(it->second->shape()), " in the state but ",
           shape_str(p.shape()), " in the module");
    }
  }
  if (given.size() != params.size()) {
    for (const auto& [name, a] : given) {
      bool known = false;
      for (const auto& [pn, p] : params) known = known || pn == name;
      if (!known) fail("load_state_dict: unexpected entry '", name, "' (the module has no such parameter)");
    }
  }
  if (!options.allow_non_finite()) {
    for (const auto& [name, p] : params) {
      const Array& a = *given.at(name);
      const float* v = a.data();
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(v[i])) {
          fail("load_state_dict: parameter '", name, "' holds ", v[i], " at flat position ", i, " of ", a.size(),
               "; refusing non-finite weights (LoadOptions().allow_non_finite(true) loads them)");
        }
      }
    }
  }
  for (auto& [name, p] : params) p.mutable_value() = *given.at(name);
}

void save_checkpoint(const std::string& path, const Module& module, const NamedArrays& optimizer_state,
                     const Metadata& metadata) {
  NamedArrays all = state_dict(module);
  for (const auto& [name, a] : optimizer_state) all.emplace_back(kOptimizerPrefix + name, a);
  save_safetensors(path, all, metadata);
}

Checkpoint load_checkpoint(const std::string& path, Module& module, const LoadOptions& options) {
  SafetensorsContents file = load_safetensors(path);
  NamedArrays model;
  Checkpoint out;
  for (auto& [name, a] : file.tensors) {
    if (name.compare(0, kOptimizerPrefix.size(), kOptimizerPrefix) == 0) {
      out.optimizer_state.emplace_back(name.substr(kOptimizerPrefix.size()), std::move(a));
    } else {
      model.emplace_back(name, std::move(a));
    }
  }
  // Optimizer entries are "<parameter>.<slot>".
  std::set<std::string> params;
  for (const auto& [name, p] : module.named_parameters()) params.insert(name);
  say_renamed("load_checkpoint: '" + path + "'",
              rename_old_parameters(module, model) + rename_old_entries(out.optimizer_state, [&](const std::string& key) {
                const std::size_t dot = key.rfind('.');
                return dot != std::string::npos && params.count(key.substr(0, dot)) != 0;
              }));
  try {
    load_state_dict(module, model, options);
  } catch (const Error& e) {
    fail("load_checkpoint: '", path, "': ", e.what());
  }
  out.metadata = std::move(file.metadata);
  return out;
}

}  // namespace xgrad::nn
