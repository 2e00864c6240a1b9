// Steering: a direction added to the residual stream (or any hook point whose last axis it
// matches) during forward and generation, built from the mean difference of activations over two
// sets of prompts (activation addition), and kept as a safetensors file.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/hook.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::inspect {

/// A direction at a hook point: `vector` (C,) is added, times `scale`, to the point's value at
/// each chosen position (the value's last axis must be C).
struct SteeringVector {
  std::string point;  ///< xgrad's full name (TransformerLens's is accepted where one is given)
  Array vector;       ///< (C,)
  float scale = 1.f;  ///< the multiple added
};

/// The mean of the activations at `point` over the `positive` prompts minus their mean over the
/// `negative` prompts, each (B, T) ids run through `model` in eval mode without recording; with
/// last_position_only, only each prompt's last position counts (else every position). Throws for
/// an empty set, a point that is not the model's (in either spelling) or not (B, T, C).
SteeringVector mean_difference_vector(nn::LanguageModel& model, const std::string& point,
                                      const std::vector<IndexArray>& positive, const std::vector<IndexArray>& negative,
                                      bool last_position_only = true);

/// While it lives, adds v.scale * v.vector at v.point of root's forwards, at positions
/// from_position on of each forward's input (axis 1 of the value). generate runs without its KV
/// cache while a hook is attached, so each step's forward holds the whole context and
/// from_position counts from the prompt's first token (until the context slides past max_len).
/// Throws, naming the point, for a point root
/// lacks, a vector that is empty or holds a value that is not finite, and, in forward, for a value
/// whose last axis is not the vector's length. Not copyable; destroying it detaches the hook.
class Steering {
 public:
  /// Attaches the hook that adds v at v.point of root, at positions from_position on.
  Steering(nn::Module& root, const SteeringVector& v, std::size_t from_position = 0);
  Steering(const Steering&) = delete;
  Steering& operator=(const Steering&) = delete;

 private:
  nn::HookHandle hook_;
};

/// Writes v as safetensors: one tensor "vector" (C,), and the point and scale as metadata
/// (atomically: an earlier file at path survives a failure). A subnormal scale is refused, as
/// load_steering_vector would refuse it.
void save_steering_vector(const std::string& path, const SteeringVector& v);
/// Reads what save_steering_vector writes; a file without that layout is an Error naming it, and so
/// is a scale that is not a number or that float32 cannot hold (not 0 in the file but 0 or
/// subnormal as a float32, or infinite or NaN), naming the field and the value.
SteeringVector load_steering_vector(const std::string& path);

}  // namespace xgrad::inspect
