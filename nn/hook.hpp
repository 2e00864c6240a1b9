// Hook points: named activations inside a module's forward, where a user can read, cache or
// replace the value and see the gradient that arrives there in backward, without editing the
// module. Each module declares its points (listed in its header); a point's full name is the
// module's dotted path plus the point, e.g. "blocks.0.attn.pattern". Attach through
// Module::add_forward_hook / add_backward_hook; the returned handle removes the hook when it is
// destroyed. With no hook attached, a point costs one atomic load: nothing is recorded or copied.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::nn {

/// Whether a point's full name ends with `suffix`, e.g.\ "blocks.0.attn.pattern" with ".pattern".
inline bool point_ends_with(const std::string& point, const std::string& suffix) {
  return point.size() >= suffix.size() && point.compare(point.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Called in forward with the value at the point; returns its replacement (same shape), or an
/// undefined Tensor to keep the value. Hooks at one point run in the order they were attached,
/// each seeing the previous one's result.
using ForwardHook = std::function<Tensor(const Tensor& value)>;
/// Called in backward with the gradient arriving at the point; may change it in place.
using BackwardHook = GradHook;

/// @cond
namespace detail {
// One module's declared points and the hooks attached to them. Attaching and removing may happen
// while other threads run forward: the lists are read and written under `mutex`.
struct HookTable {
  // Held by shared_ptr: a forward that copied the list keeps calling the same object (a
  // mutable hook keeps its state), and a backward hook on a recorded node holds it weakly, so
  // removing the hook silences it there too.
  template <class Fn>
  struct Entry {
    int id;
    std::string name;  // the full name it was attached by, for messages
    std::shared_ptr<Fn> fn;
  };
  struct Slot {
    std::string point;
    std::vector<Entry<ForwardHook>> forward;
    std::vector<Entry<BackwardHook>> backward;
  };
  std::mutex mutex;
  std::vector<Slot> slots;
  std::atomic<int> attached{0};  // hooks attached at any point: 0 is the fast path
  int next_id = 0;
};
}  // namespace detail
/// @endcond

/// Owns one attached hook; destroying it (or remove()) detaches the hook: later forwards do not
/// call it, nor does backward through values recorded before (a forward already running on
/// another thread may still call it once). Outliving the module is safe: removal then does
/// nothing. Movable, not copyable.
class HookHandle {
 public:
  /// A handle that holds no hook.
  HookHandle() = default;
  /// The handle of hook `id` at `point` of a module's table; Module::add_forward_hook and
  /// add_backward_hook make them.
  HookHandle(std::weak_ptr<detail::HookTable> table, std::string point, int id)
      : table_(std::move(table)), point_(std::move(point)), id_(id) {}
  /// Takes other's hook; other then holds none.
  HookHandle(HookHandle&& other) noexcept { *this = std::move(other); }
  /// Detaches this handle's hook, then takes other's; other then holds none.
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  /// remove().
  ~HookHandle() { remove(); }

  /// Detaches the hook now; the handle then holds none. Does nothing when it holds none.
  void remove();
  /// Whether the handle holds a hook whose module still exists.
  bool attached() const { return !table_.expired() && id_ >= 0; }
  const std::string& point() const { return point_; }  ///< the point's name within its module

 private:
  std::weak_ptr<detail::HookTable> table_;
  std::string point_;
  int id_ = -1;
};

}  // namespace xgrad::nn
