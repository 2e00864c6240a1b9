// Activation cache: run a model once and keep the value at its hook points (nn/hook.hpp) by full
// name, e.g. "blocks.0.attn.pattern", without changing what the run computes.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/module.hpp"

/// Looking inside a model: activation caches and patching at hook points, the logit lens, head
/// statistics and detectors, SVG pictures and an HTML attention viewer.
namespace xgrad::inspect {

/// Chooses hook points by full name.
using PointFilter = std::function<bool(const std::string& name)>;

/// The points a cache takes unless told otherwise: all but "*.scores" (forming the scores apart
/// from the fused softmax costs time and memory) and the residual connections' ".residual.skip"
/// and ".residual.branch", which are copies of ".residual.in".
bool default_points(const std::string& name);
/// Points whose full name ends with one of the suffixes, such as {".pattern", "stream_out"}.
PointFilter points_ending_with(std::vector<std::string> suffixes);

/// Values of a model's hook points by full name, in the order a run reached them (see
/// cache_activations).
class ActivationCache {
 public:
  /// Adds the value of point `name`; throws if `name` is already held.
  void insert(const std::string& name, Array value);
  /// True when the value of point `name` is held.
  bool has(const std::string& name) const;
  /// The value of point `name`. Throws naming the point, and the first 8 points the cache holds,
  /// if it is not held.
  const Array& at(const std::string& name) const;
  /// The points held, in the order the run reached them.
  std::vector<std::string> names() const { return order_; }
  /// The number of points held.
  std::size_t size() const { return order_.size(); }
  /// The bytes of the values held.
  std::size_t bytes() const;

 private:
  std::vector<std::string> order_;
  std::map<std::string, Array> values_;
};

/// Runs `run` (which should call root's forward once) with a recording hook at every point of
/// root's tree that `which` accepts, and returns copies of the values those points saw, after
/// any other hook attached before this call. The result of the run is unchanged, bit for bit.
/// Throws, naming the point, when a point is reached twice (cache each forward on its own), and
/// when `which` accepts no point of the tree or `run` is empty. The hooks sit on the module, so a
/// forward that another thread runs on it meanwhile is recorded too: cache a module no other
/// thread uses.
ActivationCache cache_activations(nn::Module& root, const std::function<void()>& run,
                                  const PointFilter& which = default_points);

}  // namespace xgrad::inspect
