/// @file
/// bf16 mixed precision, opt-in and scoped (in the spirit of torch.autocast): while an
/// AutocastGuard(Precision::bf16) is open on a thread, the `linear`, `matmul`,
/// `linear_activation` and `linear_cross_entropy` ops that thread runs, and the attention kernels'
/// products (`attention_weights`, `attention_scores`, `attend` and `flash_attention`'s tiles, but
/// for a decoding step's few queries),
/// compute their products from bf16-rounded operands with fp32 accumulation, fp32 outputs and fp32
/// gradients (backward uses the precision its forward saw). Everything else (norms, softmax,
/// losses, reductions, optimizers) stays fp32. Outside a guard, or
/// under AutocastGuard(Precision::fp32), every op computes exactly as before (the same bits).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xgrad/core/kernels/blas.hpp"  // Precision

namespace xgrad {

/// "fp32" or "bf16", as parse_precision and the examples' --precision spell it.
std::string precision_name(Precision p);
/// The Precision precision_name() names; anything else is an Error naming the text and the
/// choices (fp32|bf16).
Precision parse_precision(const std::string& name);

/// The precision of the innermost open AutocastGuard on the calling thread (fp32 outside any).
Precision autocast_precision();

/// Sets the calling thread's autocast precision for its scope, restoring the previous one when it
/// ends (destruction, or close() earlier).
///
/// Guards nest: an inner guard may set fp32 or bf16, and the precision is always the innermost
/// open guard's (guards closed out of order are simply removed). A guard belongs to the thread
/// that opened it and affects no other thread. close() on another thread is an Error that changes
/// nothing. A destructor cannot throw, so a guard destroyed on another thread prints one line on
/// stderr naming the mistake and ends its scope safely: the opening thread drops the guard the next
/// time it reads its precision (nothing is written to another thread's state).
class AutocastGuard {
 public:
  /// Opens a scope of precision `p` on the calling thread.
  explicit AutocastGuard(Precision p);
  /// Ends the scope unless close() already did (see the class for another thread).
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  /// Ends the scope now (a training loop closes the guard after backward, before the optimizer
  /// step). Calling it again does nothing; calling it on another thread than the opener is an
  /// Error.
  void close();
  /// Whether the scope is still open.
  bool is_open() const { return open_; }
  /// The precision this guard sets.
  Precision precision() const { return precision_; }

 private:
  Precision precision_;
  std::thread::id owner_;
  std::shared_ptr<std::atomic<bool>> alive_;  // shared with the opener's stack entry; false once ended
  bool open_ = true;
};

class Tensor;

/// Makes a bf16 copy of each tensor's value and keeps it with the value, where bf16 products read it
/// before the shared cache of parameters' copies, which keeps at most 512 MB (a model with more
/// weights would have some converted again at every step). For inference under a bf16 guard:
/// hold_bf16_copies(model.parameters()), and each token reads every weight as bf16, half the bytes of
/// fp32. The copies cost half the tensors' fp32 bytes and live as long as their values; an in-place
/// write (an optimizer step) leaves a copy stale and unused until the next call makes it again.
/// Returns the bytes held. Throws, naming the function, for an undefined tensor.
std::size_t hold_bf16_copies(const std::vector<Tensor>& tensors);

}  // namespace xgrad
