// ProbeSet bookkeeping and gradient-norm reports.
#include "xgrad/nn/probe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"

namespace xgrad::nn {

namespace {
double norm(const Array& a) { return std::sqrt(sum_of_squares(a)); }
}  // namespace

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

ProbeSet::ProbeSet(Module& root, std::function<bool(const std::string&)> which) {
  for (const std::string& point : root.hook_points()) {
    if (which ? !which(point) : ends_with(point, ".scores") || point == "scores") continue;
    const bool path_copy = ends_with(point, "residual.skip") || ends_with(point, "residual.branch");
    hooks_.push_back(root.add_forward_hook(point, [this, point, path_copy](const Tensor& t) {
      const Tensor kept = path_copy && t.requires_grad() ? identity(t) : t;
      record(point, kept);
      return path_copy ? kept : Tensor();
    }));
  }
}

void ProbeSet::record(const std::string& name, const Tensor& t) {
  Tensor kept = t;
  if (kept.requires_grad() && !kept.retains_grad()) kept.retain_grad();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = points_.find(name);
  if (it == points_.end()) {
    order_.push_back(name);
    points_.emplace(name, kept);
  } else {
    it->second = kept;
  }
}

void ProbeSet::clear() {
  points_.clear();
  order_.clear();
}

std::vector<std::string> ProbeSet::names() const { return order_; }

bool ProbeSet::has(const std::string& name) const { return points_.count(name) != 0; }

const Tensor& ProbeSet::tensor(const std::string& name) const {
  auto it = points_.find(name);
  if (it == points_.end()) fail("ProbeSet: no probe point named '", name, "' was recorded");
  return it->second;
}

const Array& ProbeSet::activation(const std::string& name) const { return tensor(name).value(); }

const Array& ProbeSet::gradient(const std::string& name) const {
  const Tensor& t = tensor(name);
  if (!t.has_grad()) fail("ProbeSet: probe point '", name, "' has no gradient (no backward through it yet)");
  return t.grad();
}

std::vector<ResidualFlow> ProbeSet::residual_flows() const {
  std::vector<ResidualFlow> flows;
  const std::string suffix = ".skip";
  for (const std::string& name : order_) {
    if (!ends_with(name, suffix)) continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    if (!has(base + ".branch") || !has(base + ".out")) continue;
    const Tensor &skip = tensor(name), &branch = tensor(base + ".branch"), &out = tensor(base + ".out");
    if (!skip.has_grad() || !branch.has_grad() || !out.has_grad()) continue;
    ResidualFlow f;
    f.name = base;
    f.out = norm(out.grad());
    f.skip = norm(skip.grad());
    f.branch = norm(branch.grad());
    f.total = norm(Array(skip.grad() + branch.grad()));
    flows.push_back(f);
  }
  return flows;
}

std::vector<std::pair<std::string, double>> gradient_norms(const Module& module) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, p] : module.named_parameters()) out.emplace_back(name, p.has_grad() ? norm(p.grad()) : 0.0);
  return out;
}

std::string gradient_norm_table(const Module& module) {
  const NamedTensors params = module.named_parameters();
  std::size_t width = 9;
  for (const auto& [n, p] : params) width = std::max(width, n.size());
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-16s %14s\n", static_cast<int>(width), "parameter", "shape", "grad norm");
  os << line;
  for (const auto& [n, p] : params) {
    std::snprintf(line, sizeof line, "%-*s  %-16s %14.6g\n", static_cast<int>(width), n.c_str(), shape_str(p.shape()).c_str(),
                  p.has_grad() ? norm(p.grad()) : 0.0);
    os << line;
  }
  return os.str();
}

}  // namespace xgrad::nn
