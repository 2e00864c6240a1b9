// The basic layers: Linear, LayerNorm, Dropout, Embedding, and positional encodings.
// Initialization follows PyTorch's defaults, drawn from the Generator passed in (the default
// generator unless given), so a seed fixes every weight on every platform.
#pragma once

#include <cstdint>

#include "xgrad/core/random.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

// y = x W^T + b, x (..., in) -> (..., out); W (out, in) and b (out,) as in PyTorch.
// Init: W, b ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's kaiming_uniform(a=sqrt(5)) and bias rule).
class Linear : public Module {
 public:
  Linear(std::size_t in_features, std::size_t out_features, bool bias = true,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;  // bias is undefined when disabled

 private:
  std::size_t in_, out_;
};

// Normalizes over the last axis: (x - mean) / sqrt(var + eps) * weight + bias.
// Init: weight 1, bias 0. Without `affine` it has no parameters.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::size_t features, float eps = 1e-5f, bool affine = true);
  Tensor forward(const Tensor& x) const;
  float eps() const { return eps_; }
  Tensor weight, bias;

 private:
  std::size_t features_;
  float eps_;
};

// Inverted dropout while training, identity in eval mode. Masks come from `gen`; threads
// running forward at once share it safely (each mask's key is one atomic draw).
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const;
  float p() const { return p_; }

 private:
  float p_;
  Generator* gen_;
};

// Rows of a (num_embeddings, dim) table looked up by integer ids. Init: N(0, 1).
class Embedding : public Module {
 public:
  Embedding(std::size_t num_embeddings, std::size_t dim, Generator& gen = default_generator());
  Tensor forward(const IndexArray& ids) const;
  Tensor weight;
};

// The sinusoidal table of "Attention Is All You Need" (fixed, no parameters):
// PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C)).
class SinusoidalPositionalEncoding : public Module {
 public:
  SinusoidalPositionalEncoding(std::size_t max_len, std::size_t dim);
  Tensor forward(std::size_t length, std::size_t first = 0) const;  // (length, dim): positions first ..
  Tensor at(const IndexArray& positions) const;                    // (..., dim): one row per position

 private:
  Tensor table_;
};

// Learned positions: an Embedding over 0 .. max_len-1. Init: N(0, 1).
class LearnedPositionalEncoding : public Module {
 public:
  LearnedPositionalEncoding(std::size_t max_len, std::size_t dim, Generator& gen = default_generator());
  Tensor forward(std::size_t length, std::size_t first = 0) const;  // (length, dim): positions first ..
  Tensor at(const IndexArray& positions) const;                    // (..., dim): one row per position
  Tensor weight;

 private:
  std::size_t max_len_;
};

}  // namespace xgrad::nn
