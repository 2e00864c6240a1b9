// Head gates, and head importance after Michel, Levy and Neubig (2019), "Are Sixteen Heads
// Really Better than One?": each head's output is multiplied by a gate equal to 1, and the
// head's importance is the expected absolute gradient of the loss with respect to its gate,
// I_h = E |dL/dg_h|.
#pragma once

#include <string>
#include <vector>

#include "xgrad/nn/attention.hpp"

namespace xgrad::inspect {

/// Multiplies each head's output (the attention's "context" point, heads side by side) by its
/// gate, gates (H,), while the returned handle lives: a gate of 0 ablates its head, and a gate
/// that requires grad receives dL/dgate. Several gates may be attached at once; each multiplies.
/// Gates of another shape throw.
[[nodiscard]] nn::HookHandle gate_heads(nn::Attention& attention, const Tensor& gates);

/// The importance of one head.
struct HeadScore {
  std::string module;     ///< the attention's path, e.g. "blocks.0.attn"
  std::size_t head = 0;   ///< the head's index, 0 .. H-1
  double importance = 0;  ///< mean |dL/dgate| over the accumulated batches
};

/// Head importance I_h = E |dL/dg_h| of every attention in a module tree, accumulated over the
/// batches whose backward ran while it lives. Not copyable.
class HeadImportance {
 public:
  /// Gates every attention under root with ones that require grad (changing no value) until it
  /// is destroyed. A tree without an attention throws.
  explicit HeadImportance(nn::Module& root);
  HeadImportance(const HeadImportance&) = delete;
  HeadImportance& operator=(const HeadImportance&) = delete;

  /// Call after each backward: adds |dL/dgate| of every head and clears the gates' gradients.
  /// Throws, naming the attention, when no gradient reached its gates.
  void accumulate();
  /// Every head's score, attention by attention (in gates(i) order), heads in order; importance
  /// 0 before the first accumulate.
  std::vector<HeadScore> scores() const;
  /// How many times accumulate ran.
  std::size_t batches() const { return batches_; }
  /// The gates of the i-th attention found under root (depth first), (H,).
  /// Throws when i is out of range.
  const Tensor& gates(std::size_t i) const;
  /// The number of attentions gated.
  std::size_t size() const { return gates_.size(); }

 private:
  struct Gate {
    std::string path;
    Tensor gate;
    std::vector<double> sum;
    nn::HookHandle hook;
  };
  std::vector<Gate> gates_;
  std::size_t batches_ = 0;
};

}  // namespace xgrad::inspect
