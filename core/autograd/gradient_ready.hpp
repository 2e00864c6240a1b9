// Gradient-ready listeners: how code outside the engine learns, during backward, that a leaf's
// gradient is final (to start work on it while the rest of the sweep runs) and that the pass is over.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

/// Receives the events of the backward passes that reach the leaves it watches (see
/// watch_gradients).
///
/// A pass that hands one of the watched leaves a gradient calls, on the pass's thread, in this
/// order: gradient_ready once for each watched leaf that receives a gradient, as soon as that
/// gradient is final (the sweep has run every op that reads the leaf; the rest of the sweep runs
/// after it), then exactly one of pass_ended (the pass has delivered every gradient) or
/// pass_failed (an exception stopped it). A pass that hands none of them a gradient does not call
/// the listener at all. Several listeners hear pass_ended (or pass_failed) in the order of their
/// first gradient_ready in the pass. Passes on several threads may call one listener at the same time (each pass
/// from its own thread, one thread running one pass at a time): a listener shared by threads keeps
/// its state per thread.
class GradientReadyListener {
 public:
  virtual ~GradientReadyListener() = default;

  /// The watched leaf `index` (its position in the list given to watch_gradients) has its final
  /// gradient for this pass.
  ///
  /// `grad` is this pass's gradient of the leaf after the leaf's hooks ran (and, in anomaly mode,
  /// after the check that it is finite), before it is added to the leaf's grad(). The listener may
  /// change its values in place, and what it leaves there is added; changing its shape is an
  /// Error. Called with the leaf's grad_mutex held. An exception fails the pass.
  virtual void gradient_ready(std::size_t index, Array& grad) = 0;

  /// The pass has delivered every gradient, to the leaves of every listener and to the rest.
  ///
  /// Called before the callbacks queued with queue_backward_callback, which it may queue too. An
  /// exception fails the pass: the listeners not yet told hear pass_failed, the queued callbacks do
  /// not run, and the exception leaves backward().
  virtual void pass_ended() {}

  /// The pass stopped with an exception, which leaves backward() after this returns.
  ///
  /// The gradients whose every listener returned were added to their leaves; the rest of the
  /// pass's gradients are dropped, among them the one whose listener threw (a listener of that
  /// leaf called before it had already seen it).
  virtual void pass_failed() noexcept {}
};

/// A listener's watch over a list of leaves, which lasts as long as this handle (or until reset()).
///
/// Movable, not copyable. Destroy or reset it only while no pass on another thread reads the
/// leaves (as with removing a hook); from within a pass on its own thread it is fine, and the
/// listener hears nothing more of that pass.
class GradientWatch {
 public:
  /// A handle that watches nothing.
  GradientWatch() = default;
  /// Ends the watch.
  ~GradientWatch() { reset(); }
  /// Takes over `other`'s watch, leaving `other` watching nothing.
  GradientWatch(GradientWatch&& other) noexcept = default;
  /// Ends this handle's watch and takes over `other`'s.
  GradientWatch& operator=(GradientWatch&& other) noexcept;
  GradientWatch(const GradientWatch&) = delete;
  GradientWatch& operator=(const GradientWatch&) = delete;

  /// Ends the watch: the listener hears of no further pass (nor of the rest of one running on this thread).
  void reset() noexcept;
  /// True while the handle keeps a watch.
  bool active() const { return state_ != nullptr; }

  /// The engine's record of one watch (opaque).
  struct State;

 private:
  friend GradientWatch watch_gradients(const std::vector<Tensor>& leaves, GradientReadyListener& listener);
  std::shared_ptr<State> state_;
};

/// Starts telling `listener` when each of `leaves` has its final gradient in a backward pass, and when that pass ends.
///
/// `leaves` are leaf tensors that require grad (parameters), each listed once; the events name a
/// leaf by its position in this list. The listener must outlive the returned handle. Any number of
/// listeners may watch one leaf: they are called in the order their watches were made, each
/// seeing what the one before left in the gradient (DataParallel leaves zeros there, and adds the
/// mean over ranks at the pass's end). A leaf with a listener, like a leaf with a hook, receives its
/// gradient as soon as it is final rather than at the end of the pass. An Error, naming the
/// position, for an undefined tensor, one that does not require grad, one computed by an op, or
/// one listed twice; and when called from inside a backward pass on this thread (from a hook or a
/// listener: start watching before backward).
[[nodiscard]] GradientWatch watch_gradients(const std::vector<Tensor>& leaves, GradientReadyListener& listener);

}  // namespace xgrad
