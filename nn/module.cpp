// Module bookkeeping: registration, dotted names, buffers, train/eval, hook points, the printed
// summary.
#include "xgrad/nn/module.hpp"

#include <unordered_set>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::nn {

void Module::check_new_name(const std::string& name, const char* who) const {
  check_utf8(name, who, "name");
  if (name.empty() || name.find_first_of(".:") != std::string::npos) {
    fail(who, ": name '", name, "' must be non-empty and contain no '.' or ':'");
  }
  const auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  if (taken(params_)) fail(who, ": '", name, "' is already registered as a parameter");
  if (taken(buffers_)) fail(who, ": '", name, "' is already registered as a buffer");
  if (taken(children_)) fail(who, ": '", name, "' is already registered as a module");
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name, "Module::register_parameter");
  if (!t.defined()) fail("Module::register_parameter: parameter '", name, "' is undefined");
  if (!t.is_leaf()) fail("Module::register_parameter: parameter '", name, "' must be a leaf tensor");
  t.set_requires_grad(true);
  if (t.name().empty()) t.set_name(name);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "Module::register_buffer");
  if (!t.defined()) fail("Module::register_buffer: buffer '", name, "' is undefined");
  if (!t.is_leaf() || t.requires_grad()) {
    fail("Module::register_buffer: buffer '", name,
         "' must be a leaf that does not require grad (a trained tensor is a parameter: register_parameter)");
  }
  if (t.name().empty()) t.set_name(name);
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "Module::register_module");
  if (!m) fail("Module::register_module: module '", name, "' is null");
  // A module inside its own tree would make every path endless ("me.me.me...", until memory ran out).
  bool cycle = false;
  m->visit("", [&](const std::string&, const Module& inside) { cycle = cycle || &inside == this; });
  if (cycle)
    fail("Module::register_module: module '", name,
         "' is this module or holds it: a module cannot be its own descendant");
  m->train(training_);
  children_.emplace_back(name, std::move(m));
}

void Module::unregister_module(const std::string& name) {
  const auto at = std::find_if(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  if (at == children_.end()) fail("Module::unregister_module: no module named '", name, "'");
  children_.erase(at);
}

void Module::collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out,
                     std::unordered_set<const void*>& seen) const {
  // A tensor registered by two modules (tied embeddings) is listed once, under its first name.
  auto add = [&](const std::string& name, const Tensor& t) {
    if (seen.insert(t.node().get()).second) out.emplace_back(name, t);
  };
  if (params) {
    for (const auto& [n, p] : params_) add(prefix + n, p);
  }
  if (buffers) {
    for (const auto& [n, b] : buffers_) add(prefix + n, b);
  }
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, buffers, out, seen);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  collect("", true, false, out, seen);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  collect("", false, true, out, seen);
  return out;
}

NamedTensors Module::named_state() const {
  NamedTensors out;
  std::unordered_set<const void*> seen;
  collect("", true, true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

NamedTensors Module::named_trainable_parameters() const {
  NamedTensors out;
  for (auto& [n, p] : named_parameters()) {
    if (p.requires_grad()) out.emplace_back(n, p);
  }
  return out;
}

Tensor Module::parameter(const std::string& path) const {
  // Every path that reaches a parameter, so a tied one answers to each of its names.
  Tensor found;
  visit("", [&](const std::string& at, const Module& m) {
    for (const auto& [n, p] : m.params_) {
      if (!found.defined() && (at.empty() ? n : at + "." + n) == path) found = p;
    }
  });
  if (!found.defined()) fail("Module::parameter: no parameter named '", path, "'");
  return found;
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

template <class F>
void Module::visit(const std::string& path, F f) const {
  f(path, *this);
  for (const auto& [n, c] : children_) c->visit(path.empty() ? n : path + "." + n, f);
}

namespace {
std::string point_name(const std::string& path, const std::string& point) {
  return path.empty() ? point : path + "." + point;
}
}  // namespace

std::vector<std::string> Module::hook_points() const {
  std::vector<std::string> out;
  visit("", [&](const std::string& path, const Module& m) {
    std::lock_guard<std::mutex> lock(m.hooks_->mutex);
    for (const auto& slot : m.hooks_->slots) out.push_back(point_name(path, slot.point));
  });
  return out;
}

void Module::declare_hook_points(std::initializer_list<const char*> points) {
  std::lock_guard<std::mutex> lock(hooks_->mutex);
  for (const char* p : points) {
    for (const auto& slot : hooks_->slots) {
      if (slot.point == p) fail("Module::declare_hook_points: '", p, "' is declared twice");
    }
    hooks_->slots.push_back({p, {}, {}});
  }
}

HookHandle Module::attach(const std::string& point, const char* who, ForwardHook* forward, BackwardHook* backward) {
  if ((forward && !*forward) || (backward && !*backward)) fail(who, ": the hook for '", point, "' is empty");
  HookHandle handle;
  visit("", [&](const std::string& path, const Module& m) {
    if (handle.attached()) return;
    std::lock_guard<std::mutex> lock(m.hooks_->mutex);
    for (auto& slot : m.hooks_->slots) {
      if (point_name(path, slot.point) != point) continue;
      const int id = m.hooks_->next_id++;
      if (forward) slot.forward.push_back({id, point, std::make_shared<ForwardHook>(std::move(*forward))});
      if (backward) slot.backward.push_back({id, point, std::make_shared<BackwardHook>(std::move(*backward))});
      m.hooks_->attached.fetch_add(1, std::memory_order_release);
      handle = HookHandle(m.hooks_, slot.point, id);
      return;
    }
  });
  if (!handle.attached()) fail(who, ": no hook point '", point, "' in this module tree (hook_points() lists them)");
  return handle;
}

HookHandle Module::add_forward_hook(const std::string& point, ForwardHook hook) {
  return attach(point, "Module::add_forward_hook", &hook, nullptr);
}

HookHandle Module::add_backward_hook(const std::string& point, BackwardHook hook) {
  return attach(point, "Module::add_backward_hook", nullptr, &hook);
}

std::size_t Module::num_hooks() const {
  std::size_t n = 0;
  visit("", [&](const std::string&, const Module& m) { n += static_cast<std::size_t>(m.hooks_->attached.load()); });
  return n;
}

bool Module::hooked(const char* point) const {
  if (hooks_->attached.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(hooks_->mutex);
  for (const auto& slot : hooks_->slots) {
    if (slot.point == point) return !slot.forward.empty() || !slot.backward.empty();
  }
  fail("Module::hooked: '", point, "' is not a declared hook point");
}

Tensor Module::hook(const char* point, const Tensor& value) const {
  if (hooks_->attached.load(std::memory_order_acquire) == 0) return value;
  // Copies, so that hooks run unlocked (they may attach or remove hooks themselves).
  std::vector<detail::HookTable::Entry<ForwardHook>> forward;
  std::vector<detail::HookTable::Entry<BackwardHook>> backward;
  {
    std::lock_guard<std::mutex> lock(hooks_->mutex);
    const auto slot =
        std::find_if(hooks_->slots.begin(), hooks_->slots.end(), [&](const auto& s) { return s.point == point; });
    if (slot == hooks_->slots.end()) fail("Module::hook: '", point, "' is not a declared hook point");
    forward = slot->forward;
    backward = slot->backward;
  }
  Tensor v = value;
  for (const auto& h : forward) {
    Tensor replaced = (*h.fn)(v);
    if (!replaced.defined()) continue;
    if (replaced.shape() != v.shape()) {
      fail("forward hook at '", h.name, "': returned shape ", shape_str(replaced.shape()), " for a value of shape ",
           shape_str(v.shape()));
    }
    v = std::move(replaced);
  }
  if (!backward.empty() && v.requires_grad() && grad_enabled()) {
    // A node of its own, so the hooks see exactly the gradient that flows back through here.
    v = identity(v);
    for (const auto& h : backward) {
      v.register_hook([weak = std::weak_ptr<BackwardHook>(h.fn)](Array& g) {
        if (const auto fn = weak.lock()) (*fn)(g);
      });
    }
  }
  return v;
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

const std::shared_ptr<Module>& ModuleList::operator[](std::size_t i) const {
  if (i >= items_.size()) fail("ModuleList: index ", i, " is out of range for ", items_.size(), " modules");
  return items_[i];
}

void ModuleList::fail_not_a(std::size_t i) const { fail("ModuleList: module ", i, " is not of the requested type"); }

}  // namespace xgrad::nn
