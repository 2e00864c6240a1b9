// Shape ops: identity, reshape, transpose/permute, slice, concat/stack, split/chunk. Values are always stored
// contiguous, so each op copies; permutes are plain strided loops.
#include <algorithm>
#include <numeric>

#include "xgrad/core/autograd/detail/axis_view.hpp"
#include "xgrad/core/autograd/detail/strided_offsets.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"

namespace xgrad {

namespace {

// out[perm-index] = in: out axis k is input axis perm[k].
Array permute_array(const Array& in, const std::vector<std::size_t>& perm) {
  const Shape& s = in.shape();
  const std::size_t n = s.size();
  Shape os(n);
  for (std::size_t k = 0; k < n; ++k) os[k] = s[perm[k]];
  Array out = Array::from_shape(os);
  if (n == 0) return in;  // a scalar: nothing to move
  if (in.size() == 0) return out;
  std::vector<std::size_t> in_stride(n, 1);
  for (std::size_t k = n; k-- > 1;) in_stride[k - 1] = in_stride[k] * s[k];
  std::vector<std::size_t> st(n);  // input stride of each output axis
  for (std::size_t k = 0; k < n; ++k) st[k] = in_stride[perm[k]];
  const std::size_t inner = n ? os[n - 1] : 1;
  const std::size_t inner_st = n ? st[n - 1] : 1;
  StridedOffsets at(os.data(), st.data(), n - 1);  // over the output's leading n-1 axes
  const float* src = in.data();
  float* dst = out.data();
  for (std::size_t o = 0, rows = out.size() / inner; o < rows; ++o, at.next()) {
    for (std::size_t j = 0; j < inner; ++j) dst[o * inner + j] = src[at.offset() + j * inner_st];
  }
  return out;
}

}  // namespace

Tensor identity(const Tensor& a) {
  check_defined(a, "identity");
  return record("identity", a.value(), {a}, [](GradContext& ctx) { ctx.pass_grad_out(0); });
}

Tensor reshape(const Tensor& a, const std::vector<std::int64_t>& shape) {
  check_defined(a, "reshape");
  Shape target(shape.size());
  std::size_t known = 1;
  int infer = -1;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == -1) {
      if (infer >= 0) fail("reshape: more than one -1 in ", shape_str(shape));
      infer = static_cast<int>(k);
    } else if (shape[k] < 0) {
      fail("reshape: negative size in ", shape_str(shape));
    } else {
      target[k] = static_cast<std::size_t>(shape[k]);
      known *= target[k];
    }
  }
  if (infer >= 0) {
    if (known == 0 || a.size() % known != 0) {
      fail("reshape: cannot reshape ", shape_str(a.shape()), " (", a.size(), " elements) into ", shape_str(shape));
    }
    target[infer] = a.size() / known;
    known *= target[infer];
  }
  if (known != a.size()) {
    fail("reshape: cannot reshape ", shape_str(a.shape()), " (", a.size(), " elements) into ", shape_str(shape));
  }
  Array y = a.value();
  y.reshape(target);
  return record("reshape", std::move(y), {a}, [](GradContext& ctx) {
    Array g = ctx.take_grad_out();
    g.reshape(ctx.input_shape(0));
    ctx.accumulate(0, std::move(g));
  });
}

Tensor permute(const Tensor& a, const std::vector<int>& axes) {
  check_defined(a, "permute");
  const std::size_t n = a.ndim();
  if (axes.size() != n) fail("permute: ", axes.size(), " axes given for a tensor of rank ", n);
  std::vector<std::size_t> perm(n), inverse(n, n);
  for (std::size_t k = 0; k < n; ++k) {
    perm[k] = normalize_axis(axes[k], n, "permute");
    if (inverse[perm[k]] != n) fail("permute: axis ", axes[k], " repeats in ", shape_str(axes));
    inverse[perm[k]] = k;
  }
  return record("permute", permute_array(a.value(), perm), {a}, [inverse](GradContext& ctx) {
    // the gradient goes back through the inverse permutation
    ctx.accumulate(0, permute_array(ctx.grad_out(), inverse));
  });
}

Tensor transpose(const Tensor& a, int axis0, int axis1) {
  check_defined(a, "transpose");
  const std::size_t n = a.ndim();
  std::vector<int> axes(n);
  std::iota(axes.begin(), axes.end(), 0);
  std::swap(axes[normalize_axis(axis0, n, "transpose")], axes[normalize_axis(axis1, n, "transpose")]);
  return permute(a, axes);
}

Tensor slice(const Tensor& a, int axis, std::size_t start, std::size_t stop) {
  check_defined(a, "slice");
  const Shape& s = a.shape();
  const std::size_t ax = normalize_axis(axis, s.size(), "slice");
  if (start > stop || stop > s[ax]) {
    fail("slice: range [", start, ", ", stop, ") is outside axis ", axis, " of length ", s[ax], " in shape ",
         shape_str(s));
  }
  const AxisView v = view_around(s, ax);
  Shape os = s;
  os[ax] = stop - start;
  Array y = Array::from_shape(os);
  const std::size_t len = (stop - start) * v.inner;
  for (std::size_t o = 0; o < v.outer; ++o) {
    std::copy_n(a.value().data() + (o * v.n + start) * v.inner, len, y.data() + o * len);
  }
  return record("slice", std::move(y), {a}, [v, start, len](GradContext& ctx) {
    Array& dx = ctx.grad_buffer(0);
    const float* g = ctx.grad_out().data();
    for (std::size_t o = 0; o < v.outer; ++o) {
      float* d = dx.data() + (o * v.n + start) * v.inner;
      for (std::size_t i = 0; i < len; ++i) d[i] += g[o * len + i];
    }
  });
}

Tensor concat(const std::vector<Tensor>& parts, int axis) {
  if (parts.empty()) fail("concat: no tensors given");
  for (const Tensor& p : parts) check_defined(p, "concat");
  const Shape& s0 = parts[0].shape();
  const std::size_t ax = normalize_axis(axis, s0.size(), "concat");
  Shape os = s0;
  os[ax] = 0;
  std::vector<std::size_t> lens;
  for (const Tensor& p : parts) {
    const Shape& s = p.shape();
    bool same = s.size() == s0.size();
    for (std::size_t k = 0; same && k < s.size(); ++k) same = k == ax || s[k] == s0[k];
    if (!same) fail("concat: shape ", shape_str(s), " does not match ", shape_str(s0), " outside axis ", axis);
    lens.push_back(s[ax]);
    os[ax] += s[ax];
  }
  const AxisView v = view_around(os, ax);
  Array y = Array::from_shape(os);
  std::size_t at = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::size_t len = lens[i] * v.inner;
    for (std::size_t o = 0; o < v.outer; ++o) {
      std::copy_n(parts[i].value().data() + o * len, len, y.data() + (o * v.n + at) * v.inner);
    }
    at += lens[i];
  }
  return record("concat", std::move(y), parts, [v, lens](GradContext& ctx) {
    // each part takes back its own band of the gradient
    std::size_t at = 0;
    for (std::size_t i = 0; i < lens.size(); ++i) {
      const std::size_t len = lens[i] * v.inner;
      if (ctx.needs(i)) {
        Array& d = ctx.grad_buffer(i);
        for (std::size_t o = 0; o < v.outer; ++o) {
          const float* g = ctx.grad_out().data() + (o * v.n + at) * v.inner;
          for (std::size_t j = 0; j < len; ++j) d.data()[o * len + j] += g[j];
        }
      }
      at += lens[i];
    }
  });
}

std::vector<Tensor> split(const Tensor& a, const std::vector<std::size_t>& sizes, int axis) {
  check_defined(a, "split");
  const std::size_t ax = normalize_axis(axis, a.ndim(), "split");
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  if (total != a.shape()[ax]) {
    fail("split: sizes ", shape_str(sizes), " add up to ", total, " but axis ", axis, " of ", shape_str(a.shape()),
         " has length ", a.shape()[ax]);
  }
  std::vector<Tensor> out;
  std::size_t at = 0;
  for (std::size_t len : sizes) {
    out.push_back(slice(a, axis, at, at + len));
    at += len;
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& parts, int axis) {
  if (parts.empty()) fail("stack: no tensors given");
  for (const Tensor& p : parts) check_defined(p, "stack");
  const Shape& s0 = parts[0].shape();
  const long rank = static_cast<long>(s0.size());
  if (axis < -rank - 1 || axis > rank) {
    fail("stack: axis ", axis, " is out of range for stacking tensors of rank ", rank, " (from ", -rank - 1, " to ",
         rank, ")");
  }
  const std::size_t ax = static_cast<std::size_t>(axis < 0 ? axis + rank + 1 : axis);
  std::vector<std::int64_t> unsqueezed(s0.begin(), s0.end());
  unsqueezed.insert(unsqueezed.begin() + static_cast<std::ptrdiff_t>(ax), 1);
  std::vector<Tensor> rows;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].shape() != s0) {
      fail("stack: part ", i, " has shape ", shape_str(parts[i].shape()), " but part 0 has ", shape_str(s0));
    }
    rows.push_back(reshape(parts[i], unsqueezed));
  }
  return concat(rows, static_cast<int>(ax));
}

std::vector<Tensor> chunk(const Tensor& a, std::size_t n, int axis) {
  check_defined(a, "chunk");
  const std::size_t ax = normalize_axis(axis, a.ndim(), "chunk");
  if (n == 0) fail("chunk: n must be at least 1, got 0");
  const std::size_t len = a.shape()[ax];
  const std::size_t piece = len / n + (len % n != 0);  // ceil(len / n); len + n - 1 can wrap
  if (piece == 0) {                                    // an empty axis: n empty pieces, as torch.chunk gives
    check_available_memory(static_cast<double>(n) * static_cast<double>(sizeof(Tensor)), "chunk",
                           std::to_string(n) + " empty pieces of an empty axis");
    return std::vector<Tensor>(n, slice(a, axis, 0, 0));
  }
  std::vector<std::size_t> sizes(len / piece, piece);
  if (len % piece) sizes.push_back(len % piece);
  return split(a, sizes, axis);
}

}  // namespace xgrad
