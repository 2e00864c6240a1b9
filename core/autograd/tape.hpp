// The tape: ops record themselves here while grad mode is on; backward walks it in reverse.
// Also grad mode (NoGradGuard) and the context a backward closure receives.
//
// Threads. Each thread records onto its own tape, and a graph belongs to the thread that
// recorded it: backward() runs on that thread, and an op may not take a non-leaf tensor
// recorded on another thread as input (both raise an Error; hand values across with detach()).
// Leaves (parameters) may be shared: several threads may run forward and backward at once on
// modules that share parameters. Each pass gathers its leaf gradients on its own and adds them
// under the leaf's mutex, running the leaf's hooks and gradient-ready listeners there (on the
// pass's thread), once per pass and one pass at a time: a leaf with hooks or listeners as soon
// as its gradient is final, the others at the pass's end; a shared gradient is the sum over all
// passes, in the order the passes delivered it (so its last bits can differ from a serial run's).
// Dropout draws from a shared Generator are safe. Left to the caller, never concurrent with a
// pass that uses the same parameters: reading or changing gradients (grad(), mutable_grad(),
// zero_grad(), clipping, optimizer steps), changing a parameter's value or requires_grad,
// registering or removing hooks or gradient watches, train()/eval() (LanguageModel::generate
// calls both), and attaching or detaching a ProbeSet or HeadImportance; while a ProbeSet is
// attached, forwards must not overlap at all (it records every forward into one shared set).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

class GradContext;
/// An op's backward closure: reads the gradient at the op's output and adds its inputs' gradients.
using BackwardFn = std::function<void(GradContext&)>;

/// An op's input as the op saw it: the node and its storage's version then.
struct SavedInput {
  std::shared_ptr<Node> node;  ///< kept alive; null for an undefined input such as "no bias"
  std::uint64_t version = 0;   ///< the storage's version when the op ran
  bool counted = false;        ///< counted in node->value_readers (a non-leaf the backward reads)
};

/// What an op's backward reads of the values it saw, for record(). By default everything. An op
/// that declares less lets a value be freed as soon as nothing else needs it (Node::value_readers):
/// a Linear's input under bf16, whose backward reads only its bf16 copy, once the norm or
/// activation that made it declares that its own backward does not read its output.
struct BackwardReads {
  bool output = true;               ///< whether the closure calls GradContext::output()
  std::uint64_t unread_inputs = 0;  ///< bit i set: the closure never calls input(i)
};

/// One recorded op: its inputs, its output, and the closure that differentiates it.
///
/// The output is not kept alive: an entry whose output died can never receive a gradient and is
/// pruned.
struct TapeEntry {
  const char* op = "";             ///< the op's name, a string literal
  std::vector<SavedInput> inputs;  ///< the inputs as the op saw them (cleared when backward releases the entry)
  std::weak_ptr<Node> output;
  std::uint64_t output_version = 0;  ///< the output storage's version when the op ran
  bool output_counted = false;       ///< counted in the output's value_readers (the backward reads it)
  BackwardFn backward;               ///< null once backward has released the entry
  std::uint64_t seq = 0;             ///< recording order, which is a topological order

  TapeEntry() = default;
  TapeEntry(const TapeEntry&) = delete;
  TapeEntry& operator=(const TapeEntry&) = delete;
  ~TapeEntry() { release_inputs(); }
  /// Lets go of the inputs and of the output's value, which this entry's backward no longer reads.
  void release_inputs();
};

/// What a backward closure sees: the gradient arriving at the op's output, the output and input
/// values, and where to add each input's gradient.
///
/// A closure reads saved values only through output() and input(i) (never through a reference
/// captured in forward), and only those it needs: each checks that the value was not written in
/// place since the op recorded it (Tensor::mutable_value, also through a detach()ed handle) and
/// raises an Error naming the op and the tensor if it was, as PyTorch's version counters do. So
/// writing to an input that the op's backward does not read (add's) is fine.
class GradContext {
 public:
  /// The context of `entry`'s backward, with `grad_out` arriving at its `output`, in a pass that
  /// keeps the graph for another (retain_graph) or not.
  GradContext(const TapeEntry& entry, Array& grad_out, const Node& output, bool retain_graph)
      : entry_(entry), grad_out_(grad_out), output_(output), retain_graph_(retain_graph) {}

  /// The gradient arriving at the op's output (the output's shape).
  const Array& grad_out() const { return grad_out_; }
  /// Moves the gradient arriving at the output out of the context, for a closure that hands it
  /// on unchanged or reshaped; grad_out() is then empty, so it is the closure's last use of it.
  Array take_grad_out() { return std::exchange(grad_out_, Array()); }
  /// The op's output value; an Error if it was written in place since the op ran.
  const Array& output() const {
    if (output_.storage->version != entry_.output_version) changed(-1);
    return output_.value();
  }
  /// Input i's value; an Error if it was written in place since the op ran.
  const Array& input(std::size_t i) const {
    const SavedInput& in = entry_.inputs[i];
    if (in.node->storage->version != in.version) changed(static_cast<long>(i));
    return in.node->value();
  }
  /// Checks that input i was not written in place since the op ran, for a closure that reads
  /// only what is kept on its storage (its bf16 copy) and not the value.
  void check_unchanged(std::size_t i) const {
    const SavedInput& in = entry_.inputs[i];
    if (in.node->storage->version != in.version) changed(static_cast<long>(i));
  }
  /// Input i's node, for what is kept on its storage (its bf16 copy); input(i) checks its value.
  const Node& input_node(std::size_t i) const { return *entry_.inputs[i].node; }
  /// Input i's shape, for closures that need only that (reading it is not a use of the value).
  const Shape& input_shape(std::size_t i) const { return entry_.inputs[i].node->shape(); }
  /// The number of inputs the op recorded, undefined ones included.
  std::size_t num_inputs() const { return entry_.inputs.size(); }
  /// Whether the graph outlives this pass (backward(true)): the closure then runs again in a later
  /// pass, so it must not give away what it saved; otherwise it is freed right after it runs.
  bool retains_graph() const { return retain_graph_; }
  /// True when input i is defined and requires grad, so the closure should compute its gradient.
  bool needs(std::size_t i) const { return entry_.inputs[i].node && entry_.inputs[i].node->requires_grad; }

  /// Adds g (input i's shape) to input i's gradient; an Error naming the op for another shape.
  void accumulate(std::size_t i, Array&& g);
  /// Adds g, which has the broadcast output shape, summed back to input i's shape.
  void accumulate_reduced(std::size_t i, const Array& g);
  /// Adds grad_out, summed back to input i's shape, to input i's gradient, moving it there when
  /// it is input i's first gradient and of its shape. grad_out is then empty: call it last.
  void pass_grad_out(std::size_t i);
  /// Input i's gradient buffer (zeros the first time), for kernels that add in place.
  Array& grad_buffer(std::size_t i);
  /// Where a kernel that writes every element of an input's gradient once writes it (see grad_target).
  struct GradTarget {
    float* data;  ///< the gradient buffer, input i's shape
    float beta;   ///< 0: the buffer is new and its contents undefined (overwrite them); 1: add to it
  };
  /// Input i's gradient buffer for kernels that write every element once, such as a GEMM.
  ///
  /// beta = 0 when the buffer is new (its contents are undefined: overwrite them, which saves
  /// zeroing it) or 1 when earlier gradients are there (add to them). Write it before asking for
  /// another input's buffer: two inputs may be one tensor.
  GradTarget grad_target(std::size_t i);

 private:
  Node& prepare(std::size_t i);
  [[noreturn]] void changed(long input) const;  // input -1: the output
  const TapeEntry& entry_;
  Array& grad_out_;
  const Node& output_;
  bool retain_graph_;
};

/// True while ops record themselves on this thread's tape (grad mode is per thread, on by default).
bool grad_enabled();
/// Turns grad mode on or off for this thread.
void set_grad_enabled(bool on);

/// Turns recording off for its scope (evaluation, optimizer steps), restoring it afterwards.
class NoGradGuard {
 public:
  /// Turns grad mode off on this thread.
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  /// Restores the grad mode the constructor found.
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// True while anomaly detection is on for this thread.
///
/// Anomaly detection is opt-in and per thread: while on, every op's forward value and every
/// gradient an op's backward hands to its inputs is checked for NaN and Inf, and the first one
/// found raises an Error naming the op (and the tensor's name, if it has one). It costs a pass
/// over every value, so it is for finding a bug, not for training.
bool anomaly_enabled();
/// Turns anomaly detection on or off for this thread (see anomaly_enabled).
void set_anomaly_enabled(bool on);

/// Turns anomaly detection on for its scope, restoring it afterwards.
class AnomalyGuard {
 public:
  /// Turns anomaly detection on for this thread.
  AnomalyGuard() : previous_(anomaly_enabled()) { set_anomaly_enabled(true); }
  /// Restores the anomaly mode the constructor found.
  ~AnomalyGuard() { set_anomaly_enabled(previous_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  bool previous_;
};

/// Wraps an op's forward value in a tensor and, when grad mode is on and an input requires grad,
/// records the op with its backward closure.
///
/// `op` must be a string literal (it names the op in errors). An Error when an input is a
/// non-leaf recorded on another thread, and in anomaly mode when the value is not finite.
Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardFn fn);
/// The same for an op whose backward reads less than every value it saw (see BackwardReads).
Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardReads reads, BackwardFn fn);

/// Runs `fn` once, on this thread, at the end of the backward pass running here.
///
/// Call it from a hook or a gradient-ready listener (gradient_ready.hpp). The callbacks run after
/// the pass has delivered every gradient and its listeners have heard pass_ended, in the order
/// queued (one may queue another), and not at all when the pass fails. An Error outside a pass
/// and for an empty function.
void queue_backward_callback(std::function<void()> fn);

/// The engine behind Tensor::backward: seeds `root` with `seed` (or 1 for a single element) and
/// walks the tape back from it.
///
/// Releases the entries it ran unless `retain_graph`. An Error when called from inside another
/// pass, on another thread than the one that recorded the graph, or on a graph already released.
void run_backward(const Tensor& root, const Array* seed, bool retain_graph);

/// Number of live entries on this thread's tape (for tests and memory checks).
std::size_t tape_size();

}  // namespace xgrad
