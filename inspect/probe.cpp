// ProbeSet bookkeeping and gradient-norm reports.
#include "xgrad/inspect/probe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::inspect {

namespace {
double norm(const Array& a) { return std::sqrt(sum_of_squares(a)); }
}  // namespace

ProbeSet::ProbeSet(nn::Module& root, std::function<bool(const std::string&)> which) {
  for (const std::string& point : root.hook_points()) {
    const bool formed_on_request = nn::point_ends_with(point, ".scores") || point == "scores" ||
                                   nn::point_ends_with(point, ".result") || point == "result";
    if (which ? !which(point) : formed_on_request) continue;
    const bool path_copy = nn::point_ends_with(point, "residual.skip") || nn::point_ends_with(point, "residual.branch");
    // The hooks hold the records, not the ProbeSet: a forward on another thread that still
    // calls one after the ProbeSet is gone writes into records nobody reads.
    hooks_.push_back(root.add_forward_hook(point, [records = records_, point, path_copy](const Tensor& t) {
      const Tensor kept = path_copy && t.requires_grad() ? identity(t) : t;
      records->record(point, kept);
      return path_copy ? kept : Tensor();
    }));
  }
}

void ProbeSet::Records::record(const std::string& name, const Tensor& t) {
  Tensor kept = t;
  if (kept.requires_grad() && !kept.retains_grad()) kept.retain_grad();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = points.find(name);
  if (it == points.end()) {
    order.push_back(name);
    points.emplace(name, kept);
  } else {
    it->second = kept;
  }
}

void ProbeSet::clear() {
  std::lock_guard<std::mutex> lock(records_->mutex);
  records_->points.clear();
  records_->order.clear();
}

std::vector<std::string> ProbeSet::names() const {
  std::lock_guard<std::mutex> lock(records_->mutex);
  return records_->order;
}

bool ProbeSet::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(records_->mutex);
  return records_->points.count(name) != 0;
}

Tensor ProbeSet::tensor(const std::string& name) const {
  std::lock_guard<std::mutex> lock(records_->mutex);
  auto it = records_->points.find(name);
  if (it == records_->points.end()) fail("ProbeSet: no probe point named '", name, "' was recorded");
  return it->second;
}

Array ProbeSet::activation(const std::string& name) const { return tensor(name).value(); }

Array ProbeSet::gradient(const std::string& name) const {
  const Tensor t = tensor(name);
  if (!t.has_grad()) fail("ProbeSet: probe point '", name, "' has no gradient (no backward through it yet)");
  return t.grad();
}

std::vector<ResidualFlow> ProbeSet::residual_flows() const {
  std::vector<ResidualFlow> flows;
  const std::string suffix = ".skip";
  for (const std::string& name : names()) {
    if (!nn::point_ends_with(name, suffix)) continue;
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

std::vector<std::pair<std::string, double>> gradient_norms(const nn::Module& module) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, p] : module.named_parameters()) out.emplace_back(name, p.has_grad() ? norm(p.grad()) : 0.0);
  return out;
}

std::string gradient_norm_table(const nn::Module& module) {
  const NamedTensors params = module.named_parameters();
  std::size_t width = 9;
  for (const auto& [n, p] : params) width = std::max(width, n.size());
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-16s %14s\n", static_cast<int>(width), "parameter", "shape", "grad norm");
  os << line;
  for (const auto& [n, p] : params) {
    std::snprintf(line, sizeof line, "%-*s  %-16s %14.6g\n", static_cast<int>(width), n.c_str(),
                  shape_str(p.shape()).c_str(), p.has_grad() ? norm(p.grad()) : 0.0);
    os << line;
  }
  return os.str();
}

}  // namespace xgrad::inspect
