// The (outer, n, inner) view of a contiguous array around one axis, used by the kernels that
// work along an axis: element (o, i, j) sits at (o * n + i) * inner + j.
#pragma once

#include <cstddef>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

struct AxisView {
  std::size_t outer = 1, n = 0, inner = 1;
};

inline AxisView view_around(const Shape& s, std::size_t axis) {
  AxisView v;
  v.n = s[axis];
  for (std::size_t k = 0; k < axis; ++k) v.outer *= s[k];
  for (std::size_t k = axis + 1; k < s.size(); ++k) v.inner *= s[k];
  return v;
}

}  // namespace xgrad
