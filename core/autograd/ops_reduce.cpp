// Reductions: sum and mean over all elements or a set of axes, max along one axis.
#include <algorithm>
#include <limits>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

// The reduced shape with the reduced axes kept as length 1, and the final output shape.
struct Reduction {
  Shape kept;
  Shape out;
  std::size_t count = 1;  // elements folded into each output element
};

Reduction plan(const Shape& shape, const std::vector<int>& axes, bool keepdims, const char* op) {
  std::vector<bool> reduced(shape.size(), false);
  for (int ax : axes) {
    const std::size_t k = normalize_axis(ax, shape.size(), op);
    if (reduced[k]) fail(op, ": axis ", ax, " is listed twice");
    reduced[k] = true;
  }
  Reduction r;
  r.kept = shape;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (reduced[k]) {
      r.count *= shape[k];
      r.kept[k] = 1;
    } else {
      r.out.push_back(shape[k]);
    }
  }
  if (keepdims) r.out = r.kept;
  return r;
}

Array expand_to(const Array& g, const Shape& kept, const Shape& full) {
  Array gk = g;
  gk.reshape(kept);
  return xt::broadcast(gk, full);
}

Tensor sum_impl(const char* op, const Tensor& a, const std::vector<int>& axes, bool keepdims, float scale) {
  if (!a.defined()) fail(op, ": input is an undefined tensor");
  const Reduction r = plan(a.shape(), axes, keepdims, op);
  Array y = xt::zeros<float>(r.kept);
  add_reduced(y, a.value());  // summing into the kept shape is exactly the reduction
  if (scale != 1.f) y *= scale;
  y.reshape(r.out);
  const Shape kept = r.kept;
  return record(op, std::move(y), {a}, [kept, scale](GradContext& ctx) {
    // every input element of a slice gets that slice's output gradient (times 1/count for mean)
    Array g = expand_to(ctx.grad_out(), kept, ctx.input_shape(0));
    if (scale != 1.f) g *= scale;
    ctx.accumulate(0, std::move(g));
  });
}

std::vector<int> all_axes(const Tensor& a) {
  std::vector<int> axes(a.defined() ? a.ndim() : 0);
  for (std::size_t k = 0; k < axes.size(); ++k) axes[k] = static_cast<int>(k);
  return axes;
}

}  // namespace

Tensor sum(const Tensor& a) { return sum_impl("sum", a, all_axes(a), false, 1.f); }

Tensor sum(const Tensor& a, const std::vector<int>& axes, bool keepdims) {
  return sum_impl("sum", a, axes, keepdims, 1.f);
}

Tensor mean(const Tensor& a) { return mean(a, all_axes(a), false); }

Tensor mean(const Tensor& a, const std::vector<int>& axes, bool keepdims) {
  if (!a.defined()) fail("mean: input is an undefined tensor");
  const Reduction r = plan(a.shape(), axes, keepdims, "mean");
  if (r.count == 0) fail("mean: reducing ", shape_str(a.shape()), " over an empty axis");
  return sum_impl("mean", a, axes, keepdims, 1.f / static_cast<float>(r.count));
}

Tensor max(const Tensor& a, int axis, bool keepdims) {
  if (!a.defined()) fail("max: input is an undefined tensor");
  const Shape& s = a.shape();
  const std::size_t ax = normalize_axis(axis, s.size(), "max");
  const std::size_t n = s[ax];
  if (n == 0) fail("max: axis ", axis, " of shape ", shape_str(s), " is empty");
  std::size_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < ax; ++k) outer *= s[k];
  for (std::size_t k = ax + 1; k < s.size(); ++k) inner *= s[k];
  // View as (outer, n, inner); y[o, j] = max_i x[o, i, j]
  const Reduction r = plan(s, {axis}, keepdims, "max");
  Array y = Array::from_shape(r.out);
  std::vector<std::uint32_t> arg(outer * inner);
  const float* x = a.value().data();
  for (std::size_t o = 0; o < outer; ++o) {
    for (std::size_t j = 0; j < inner; ++j) {
      const float* p = x + o * n * inner + j;
      std::uint32_t best = 0;
      for (std::size_t i = 1; i < n; ++i) {
        if (p[i * inner] > p[best * inner]) best = static_cast<std::uint32_t>(i);
      }
      arg[o * inner + j] = best;
      y.data()[o * inner + j] = p[best * inner];
    }
  }
  return record("max", std::move(y), {a}, [arg = std::move(arg), n, inner](GradContext& ctx) {
    // dx[o, argmax, j] += g[o, j]
    Array& dx = ctx.grad_buffer(0);
    const float* g = ctx.grad_out().data();
    for (std::size_t q = 0; q < arg.size(); ++q) {
      const std::size_t o = q / inner, j = q % inner;
      dx.data()[(o * n + arg[q]) * inner + j] += g[q];
    }
  });
}

}  // namespace xgrad
