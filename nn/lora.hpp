// LoRA, low-rank adapters beside Linear layers (Hu et al. 2021, as PEFT's LoraLayer defines them):
//   y = x W^T + b + s dropout(x) A^T B^T,   A (r, in), B (out, r),
//   s = alpha / r, or alpha / sqrt(r) with rsLoRA.
// Init as PEFT's: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a = sqrt(5)), B = 0, so an
// adapter starts as the identity change. Hook points of LoRA: hidden (dropout(x) A^T, (..., r)) and
// out (s hidden B^T, (..., out)).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/nn/freeze.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/random_stream.hpp"

namespace xgrad::nn {

/// The options of LoRA adapters: LoraOptions().rank(8).alpha(16).targets({"q_proj", "v_proj"}).
/// PEFT's LoraConfig names: r, lora_alpha, lora_dropout, use_rslora, target_modules.
struct LoraOptions {
  XGRAD_ARG(std::size_t, rank, 8);  ///< r: at least 1, at most min(in, out) of every layer adapted
  XGRAD_ARG(float, alpha, 8.f);     ///< finite and > 0
  XGRAD_ARG(float, dropout, 0.f);   ///< on the adapter's input while training; in [0, 1)
  XGRAD_ARG(bool, rslora, false);   ///< s = alpha / sqrt(r) instead of alpha / r
  /// The Linear modules adapted, as name patterns (matches_name_pattern) over module names or
  /// their aliases: "q_proj", "blocks.*.attn.w_v", "re:.*\\.w_[qv]".
  XGRAD_ARG(std::vector<std::string>, targets, {});

 public:
  /// s: alpha / r, or alpha / sqrt(r) with rslora.
  float scaling() const;
  /// Throws naming the option (rank 0, alpha not finite and positive, dropout outside [0, 1)).
  void check(const char* who) const;
};

/// One adapter: A (r, in) and B (out, r) as parameters "A" and "B", and a buffer "merged" (0-d: 1
/// while s B A is folded into the Linear's weight, so that a saved state says so). Dropout masks come
/// from its RandomStream.
class LoRA : public Module, public RandomStream {
 public:
  /// Draws A from `gen` (B starts at 0); checks the options and that rank <= min(in, out).
  LoRA(std::size_t in_features, std::size_t out_features, const LoraOptions& options, Generator& gen);
  /// s dropout(x) A^T B^T: x (..., in) -> (..., out).
  Tensor forward(const Tensor& x) const;
  /// s B A (out, in), recorded (the change the adapter makes to the weight).
  Tensor delta() const;
  /// Whether s B A is folded into the Linear's weight (Linear::merge_lora).
  bool merged() const { return merged_.value()() != 0.f; }
  /// The options (targets as given to apply_lora).
  const LoraOptions& options() const { return options_; }
  Tensor A;  ///< (r, in)
  Tensor B;  ///< (out, r)

 private:
  friend class Linear;
  void set_merged(bool on) { merged_.mutable_value()() = on ? 1.f : 0.f; }
  LoraOptions options_;
  Tensor merged_;
};

/// Adds an adapter to every Linear of `model` whose module name (or its alias in `aliases`, a
/// parameter name's alias with ".weight" dropped) matches one of options.targets, then freezes
/// every parameter but the adapters' (PEFT's get_peft_model; unfreeze() trains more). Returns the
/// adapted module names. Before anything changes, throws naming the option or target for: no
/// targets, a target that matches no module, one that matches a module that is not a Linear, a
/// Linear that already has an adapter, a rank above a layer's min(in, out), and options check()
/// refuses.
///
///     nn::apply_lora(model, nn::LoraOptions().rank(8).alpha(16).targets({"w_q", "w_v"}));
std::vector<std::string> apply_lora(Module& model, const LoraOptions& options, Generator& gen = default_generator(),
                                    const NameAliases& aliases = {});

/// Every Linear of `model` that has an adapter, by module name, in named_modules() order.
std::vector<std::pair<std::string, Linear*>> lora_layers(Module& model);

/// Folds every adapter into its Linear's weight (W + s B A) and removes it, as PEFT's
/// merge_and_unload: the model then computes what it computed with the adapters (to rounding)
/// and holds only the base parameters, which stay frozen as they were. Returns the merged names.
std::vector<std::string> merge_lora(Module& model);

}  // namespace xgrad::nn
