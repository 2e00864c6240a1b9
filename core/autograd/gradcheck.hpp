/// @file
/// A public gradient checker: compares backward's gradients with central finite differences.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

/// How gradcheck() differentiates numerically and when it calls an element a match.
struct GradcheckOptions {
  /// Step of the central difference. The derivative is Richardson-extrapolated from steps eps
  /// and eps/2, so truncation error is O(eps^4) and eps can stay large against float32 noise.
  /// Finite and > 0; an element where x + eps/2 rounds back to x in float32 is an Error.
  double eps = 1e-2;
  /// An element passes when |analytic - numeric| <= atol + rtol * |numeric|. Finite and >= 0.
  double atol = 2e-4;
  /// The relative part of that tolerance (see atol). Finite and >= 0.
  double rtol = 2e-3;
  /// Skip elements that sit within eps of a kink (ReLU, abs and clamp at their corners, ties of
  /// max), where no derivative exists to compare. A kink is a jump between the one-sided slopes
  /// that does not shrink as the step halves (curvature's does): skipped when that jump exceeds
  /// kink_threshold times the larger one-sided slope, and atol (a smaller jump cannot fail the
  /// comparison); also when the central differences of steps eps, eps/2 and eps/4 depart from a
  /// smooth function's (d(s) = f' + c s^2) by more than 3 times the tolerance, as they do for a
  /// kink near x but not at it (this costs two more calls of fn per element). kink_threshold:
  /// finite and >= 0.
  bool skip_kinks = false;
  /// The jump between one-sided slopes, relative to the larger slope, past which skip_kinks
  /// skips an element (see skip_kinks). Finite and >= 0.
  double kink_threshold = 0.1;
  std::uint64_t seed = 0;  ///< draws the fixed projection of the output (and the max_elements subset)
  /// Compare at most this many elements of each tensor, a fixed random subset (0: all of them).
  std::size_t max_elements = 0;
};

/// What gradcheck() compared and found; converts to `ok`.
struct GradcheckResult {
  bool ok = true;                                ///< every compared element passed, and nothing was NaN or infinite
  std::size_t tensors = 0;                       ///< tensors whose gradients were compared
  std::size_t checked = 0;                       ///< elements compared
  std::size_t skipped = 0;                       ///< elements skipped at kinks
  double max_abs_error = 0;                      ///< worst |analytic - numeric| over checked elements
  std::string report;                            ///< the first failure (tensor, element, both values), or a summary
  explicit operator bool() const { return ok; }  ///< returns ok
};

/// The function gradcheck() differentiates: inputs in, one tensor out.
using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Checks d<fn(inputs), r>/d input for every input that requires grad, with r a fixed random
/// projection of the output (so any output shape works). The inputs are not modified: fn is
/// called on fresh leaf copies of them. fn must be deterministic (no dropout). An option out of
/// range, no input requiring grad, or an output that is undefined or does not depend on them is
/// an Error; so is a call inside an AutocastGuard(Precision::bf16), whose rounded products would
/// make any finite difference meaningless.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

/// The same, and also the gradients of `params`: tensors fn reads without receiving them, such
/// as a module's named_parameters(). They are perturbed in place and restored bit for bit, and
/// their gradients are left as they were. Failures name a parameter by its name. A NaN or an
/// infinity in the output or in any analytic gradient is a failure too.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const NamedTensors& params,
                          const GradcheckOptions& options = {});

}  // namespace xgrad
