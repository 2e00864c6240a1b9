// Tensor's op methods: each is one call of the ops.hpp function of the same name on *this.
// Calls are qualified: inside the class an unqualified exp would name the method.
#include "xgrad/core/autograd/ops.hpp"

namespace xgrad {

Tensor Tensor::neg() const { return xgrad::neg(*this); }
Tensor Tensor::exp() const { return xgrad::exp(*this); }
Tensor Tensor::log() const { return xgrad::log(*this); }
Tensor Tensor::sqrt() const { return xgrad::sqrt(*this); }
Tensor Tensor::pow(float exponent) const { return xgrad::pow(*this, exponent); }
Tensor Tensor::tanh() const { return xgrad::tanh(*this); }
Tensor Tensor::sigmoid() const { return xgrad::sigmoid(*this); }
Tensor Tensor::relu() const { return xgrad::relu(*this); }
Tensor Tensor::gelu() const { return xgrad::gelu(*this); }
Tensor Tensor::gelu(GeluApprox approx) const { return xgrad::gelu(*this, approx); }

Tensor Tensor::sum() const { return xgrad::sum(*this); }
Tensor Tensor::sum(const std::vector<int>& axes, bool keepdims) const { return xgrad::sum(*this, axes, keepdims); }
Tensor Tensor::mean() const { return xgrad::mean(*this); }
Tensor Tensor::mean(const std::vector<int>& axes, bool keepdims) const { return xgrad::mean(*this, axes, keepdims); }
Tensor Tensor::max(int axis, bool keepdims) const { return xgrad::max(*this, axis, keepdims); }

Tensor Tensor::reshape(const std::vector<std::int64_t>& shape) const { return xgrad::reshape(*this, shape); }
Tensor Tensor::transpose(int axis0, int axis1) const { return xgrad::transpose(*this, axis0, axis1); }
Tensor Tensor::permute(const std::vector<int>& axes) const { return xgrad::permute(*this, axes); }
Tensor Tensor::slice(int axis, std::size_t start, std::size_t stop) const {
  return xgrad::slice(*this, axis, start, stop);
}
std::vector<Tensor> Tensor::split(const std::vector<std::size_t>& sizes, int axis) const {
  return xgrad::split(*this, sizes, axis);
}
std::vector<Tensor> Tensor::chunk(std::size_t n, int axis) const { return xgrad::chunk(*this, n, axis); }

Tensor Tensor::gather(int axis, const IndexArray& index) const { return xgrad::gather(*this, axis, index); }
Tensor Tensor::index_select(int axis, const IndexArray& ids) const { return xgrad::index_select(*this, axis, ids); }
Tensor Tensor::where(const Mask& mask, const Tensor& other) const { return xgrad::where(mask, *this, other); }
IndexArray Tensor::argmax(int axis, bool keepdims) const { return xgrad::argmax(*this, axis, keepdims); }
TopK Tensor::topk(std::size_t k, int axis) const { return xgrad::topk(*this, k, axis); }

Tensor Tensor::matmul(const Tensor& other, bool transpose_a, bool transpose_b) const {
  return xgrad::matmul(*this, other, transpose_a, transpose_b);
}

Tensor Tensor::softmax(int axis) const { return xgrad::softmax(*this, axis); }
Tensor Tensor::log_softmax(int axis) const { return xgrad::log_softmax(*this, axis); }
Tensor Tensor::masked_fill(const Mask& mask, float value) const { return xgrad::masked_fill(*this, mask, value); }
Tensor Tensor::masked_fill(const Mask& mask, const Array& values) const {
  return xgrad::masked_fill(*this, mask, values);
}

}  // namespace xgrad
