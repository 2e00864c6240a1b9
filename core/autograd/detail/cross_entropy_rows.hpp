// Cross-entropy's arithmetic on one row of logits, shared by cross_entropy and
// linear_cross_entropy so that the two give the same bits. Not API.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>

#include "xgrad/core/kernels/detail/vector_kernels.hpp"

namespace xgrad::detail {

/// (max, log sum exp(x - max)) of n values at stride st, in exact arithmetic (NaN and infinities
/// propagate; a slice of -inf only, or an empty one, takes max 0).
inline std::pair<float, float> max_and_log_sum(const float* x, std::size_t n, std::size_t st) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, x[i * st]);
  if (!std::isfinite(m)) m = 0.f;
  float s = 0.f;
  for (std::size_t i = 0; i < n; ++i) s += std::exp(x[i * st] - m);
  return {m, std::log(s)};
}

/// What backward needs of one row: m and l with log sum exp x = m + l, and whether the vector
/// kernel computed them (every logit finite) or the exact arithmetic did.
struct RowLogSumExp {
  float m = 0, l = 0;
  bool vectored = false;
};

/// The row's loss, log sum_j exp(x_j) - x_target, and its RowLogSumExp.
inline float row_loss(const float* x, std::size_t n, std::int64_t target, RowLogSumExp& lse) {
  lse.vectored = kernels::log_sum_exp_finite(x, n, &lse.m, &lse.l);
  if (!lse.vectored) std::tie(lse.m, lse.l) = max_and_log_sum(x, n, 1);
  return lse.m + lse.l - x[target];
}

/// The row's gradient scale (softmax(x) - onehot(target)), added to d, or written over it when
/// `overwrite` (then d may be x).
inline void row_gradient(const float* x, std::size_t n, std::int64_t target, const RowLogSumExp& lse, float scale,
                         float* d, bool overwrite) {
  if (lse.vectored) {
    if (overwrite) {
      kernels::scaled_softmax(x, n, lse.m, lse.l, scale, d);
    } else {
      kernels::add_scaled_softmax(x, n, lse.m, lse.l, scale, d);
    }
  } else {
    for (std::size_t j = 0; j < n; ++j) {
      const float e = scale * std::exp(x[j] - lse.m - lse.l);
      d[j] = overwrite ? e : d[j] + e;
    }
  }
  d[target] -= scale;
}

}  // namespace xgrad::detail
