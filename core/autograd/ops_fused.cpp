// Fused products: linear_activation, act(x W^T + b) as one op with one backward. The forward is
// blas::linear_activation (oneDNN's matmul primitive with the bias and activation as post-ops);
// the backward forms dz = g act'(z) and the bias gradient in one pass over g, then two products.
// Shapes: N rows (every axis of x but the last), I in_features, O out_features.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/detail/linear_activation.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

// What the GELUs keep for backward. Keeping z costs one (N, O) activation, as the unfused
// gelu(linear()) keeps its input; computing z again in backward costs a third product. Measured
// with bench_fused_products (docs/speed.md, "Fused products"; one thread, forward and backward):
// computing z again was 1.27x slower for the exact GELU (1.22x to 1.32x) and 1.21x for the tanh
// form (1.07x to 1.28x) over six runs of the benchmark's FFN shapes.
constexpr detail::GeluKeeps kGeluKeeps = detail::GeluKeeps::pre_activation;

blas::Epilogue epilogue_of(LinearActivation a) {
  switch (a) {
    case LinearActivation::relu:
      return blas::Epilogue::relu;
    case LinearActivation::gelu:
      return blas::Epilogue::gelu;
    case LinearActivation::gelu_tanh:
      return blas::Epilogue::gelu_tanh;
  }
  fail("linear_activation: unknown activation ", static_cast<int>(a));
}

const char* op_name(LinearActivation a) {
  return a == LinearActivation::relu ? "linear_relu" : a == LinearActivation::gelu ? "linear_gelu" : "linear_gelu_tanh";
}

// Rows of dz (and their column sums into part) per task: a chunk of dz is summed while in cache,
// and the chunks' partial sums are added in chunk order, as linear's bias gradient does (the same
// bits for every thread count).
constexpr std::size_t kChunkRows = 64;

// dz = g where y > 0, else 0. Both loads unconditional, so that GCC makes the choice a vector mask:
// as a branch on random signs it mispredicted half the time (the whole backward of
// 2048 x 256 -> 1024 ran 1.4x slower).
void relu_slope(const float* y, const float* g, float* dz, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i], yi = y[i];
    dz[i] = yi > 0.f ? gi : 0.f;
  }
}

// dz = g act'(z) over rows [r0, r1): ReLU reads y (z > 0 exactly where y > 0), the GELUs read z.
void slope_rows(LinearActivation a, const float* g, const float* zy, float* dz, std::size_t r0, std::size_t r1,
                std::size_t out) {
  const std::size_t lo = r0 * out, n = (r1 - r0) * out;
  g += lo, zy += lo, dz += lo;
  switch (a) {
    case LinearActivation::relu:
      return relu_slope(zy, g, dz, n);
    case LinearActivation::gelu:
      return kernels::gelu_backward(zy, g, dz, n);
    case LinearActivation::gelu_tanh:
      return kernels::gelu_tanh_backward(zy, g, dz, n);
  }
}

}  // namespace

namespace detail {

Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, LinearActivation a,
                         GeluKeeps keeps) {
  if (!x.defined() || !weight.defined()) fail("linear_activation: input is an undefined tensor");
  const blas::Epilogue act = epilogue_of(a);
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  if (ws.size() != 2) fail("linear_activation: weight must be (out, in), got ", shape_str(ws));
  const std::size_t out = ws[0], in = ws[1];
  if (xs.empty() || xs.back() != in) {
    fail("linear_activation: input of shape ", shape_str(xs), " does not end in the weight's in_features ", in,
         " (weight ", shape_str(ws), ")");
  }
  if (bias.defined() && bias.shape() != Shape{out}) {
    fail("linear_activation: bias of shape ", shape_str(bias.shape()), " is not (out,) = (", out, ",)");
  }
  if (autocast_precision() == Precision::bf16) {
    // bf16 products are linear's (its weight cache, its recorded precision); the activation after
    const Tensor z = linear(x, weight, bias);
    return a == LinearActivation::relu ? relu(z) : a == LinearActivation::gelu ? gelu(z) : gelu(z, GeluApprox::tanh);
  }
  std::size_t rows = 1;
  for (std::size_t k = 0; k + 1 < xs.size(); ++k) rows *= xs[k];
  Shape ys = xs;
  ys.back() = out;
  const float* X = x.value().data();
  const float* W = weight.value().data();
  const float* b = bias.defined() ? bias.value().data() : nullptr;
  const bool recording =
      grad_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  const bool keep_z = recording && a != LinearActivation::relu && keeps == GeluKeeps::pre_activation;
  Array y = Array::from_shape(ys);
  // z = X W^T + b, the GELUs' backward input, kept when the choice says so
  std::shared_ptr<Array> z;
  if (keep_z) {
    z = std::make_shared<Array>(Array::from_shape(ys));
    blas::linear_activation(rows, out, in, X, W, b, z->data(), blas::Epilogue::none);
    const float* zs = z->data();
    float* yv = y.data();
    const auto forward = a == LinearActivation::gelu ? kernels::gelu_forward : kernels::gelu_tanh_forward;
    parallel_for(y.size(), kGrainCostly, [=](std::size_t lo, std::size_t hi) { forward(zs + lo, yv + lo, hi - lo); });
  } else {
    // Y = act(X W^T + b) in one product
    blas::linear_activation(rows, out, in, X, W, b, y.data(), act);
  }
  return record(op_name(a), std::move(y), {x, weight, bias},
                [a, z, has_bias = b != nullptr, rows, in, out](GradContext& ctx) {
    // y = act(z), z = X W^T + b:  dz = g act'(z),  db = sum over rows of dz,  dX = dz W,  dW = dz^T X
    const float* G = ctx.grad_out().data();
    std::shared_ptr<Array> pre = z;
    if (a != LinearActivation::relu && !pre) {
      // z again, from the inputs as saved (each checked for in-place writes)
      pre = std::make_shared<Array>(Array::from_shape({rows, out}));
      blas::linear_activation(rows, out, in, ctx.input(0).data(), ctx.input(1).data(),
                              has_bias ? ctx.input(2).data() : nullptr, pre->data(), blas::Epilogue::none);
    }
    const float* zy = a == LinearActivation::relu ? ctx.output().data() : pre->data();
    Array dz_array = Array::from_shape({rows, out});
    float* dz = dz_array.data();
    const bool with_bias = ctx.needs(2);
    const std::size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    std::vector<float> partial(with_bias ? chunks * out : 0, 0.f);
    float* part = partial.data();
    parallel_for(chunks, grain_for(kGrainCostly, kChunkRows * out), [=](std::size_t lo, std::size_t hi) {
      for (std::size_t c = lo; c < hi; ++c) {
        const std::size_t r0 = c * kChunkRows, r1 = std::min(rows, r0 + kChunkRows);
        slope_rows(a, G, zy, dz, r0, r1, out);
        if (with_bias) kernels::add_column_sums(dz + r0 * out, r1 - r0, out, part + c * out);
      }
    });
    if (ctx.needs(0)) {
      const auto dx = ctx.grad_target(0);
      blas::sgemm(false, false, rows, in, out, 1.f, dz, out, ctx.input(1).data(), in, dx.beta, dx.data, in);
    }
    if (ctx.needs(1)) {
      const auto dw = ctx.grad_target(1);
      blas::sgemm(true, false, out, in, rows, 1.f, dz, out, ctx.input(0).data(), in, dw.beta, dw.data, in);
    }
    if (with_bias) kernels::add_column_sums(part, chunks, out, ctx.grad_buffer(2).data());
  });
}

}  // namespace detail

Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, LinearActivation a) {
  return detail::linear_activation(x, weight, bias, a, kGeluKeeps);
}

}  // namespace xgrad
