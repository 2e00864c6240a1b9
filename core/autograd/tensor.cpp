// Tensor handle accessors; backward itself is in tape.cpp.
#include "xgrad/core/autograd/tensor.hpp"

#include <algorithm>
#include <ostream>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/allocator.hpp"

namespace xgrad {

namespace {
// Every program that makes a tensor links this file, so the allocator is tuned before main.
const bool allocator_tuned = (keep_freed_memory(), true);

Node& checked(const std::shared_ptr<Node>& node, const char* who) {
  if (!node) fail(who, ": the tensor is undefined (default-constructed handle)");
  return *node;
}
}  // namespace

Tensor::Tensor(Array value, bool requires_grad) : node_(std::make_shared<Node>()) {
  node_->storage = std::make_shared<Storage>(std::move(value));
  node_->requires_grad = requires_grad;
  node_->handles = 1;
}

Tensor::Tensor(std::shared_ptr<Node> node) : node_(std::move(node)) {
  if (node_) node_->handles.fetch_add(1, std::memory_order_relaxed);
}

Tensor::Tensor(const Tensor& other) noexcept : node_(other.node_) {
  if (node_) node_->handles.fetch_add(1, std::memory_order_relaxed);
}

Tensor& Tensor::operator=(const Tensor& other) noexcept {
  Tensor copy(other);
  std::swap(node_, copy.node_);
  return *this;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  Tensor moved(std::move(other));
  std::swap(node_, moved.node_);
  return *this;
}

Tensor::~Tensor() {
  if (!node_ || node_->handles.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last handle: a recorded op's output that a tape entry still holds (for the gradient's
  // way back) but whose value no backward reads, and that no detach()ed handle shares, is freed.
  Node& n = *node_;
  if (n.has_creator && n.value_readers == 0 && node_.use_count() > 1 && n.storage.use_count() == 1 &&
      !n.storage->freed) {
    n.storage->freed_shape = n.storage->array.shape();
    n.storage->array = Array();
    n.storage->freed = true;
  }
}

void Node::freed_value_error(const Node& node) {
  fail("the value of ", node.name.empty() ? std::string("an unnamed tensor") : "'" + node.name + "'", " (shape ",
       shape_str(node.storage->freed_shape), ") was freed when its last handle went: the ops that read it declared ",
       "(BackwardReads) that their backward does not read it");
}

Tensor Tensor::zeros(const Shape& shape, bool requires_grad) { return full(shape, 0.f, requires_grad); }
Tensor Tensor::ones(const Shape& shape, bool requires_grad) { return full(shape, 1.f, requires_grad); }
Tensor Tensor::full(const Shape& shape, float fill, bool requires_grad) {
  Array a = Array::from_shape(shape);
  a.fill(fill);
  return Tensor(std::move(a), requires_grad);
}
Tensor Tensor::scalar(float v, bool requires_grad) { return Tensor(Array(v), requires_grad); }

const Array& Tensor::value() const { return checked(node_, "Tensor::value").value(); }

Array& Tensor::mutable_value() {
  Storage& s = *checked(node_, "Tensor::mutable_value").storage;
  ++s.version;
  return s.array;
}

std::uint64_t Tensor::version() const { return checked(node_, "Tensor::version").storage->version; }

std::size_t Tensor::dim(int axis) const { return shape()[normalize_axis(axis, ndim(), "Tensor::dim")]; }

float Tensor::item() const {
  const Array& v = value();
  if (v.size() != 1)
    fail("Tensor::item: tensor of shape ", shape_str(v.shape()), " has ", v.size(), " elements, not 1");
  return v.data()[0];
}

bool Tensor::requires_grad() const { return checked(node_, "Tensor::requires_grad").requires_grad; }

Tensor& Tensor::set_requires_grad(bool on) {
  Node& n = checked(node_, "Tensor::set_requires_grad");
  if (n.has_creator)
    fail(
        "Tensor::set_requires_grad: only leaf tensors can change requires_grad (this one was computed by an op; use "
        "detach())");
  n.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !checked(node_, "Tensor::is_leaf").has_creator; }

bool Tensor::has_grad() const { return checked(node_, "Tensor::has_grad").has_grad; }

const Array& Tensor::grad() const {
  const Node& n = checked(node_, "Tensor::grad");
  if (!n.has_grad) {
    fail("Tensor::grad: no gradient", n.name.empty() ? "" : " for '", n.name, n.name.empty() ? "" : "'",
         " (not reached by backward yet",
         n.has_creator && !n.retains_grad ? ", or an intermediate tensor without retain_grad()" : "", ")");
  }
  return n.grad;
}

Array& Tensor::mutable_grad() { return const_cast<Array&>(static_cast<const Tensor*>(this)->grad()); }

void Tensor::set_grad(Array grad) {
  Node& n = checked(node_, "Tensor::set_grad");
  if (!n.requires_grad) fail("Tensor::set_grad: the tensor does not require grad");
  if (n.has_creator && !n.retains_grad)
    fail("Tensor::set_grad: only a leaf or a retain_grad() tensor keeps a gradient");
  if (grad.shape() != n.value().shape()) {
    fail("Tensor::set_grad: gradient of shape ", shape_str(grad.shape()), " for a tensor of shape ",
         shape_str(n.value().shape()));
  }
  n.grad = std::move(grad);
  n.has_grad = true;
}

void Tensor::zero_grad() {
  Node& n = checked(node_, "Tensor::zero_grad");
  n.grad = Array();
  n.has_grad = false;
}

void Tensor::retain_grad() {
  Node& n = checked(node_, "Tensor::retain_grad");
  if (!n.requires_grad) fail("Tensor::retain_grad: the tensor does not require grad");
  n.retains_grad = true;
}

bool Tensor::retains_grad() const {
  const Node& n = checked(node_, "Tensor::retains_grad");
  return n.retains_grad || (!n.has_creator && n.requires_grad);
}

int Tensor::register_hook(GradHook hook) {
  Node& n = checked(node_, "Tensor::register_hook");
  if (!n.requires_grad) fail("Tensor::register_hook: the tensor does not require grad, no gradient will reach it");
  if (!hook) fail("Tensor::register_hook: empty hook");
  n.hooks.emplace_back(n.next_hook_id, std::move(hook));
  return n.next_hook_id++;
}

void Tensor::remove_hook(int id) {
  Node& n = checked(node_, "Tensor::remove_hook");
  auto it = std::find_if(n.hooks.begin(), n.hooks.end(), [id](const auto& h) { return h.first == id; });
  if (it == n.hooks.end()) fail("Tensor::remove_hook: no hook with id ", id);
  n.hooks.erase(it);
}

const std::string& Tensor::name() const { return checked(node_, "Tensor::name").name; }

Tensor& Tensor::set_name(std::string name) {
  checked(node_, "Tensor::set_name").name = std::move(name);
  return *this;
}

Tensor Tensor::detach() const {
  auto n = std::make_shared<Node>();
  n->storage = checked(node_, "Tensor::detach").storage;
  return Tensor(std::move(n));
}

void Tensor::backward(bool retain_graph) const { run_backward(*this, nullptr, retain_graph); }
void Tensor::backward(const Array& seed, bool retain_graph) const { run_backward(*this, &seed, retain_graph); }

const std::shared_ptr<Node>& Tensor::node() const {
  checked(node_, "Tensor::node");
  return node_;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(" << t.value() << ", shape " << shape_str(t.shape());
  if (!t.name().empty()) os << ", name '" << t.name() << "'";
  if (t.requires_grad()) os << ", requires_grad";
  return os << ')';
}

std::size_t first_non_finite(const Array& a) {
  // x * 0 is 0 for every finite x and NaN for NaN and the infinities, so one sum answers "all
  // finite?"; the search for the position runs only when it says no.
  const float* d = a.data();
  float probe = 0.f;
  for (std::size_t i = 0; i < a.size(); ++i) probe += d[i] * 0.f;
  if (probe == 0.f) return a.size();
  std::size_t i = 0;
  while (std::isfinite(d[i])) ++i;
  return i;
}

void check_defined(const Tensor& t, const char* op) {
  if (!t.defined()) fail(op, ": input is an undefined tensor");
}

std::size_t normalize_axis(int axis, std::size_t ndim, const char* who) {
  const long n = static_cast<long>(ndim);
  if (axis < -n || axis >= n) fail(who, ": axis ", axis, " is out of range for a tensor of rank ", ndim);
  return static_cast<std::size_t>(axis < 0 ? axis + n : axis);
}

}  // namespace xgrad
