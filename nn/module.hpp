// Module: the base of every layer. Named parameters and buffers with dotted paths in a stable
// order, child modules, the train/eval flag, and hook points (hook.hpp).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/hook.hpp"

/// Modules (the layers, attention, the transformer and its language model), their parameters and
/// buffers, and hook points.
namespace xgrad::nn {

/// The base of every layer: named parameters, buffers and child modules with dotted paths in a
/// stable order, the train/eval flag, and hook points (hook.hpp). Not copyable.
class Module {
 public:
  virtual ~Module() = default;
  /// A module with no parameters, buffers, children or hook points, in training mode.
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Every parameter, depth first in registration order, named by its dotted path
  /// (such as "blocks.0.attn.w_q.weight"). A tensor two modules share (tied embeddings) is
  /// listed once, under the first path that reaches it.
  NamedTensors named_parameters() const;
  /// The tensors of named_parameters(), in its order.
  std::vector<Tensor> parameters() const;
  /// The parameters that train (requires_grad), named and ordered as named_parameters(): what an
  /// optimizer takes once some are frozen (freeze.hpp, lora.hpp).
  NamedTensors named_trainable_parameters() const;
  /// The parameter at a dotted path, any path that reaches it (a tied tensor answers to each
  /// of its names); throws if there is none.
  Tensor parameter(const std::string& path) const;
  std::size_t num_parameters() const;  ///< total number of scalar values
  /// Zeroes the gradient of every parameter.
  void zero_grad();

  /// Every buffer (state that is saved with the module but not trained: no gradient, not in
  /// parameters()), named and ordered as named_parameters() names and orders parameters.
  NamedTensors named_buffers() const;
  /// Parameters and buffers together, as state_dict saves them: module by module, depth first,
  /// each module's parameters, then its buffers, then its children.
  NamedTensors named_state() const;

  /// Recursively sets the training flag (read by Dropout and attention dropout). It never
  /// changes requires_grad.
  void train(bool on = true);
  /// train(false).
  void eval() { train(false); }
  /// The training flag (true for a new module).
  bool is_training() const { return training_; }

  /// A table of parameter names, shapes and counts, with the total.
  std::string summary() const;

  /// Every module of the tree, depth first: this one first (named ""), then, for example,
  /// "blocks", "blocks.0", "blocks.0.attn", ...
  std::vector<std::pair<std::string, Module*>> named_modules();

  /// Every hook point of the tree by full name ("blocks.0.attn.pattern"), modules depth first,
  /// each module's points in the order it declares them.
  std::vector<std::string> hook_points() const;
  /// Attaches a hook at the point of that full name (relative to this module) until the handle
  /// is destroyed; throws naming the point when no module of the tree declares it.
  [[nodiscard]] HookHandle add_forward_hook(const std::string& point, ForwardHook hook);
  /// Attaches a backward hook, as add_forward_hook attaches a forward one.
  [[nodiscard]] HookHandle add_backward_hook(const std::string& point, BackwardHook hook);
  /// How many hooks are attached in the tree.
  std::size_t num_hooks() const;

 protected:
  /// Declares this module's hook points; constructors call it. A point declared twice throws.
  void declare_hook_points(std::initializer_list<const char*> points);
  /// Whether a hook is attached at `point` (to form a value the fused path never materializes).
  /// Throws when hooks are attached and `point` is not a declared point.
  bool hooked(const char* point) const;
  /// The value at `point` after the attached forward hooks, routed through an identity op whose
  /// gradient the backward hooks see; `value` itself when no hook is attached anywhere here.
  Tensor hook(const char* point, const Tensor& value) const;

  /// Registers a parameter (a leaf that requires grad) under `name` and returns it; an undefined
  /// tensor or one that is not a leaf throws.
  /// Names of parameters, buffers and children: UTF-8, non-empty, without '.' (the path
  /// separator) or ':' (checkpoints keep their own entries under "<namespace>:<name>", which no
  /// module path can spell), and unique among the module's parameters, buffers and children.
  Tensor register_parameter(const std::string& name, Tensor t);
  /// Registers a child module under `name` (named as register_parameter says) and returns it;
  /// the child takes this module's training flag. A null module, or one that is this module or
  /// holds it, throws.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  /// Registers a buffer under `name` and returns it: a leaf that does not require grad (a copy
  /// of `value` for an Array), saved and loaded with the parameters. An undefined tensor, or one
  /// that is not such a leaf, throws.
  Tensor register_buffer(const std::string& name, Tensor t);
  /// register_buffer(name, Tensor(value)).
  Tensor register_buffer(const std::string& name, const Array& value) { return register_buffer(name, Tensor(value)); }
  /// Removes the child module registered under `name`; throws when there is none.
  void unregister_module(const std::string& name);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name, const char* who) const;
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out,
               std::unordered_set<const void*>& seen) const;
  void collect_modules(const std::string& path, std::vector<std::pair<std::string, Module*>>& out);
  template <class F>
  void visit(const std::string& path, F f) const;
  HookHandle attach(const std::string& point, const char* who, ForwardHook* forward, BackwardHook* backward);
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::shared_ptr<detail::HookTable> hooks_ = std::make_shared<detail::HookTable>();
};

/// An ordered list of child modules named "0", "1", ... (so paths read "blocks.0.attn...").
class ModuleList : public Module {
 public:
  /// Appends `m` as the next child (named by its index) and returns it.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    items_.push_back(m);
    return register_module(std::to_string(items_.size() - 1), std::move(m));
  }
  /// The number of modules.
  std::size_t size() const { return items_.size(); }
  /// The i-th module; throws naming i and the size when out of range.
  const std::shared_ptr<Module>& operator[](std::size_t i) const;
  /// The i-th module as an M; throws also when it is not one.
  template <class M>
  std::shared_ptr<M> at(std::size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    if (!m) fail_not_a(i);
    return m;
  }
  /// Iterates over the modules (std::shared_ptr<Module>) in order.
  auto begin() const { return items_.begin(); }
  /// The end of begin()'s range.
  auto end() const { return items_.end(); }

 private:
  [[noreturn]] void fail_not_a(std::size_t i) const;
  std::vector<std::shared_ptr<Module>> items_;
};

/// Puts a module tree in eval mode for a scope, and sets it back to the mode the module had
/// (train(previous) on the whole tree) when destroyed, also when an exception leaves the scope.
class EvalGuard {
 public:
  /// Remembers module.is_training() and calls module.eval().
  explicit EvalGuard(Module& module) : module_(module), was_training_(module.is_training()) { module.eval(); }
  ~EvalGuard() { module_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Module& module_;
  bool was_training_;
};

}  // namespace xgrad::nn
