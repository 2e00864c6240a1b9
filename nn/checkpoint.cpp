// Module state dictionaries and checkpoint files.
#include "xgrad/nn/checkpoint.hpp"

#include <cmath>
#include <map>

#include "xgrad/core/error.hpp"

namespace xgrad::nn {

namespace {
const std::string kOptimizerPrefix = "optimizer.";
}

NamedArrays state_dict(const Module& module) {
  NamedArrays out;
  for (const auto& [name, p] : module.named_parameters()) out.emplace_back(name, p.value());
  return out;
}

void load_state_dict(Module& module, const NamedArrays& state, const LoadOptions& options) {
  NamedTensors params = module.named_parameters();
  std::map<std::string, const Array*> given;
  for (const auto& [name, a] : state) {
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
  try {
    load_state_dict(module, model, options);
  } catch (const Error& e) {
    fail("load_checkpoint: '", path, "': ", e.what());
  }
  out.metadata = std::move(file.metadata);
  return out;
}

}  // namespace xgrad::nn
