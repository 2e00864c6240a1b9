/// @file
/// The tensor handle users hold, and the graph node behind it (value, gradient, hooks).
/// Ops live in ops.hpp (the handle's op methods call them, from tensor_methods.cpp); recording
/// and backward live in tape.hpp.
#pragma once

#include <atomic>
#include <cstddef>
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

#include "xgrad/core/autograd/array_allocator.hpp"

namespace xgrad {

/// row-major float32 values and gradients
using Array = xt::xarray<float, xt::layout_type::row_major, ArrayAllocator<float>>;
using Shape = Array::shape_type;              ///< the sizes of an Array's axes
using IndexArray = xt::xarray<std::int64_t>;  ///< token ids, class targets
using Mask = xt::xarray<bool>;                ///< true marks an element to mask out

class Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;  ///< e.g.\ a module's parameters
using NamedArrays = std::vector<std::pair<std::string, Array>>;    ///< e.g.\ a checkpoint's contents

/// The sum of every element's square, accumulated in double: gradient norms and clipping.
inline double sum_of_squares(const Array& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return s;
}

/// An array of `shape` over the floats at `data`, which `owner` keeps alive (a file's mapping):
/// nothing is copied. The array never frees them; when it goes (or what it was moved into), its
/// reference to `owner` goes. Copies of it are ordinary arrays. `data` must be aligned for float
/// and hold the shape's elements; an empty shape gives an ordinary empty array.
Array array_over(float* data, const Shape& shape, std::shared_ptr<const void> owner);
/// An array of `shape` filled with zeros by calloc: memory fresh from the system is zero already
/// and is left untouched until used (a loader's model, whose every weight it then reads).
Array zeroed_array(const Shape& shape);

/// A gradient hook sees the gradient arriving at a tensor during backward and may change it
/// in place (scale it, zero it, replace it); the changed gradient is what flows on. It must keep
/// the gradient's shape (backward throws otherwise).
using GradHook = std::function<void(Array& grad)>;

struct TapeEntry;
struct TopK;
enum class GeluApprox;

/// A value's storage, shared by a tensor and its detach()ed handles. `version` counts the
/// in-place writes to it (one per Tensor::mutable_value() call): an op records the versions of
/// the values it may read in backward, and backward refuses to run on a value written since.
struct Storage {
  /// Storage holding `a`, at version 0.
  explicit Storage(Array a) : array(std::move(a)) {}
  Array array;
  std::uint64_t version = 0;  ///< in-place writes so far
  /// An activation's bf16 copy for the bf16 products that read it, made by the first and dropped
  /// with the value: a detail::Bf16Value (detail/bf16_cache.hpp), held untyped so this header
  /// declares nothing of it. Parameters' copies live in a cache instead.
  std::shared_ptr<const void> bf16;
  /// The values were freed (Node::value_readers): `array` is empty and `freed_shape` is its shape.
  bool freed = false;
  Shape freed_shape;
};

/// One vertex of the graph. Tensor handles share it; tape entries keep their inputs alive.
/// A non-leaf belongs to the thread that recorded it. A leaf (a parameter) may be shared by
/// passes on several threads: they keep its gradient apart until the end of the pass and then
/// run its hooks and add to `grad` under `grad_mutex`.
struct Node {
  std::shared_ptr<Storage> storage;             ///< shared between a tensor and its detach()ed handles
  Array grad;                                   ///< accumulated gradient of a leaf or a retain_grad() tensor
  bool has_grad = false;                        ///< whether `grad` holds a gradient
  Array pending;                                ///< a non-leaf's gradient gathered during the running pass only
  bool has_pending = false;                     ///< whether `pending` holds a gradient
  bool requires_grad = false;                   ///< whether backward computes a gradient for this tensor
  bool retains_grad = false;                    ///< retain_grad() was called: a non-leaf keeps its `grad` too
  bool has_creator = false;                     ///< produced by a recorded op, i.e.\ not a leaf
  std::weak_ptr<TapeEntry> creator;             ///< expires when backward releases the entry
  std::uint64_t tape_id = 0;                    ///< the tape (thread) that recorded the creator; 0 for a leaf
  std::mutex grad_mutex;                        ///< held while a pass delivers a leaf's gradient
  std::string name;                             ///< set_name()'s name, in messages; empty when unnamed
  std::vector<std::pair<int, GradHook>> hooks;  ///< (id, hook) pairs, run in this order
  int next_hook_id = 0;                         ///< the id register_hook() gives next
  /// Tensor handles holding this node (tape entries hold nodes without being handles).
  std::atomic<std::size_t> handles{0};
  /// Live tape entries whose backward may read this node's value. A recorded op's output whose
  /// last handle goes while no entry may read it (the entries that hold it declared with
  /// BackwardReads that they read only its bf16 copy, or nothing) has its value freed then; its
  /// shape stays. Non-leaves only, so only the recording thread touches it.
  std::size_t value_readers = 0;

  /// The value in `storage`; an Error once it was freed (see value_readers).
  const Array& value() const {
    if (storage->freed) freed_value_error(*this);
    return storage->array;
  }
  /// The value's shape, also once the value was freed.
  const Shape& shape() const { return storage->freed ? storage->freed_shape : storage->array.shape(); }

 private:
  [[noreturn]] static void freed_value_error(const Node& node);
};

/// The handle users hold: shared ownership of a Node (value, gradient, name, hooks). Copying a
/// handle never copies data. On an undefined handle every member but defined() and is_same()
/// throws an Error.
class Tensor {
 public:
  Tensor() = default;  ///< an undefined handle (e.g.\ "no bias"); using it throws
  /// A leaf holding `value`.
  explicit Tensor(Array value, bool requires_grad = false);

  /// A leaf of `shape` filled with 0.
  static Tensor zeros(const Shape& shape, bool requires_grad = false);
  /// A leaf of `shape` filled with 1.
  static Tensor ones(const Shape& shape, bool requires_grad = false);
  /// A leaf of `shape` filled with `fill`.
  static Tensor full(const Shape& shape, float fill, bool requires_grad = false);
  /// A leaf of shape () holding `v`.
  static Tensor scalar(float v, bool requires_grad = false);

  /// @name Handles
  /// Copies share the node and count as its handles (Node::handles): when the last handle of a
  /// recorded op's output goes and no backward reads its value, the value is freed.
  /// @{
  Tensor(const Tensor& other) noexcept;             ///< another handle to the same node
  Tensor(Tensor&& other) noexcept = default;        ///< takes other's handle; other is undefined then
  Tensor& operator=(const Tensor& other) noexcept;  ///< lets go of the held node, then shares other's
  Tensor& operator=(Tensor&& other) noexcept;       ///< lets go of the held node, then takes other's
  ~Tensor();                                        ///< lets go of the node
  /// @}

  /// Whether the handle holds a node (false for a default-constructed one).
  bool defined() const { return node_ != nullptr; }
  /// The value (read-only; see mutable_value()).
  const Array& value() const;
  /// Writes to a leaf's storage without recording (optimizer steps, initialization). Each call
  /// counts as one in-place write (it bumps the storage's version), so take the reference for
  /// the write and let it go: a graph recorded before the call cannot backpropagate through
  /// an op that saved this value (see version()).
  Array& mutable_value();
  /// How many times the storage (shared with detach()ed handles) was written in place.
  std::uint64_t version() const;
  const Shape& shape() const { return value().shape(); }    ///< the value's shape
  std::size_t ndim() const { return value().dimension(); }  ///< the number of axes
  std::size_t size() const { return value().size(); }       ///< the number of elements
  std::size_t dim(int axis) const;                          ///< the length of `axis`; negative axes count from the end
  float item() const;                                       ///< the only element; throws unless size() == 1

  /// Whether backward computes a gradient for this tensor (while grad mode is on, ops on it are
  /// recorded; see tape.hpp).
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);  ///< leaves only (an Error on an op's output); returns *this
  /// Whether the tensor was not computed by a recorded op.
  bool is_leaf() const;

  /// Whether a gradient is held (see grad()).
  bool has_grad() const;
  const Array& grad() const;  ///< throws if no gradient has reached this tensor yet
  Array& mutable_grad();      ///< for clipping and similar in-place edits; throws as grad() does
  /// Sets the gradient of a leaf or retain_grad tensor (same shape as the value), e.g.\ to hand a
  /// gradient computed elsewhere (another process) to an optimizer. The tensor must require grad;
  /// anything else is an Error.
  void set_grad(Array grad);
  void zero_grad();  ///< forgets the gradient (the next backward starts from zero)

  /// Keep the gradient of an intermediate tensor after backward (leaves always keep theirs).
  /// The tensor must require grad.
  void retain_grad();
  /// Whether backward keeps this tensor's gradient: after retain_grad(), and for every leaf that
  /// requires grad.
  bool retains_grad() const;
  /// Adds a hook that sees this tensor's gradient during backward (hooks run in the order they
  /// were added); returns an id for remove_hook. The tensor must require grad.
  int register_hook(GradHook hook);
  /// Removes the hook register_hook returned `id` for; an unknown id is an Error.
  void remove_hook(int id);

  /// The name given by set_name (empty by default); messages use it.
  const std::string& name() const;
  /// Names the tensor, for messages and tools; returns *this.
  Tensor& set_name(std::string name);

  /// A new leaf sharing this tensor's storage, cut from the graph (it does not require grad,
  /// and has no name, gradient or hooks).
  Tensor detach() const;

  /// @name Op methods
  /// x.op(args) is the free function op(x, args) of ops.hpp, called as it is: the same value,
  /// gradient and errors (which name the op). topk() returns ops.hpp's TopK and gelu(approx) takes
  /// its GeluApprox, so calling them needs ops.hpp (xgrad.hpp includes it).
  /// @{
  Tensor neg() const;                    ///< neg(x): -x
  Tensor exp() const;                    ///< exp(x): e^x
  Tensor log() const;                    ///< log(x): the natural logarithm
  Tensor sqrt() const;                   ///< sqrt(x): the square root
  Tensor pow(float exponent) const;      ///< pow(x, exponent): x^exponent
  Tensor tanh() const;                   ///< tanh(x): the hyperbolic tangent
  Tensor sigmoid() const;                ///< sigmoid(x): 1 / (1 + e^-x)
  Tensor relu() const;                   ///< relu(x): max(x, 0)
  Tensor gelu() const;                   ///< gelu(x): the exact (erf) GELU
  Tensor gelu(GeluApprox approx) const;  ///< gelu(x, approx): GELU in the form approx names

  Tensor sum() const;   ///< sum(x): the sum of all elements, shape ()
  Tensor mean() const;  ///< mean(x): the mean of all elements, shape ()
  /// sum(x, axes, keepdims): the sum over the listed axes.
  Tensor sum(const std::vector<int>& axes, bool keepdims = false) const;
  /// mean(x, axes, keepdims): the mean over the listed axes.
  Tensor mean(const std::vector<int>& axes, bool keepdims = false) const;
  /// max(x, axis, keepdims): the largest element of each slice along axis (the values only).
  Tensor max(int axis, bool keepdims = false) const;

  /// reshape(x, shape): the elements in row-major order in shape; one entry may be -1.
  Tensor reshape(const std::vector<std::int64_t>& shape) const;
  /// transpose(x, axis0, axis1): x with the two axes swapped.
  Tensor transpose(int axis0, int axis1) const;
  /// permute(x, axes): axis k of the result is axis axes[k] of x.
  Tensor permute(const std::vector<int>& axes) const;
  /// slice(x, axis, start, stop): the elements [start, stop) along axis.
  Tensor slice(int axis, std::size_t start, std::size_t stop) const;
  /// split(x, sizes, axis): pieces of the given sizes along axis.
  std::vector<Tensor> split(const std::vector<std::size_t>& sizes, int axis) const;
  /// chunk(x, n, axis): pieces of ceil(length / n) elements along axis, as torch.chunk.
  std::vector<Tensor> chunk(std::size_t n, int axis) const;

  /// gather(x, axis, index): x read at index along axis, as torch.gather.
  Tensor gather(int axis, const IndexArray& index) const;
  /// index_select(x, axis, ids): the slices along axis named by the 1-D ids.
  Tensor index_select(int axis, const IndexArray& ids) const;
  /// where(mask, x, other): x where mask is true, other where it is false, as torch.Tensor.where.
  Tensor where(const Mask& mask, const Tensor& other) const;
  /// argmax(x, axis, keepdims): the position of each slice's largest element (no gradient).
  IndexArray argmax(int axis, bool keepdims = false) const;
  /// topk(x, k, axis): the k largest elements of each slice and their positions, largest first.
  TopK topk(std::size_t k, int axis = -1) const;

  /// matmul(x, other, transpose_a, transpose_b): x @ other, the flags transposing x and other.
  Tensor matmul(const Tensor& other, bool transpose_a = false, bool transpose_b = false) const;

  Tensor softmax(int axis = -1) const;      ///< softmax(x, axis)
  Tensor log_softmax(int axis = -1) const;  ///< log_softmax(x, axis)
  /// masked_fill(x, mask, value): value where mask is true, x elsewhere.
  Tensor masked_fill(const Mask& mask, float value) const;
  /// masked_fill(x, mask, values): values (of x's shape) where mask is true, x elsewhere.
  Tensor masked_fill(const Mask& mask, const Array& values) const;
  /// @}

  /// Reverse-mode sweep from this tensor. Without a seed the tensor must hold one element (the
  /// seed is then 1).
  /// The graph is released afterwards unless retain_graph is true. Runs on the thread that
  /// recorded the graph (see tape.hpp for what threads may share).
  void backward(bool retain_graph = false) const;
  /// The same sweep seeded with `seed` (the gradient of this tensor, of its shape).
  void backward(const Array& seed, bool retain_graph = false) const;

  /// The node behind the handle, for the tape and tools that read the graph.
  const std::shared_ptr<Node>& node() const;
  /// Whether both handles hold the same node.
  bool is_same(const Tensor& other) const { return node_ == other.node_; }

 private:
  explicit Tensor(std::shared_ptr<Node> node);
  std::shared_ptr<Node> node_;
};

/// Prints the values, then shape, name and whether the tensor requires grad.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// Throws naming `op` when the handle is undefined.
void check_defined(const Tensor& t, const char* op);

/// The flat position of the first NaN or infinity in `a`, or a.size() when every element is
/// finite (one vectorizable pass when all are).
std::size_t first_non_finite(const Array& a);

/// Normalizes a possibly negative axis for a tensor of rank ndim; `who` names the caller.
/// An axis outside [-ndim, ndim) is an Error.
std::size_t normalize_axis(int axis, std::size_t ndim, const char* who);

}  // namespace xgrad
