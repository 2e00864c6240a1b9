// Probes: read activations and gradients at named points of a model without editing its code.
// Attach a ProbeSet to a module tree; the modules' forward passes record their probe points
// into it (retaining their gradients), and after backward each point's gradient is readable.
//
// Points recorded by the xgrad modules (paths as in named_modules()):
//   <block>.stream_in, <block>.stream_mid, <block>.stream_out   the residual stream entering a
//       TransformerBlock, after its attention sublayer, after its feed-forward sublayer
//   <attn>.residual.*, <block>.ffn_residual.*                   each residual connection:
//       .in (x), .sublayer (the sublayer's output), .out (y), and .skip / .branch, two identity
//       copies of x through which the skip path and the sublayer branch take x
//   <attn>.context  (B, T, C) the heads' concatenated outputs before W_o
#pragma once

#include <map>
#include <string>
#include <vector>

#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

// Gradient norms at one residual connection y = x + f(x) (Pre-Norm) or y = LN(x + f(x))
// (Post-Norm), after backward.
struct ResidualFlow {
  std::string name;    // e.g. "blocks.0.attn.residual"
  double out = 0;      // |dL/dy|, arriving at the connection's output
  double skip = 0;     // |part of dL/dx that came through the skip path|
  double branch = 0;   // |part of dL/dx that came through the sublayer f|
  double total = 0;    // |skip part + branch part| = |dL/dx| from this connection
};

class ProbeSet {
 public:
  // Attaches to every module under `root` (one ProbeSet per tree at a time) and detaches when
  // destroyed. While attached, residual connections route x through identity copies: two
  // copies per connection, no value changed; a gradient can differ in its last bits where x
  // has more than two consumers (Post-Norm attention), since its parts are added in another order.
  explicit ProbeSet(Module& root);
  ~ProbeSet();
  ProbeSet(const ProbeSet&) = delete;
  ProbeSet& operator=(const ProbeSet&) = delete;

  // Called by modules; keeps the latest tensor per name and retains its gradient.
  void record(const std::string& name, const Tensor& t);
  // Forgets every recorded tensor (and the activations they hold).
  void clear();

  std::vector<std::string> names() const;  // in first-recorded order
  bool has(const std::string& name) const;
  const Tensor& tensor(const std::string& name) const;  // throws naming the point if absent
  const Array& activation(const std::string& name) const;
  const Array& gradient(const std::string& name) const;  // after backward
  // One entry per residual connection recorded in the last forward, in order (a connection
  // whose input does not require grad has no gradient to split and is left out).
  std::vector<ResidualFlow> residual_flows() const;

 private:
  std::vector<Module*> attached_;
  std::vector<std::string> order_;
  std::map<std::string, Tensor> points_;
};

// The L2 norm of each parameter's gradient by dotted name (0 for a parameter without one).
std::vector<std::pair<std::string, double>> gradient_norms(const Module& module);
// The same as a table: name, shape, gradient norm.
std::string gradient_norm_table(const Module& module);

}  // namespace xgrad::nn
