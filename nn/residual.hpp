// Residual<Sublayer>: a sublayer f that knows nothing of norms, wrapped in a residual connection
// with its norm (LayerNorm or RMSNorm, as NormOptions say) placed by `placement`:
//   pre:  y = x + f(norm(x))      post: y = norm(x + f(x))      none: y = f(x)
//   sandwich: y = x + post_norm(f(norm(x)))
// It is the sublayer itself (it derives from it), with one child more, "norm" (sandwich: two,
// "norm" and "post_norm"), so its parameters read "attn.w_q.weight" and "attn.norm.weight",
// "ffn.linear1.weight" and "ffn.norm.weight".
// Sublayer::forward(x, args...) returns a Tensor, or an output struct whose main tensor
// `residual_output` picks; Sublayer::check_input(x) throws, naming the sublayer, when x cannot be
// its input (checked before the norm sees x).
//
// Hook points, declared after the sublayer's own (forward reaches them first and last):
//   residual.in      x
//   residual.skip    x as the skip path takes it   } a gradient hook on each splits dL/dx into
//   residual.branch  x as f (or the norm) takes it } the two paths' parts (none: no skip path,
//   residual.out     y                                and no residual.skip point)
#pragma once

#include <memory>
#include <utility>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/options.hpp"

namespace xgrad::nn {

/// The main tensor of a sublayer's output, for Residual: the output itself when it is a Tensor.
inline Tensor& residual_output(Tensor& out) { return out; }

/// A sublayer f wrapped in a residual connection with its norm placed by `placement`
/// (pre: y = x + f(norm(x)), post: y = norm(x + f(x)), none: y = f(x), sandwich:
/// y = x + post_norm(f(norm(x)))). It is the sublayer itself, with one child more, "norm" (not for
/// none; sandwich adds "post_norm"), and the hook points residual.in, residual.skip (not for
/// none), residual.branch and residual.out.
template <class Sublayer>
class Residual : public Sublayer {
 public:
  /// Builds Sublayer(sublayer_args...) and, unless placement is Norm::none, the norm
  /// make_norm(features, norm_options) registered as "norm" (sandwich: and another, "post_norm").
  template <class... Args>
  Residual(Norm placement, std::size_t features, const NormOptions& norm_options, Args&&... sublayer_args)
      : Sublayer(std::forward<Args>(sublayer_args)...), placement_(placement) {
    if (placement == Norm::none) {
      this->declare_hook_points({"residual.in", "residual.branch", "residual.out"});
    } else {
      norm = this->register_module("norm", make_norm(features, norm_options));
      if (placement == Norm::sandwich)
        post_norm = this->register_module("post_norm", make_norm(features, norm_options));
      this->declare_hook_points({"residual.in", "residual.skip", "residual.branch", "residual.out"});
    }
  }

  /// The sublayer's output (Sublayer::forward(x, args...) with the norm placed around it) whose
  /// main tensor is y; throws, through Sublayer::check_input, when x cannot be the input.
  template <class... Args>
  auto forward(const Tensor& x, Args&&... args) const {
    Sublayer::check_input(x);
    const Tensor in = this->hook("residual.in", x);
    const Tensor skip = placement_ == Norm::none ? in : this->hook("residual.skip", in);
    const Tensor branch = this->hook("residual.branch", in);
    auto out = Sublayer::forward(post_norm || placement_ == Norm::pre ? norm->forward(branch) : branch,
                                 std::forward<Args>(args)...);
    Tensor& f = residual_output(out);
    switch (placement_) {
      case Norm::pre:
        f = skip + f;
        break;
      case Norm::sandwich:
        f = skip + post_norm->forward(f);
        break;
      case Norm::post:
        f = norm->forward(skip + f);
        break;
      case Norm::none:
        break;
    }
    f = this->hook("residual.out", f);
    return out;
  }

  /// The branch alone, f(norm(x)) (Pre-Norm and sandwich, whose post_norm it applies too; f(x)
  /// without a norm), for a parallel residual whose
  /// skip path another sublayer's connection carries. Hook points residual.in, residual.branch and
  /// residual.out (which then holds f's output, not a sum).
  template <class... Args>
  auto forward_branch(const Tensor& x, Args&&... args) const {
    Sublayer::check_input(x);
    const Tensor branch = this->hook("residual.branch", this->hook("residual.in", x));
    auto out = Sublayer::forward(post_norm || placement_ == Norm::pre ? norm->forward(branch) : branch,
                                 std::forward<Args>(args)...);
    Tensor& f = residual_output(out);
    if (post_norm) f = post_norm->forward(f);
    f = this->hook("residual.out", f);
    return out;
  }

  /// The sublayer alone, f, without the connection and the norm.
  const Sublayer& sublayer() const { return *this; }
  /// Where the norm sits.
  Norm placement() const { return placement_; }
  std::shared_ptr<NormLayer> norm;       ///< null for Norm::none
  std::shared_ptr<NormLayer> post_norm;  ///< sandwich only: the norm of f's output

 private:
  Norm placement_;
};

}  // namespace xgrad::nn
