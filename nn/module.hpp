// Module: the base of every layer. Named parameters with dotted paths in a stable order,
// child modules, and the train/eval flag.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/tensor.hpp"

namespace xgrad::nn {

class ProbeSet;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter, depth first in registration order, named by its dotted path
  // (e.g. "blocks.0.attn.w_q.weight").
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The parameter at a dotted path; throws if there is none.
  Tensor parameter(const std::string& path) const;
  std::size_t num_parameters() const;  // total number of scalar values
  void zero_grad();

  // Recursively sets the training flag (read by Dropout and attention dropout). It never
  // changes requires_grad.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // A table of parameter names, shapes and counts, with the total.
  std::string summary() const;

  // Every module of the tree, depth first: this one first (named ""), then e.g. "blocks",
  // "blocks.0", "blocks.0.attn", ...
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Records `t` as the probe point "<this module's path>.<point>" when a ProbeSet is attached
  // to the tree (see probe.hpp); does nothing otherwise. Modules call it from forward.
  void probe(const std::string& point, const Tensor& t) const;
  bool probing() const { return probes_ != nullptr; }

 protected:
  // Registers a parameter (a leaf that requires grad) under `name` and returns it.
  Tensor register_parameter(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void collect(const std::string& prefix, NamedTensors& out) const;
  friend class ProbeSet;
  void collect_modules(const std::string& path, std::vector<std::pair<std::string, Module*>>& out);
  NamedTensors params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  ProbeSet* probes_ = nullptr;  // set while a ProbeSet is attached to the tree
  std::string probe_path_;      // this module's dotted path from the probed root
};

// An ordered list of child modules named "0", "1", ... (so paths read "blocks.0.attn...").
class ModuleList : public Module {
 public:
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    return register_module(std::to_string(size_++), std::move(m));
  }
  std::size_t size() const { return size_; }

 private:
  std::size_t size_ = 0;
};

}  // namespace xgrad::nn
