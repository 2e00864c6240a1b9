// The tape: ops record themselves here while grad mode is on; backward walks it in reverse.
// Also grad mode (NoGradGuard) and the context a backward closure receives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

class GradContext;
using BackwardFn = std::function<void(GradContext&)>;

// One recorded op: its inputs (kept alive), its output (not kept alive: an entry whose output
// died can never receive a gradient and is pruned) and the closure that differentiates it.
struct TapeEntry {
  const char* op = "";
  std::vector<std::shared_ptr<Node>> inputs;
  std::weak_ptr<Node> output;
  BackwardFn backward;
  std::uint64_t seq = 0;  // recording order, which is a topological order
};

// What a backward closure sees: the gradient arriving at the op's output, the output and
// input values, and where to add each input's gradient.
class GradContext {
 public:
  GradContext(const TapeEntry& entry, const Array& grad_out, const Array& output)
      : entry_(entry), grad_out_(grad_out), output_(output) {}

  const Array& grad_out() const { return grad_out_; }
  const Array& output() const { return output_; }
  const Array& input(std::size_t i) const { return *entry_.inputs[i]->value; }
  std::size_t num_inputs() const { return entry_.inputs.size(); }
  bool needs(std::size_t i) const { return entry_.inputs[i] && entry_.inputs[i]->requires_grad; }

  // Adds g (input i's shape) to input i's gradient.
  void accumulate(std::size_t i, Array&& g);
  // Adds g, which has the broadcast output shape, summed back to input i's shape.
  void accumulate_reduced(std::size_t i, const Array& g);
  // Input i's gradient buffer (zeros the first time), for kernels that add in place.
  Array& grad_buffer(std::size_t i);

 private:
  Node& prepare(std::size_t i);
  const TapeEntry& entry_;
  const Array& grad_out_;
  const Array& output_;
};

// Grad mode is per thread; a graph belongs to the thread that recorded it.
bool grad_enabled();
void set_grad_enabled(bool on);

// Turns recording off for its scope (evaluation, optimizer steps), restoring it afterwards.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Anomaly detection, opt-in and per thread: while on, every op's forward value and every
// gradient an op's backward hands to its inputs is checked for NaN and Inf, and the first one
// found raises an Error naming the op (and the tensor's name, if it has one). It costs a pass
// over every value, so it is for finding a bug, not for training.
bool anomaly_enabled();
void set_anomaly_enabled(bool on);

class AnomalyGuard {
 public:
  AnomalyGuard() : previous_(anomaly_enabled()) { set_anomaly_enabled(true); }
  ~AnomalyGuard() { set_anomaly_enabled(previous_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  bool previous_;
};

// True when an op over these inputs would be recorded (undefined tensors are ignored); ops
// use it to skip caching what only backward needs.
template <class... Ts>
bool should_record(const Ts&... inputs) {
  return grad_enabled() && ((inputs.defined() && inputs.requires_grad()) || ...);
}

// Wraps an op's forward value in a tensor and, when should_record holds, records the op with
// its backward closure. `op` must be a string literal (it names the op in errors).
Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardFn fn);

// The engine behind Tensor::backward.
void run_backward(const Tensor& root, const Array* seed, bool retain_graph);

// Number of live entries on this thread's tape (for tests and memory checks).
std::size_t tape_size();

}  // namespace xgrad
