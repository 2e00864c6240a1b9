// The norm a model uses, chosen by option: what Residual and the final norm build. LayerNorm and
// RMSNorm (layers.hpp) are its two kinds.
#pragma once

#include <memory>

#include "xgrad/core/arg.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

/// Which normalization a norm computes over the last axis.
/// layer_norm: (x - mean) / sqrt(var + eps) * weight + bias; rms_norm: x / sqrt(mean(x^2) + eps) * weight
/// (or * (1 + weight) with NormOptions::unit_offset).
enum class NormKind { layer_norm, rms_norm };

/// What norm to build, e.g.\ NormOptions().kind(NormKind::rms_norm).eps(1e-6f).
struct NormOptions {
  XGRAD_ARG(NormKind, kind, NormKind::layer_norm);  ///< LayerNorm or RMSNorm
  XGRAD_ARG(float, eps, 1e-5f);                     ///< added to the variance (mean square); finite and > 0
  XGRAD_ARG(bool, affine, true);                    ///< whether the norm has a weight
  /// Whether a LayerNorm with a weight also has a bias (an RMSNorm never has one).
  XGRAD_ARG(bool, bias, true);
  /// An RMSNorm with a weight scales by (1 + weight), the weight starting at 0 (Gemma's norms).
  XGRAD_ARG(bool, unit_offset, false);
};

/// A norm over the last axis of `features` values: the base of LayerNorm and RMSNorm, so a layer
/// that needs "a norm" holds this and never names a kind.
class NormLayer : public Module {
 public:
  /// The normalized x; throws naming the norm and the shape when x does not end in features().
  virtual Tensor forward(const Tensor& x) const = 0;
  /// The eps added under the square root.
  float eps() const { return eps_; }
  /// The number of values normalized together.
  std::size_t features() const { return features_; }
  /// The scale weight and the shift bias, each (features,); undefined without one (bias always,
  /// for RMSNorm).
  Tensor weight, bias;

 protected:
  /// Checks features (> 0) and eps (finite and > 0), naming `who`.
  NormLayer(const char* who, std::size_t features, float eps);
  /// Throws, naming `who`, unless x is defined and ends in features().
  void check_input(const Tensor& x, const char* who) const;

 private:
  std::size_t features_;
  float eps_;
};

/// The norm `options` describe over `features` values: LayerNorm(features, eps, affine, bias) or
/// RMSNorm(features, eps, affine, unit_offset).
std::shared_ptr<NormLayer> make_norm(std::size_t features, const NormOptions& options);

/// Throws, naming `who` and the option, for options make_norm refuses (an eps that is not finite
/// and positive, an unknown kind, unit_offset on a LayerNorm or on a norm without a weight).
void check_norm_options(const NormOptions& options, const char* who);

}  // namespace xgrad::nn
