// The per-thread tape, grad mode, the reverse sweep, and the gradient-ready listeners it tells.
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
#include "xgrad/core/autograd/detail/recompute.hpp"
#include "xgrad/core/autograd/gradient_ready.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

struct GradientWatch::State {
  GradientReadyListener* listener = nullptr;
  std::vector<std::shared_ptr<Node>> leaves;  // kept alive: the registry is keyed by their nodes
  std::atomic<bool> active{true};             // false once the handle ends the watch
};

namespace {

std::atomic<std::uint64_t> last_tape_id{0};

struct Tape {
  std::uint64_t id = ++last_tape_id;                // never reused, so a dead thread's id matches no tape
  std::vector<std::shared_ptr<TapeEntry>> entries;  // in recording order
  std::uint64_t next_seq = 0;
  std::size_t prune_at = 4096;
};

// A listener's place in the registry: which watch, and the leaf's position in its list.
struct Watcher {
  std::shared_ptr<GradientWatch::State> watch;
  std::size_t index = 0;
};

// A leaf that gets its gradient as soon as it is final (it has hooks or listeners), after the
// sweep has run the earliest tape entry that reads it.
struct ReadyLeaf {
  std::size_t first_reader = 0;
  Node* leaf = nullptr;
  std::vector<Watcher> watchers;
};

// State of the backward pass running on this thread. A non-leaf's pending gradient lives on
// its node (only this thread records or sweeps it); a leaf's lives here, since passes on
// other threads may be gathering gradients for the same leaf at the same time.
struct Pass {
  std::vector<std::shared_ptr<Node>> touched;                  // non-leaves holding a pending gradient
  std::deque<std::pair<std::shared_ptr<Node>, Array>> leaves;  // first-touch order; a deque
                                                               // keeps references stable
  std::unordered_map<const Node*, Array*> leaf_index;
  std::unordered_set<const Node*> delivered;                  // leaves handed their gradient before the end
  std::vector<std::shared_ptr<GradientWatch::State>> joined;  // listeners told of this pass
  std::size_t told_end = 0;                                   // joined[0, told_end) heard pass_ended
  std::vector<std::function<void()>> callbacks;               // queue_backward_callback, run at the end
};

thread_local Tape tape;
thread_local bool grad_mode = true;
thread_local bool anomaly_mode = false;
thread_local Pass* current_pass = nullptr;

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

// The gradient has arrived in full at `node`: its hooks see it, and in anomaly mode it is checked.
void arrive(Node& node, Array& grad) {
  for (auto& [id, hook] : node.hooks) {
    hook(grad);
    if (grad.shape() != node.shape()) {
      fail("backward: a hook on tensor '", node.name, "' changed its gradient's shape from ", shape_str(node.shape()),
           " to ", shape_str(grad.shape()));
    }
  }
  if (anomaly_mode) {
    const std::size_t bad = first_non_finite(grad);
    if (bad < grad.size()) {
      fail("anomaly: the gradient reaching ", describe(node), " is ", grad.data()[bad], " at flat position ", bad,
           node.hooks.empty() ? "" : " (after its hooks ran)");
    }
  }
}

// A leaf or retain_grad tensor keeps its gradient, accumulating across backward calls as PyTorch
// does. `consume`: the caller no longer needs `grad`, so a first gradient is moved in, not copied.
void keep(Node& node, Array& grad, bool consume) {
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

// Hands a leaf its gradient for the pass under its mutex: its hooks, then its listeners, then the
// sum into its grad (the pass-local gradient ends here).
void deliver_leaf(Node& leaf, Array& grad, const std::vector<Watcher>& watchers) {
  std::lock_guard<std::mutex> lock(leaf.grad_mutex);
  arrive(leaf, grad);
  for (const Watcher& w : watchers) {
    if (!w.watch->active) continue;
    auto& joined = current_pass->joined;
    if (std::find(joined.begin(), joined.end(), w.watch) == joined.end()) joined.push_back(w.watch);
    w.watch->listener->gradient_ready(w.index, grad);
    if (grad.shape() != leaf.shape()) {
      fail("backward: a gradient-ready listener changed the gradient of ", describe(leaf), " (leaf ", w.index,
           " of its watch) from shape ", shape_str(leaf.shape()), " to ", shape_str(grad.shape()));
    }
  }
  keep(leaf, grad, true);
}

std::mutex watch_mutex;  // guards the registry below
std::unordered_map<const Node*, std::vector<Watcher>> watchers_of;
std::atomic<std::size_t> watch_count{0};

// The leaves that get their gradient as soon as it is final, those with hooks or listeners, each
// with the earliest of entries[0, end) that reads it and can still run, latest first (ties in
// reading order): once the sweep has run that entry the leaf's gradient is final. A leaf root is
// final from the start.
std::vector<ReadyLeaf> ready_schedule(const std::vector<std::shared_ptr<TapeEntry>>& entries, std::size_t end,
                                      Node& root) {
  std::unique_lock<std::mutex> lock(watch_mutex, std::defer_lock);
  if (watch_count > 0) lock.lock();
  std::vector<ReadyLeaf> ready;
  std::unordered_set<const Node*> seen;
  auto consider = [&](Node& n, std::size_t reader) {
    if (n.has_creator || (n.hooks.empty() && !lock.owns_lock()) || !seen.insert(&n).second) return;
    const std::vector<Watcher>* watchers = nullptr;
    if (lock.owns_lock()) {
      const auto it = watchers_of.find(&n);
      if (it != watchers_of.end()) watchers = &it->second;
    }
    if (n.hooks.empty() && !watchers) return;
    ready.push_back({reader, &n, watchers ? *watchers : std::vector<Watcher>()});
  };
  consider(root, 0);
  for (std::size_t j = 0; j < end; ++j) {
    if (entries[j]->output.expired()) continue;  // it can never run
    for (const SavedInput& in : entries[j]->inputs) {
      if (in.node && in.node->requires_grad) consider(*in.node, j);
    }
  }
  std::stable_sort(ready.begin(), ready.end(),
                   [](const ReadyLeaf& a, const ReadyLeaf& b) { return a.first_reader > b.first_reader; });
  return ready;
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

void TapeEntry::release_inputs() {
  for (const SavedInput& in : inputs) {
    if (in.counted) --in.node->value_readers;
  }
  inputs.clear();
  if (!output_counted) return;
  output_counted = false;
  if (const auto out = output.lock()) --out->value_readers;
}

Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardFn fn) {
  return record(op, std::move(value), inputs, BackwardReads{}, std::move(fn));
}

Tensor record(const char* op, Array value, const std::vector<Tensor>& inputs, BackwardReads reads, BackwardFn fn) {
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
  const bool any =
      std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); });
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
    const std::size_t i = entry->inputs.size();
    // counted for non-leaves only: a leaf's value is never freed, and leaves may be shared by threads
    const bool counted = in.has_creator && (i >= 64 || !(reads.unread_inputs >> i & 1u));
    if (counted) ++t.node()->value_readers;
    entry->inputs.push_back({t.node(), in.storage->version, counted});
  }
  entry->output = out.node();
  entry->output_version = out.node()->storage->version;
  entry->output_counted = reads.output;
  if (reads.output) ++out.node()->value_readers;
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
  fail("backward: ", entry_.op, "'s ", which, " (", what, "shape ", shape_str(n.shape()),
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
  if (g.shape() != n.shape()) {
    fail("backward of ", entry_.op, ": gradient for input ", i, " has shape ", shape_str(g.shape()),
         " but the input has shape ", shape_str(n.shape()));
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
  Array zeros = Array::from_shape(n.shape());
  float* d = zeros.data();
  parallel_for(zeros.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) { std::fill(d + lo, d + hi, 0.f); });
  return start_pending(entry_.inputs[i].node, std::move(zeros));
}

GradContext::GradTarget GradContext::grad_target(std::size_t i) {
  Node& n = prepare(i);
  if (Array* pending = pending_of(n)) return {pending->data(), 1.f};
  return {start_pending(entry_.inputs[i].node, Array::from_shape(n.shape())).data(), 0.f};
}

void GradContext::accumulate_reduced(std::size_t i, const Array& g) {
  Node& n = prepare(i);
  if (g.shape() == n.shape()) {
    if (Array* pending = pending_of(n)) {
      add_into(*pending, g);
      return;
    }
    Array copy = Array::from_shape(g.shape());
    const float* s = g.data();
    float* d = copy.data();
    parallel_for(g.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) { std::copy(s + lo, s + hi, d + lo); });
    start_pending(entry_.inputs[i].node, std::move(copy));
  } else {
    add_reduced(grad_buffer(i), g);
  }
}

void GradContext::pass_grad_out(std::size_t i) {
  Node& n = prepare(i);
  Array g = take_grad_out();
  if (g.shape() != n.shape()) {
    add_reduced(grad_buffer(i), g);
  } else if (Array* pending = pending_of(n)) {
    add_into(*pending, g);
  } else {
    start_pending(entry_.inputs[i].node, std::move(g));
  }
}

namespace {

// The gradient the sweep starts from at `root`: the seed, or 1 for a single element.
Array seed_gradient(const Node& root, const Array* seed) {
  if (seed) {
    if (seed->shape() != root.shape()) {
      fail("backward: seed gradient of shape ", shape_str(seed->shape()), " does not match the tensor's shape ",
           shape_str(root.shape()));
    }
    return *seed;
  }
  if (root.value().size() != 1) {
    fail("backward: called without a seed gradient on a tensor of shape ", shape_str(root.shape()),
         "; only a single-element tensor gets the implicit seed 1");
  }
  return xt::ones<float>(root.shape());
}

// Makes `pass` the one running on this thread for its scope. Whatever happens, it leaves no
// pending gradient behind and drops the entries that ran.
struct RunningPass {
  explicit RunningPass(Pass& p) : pass(p) { current_pass = &pass; }
  ~RunningPass() {
    for (auto& n : pass.touched) {
      n->pending = Array();
      n->has_pending = false;
    }
    auto& e = tape.entries;
    e.erase(std::remove_if(e.begin(), e.end(), [](const auto& x) { return !x->backward; }), e.end());
    current_pass = nullptr;
  }
  RunningPass(const RunningPass&) = delete;
  RunningPass& operator=(const RunningPass&) = delete;
  Pass& pass;
};

// Runs one tape entry of the sweep, if a gradient reached its output.
void run_entry(TapeEntry& e, bool retain_graph) {
  std::shared_ptr<Node> out = e.output.lock();
  if (!out || !out->has_pending) return;
  if (!e.backward) fail(kReleased);
  Array grad = std::move(out->pending);
  out->has_pending = false;
  arrive(*out, grad);
  keep(*out, grad, false);  // its backward still reads grad
  const bool grad_finite = !anomaly_mode || first_non_finite(grad) == grad.size();
  GradContext ctx(e, grad, *out, retain_graph);
  e.backward(ctx);  // may move grad on (pass_grad_out)
  if (anomaly_mode) {
    for (std::size_t i = 0; i < e.inputs.size(); ++i) {
      const auto& in = e.inputs[i].node;
      const Array* pending = in ? pending_of(*in) : nullptr;
      if (!pending) continue;
      const std::size_t bad = first_non_finite(*pending);
      if (bad < pending->size()) {
        fail("anomaly: backward of ", e.op, " produced ", pending->data()[bad], " in the gradient of its input ", i,
             " (", describe(*in), ", shape ", shape_str(pending->shape()), ") at flat position ", bad,
             "; the gradient arriving at its output was ", grad_finite ? "finite" : "not finite");
      }
    }
  }
  if (!retain_graph) {
    e.backward = nullptr;  // frees what the closure cached
    e.release_inputs();    // frees activations (the pass still holds the touched nodes)
  }
}

// Hands a leaf of the ready schedule its gradient, if the pass produced one.
void deliver_ready(ReadyLeaf& r) {
  const auto found = current_pass->leaf_index.find(r.leaf);
  if (found == current_pass->leaf_index.end()) return;
  deliver_leaf(*r.leaf, *found->second, r.watchers);
  current_pass->delivered.insert(r.leaf);
}

// Every gradient is delivered: the listeners hear that the pass ended, then the queued callbacks run.
void end_pass(Pass& pass) {
  while (pass.told_end < pass.joined.size()) {
    const auto& watch = pass.joined[pass.told_end++];
    if (watch->active) watch->listener->pass_ended();
  }
  for (std::size_t i = 0; i < pass.callbacks.size(); ++i) pass.callbacks[i]();
}

void fail_pass(Pass& pass) noexcept {
  for (std::size_t k = pass.told_end; k < pass.joined.size(); ++k) {
    if (pass.joined[k]->active) pass.joined[k]->listener->pass_failed();
  }
}

}  // namespace

void run_backward(const Tensor& root, const Array* seed, bool retain_graph) {
  const std::shared_ptr<Node>& r = root.node();
  if (!r->requires_grad) {
    fail(
        "backward: the tensor does not require grad (it was computed under NoGradGuard or from "
        "inputs that do not require grad)");
  }
  if (current_pass) fail("backward: called from inside another backward pass (from a hook?)");
  if (r->has_creator && r->tape_id != tape.id) fail(kOtherThread);
  std::shared_ptr<TapeEntry> root_entry;
  if (r->has_creator) {
    root_entry = r->creator.lock();
    if (!root_entry) fail(kReleased);
  }
  Array g = seed_gradient(*r, seed);

  Pass pass;
  const RunningPass running(pass);
  start_pending(r, std::move(g));
  // The sweep runs entries [0, end) in reverse: the root's and every entry recorded before it.
  auto& entries = tape.entries;
  std::size_t end = 0;
  if (root_entry) {
    const auto it = std::lower_bound(entries.begin(), entries.end(), root_entry->seq,
                                     [](const auto& e, std::uint64_t s) { return e->seq < s; });
    end = static_cast<std::size_t>(it - entries.begin()) + 1;
  }
  std::vector<ReadyLeaf> ready = ready_schedule(entries, end, *r);
  std::size_t next_ready = 0;
  try {
    for (std::size_t i = end; i-- > 0;) {
      for (; next_ready < ready.size() && ready[next_ready].first_reader > i; ++next_ready) {
        deliver_ready(ready[next_ready]);
      }
      run_entry(*entries[i], retain_graph);
    }
    for (; next_ready < ready.size(); ++next_ready) deliver_ready(ready[next_ready]);
    for (auto& [leaf, grad] : pass.leaves) {
      if (!pass.delivered.count(leaf.get())) deliver_leaf(*leaf, grad, {});
    }
    end_pass(pass);
  } catch (...) {
    fail_pass(pass);
    throw;
  }
}

namespace {

// This thread's tape, pass and grad mode set aside for a scope (grad mode on), restored whatever happens.
struct SetAside {
  Tape outer = std::exchange(tape, Tape{});
  Pass* pass = std::exchange(current_pass, nullptr);
  bool mode = std::exchange(grad_mode, true);
  SetAside() = default;
  SetAside(const SetAside&) = delete;
  SetAside& operator=(const SetAside&) = delete;
  ~SetAside() {
    tape = std::move(outer);
    current_pass = pass;
    grad_mode = mode;
  }
};

}  // namespace

Array detail::run_isolated(const std::function<Tensor()>& forward) {
  const SetAside aside;
  Tensor out = forward();
  check_defined(out, "checkpoint: the function's output");
  // The tape and out's graph end here: the value is moved out, unless out shares its storage (fn
  // returned one of its inputs, or a view of one).
  if (out.node().use_count() > 1 || out.node()->storage.use_count() > 1) return out.value();
  return std::move(out.mutable_value());
}

std::vector<std::pair<std::shared_ptr<Node>, Array>> detail::recompute_gradients(const std::function<Tensor()>& forward,
                                                                                 const Array& seed) {
  const SetAside aside;
  const Tensor out = forward();
  std::vector<std::pair<std::shared_ptr<Node>, Array>> grads;
  if (!out.defined() || !out.requires_grad()) return grads;  // nothing it computed takes a gradient
  const std::shared_ptr<Node>& r = out.node();
  Array g = seed_gradient(*r, &seed);
  Pass pass;
  const RunningPass running(pass);
  start_pending(r, std::move(g));
  for (std::size_t i = tape.entries.size(); i-- > 0;) run_entry(*tape.entries[i], false);
  for (auto& [leaf, grad] : pass.leaves) grads.emplace_back(leaf, std::move(grad));
  return grads;
}

void queue_backward_callback(std::function<void()> fn) {
  if (!current_pass) fail("queue_backward_callback: no backward pass is running on this thread (call it from a hook)");
  if (!fn) fail("queue_backward_callback: empty callback");
  current_pass->callbacks.push_back(std::move(fn));
}

GradientWatch watch_gradients(const std::vector<Tensor>& leaves, GradientReadyListener& listener) {
  if (current_pass) {
    fail(
        "watch_gradients: called from inside a backward pass on this thread (from a hook or a listener); start "
        "watching before backward");
  }
  auto state = std::make_shared<GradientWatch::State>();
  state->listener = &listener;
  std::unordered_map<const Node*, std::size_t> position;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Tensor& t = leaves[i];
    if (!t.defined()) fail("watch_gradients: leaf ", i, " is an undefined tensor");
    const std::shared_ptr<Node>& n = t.node();
    const std::string what = n->name.empty() ? std::string() : " ('" + n->name + "')";
    if (!n->requires_grad) fail("watch_gradients: leaf ", i, what, " does not require grad, no gradient will reach it");
    if (n->has_creator) {
      fail("watch_gradients: leaf ", i, what, " was computed by an op, not a leaf (watch the parameters)");
    }
    const auto [at, fresh] = position.emplace(n.get(), i);
    if (!fresh) fail("watch_gradients: leaf ", i, what, " is listed twice (also as leaf ", at->second, ")");
    state->leaves.push_back(n);
  }
  std::lock_guard<std::mutex> lock(watch_mutex);
  for (const auto& [node, list] : watchers_of) {
    for (const Watcher& w : list) {
      if (w.watch->listener == &listener) {
        fail("watch_gradients: the listener already has a watch (give it one list of every leaf)");
      }
    }
  }
  for (std::size_t i = 0; i < state->leaves.size(); ++i) watchers_of[state->leaves[i].get()].push_back({state, i});
  ++watch_count;
  GradientWatch watch;
  watch.state_ = std::move(state);
  return watch;
}

GradientWatch& GradientWatch::operator=(GradientWatch&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
  }
  return *this;
}

void GradientWatch::reset() noexcept {
  if (!state_) return;
  state_->active = false;
  {
    std::lock_guard<std::mutex> lock(watch_mutex);
    for (const auto& leaf : state_->leaves) {
      auto it = watchers_of.find(leaf.get());
      if (it == watchers_of.end()) continue;
      auto& list = it->second;
      list.erase(std::remove_if(list.begin(), list.end(), [this](const Watcher& w) { return w.watch == state_; }),
                 list.end());
      if (list.empty()) watchers_of.erase(it);
    }
    --watch_count;
  }
  state_.reset();
}

}  // namespace xgrad
