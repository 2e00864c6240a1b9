// Indexing and selection: gather, index_select, where, argmax, topk. Each backward adds the
// output gradient into the positions the forward read.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/autograd/detail/axis_view.hpp"
#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

using Offsets = std::shared_ptr<std::vector<std::size_t>>;

// dx.flat[offsets[q]] += g.flat[q]: the backward of every op here that copies elements.
Tensor record_pick(const char* op, Array y, const Tensor& a, Offsets at) {
  return record(op, std::move(y), {a}, [at = std::move(at)](GradContext& ctx) {
    float* dx = ctx.grad_buffer(0).data();
    const float* g = ctx.grad_out().data();
    for (std::size_t q = 0; q < at->size(); ++q) dx[(*at)[q]] += g[q];
  });
}

// Row-major multi-index of flat position q in shape s.
std::vector<std::size_t> position(std::size_t q, const Shape& s) {
  std::vector<std::size_t> pos(s.size());
  for (std::size_t k = s.size(); k-- > 0;) {
    pos[k] = q % s[k];
    q /= s[k];
  }
  return pos;
}

// NaN ranks above every number, as in PyTorch's argmax and topk.
bool greater(float u, float v) { return (std::isnan(u) && !std::isnan(v)) || u > v; }

}  // namespace

Tensor gather(const Tensor& a, int axis, const IndexArray& index) {
  check_defined(a, "gather");
  const Shape& s = a.shape();
  const std::size_t n = s.size();
  const std::size_t ax = normalize_axis(axis, n, "gather");
  const Shape is(index.shape().begin(), index.shape().end());
  if (is.size() != n) {
    fail("gather: index of shape ", shape_str(is), " has rank ", is.size(), " but the input ", shape_str(s),
         " has rank ", n);
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (k != ax && is[k] > s[k]) {
      fail("gather: index of shape ", shape_str(is), " is longer than the input ", shape_str(s), " along axis ", k);
    }
  }
  std::vector<std::size_t> stride(n, 1);
  for (std::size_t k = n; k-- > 1;) stride[k - 1] = stride[k] * s[k];
  auto at = std::make_shared<std::vector<std::size_t>>(index.size());
  Array y = Array::from_shape(is);
  std::vector<std::size_t> pos(n, 0);
  for (std::size_t q = 0; q < index.size(); ++q) {
    const std::int64_t id = index.data()[q];
    if (id < 0 || static_cast<std::size_t>(id) >= s[ax]) {
      fail("gather: index ", id, " at position ", shape_str(position(q, is)), " is outside [0, ", s[ax],
           ") along axis ", axis, " of ", shape_str(s));
    }
    std::size_t off = 0;
    for (std::size_t k = 0; k < n; ++k) off += (k == ax ? static_cast<std::size_t>(id) : pos[k]) * stride[k];
    (*at)[q] = off;
    y.data()[q] = a.value().data()[off];
    for (std::size_t k = n; k-- > 0;) {  // the next row-major position of the index
      if (++pos[k] < is[k]) break;
      pos[k] = 0;
    }
  }
  return record_pick("gather", std::move(y), a, std::move(at));
}

Tensor index_select(const Tensor& a, int axis, const IndexArray& ids) {
  check_defined(a, "index_select");
  const Shape& s = a.shape();
  const std::size_t ax = normalize_axis(axis, s.size(), "index_select");
  if (ids.dimension() != 1) fail("index_select: ids must be 1-D, got shape ", shape_str(ids.shape()));
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (ids(k) < 0 || static_cast<std::size_t>(ids(k)) >= s[ax]) {
      fail("index_select: id ", ids(k), " at position ", k, " is outside [0, ", s[ax], ") along axis ", axis, " of ",
           shape_str(s));
    }
  }
  const AxisView v = view_around(s, ax);
  Shape os = s;
  os[ax] = ids.size();
  Array y = Array::from_shape(os);
  auto at = std::make_shared<std::vector<std::size_t>>(y.size());
  std::size_t q = 0;
  for (std::size_t o = 0; o < v.outer; ++o) {
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::size_t base = (o * v.n + static_cast<std::size_t>(ids(k))) * v.inner;
      for (std::size_t j = 0; j < v.inner; ++j, ++q) {
        (*at)[q] = base + j;
        y.data()[q] = a.value().data()[base + j];
      }
    }
  }
  return record_pick("index_select", std::move(y), a, std::move(at));
}

Tensor where(const Mask& mask, const Tensor& a, const Tensor& b) {
  check_defined(a, "where");
  check_defined(b, "where");
  const Shape ms(mask.shape().begin(), mask.shape().end());
  const Shape os = broadcast_shapes(ms, broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  // three operands of feasible sizes can broadcast to more elements than size_t counts
  if (std::find(os.begin(), os.end(), std::size_t{0}) == os.end()) {
    std::size_t count = 1;
    for (std::size_t d : os) {
      if (count > std::numeric_limits<std::size_t>::max() / d) {
        fail("where: the broadcast shape ", shape_str(os), " of mask ", shape_str(ms), ", a ", shape_str(a.shape()),
             " and b ", shape_str(b.shape()), " has more elements than size_t can count");
      }
      count *= d;
    }
  }
  auto m = std::make_shared<Mask>(xt::broadcast(mask, os));
  const Array av = xt::broadcast(a.value(), os);
  const Array bv = xt::broadcast(b.value(), os);
  Array y = Array::from_shape(os);
  for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = m->data()[i] ? av.data()[i] : bv.data()[i];
  return record("where", std::move(y), {a, b}, [m](GradContext& ctx) {
    // a takes the gradient where the mask is true, b where it is false
    const Array& g = ctx.grad_out();
    for (std::size_t i = 0; i < 2; ++i) {
      if (!ctx.needs(i)) continue;
      Array d = g;
      for (std::size_t e = 0; e < d.size(); ++e) {
        if (m->data()[e] != (i == 0)) d.data()[e] = 0.f;
      }
      ctx.accumulate_reduced(i, d);
    }
  });
}

IndexArray argmax(const Tensor& a, int axis, bool keepdims) {
  check_defined(a, "argmax");
  const Shape& s = a.shape();
  const std::size_t ax = normalize_axis(axis, s.size(), "argmax");
  if (s[ax] == 0) fail("argmax: axis ", axis, " of shape ", shape_str(s), " is empty");
  const AxisView v = view_around(s, ax);
  std::vector<std::size_t> os;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (k != ax)
      os.push_back(s[k]);
    else if (keepdims)
      os.push_back(1);
  }
  IndexArray out = IndexArray::from_shape(os);
  const float* x = a.value().data();
  for (std::size_t o = 0; o < v.outer; ++o) {
    for (std::size_t j = 0; j < v.inner; ++j) {
      const float* p = x + o * v.n * v.inner + j;
      std::size_t best = 0;
      for (std::size_t i = 1; i < v.n; ++i) {
        if (greater(p[i * v.inner], p[best * v.inner])) best = i;
      }
      out.data()[o * v.inner + j] = static_cast<std::int64_t>(best);
    }
  }
  return out;
}

TopK topk(const Tensor& a, std::size_t k, int axis) {
  check_defined(a, "topk");
  const Shape& s = a.shape();
  const std::size_t ax = normalize_axis(axis, s.size(), "topk");
  if (k > s[ax]) fail("topk: k = ", k, " is larger than axis ", axis, " of length ", s[ax], " in shape ", shape_str(s));
  const AxisView v = view_around(s, ax);
  Shape os = s;
  os[ax] = k;
  Array y = Array::from_shape(os);
  IndexArray idx = IndexArray::from_shape(std::vector<std::size_t>(os.begin(), os.end()));
  auto at = std::make_shared<std::vector<std::size_t>>(y.size());
  const float* x = a.value().data();
  std::vector<std::size_t> order(v.n);
  for (std::size_t o = 0; o < v.outer; ++o) {
    for (std::size_t j = 0; j < v.inner; ++j) {
      const std::size_t base = o * v.n * v.inner + j;
      std::iota(order.begin(), order.end(), std::size_t{0});
      // largest first; equal values keep their order along the axis
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                        [&](std::size_t p, std::size_t q) {
        const float u = x[base + p * v.inner], w = x[base + q * v.inner];
        return greater(u, w) || (!greater(w, u) && p < q);
      });
      for (std::size_t r = 0; r < k; ++r) {
        const std::size_t out = (o * k + r) * v.inner + j;
        (*at)[out] = base + order[r] * v.inner;
        y.data()[out] = x[(*at)[out]];
        idx.data()[out] = static_cast<std::int64_t>(order[r]);
      }
    }
  }
  return {record_pick("topk", std::move(y), a, std::move(at)), std::move(idx)};
}

}  // namespace xgrad
