// Linear, LayerNorm, RMSNorm, Dropout, Embedding and positional encodings.
#include "xgrad/nn/layers.hpp"

#include <cmath>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/nn/lora.hpp"

namespace xgrad::nn {

Linear::Linear(std::size_t in_features, std::size_t out_features, bool use_bias, Generator& gen)
    : in_(in_features), out_(out_features) {
  if (in_features == 0 || out_features == 0) {
    fail("Linear: in_features ", in_features, " and out_features ", out_features, " must be positive");
  }
  const float bound = 1.f / std::sqrt(static_cast<float>(in_features));
  weight = register_parameter("weight", Tensor(gen.uniform({out_features, in_features}, -bound, bound)));
  if (use_bias) bias = register_parameter("bias", Tensor(gen.uniform({out_features}, -bound, bound)));
}

Tensor Linear::forward(const Tensor& x) const {
  check_defined(x, "Linear");
  if (x.ndim() == 0 || x.shape().back() != in_) {
    fail("Linear: input of shape ", shape_str(x.shape()), " does not end in in_features ", in_);
  }
  const Tensor y = linear(x, weight, bias);  // (..., in) -> (..., out)
  return adapted() ? y + lora->forward(x) : y;
}

std::shared_ptr<LoRA> Linear::add_lora(const LoraOptions& options, Generator& gen) {
  if (lora) fail("Linear::add_lora: the layer has an adapter already");
  auto adapter = std::make_shared<LoRA>(in_, out_, options, gen);
  lora = register_module("lora", adapter);
  return lora;
}

bool Linear::adapted() const { return lora && !lora->merged(); }

void Linear::merge_lora() {
  if (!adapted()) fail("Linear::merge_lora: ", lora ? "the adapter is merged already" : "the layer has no adapter");
  NoGradGuard no_grad;
  weight.mutable_value() += lora->delta().value();
  lora->set_merged(true);
}

void Linear::unmerge_lora() {
  if (!lora || !lora->merged()) fail("Linear::unmerge_lora: the layer has no merged adapter");
  NoGradGuard no_grad;
  weight.mutable_value() -= lora->delta().value();
  lora->set_merged(false);
}

void Linear::remove_lora() {
  if (!lora) fail("Linear::remove_lora: the layer has no adapter");
  unregister_module("lora");
  lora.reset();
}

Tensor Linear::effective_weight() const {
  if (!adapted()) return weight;
  if (lora->is_training() && lora->options().dropout() > 0.f)
    fail("Linear::effective_weight: the adapter's dropout ", lora->options().dropout(),
         " is active (training): no single weight gives its forward");
  return weight + lora->delta();
}

Linear::Linear(Tensor w, Tensor b) {
  check_defined(w, "Linear: weight");
  if (w.ndim() != 2 || w.shape()[0] == 0 || w.shape()[1] == 0) {
    fail("Linear: weight must be (out, in) with both positive, got ", shape_str(w.shape()));
  }
  out_ = w.shape()[0], in_ = w.shape()[1];
  if (b.defined() && b.shape() != Shape{out_}) {
    fail("Linear: bias of shape ", shape_str(b.shape()), " does not fit weight ", shape_str(w.shape()));
  }
  weight = register_parameter("weight", std::move(w));
  if (b.defined()) bias = register_parameter("bias", std::move(b));
}

NormLayer::NormLayer(const char* who, std::size_t features, float eps) : features_(features), eps_(eps) {
  if (features == 0) fail(who, ": features must be positive");
  if (!(eps > 0.f && std::isfinite(eps))) fail(who, ": eps must be finite and positive, got ", eps);
}

void NormLayer::check_input(const Tensor& x, const char* who) const {
  check_defined(x, who);
  if (x.ndim() == 0 || x.shape().back() != features_) {
    fail(who, ": input of shape ", shape_str(x.shape()), " does not end in the normalized size ", features_);
  }
}

void check_norm_options(const NormOptions& o, const char* who) {
  if (o.kind() != NormKind::layer_norm && o.kind() != NormKind::rms_norm) {
    fail(who, ": unknown norm kind ", static_cast<int>(o.kind()));
  }
  if (!(o.eps() > 0.f && std::isfinite(o.eps()))) fail(who, ": norm eps ", o.eps(), " must be finite and > 0");
  if (o.unit_offset() && (o.kind() != NormKind::rms_norm || !o.affine()))
    fail(who, ": norm unit_offset (a scale of 1 + weight) needs an RMSNorm with a weight");
}

std::shared_ptr<NormLayer> make_norm(std::size_t features, const NormOptions& o) {
  check_norm_options(o, "make_norm");
  if (o.kind() == NormKind::rms_norm) return std::make_shared<RMSNorm>(features, o.eps(), o.affine(), o.unit_offset());
  return std::make_shared<LayerNorm>(features, o.eps(), o.affine(), o.bias());
}

LayerNorm::LayerNorm(std::size_t features, float eps, bool affine, bool use_bias)
    : NormLayer("LayerNorm", features, eps) {
  if (affine) {
    weight = register_parameter("weight", Tensor::ones({features}));
    if (use_bias) bias = register_parameter("bias", Tensor::zeros({features}));
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  check_input(x, "LayerNorm");
  return layer_norm(x, weight, bias, eps());
}

RMSNorm::RMSNorm(std::size_t features, float eps, bool affine, bool unit_offset)
    : NormLayer("RMSNorm", features, eps), unit_offset_(unit_offset) {
  if (unit_offset && !affine) fail("RMSNorm: unit_offset (a scale of 1 + weight) needs a weight");
  if (affine) weight = register_parameter("weight", unit_offset ? Tensor::zeros({features}) : Tensor::ones({features}));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  check_input(x, "RMSNorm");
  return rms_norm(x, unit_offset_ ? weight + 1.f : weight, eps());
}

Dropout::Dropout(float p, Generator& gen) : p_(p), gen_(&gen) {
  if (!(p >= 0.f && p < 1.f)) fail("Dropout: probability ", p, " is outside [0, 1)");
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, is_training(), *gen_); }

Embedding::Embedding(std::size_t num_embeddings, std::size_t dim, Generator& gen) {
  if (num_embeddings == 0 || dim == 0)
    fail("Embedding: num_embeddings ", num_embeddings, " and dim ", dim, " must be positive");
  weight = register_parameter("weight", Tensor(gen.normal({num_embeddings, dim}, 0.f, 1.f)));
}

Tensor Embedding::forward(const IndexArray& ids) const { return embedding(weight, ids); }

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(std::size_t max_len, std::size_t dim) {
  if (max_len == 0 || dim == 0) fail("SinusoidalPositionalEncoding: max_len and dim must be positive");
  // In double: a count that wrapped around would make a table too small for the loop below.
  check_available_memory(static_cast<double>(max_len) * static_cast<double>(dim) * sizeof(float),
                         "SinusoidalPositionalEncoding", "a table of shape " + shape_str(Shape{max_len, dim}));
  Array pe = Array::from_shape({max_len, dim});
  for (std::size_t t = 0; t < max_len; ++t) {
    for (std::size_t j = 0; j < dim; ++j) {
      const double freq = std::pow(10000.0, -static_cast<double>(j - j % 2) / static_cast<double>(dim));
      const double angle = static_cast<double>(t) * freq;
      pe(t, j) = static_cast<float>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  table_ = Tensor(std::move(pe));
}

namespace {

void check_position_ids(const char* who, const IndexArray& positions, std::size_t max_len) {
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const std::int64_t p = positions.data()[i];
    if (p < 0 || p >= static_cast<std::int64_t>(max_len)) {
      fail(who, ": position ", p, " at flat position ", i, " is outside [0, max_len ", max_len, ")");
    }
  }
}

void check_positions(const char* who, std::size_t length, std::size_t first, std::size_t max_len) {
  if (first > max_len || length > max_len - first) {
    if (first == 0) fail(who, ": length ", length, " exceeds max_len ", max_len);
    fail(who, ": ", length, " positions from ", first, " exceed max_len ", max_len);
  }
}

}  // namespace

Tensor SinusoidalPositionalEncoding::forward(std::size_t length, std::size_t first) const {
  check_positions("SinusoidalPositionalEncoding", length, first, table_.shape()[0]);
  return slice(table_, 0, first, first + length);
}

Tensor SinusoidalPositionalEncoding::at(const IndexArray& positions) const {
  check_position_ids("SinusoidalPositionalEncoding", positions, table_.shape()[0]);
  return embedding(table_, positions);
}

LearnedPositionalEncoding::LearnedPositionalEncoding(std::size_t max_len, std::size_t dim, Generator& gen)
    : max_len_(max_len) {
  if (max_len == 0 || dim == 0) fail("LearnedPositionalEncoding: max_len and dim must be positive");
  weight = register_parameter("weight", Tensor(gen.normal({max_len, dim}, 0.f, 1.f)));
}

Tensor LearnedPositionalEncoding::forward(std::size_t length, std::size_t first) const {
  check_positions("LearnedPositionalEncoding", length, first, max_len_);
  return slice(weight, 0, first, first + length);
}

Tensor LearnedPositionalEncoding::at(const IndexArray& positions) const {
  check_position_ids("LearnedPositionalEncoding", positions, max_len_);
  return embedding(weight, positions);
}

}  // namespace xgrad::nn
