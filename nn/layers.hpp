// The basic layers: Linear, LayerNorm, RMSNorm, Dropout, Embedding, and positional encodings.
// Initialization follows PyTorch's defaults, drawn from the Generator passed in (the default
// generator unless given), so a seed fixes every weight on every platform.
#pragma once

#include <cstdint>

#include "xgrad/core/random.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/norm.hpp"

namespace xgrad::nn {

class LoRA;
struct LoraOptions;

/// y = x W^T + b, x (..., in) -> (..., out); W (out, in) and b (out,) as in PyTorch.
/// Init: W, b ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's kaiming_uniform(a=sqrt(5)) and bias rule).
class Linear : public Module {
 public:
  /// Draws W (and b, unless `bias` is false) from `gen`; a size of 0 throws.
  Linear(std::size_t in_features, std::size_t out_features, bool bias = true, Generator& gen = default_generator());
  /// A Linear over existing tensors: weight (out, in) and, when defined, bias (out,); registered
  /// as its parameters, so a weight shared with another module (tied embeddings) is one parameter.
  /// Throws naming the shapes when they do not fit.
  explicit Linear(Tensor weight, Tensor bias = Tensor());
  /// x W^T + b, plus the adapter's s dropout(x) A^T B^T while one is on and not merged (lora.hpp);
  /// throws naming the shape when x does not end in in_features.
  Tensor forward(const Tensor& x) const;
  /// The weight (out, in) and the bias (out,); bias is undefined when disabled.
  Tensor weight, bias;
  /// The LoRA adapter (child module "lora": lora.A, lora.B), or null.
  std::shared_ptr<LoRA> lora;
  /// Adds an adapter drawn from `gen` (see LoRA); throws when there is one already, or for options
  /// LoRA refuses.
  std::shared_ptr<LoRA> add_lora(const LoraOptions& options, Generator& gen = default_generator());
  /// W += s B A (without recording): forward then skips the adapter, and computes the same to
  /// rounding. Throws without an adapter or when it is merged already.
  void merge_lora();
  /// W -= s B A, undoing merge_lora to rounding; throws without a merged adapter.
  void unmerge_lora();
  /// Drops the adapter as it is (merged into W or not); throws without one.
  void remove_lora();
  /// Whether an adapter is on and not merged: forward then adds its path.
  bool adapted() const;
  /// The weight forward applies: W, plus s B A (recorded) while adapted(). Throws when the
  /// adapter's dropout is active (training with dropout > 0): no single weight gives that forward.
  Tensor effective_weight() const;
  /// The input width.
  std::size_t in_features() const { return in_; }
  /// The output width.
  std::size_t out_features() const { return out_; }

 private:
  std::size_t in_, out_;
};

/// Normalizes over the last axis: (x - mean) / sqrt(var + eps) * weight + bias.
/// Init: weight 1, bias 0. Without `affine` it has no parameters; without `bias`, no bias.
class LayerNorm : public NormLayer {
 public:
  /// Throws for 0 features and for an eps that is not finite and positive.
  explicit LayerNorm(std::size_t features, float eps = 1e-5f, bool affine = true, bool bias = true);
  /// The normalized x; throws naming the shape when x does not end in `features`.
  Tensor forward(const Tensor& x) const override;
};

/// Root-mean-square norm over the last axis: x / sqrt(mean(x^2) + eps) * weight, with no mean
/// subtracted and no bias (the norm of Llama-style models). Init: weight 1. Without `affine` it
/// has no parameters. The default eps, 1e-6, is Hugging Face Llama's `rms_norm_eps` default.
/// With `unit_offset` it scales by (1 + weight), the weight starting at 0 (Gemma's RMSNorm).
class RMSNorm : public NormLayer {
 public:
  /// Throws for 0 features, for an eps that is not finite and positive, and for unit_offset
  /// without `affine`.
  explicit RMSNorm(std::size_t features, float eps = 1e-6f, bool affine = true, bool unit_offset = false);
  /// The normalized x; throws naming the shape when x does not end in `features`.
  Tensor forward(const Tensor& x) const override;
  /// Whether the scale is 1 + weight.
  bool unit_offset() const { return unit_offset_; }

 private:
  bool unit_offset_;
};

/// Inverted dropout while training, identity in eval mode. Masks come from `gen`; threads
/// running forward at once share it safely (each mask's key is one atomic draw).
class Dropout : public Module {
 public:
  /// Keeps a reference to `gen`, which must outlive the module; p outside [0, 1) throws.
  explicit Dropout(float p = 0.5f, Generator& gen = default_generator());
  /// While training, zeroes each element with probability p and scales the rest by 1/(1-p);
  /// x itself in eval mode (and for p 0).
  Tensor forward(const Tensor& x) const;
  /// The probability of zeroing an element.
  float p() const { return p_; }

 private:
  float p_;
  Generator* gen_;
};

/// Rows of a (num_embeddings, dim) table looked up by integer ids. Init: N(0, 1).
class Embedding : public Module {
 public:
  /// Draws the table from `gen`; a size of 0 throws.
  Embedding(std::size_t num_embeddings, std::size_t dim, Generator& gen = default_generator());
  /// ids (...) -> (..., dim): the row of each id; an id outside the table throws.
  Tensor forward(const IndexArray& ids) const;
  Tensor weight;  ///< (num_embeddings, dim)
};

/// The sinusoidal table of "Attention Is All You Need" (fixed, no parameters):
/// PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C)).
class SinusoidalPositionalEncoding : public Module {
 public:
  /// The table of positions 0 .. max_len-1 (C = dim); a size of 0 throws.
  SinusoidalPositionalEncoding(std::size_t max_len, std::size_t dim);
  /// Rows first .. first + length - 1, (length, dim); throws when they pass max_len.
  Tensor forward(std::size_t length, std::size_t first = 0) const;
  /// The rows of `positions` (...), (..., dim); a position outside [0, max_len) throws.
  Tensor at(const IndexArray& positions) const;

 private:
  Tensor table_;
};

/// Learned positions: an Embedding over 0 .. max_len-1. Init: N(0, 1).
class LearnedPositionalEncoding : public Module {
 public:
  /// Draws the table from `gen`; a size of 0 throws.
  LearnedPositionalEncoding(std::size_t max_len, std::size_t dim, Generator& gen = default_generator());
  /// Rows first .. first + length - 1, (length, dim); throws when they pass max_len.
  Tensor forward(std::size_t length, std::size_t first = 0) const;
  /// The rows of `positions` (...), (..., dim); a position outside [0, max_len) throws.
  Tensor at(const IndexArray& positions) const;
  Tensor weight;  ///< (max_len, dim)

 private:
  std::size_t max_len_;
};

}  // namespace xgrad::nn
