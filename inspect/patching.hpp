// Activation patching: run a model while named activations, or parts of them, take the values
// they had in another run (an ActivationCache), to find which component carries which
// information. Patching a run with its own cache changes nothing, bit for bit.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/inspect/activation_cache.hpp"

namespace xgrad::inspect {

/// What to patch at one hook point. Without head and position the whole value is replaced;
/// with both, the head's slice at the position.
struct Patch {
  std::string point;  ///< full name, such as "blocks.0.attn.context"
  /// The slice of one head h: columns [h D, (h + 1) D) of an attention's q, rot_q and context
  /// points (B, T, C), heads side by side (D = C / H), and of its k, v and rot_k points
  /// (B, S, KV D), whose heads are the KV key/value heads; index h of axis 1 of its pattern and
  /// scores points (B, H, T, S). Other points have no heads.
  std::optional<std::size_t> head;
  /// One position: axis 1 of a (B, T, ...) point; the query axis (2) of pattern and scores.
  std::optional<std::size_t> position;
};

/// Attaches the patches to root's tree for as long as it lives; the source values are copied,
/// so the cache may go. Several patches at one point replace the union of their regions.
/// Patched elements get no gradient; the others keep theirs. Throws, naming the point, for a
/// point the tree or the cache lacks, a head past the attention's count or on a point without
/// heads; and in forward, for a value whose shape differs from the cached one (another batch or
/// length) or a position past its length. Like any hook, a patch applies to every forward of
/// the module while it lives, on any thread.
class PatchSet {
 public:
  /// Attaches `patches` to root's tree with their values from `source`; throws as said above,
  /// and for no patches.
  PatchSet(nn::Module& root, const ActivationCache& source, const std::vector<Patch>& patches);
  /// Takes over the patches of the moved-from set, which stay attached.
  PatchSet(PatchSet&&) = default;
  /// Detaches this set's patches and takes over those of the other set.
  PatchSet& operator=(PatchSet&&) = default;
  /// The number of points patched.
  std::size_t size() const { return hooks_.size(); }

 private:
  std::vector<nn::HookHandle> hooks_;
};

}  // namespace xgrad::inspect
