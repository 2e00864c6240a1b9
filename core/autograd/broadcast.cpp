// Shape broadcasting and the broadcast-reducing gradient sum (a plain strided loop).
#include "xgrad/core/autograd/detail/broadcast.hpp"

#include <algorithm>

#include "xgrad/core/autograd/detail/strided_offsets.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t k = 0; k < n; ++k) {
    // Align from the right; a missing axis counts as 1.
    const std::size_t da = k < n - a.size() ? 1 : a[k - (n - a.size())];
    const std::size_t db = k < n - b.size() ? 1 : b[k - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      fail(op, ": shapes ", shape_str(a), " and ", shape_str(b), " cannot be broadcast together");
    }
    out[k] = da == 1 ? db : da;
  }
  return out;
}

void add_reduced(Array& dst, const Array& g) {
  const Shape& gs = g.shape();
  const Shape& ds = dst.shape();
  if (gs == ds) {
    float* d = dst.data();
    const float* s = g.data();
    parallel_for(g.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) d[i] += s[i];
    });
    return;
  }
  const std::size_t n = gs.size();
  if (ds.size() > n) fail("add_reduced: gradient ", shape_str(gs), " has fewer axes than ", shape_str(ds));
  // Strides of dst viewed with g's rank; a broadcast axis gets stride 0.
  std::vector<std::size_t> stride(n, 0);
  std::size_t s = 1;
  for (std::size_t k = n; k-- > 0;) {
    const std::size_t dk = k + ds.size() >= n ? ds[k + ds.size() - n] : 1;
    if (dk != 1 && dk != gs[k]) {
      fail("add_reduced: shape ", shape_str(ds), " does not broadcast to ", shape_str(gs));
    }
    stride[k] = dk == 1 ? 0 : s;
    s *= dk;
  }
  if (g.size() == 0) return;
  const std::size_t inner = n ? gs[n - 1] : 1;
  const std::size_t inner_stride = n ? stride[n - 1] : 0;
  const std::size_t outer = g.size() / inner;
  StridedOffsets at(gs.data(), stride.data(), n ? n - 1 : 0);  // over g's leading n-1 axes
  const float* src = g.data();
  float* d = dst.data();
  for (std::size_t o = 0; o < outer; ++o, at.next()) {
    const std::size_t off = at.offset();
    const float* row = src + o * inner;
    if (inner_stride == 0) {
      float acc = 0.f;
      for (std::size_t j = 0; j < inner; ++j) acc += row[j];
      d[off] += acc;
    } else {
      float* drow = d + off;
      for (std::size_t j = 0; j < inner; ++j) drow[j] += row[j];
    }
  }
}

}  // namespace xgrad
