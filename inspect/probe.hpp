// Probes: read activations and gradients at every hook point of a model (nn/hook.hpp) without
// editing its code. A ProbeSet attaches a forward hook to each point of a module tree; forward
// records the points (retaining their gradients), and after backward each point's gradient is
// readable. The points are the modules' hook points, e.g.
//   <block>.stream_in, <block>.stream_mid, <block>.stream_out   the residual stream entering a
//       TransformerBlock, between its sublayers, leaving it
//   <block>.attn.residual.*, <block>.ffn.residual.*             each residual connection:
//       .in (x), .out (y), and .skip / .branch, the two paths' copies of x
//   <block>.attn.q, .k, .v, .pattern, .context, .out and <block>.ffn.pre, .hidden, .out
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xgrad/nn/module.hpp"

namespace xgrad::inspect {

/// Gradient norms at one residual connection y = x + f(LN(x)) (Pre-Norm) or y = LN(x + f(x))
/// (Post-Norm), after backward. All norms are L2.
struct ResidualFlow {
  std::string name;   ///< e.g. "blocks.0.attn.residual"
  double out = 0;     ///< |dL/dy|, arriving at the connection's output
  double skip = 0;    ///< |part of dL/dx that came through the skip path|
  double branch = 0;  ///< |part of dL/dx that came through the sublayer f (and, Pre-Norm, LN)|
  double total = 0;   ///< |skip part + branch part| = |dL/dx| from this connection
};

/// Records the activation, and after backward the gradient, at the hook points of a module tree
/// while it lives. Not copyable.
class ProbeSet {
 public:
  /// Attaches to every hook point of `root` that `which` accepts (by full name; all but
  /// "*.scores" and "*.result" by default: recording those makes attention form its scores apart
  /// from the fused softmax, or each head's share of its output apart from the output projection,
  /// which costs time and memory, and result changes the last bits of the output). While attached, each residual
  /// connection routes x through two identity copies (".residual.skip" and ".residual.branch"), so that the gradient
  /// arriving through each path can be read apart; no value changes, and a gradient can differ in its last bits where x
  /// has more than two consumers (Post-Norm attention), since its parts are added in another order. Other hooks may be
  /// attached at the same time.
  explicit ProbeSet(nn::Module& root, std::function<bool(const std::string&)> which = {});
  ProbeSet(const ProbeSet&) = delete;
  ProbeSet& operator=(const ProbeSet&) = delete;

  /// Forgets every recorded tensor (and the activations they hold).
  void clear();

  /// The recorded points' full names, in first-recorded order.
  /// Read this and the functions below after forward (and backward), not while one runs: a
  /// point holds the latest value.
  std::vector<std::string> names() const;
  /// Whether the point `name` was recorded.
  bool has(const std::string& name) const;
  Tensor tensor(const std::string& name) const;  ///< the recorded tensor; throws naming the point if absent
  /// The recorded value at the point; throws naming the point if absent.
  Array activation(const std::string& name) const;
  /// The gradient at the point, after backward; throws naming the point if it has none.
  Array gradient(const std::string& name) const;
  /// One entry per residual connection recorded in the last forward, in order (a connection
  /// whose input does not require grad has no gradient to split and is left out, as is a
  /// Norm::none connection, which has no skip path).
  std::vector<ResidualFlow> residual_flows() const;

 private:
  struct Records {
    // Keeps the latest tensor per name and retains its gradient.
    void record(const std::string& name, const Tensor& t);
    std::mutex mutex;  // forward may run on several threads
    std::vector<std::string> order;
    std::map<std::string, Tensor> points;
  };
  std::shared_ptr<Records> records_ = std::make_shared<Records>();
  std::vector<nn::HookHandle> hooks_;
};

/// The L2 norm of each parameter's gradient by dotted name (0 for a parameter without one).
std::vector<std::pair<std::string, double>> gradient_norms(const nn::Module& module);
/// The same as a table: name, shape, gradient norm.
std::string gradient_norm_table(const nn::Module& module);

}  // namespace xgrad::inspect
