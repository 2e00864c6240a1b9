// The tensor handle users hold, and the graph node behind it (value, gradient, hooks).
// Ops live in ops.hpp; recording and backward live in tape.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xio.hpp>

namespace xgrad {

using Array = xt::xarray<float>;           // row-major float32 values and gradients
using Shape = Array::shape_type;
using IndexArray = xt::xarray<std::int64_t>;  // token ids, class targets
using Mask = xt::xarray<bool>;             // true marks an element to mask out

class Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;  // e.g. a module's parameters
using NamedArrays = std::vector<std::pair<std::string, Array>>;    // e.g. a checkpoint's contents

// The sum of every element's square, accumulated in double: gradient norms and clipping.
inline double sum_of_squares(const Array& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return s;
}

// A gradient hook sees the gradient arriving at a tensor during backward and may change it
// in place (scale it, zero it, replace it); the changed gradient is what flows on.
using GradHook = std::function<void(Array& grad)>;

struct TapeEntry;

// A value's storage, shared by a tensor and its detach()ed handles. `version` counts the
// in-place writes to it (one per Tensor::mutable_value() call): an op records the versions of
// the values it may read in backward, and backward refuses to run on a value written since.
struct Storage {
  explicit Storage(Array a) : array(std::move(a)) {}
  Array array;
  std::uint64_t version = 0;
};

// One vertex of the graph. Tensor handles share it; tape entries keep their inputs alive.
// A non-leaf belongs to the thread that recorded it. A leaf (a parameter) may be shared by
// passes on several threads: they keep its gradient apart until the end of the pass and then
// run its hooks and add to `grad` under `grad_mutex`.
struct Node {
  std::shared_ptr<Storage> storage;  // shared between a tensor and its detach()ed handles
  Array grad;                    // accumulated gradient of a leaf or a retain_grad() tensor
  bool has_grad = false;
  Array pending;                 // a non-leaf's gradient gathered during the running pass only
  bool has_pending = false;
  bool requires_grad = false;
  bool retains_grad = false;
  bool has_creator = false;      // produced by a recorded op, i.e. not a leaf
  std::weak_ptr<TapeEntry> creator;  // expires when backward releases the entry
  std::uint64_t tape_id = 0;     // the tape (thread) that recorded the creator; 0 for a leaf
  std::mutex grad_mutex;         // held while a pass delivers a leaf's gradient
  std::string name;
  std::vector<std::pair<int, GradHook>> hooks;
  int next_hook_id = 0;

  const Array& value() const { return storage->array; }
};

class Tensor {
 public:
  Tensor() = default;  // an undefined handle (e.g. "no bias"); using it throws
  explicit Tensor(Array value, bool requires_grad = false);

  static Tensor zeros(const Shape& shape, bool requires_grad = false);
  static Tensor ones(const Shape& shape, bool requires_grad = false);
  static Tensor full(const Shape& shape, float fill, bool requires_grad = false);
  static Tensor scalar(float v, bool requires_grad = false);

  bool defined() const { return node_ != nullptr; }
  const Array& value() const;
  // Writes to a leaf's storage without recording (optimizer steps, initialization). Each call
  // counts as one in-place write (it bumps the storage's version), so take the reference for
  // the write and let it go: a graph recorded before the call cannot backpropagate through
  // an op that saved this value (see version()).
  Array& mutable_value();
  // How many times the storage (shared with detach()ed handles) was written in place.
  std::uint64_t version() const;
  const Shape& shape() const { return value().shape(); }
  std::size_t ndim() const { return value().dimension(); }
  std::size_t size() const { return value().size(); }
  std::size_t dim(int axis) const;  // negative axes count from the end
  float item() const;               // the only element; throws unless size() == 1

  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);  // leaves only
  bool is_leaf() const;

  bool has_grad() const;
  const Array& grad() const;  // throws if no gradient has reached this tensor yet
  Array& mutable_grad();      // for clipping and similar in-place edits
  // Sets the gradient of a leaf or retain_grad tensor (same shape as the value), e.g. to hand a
  // gradient computed elsewhere (another process) to an optimizer.
  void set_grad(Array grad);
  void zero_grad();           // forgets the gradient (the next backward starts from zero)

  // Keep the gradient of an intermediate tensor after backward (leaves always keep theirs).
  void retain_grad();
  bool retains_grad() const;
  int register_hook(GradHook hook);  // returns an id for remove_hook
  void remove_hook(int id);

  const std::string& name() const;
  Tensor& set_name(std::string name);

  // A new leaf sharing this tensor's storage, cut from the graph.
  Tensor detach() const;

  // Reverse-mode sweep from this tensor. Without a seed the tensor must hold one element.
  // The graph is released afterwards unless retain_graph is true. Runs on the thread that
  // recorded the graph (see tape.hpp for what threads may share).
  void backward(bool retain_graph = false) const;
  void backward(const Array& seed, bool retain_graph = false) const;

  const std::shared_ptr<Node>& node() const;
  bool is_same(const Tensor& other) const { return node_ == other.node_; }

 private:
  explicit Tensor(std::shared_ptr<Node> node) : node_(std::move(node)) {}
  std::shared_ptr<Node> node_;
};

// Prints the values, then shape, name and whether the tensor requires grad.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Throws naming `op` when the handle is undefined.
void check_defined(const Tensor& t, const char* op);

// Normalizes a possibly negative axis for a tensor of rank ndim; `who` names the caller.
std::size_t normalize_axis(int axis, std::size_t ndim, const char* who);

}  // namespace xgrad
