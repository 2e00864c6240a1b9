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

namespace xgrad::inspect {

// Chooses hook points by full name.
using PointFilter = std::function<bool(const std::string& name)>;

// The points a cache takes unless told otherwise: all but "*.scores" (forming the scores apart
// from the fused softmax costs time and memory) and the residual connections' ".residual.skip"
// and ".residual.branch", which are copies of ".residual.in".
bool default_points(const std::string& name);
// Points whose full name ends with one of the suffixes, e.g. {".pattern", "stream_out"}.
PointFilter points_ending_with(std::vector<std::string> suffixes);

class ActivationCache {
 public:
  // Throws if `name` is already held.
  void insert(const std::string& name, Array value);
  bool has(const std::string& name) const;
  // Throws naming the point, and the cache's points when there are few, if it is not held.
  const Array& at(const std::string& name) const;
  std::vector<std::string> names() const { return order_; }  // in the order the run reached them
  std::size_t size() const { return order_.size(); }
  std::size_t bytes() const;  // of the values held

 private:
  std::vector<std::string> order_;
  std::map<std::string, Array> values_;
};

// Runs `run` (which should call root's forward once) with a recording hook at every point of
// root's tree that `which` accepts, and returns copies of the values those points saw, after
// any other hook attached before this call. The result of the run is unchanged, bit for bit.
// Throws, naming the point, when a point is reached twice (cache each forward on its own), and
// when `which` accepts no point of the tree. The hooks sit on the module, so a forward that
// another thread runs on it meanwhile is recorded too: cache a module no other thread uses.
ActivationCache cache_activations(nn::Module& root, const std::function<void()>& run,
                                  const PointFilter& which = default_points);

}  // namespace xgrad::inspect
