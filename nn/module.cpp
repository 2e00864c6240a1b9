// Module bookkeeping: registration, dotted names, train/eval, the printed summary.
#include "xgrad/nn/module.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "xgrad/core/error.hpp"
#include "xgrad/nn/probe.hpp"

namespace xgrad::nn {

namespace {
void check_name(const std::string& name, const char* who) {
  if (name.empty() || name.find('.') != std::string::npos) {
    fail(who, ": name '", name, "' must be non-empty and contain no '.'");
  }
}
}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name, "Module::register_parameter");
  if (!t.defined()) fail("Module::register_parameter: parameter '", name, "' is undefined");
  if (!t.is_leaf()) fail("Module::register_parameter: parameter '", name, "' must be a leaf tensor");
  for (const auto& [n, p] : params_) {
    if (n == name) fail("Module::register_parameter: '", name, "' is already registered");
  }
  t.set_requires_grad(true);
  if (t.name().empty()) t.set_name(name);
  params_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name, "Module::register_module");
  if (!m) fail("Module::register_module: module '", name, "' is null");
  for (const auto& [n, c] : children_) {
    if (n == name) fail("Module::register_module: '", name, "' is already registered");
  }
  m->train(training_);
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [n, p] : params_) out.emplace_back(prefix + n, p);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

Tensor Module::parameter(const std::string& path) const {
  for (auto& [n, p] : named_parameters()) {
    if (n == path) return p;
  }
  fail("Module::parameter: no parameter named '", path, "'");
}

std::size_t Module::num_parameters() const {
  std::size_t total = 0;
  for (auto& [n, p] : named_parameters()) total += p.size();
  return total;
}

void Module::zero_grad() {
  for (auto& [n, p] : named_parameters()) p.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::collect_modules(const std::string& path, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(path, this);
  for (auto& [n, c] : children_) c->collect_modules(path.empty() ? n : path + "." + n, out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

void Module::probe(const std::string& point, const Tensor& t) const {
  if (probes_) probes_->record(probe_path_.empty() ? point : probe_path_ + "." + point, t);
}

std::string Module::summary() const {
  const NamedTensors named = named_parameters();
  std::size_t width = 9;
  for (const auto& [n, p] : named) width = std::max(width, n.size());
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-16s %12s\n", static_cast<int>(width), "parameter", "shape", "count");
  os << line;
  for (const auto& [n, p] : named) {
    std::snprintf(line, sizeof line, "%-*s  %-16s %12zu\n", static_cast<int>(width), n.c_str(),
                  shape_str(p.shape()).c_str(), p.size());
    os << line;
  }
  std::snprintf(line, sizeof line, "%-*s  %-16s %12zu\n", static_cast<int>(width), "total", "", num_parameters());
  os << line;
  return os.str();
}

}  // namespace xgrad::nn
