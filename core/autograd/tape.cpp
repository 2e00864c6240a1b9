// The per-thread tape, grad mode, and the reverse sweep.
#include "xgrad/core/autograd/tape.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

std::atomic<std::uint64_t> last_tape_id{0};

struct Tape {
  std::uint64_t id = ++last_tape_id;  // never reused, so a dead thread's id matches no tape
  std::vector<std::shared_ptr<TapeEntry>> entries;  // in recording order
  std::uint64_t next_seq = 0;
  std::size_t prune_at = 4096;
};

// State of the backward pass running on this thread. A non-leaf's pending gradient lives on
// its node (only this thread records or sweeps it); a leaf's lives here, since passes on
// other threads may be gathering gradients for the same leaf at the same time.
struct Pass {
  std::vector<std::shared_ptr<Node>> touched;  // non-leaves holding a pending gradient
  std::deque<std::pair<std::shared_ptr<Node>, Array>> leaves;  // first-touch order; a deque
                                                               // keeps references stable
  std::unordered_map<const Node*, Array*> leaf_index;
  std::unordered_set<const Node*> delivered;  // leaves handed their gradient before the end
  std::vector<std::function<void()>> callbacks;  // queue_backward_callback, run at the end
};

thread_local Tape tape;
thread_local bool grad_mode = true;
thread_local bool anomaly_mode = false;
thread_local Pass* current_pass = nullptr;
thread_local std::uint64_t pass_count = 0;

constexpr std::size_t kMinPrune = 4096;

// Drops entries whose output no handle or later op holds: no gradient can ever reach them.
// Walking backwards lets one sweep cascade, since dropping an entry releases its inputs.
void prune() {
  auto& e = tape.entries;
  for (std::size_t i = e.size(); i-- > 0;) {
    if (e[i]->output.expired()) e[i].reset();
  }
  e.erase(std::remove(e.begin(), e.end(), nullptr), e.end());
  tape.prune_at = std::max(kMinPrune, 2 * e.size());
}

// Index of the first NaN or Inf in a, or a.size() when every element is finite.
std::size_t first_non_finite(const Array& a) {
  const float* d = a.data();
  for (std::size_t i = 0, n = a.size(); i < n; ++i) {
    if (!std::isfinite(d[i])) return i;
  }
  return a.size();
}

// The gradient gathered so far for n in the running pass, or null.
Array* pending_of(Node& n) {
  if (n.has_creator) return n.has_pending ? &n.pending : nullptr;
  const auto it = current_pass->leaf_index.find(&n);
  return it == current_pass->leaf_index.end() ? nullptr : it->second;
}

// Makes g the first pending gradient of n in the running pass.
Array& start_pending(const std::shared_ptr<Node>& n, Array&& g) {
  if (n->has_creator) {
    n->pending = std::move(g);
    n->has_pending = true;
    current_pass->touched.push_back(n);
    return n->pending;
  }
  Array& slot = current_pass->leaves.emplace_back(n, std::move(g)).second;
  current_pass->leaf_index.emplace(n.get(), &slot);
  return slot;
}

std::string describe(const Node& n) { return n.name.empty() ? std::string("an unnamed tensor") : "'" + n.name + "'"; }

void add_into(Array& dst, const Array& src) {
  float* d = dst.data();
  const float* s = src.data();
  parallel_for(src.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) d[i] += s[i];
  });
}

// The gradient has arrived in full at `node`: hooks see it, and a leaf or retain_grad tensor
// keeps it (accumulating across backward calls, as PyTorch does). A leaf's caller holds its
// grad_mutex.
// `consume`: the caller no longer needs `grad`, so a first gradient is moved in, not copied.
void deliver(Node& node, Array& grad, bool consume) {
  for (auto& [id, hook] : node.hooks) {
    hook(grad);
    if (grad.shape() != node.value().shape()) {
      fail("backward: a hook on tensor '", node.name, "' changed its gradient's shape from ",
           shape_str(node.value().shape()), " to ", shape_str(grad.shape()));
    }
  }
  if (anomaly_mode) {
    const std::size_t bad = first_non_finite(grad);
    if (bad < grad.size()) {
      fail("anomaly: the gradient reaching ", describe(node), " is ", grad.data()[bad], " at flat position ", bad,
           node.hooks.empty() ? "" : " (after its hooks ran)");
    }
  }
  const bool keeps = !node.has_creator || node.retains_grad;
  if (!keeps) return;
  if (node.has_grad) {
    add_into(node.grad, grad);
  } else {
    if (consume) {
      node.grad = std::move(grad);
    } else {
      node.grad = grad;
    }
    node.has_grad = true;
  }
}

const char* const kOtherThread =
    "backward: the graph behind this tensor was recorded on another thread; backward must run on the "
    "thread that recorded it (each thread has its own tape)";

const char* const kReleased =
    "backward: the graph behind this tensor was already released by an earlier backward(); "
    "pass retain_graph=true to the first backward() to backpropagate through it again";

}  // namespace

bool grad_enabled() { return grad_mode; }
bool anomaly_enabled() { return anomaly_mode; }
void set_anomaly_enabled(bool on) { anomaly_mode = on; }
void set_grad_enabled(bool on) { grad_mode = on; }

std::size_t tape_size() { return tape.entries.size(); }

Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardFn fn) {
  if (anomaly_mode) {
    const std::size_t bad = first_non_finite(value);
    if (bad < value.size()) {
      std::string names;
      for (const Tensor& t : inputs) {
        if (t.defined()) names += (names.empty() ? "" : ", ") + describe(*t.node());
      }
      fail("anomaly: forward of ", op, " produced ", value.data()[bad], " at flat position ", bad, " of its ",
           shape_str(value.shape()), " output (inputs: ", names, ")");
    }
  }
  Tensor out(std::move(value));
  if (!grad_mode) return out;
  const bool any = std::any_of(inputs.begin(), inputs.end(),
                               [](const Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!any) return out;
  auto entry = std::make_shared<TapeEntry>();
  entry->op = op;
  entry->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      entry->inputs.push_back({nullptr, 0});
      continue;
    }
    const Node& in = *t.node();
    // This thread's sweep never reaches another tape's entries: the gradient would be lost.
    if (in.has_creator && in.tape_id != tape.id) {
      fail(op, ": input ", entry->inputs.size(), in.name.empty() ? std::string() : " ('" + in.name + "')",
           " was computed by an op recorded on another thread, and the gradient cannot flow back to that "
           "thread's graph; pass it as t.detach() (a new leaf) or record the whole graph on one thread");
    }
    entry->inputs.push_back({t.node(), in.storage->version});
  }
  entry->output = out.node();
  entry->output_version = out.node()->storage->version;
  entry->backward = std::move(fn);
  entry->seq = tape.next_seq++;
  Node& n = *out.node();
  n.requires_grad = true;
  n.has_creator = true;
  n.creator = entry;
  n.tape_id = tape.id;
  tape.entries.push_back(std::move(entry));
  if (tape.entries.size() >= tape.prune_at) prune();
  return out;
}

void GradContext::changed(long input) const {
  const Node& n = input < 0 ? output_ : *entry_.inputs[static_cast<std::size_t>(input)].node;
  const std::uint64_t was = input < 0 ? entry_.output_version : entry_.inputs[static_cast<std::size_t>(input)].version;
  const std::string which = input < 0 ? std::string("output") : "input " + std::to_string(input);
  const std::string what = n.name.empty() ? std::string() : "'" + n.name + "', ";
  fail("backward: ", entry_.op, "'s ", which, " (", what, "shape ", shape_str(n.value().shape()),
       ") was changed in place after the op saved it for backward (version ", was, " -> ", n.storage->version,
       "), so backward would compute with the new values; change it after backward, or run the forward again "
       "after changing it");
}

Node& GradContext::prepare(std::size_t i) {
  const auto& in = entry_.inputs.at(i).node;
  if (!in || !in->requires_grad) fail("backward of ", entry_.op, ": input ", i, " does not take a gradient");
  if (in->has_creator && in->creator.expired()) fail(kReleased);
  return *in;
}

void GradContext::accumulate(std::size_t i, Array&& g) {
  Node& n = prepare(i);
  if (g.shape() != n.value().shape()) {
    fail("backward of ", entry_.op, ": gradient for input ", i, " has shape ", shape_str(g.shape()),
         " but the input has shape ", shape_str(n.value().shape()));
  }
  if (Array* pending = pending_of(n)) {
    add_into(*pending, g);
    return;
  }
  start_pending(entry_.inputs[i].node, std::move(g));
}

Array& GradContext::grad_buffer(std::size_t i) {
  Node& n = prepare(i);
  if (Array* pending = pending_of(n)) return *pending;
  Array zeros = Array::from_shape(n.value().shape());
  float* d = zeros.data();
  parallel_for(zeros.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) { std::fill(d + lo, d + hi, 0.f); });
  return start_pending(entry_.inputs[i].node, std::move(zeros));
}

GradContext::GradTarget GradContext::grad_target(std::size_t i) {
  Node& n = prepare(i);
  if (Array* pending = pending_of(n)) return {pending->data(), 1.f};
  return {start_pending(entry_.inputs[i].node, Array::from_shape(n.value().shape())).data(), 0.f};
}

void GradContext::accumulate_reduced(std::size_t i, const Array& g) {
  if (g.shape() == entry_.inputs.at(i).node->value().shape()) {
    Array copy = Array::from_shape(g.shape());
    const float* s = g.data();
    float* d = copy.data();
    parallel_for(g.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) { std::copy(s + lo, s + hi, d + lo); });
    accumulate(i, std::move(copy));
  } else {
    add_reduced(grad_buffer(i), g);
  }
}

void run_backward(const Tensor& root, const Array* seed, bool retain_graph) {
  const std::shared_ptr<Node>& r = root.node();
  if (!r->requires_grad) {
    fail("backward: the tensor does not require grad (it was computed under NoGradGuard or from "
         "inputs that do not require grad)");
  }
  if (current_pass) fail("backward: called from inside another backward pass (from a hook?)");
  if (r->has_creator && r->tape_id != tape.id) fail(kOtherThread);
  std::shared_ptr<TapeEntry> root_entry;
  if (r->has_creator) {
    root_entry = r->creator.lock();
    if (!root_entry) fail(kReleased);
  }
  Array g;
  if (seed) {
    if (seed->shape() != r->value().shape()) {
      fail("backward: seed gradient of shape ", shape_str(seed->shape()), " does not match the tensor's shape ",
           shape_str(r->value().shape()));
    }
    g = *seed;
  } else {
    if (r->value().size() != 1) {
      fail("backward: called without a seed gradient on a tensor of shape ", shape_str(r->value().shape()),
           "; only a single-element tensor gets the implicit seed 1");
    }
    g = xt::ones<float>(r->value().shape());
  }

  Pass pass;
  current_pass = &pass;
  ++pass_count;
  // Whatever happens, leave no pending gradient behind and drop the entries that ran.
  struct Cleanup {
    Pass& pass;
    ~Cleanup() {
      for (auto& n : pass.touched) {
        n->pending = Array();
        n->has_pending = false;
      }
      auto& e = tape.entries;
      e.erase(std::remove_if(e.begin(), e.end(), [](const auto& x) { return !x->backward; }), e.end());
      current_pass = nullptr;
    }
  } cleanup{pass};

  start_pending(r, std::move(g));

  auto deliver_leaf = [](Node& leaf, Array& grad) {
    std::lock_guard<std::mutex> lock(leaf.grad_mutex);
    deliver(leaf, grad, true);  // a leaf's pass-local gradient ends here
  };
  if (root_entry) {
    auto& entries = tape.entries;
    auto it = std::lower_bound(entries.begin(), entries.end(), root_entry->seq,
                               [](const auto& e, std::uint64_t s) { return e->seq < s; });
    const std::size_t root_index = static_cast<std::size_t>(it - entries.begin());
    // A leaf with hooks gets its gradient as soon as it is final, once the sweep has passed the
    // earliest entry that reads it, so a hook that starts work (DataParallel's reductions)
    // overlaps the rest of backward. Other leaves get theirs at the end.
    std::vector<std::pair<std::size_t, Node*>> early;  // (earliest reader, leaf), latest first
    {
      std::unordered_map<Node*, std::size_t> first_reader;
      for (std::size_t j = 0; j <= root_index; ++j) {
        for (const auto& [in, version] : entries[j]->inputs) {
          if (in && !in->has_creator && !in->hooks.empty()) first_reader.emplace(in.get(), j);
        }
      }
      for (const auto& [leaf, j] : first_reader) early.emplace_back(j, leaf);
      std::sort(early.begin(), early.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    }
    std::size_t next_early = 0;
    for (std::size_t i = root_index + 1; i-- > 0;) {
      for (; next_early < early.size() && early[next_early].first > i; ++next_early) {
        Node* leaf = early[next_early].second;
        const auto found = pass.leaf_index.find(leaf);
        if (found == pass.leaf_index.end()) continue;
        deliver_leaf(*leaf, *found->second);
        pass.delivered.insert(leaf);
      }
      TapeEntry& e = *entries[i];
      std::shared_ptr<Node> out = e.output.lock();
      if (!out || !out->has_pending) continue;
      if (!e.backward) fail(kReleased);
      Array grad = std::move(out->pending);
      out->has_pending = false;
      deliver(*out, grad, false);  // its backward still reads grad
      GradContext ctx(e, grad, *out);
      e.backward(ctx);
      if (anomaly_mode) {
        for (std::size_t i = 0; i < e.inputs.size(); ++i) {
          const auto& in = e.inputs[i].node;
          const Array* pending = in ? pending_of(*in) : nullptr;
          if (!pending) continue;
          const std::size_t bad = first_non_finite(*pending);
          if (bad < pending->size()) {
            fail("anomaly: backward of ", e.op, " produced ", pending->data()[bad], " in the gradient of its input ", i,
                 " (", describe(*in), ", shape ", shape_str(pending->shape()), ") at flat position ", bad,
                 "; the gradient arriving at its output was ", first_non_finite(grad) < grad.size() ? "not finite" : "finite");
          }
        }
      }
      if (!retain_graph) {
        e.backward = nullptr;  // frees what the closure cached
        e.inputs.clear();      // frees activations (the pass still holds the touched nodes)
      }
    }
  }
  for (auto& [leaf, grad] : pass.leaves) {
    if (!pass.delivered.count(leaf.get())) deliver_leaf(*leaf, grad);
  }
  for (std::size_t i = 0; i < pass.callbacks.size(); ++i) pass.callbacks[i]();
}

std::uint64_t current_backward_pass() { return current_pass ? pass_count : 0; }

void queue_backward_callback(std::function<void()> fn) {
  if (!current_pass) fail("queue_backward_callback: no backward pass is running on this thread (call it from a hook)");
  if (!fn) fail("queue_backward_callback: empty callback");
  current_pass->callbacks.push_back(std::move(fn));
}

}  // namespace xgrad
