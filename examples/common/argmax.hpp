// The index of a row's largest value (the first, on ties): the predicted class, for accuracy.
#pragma once

#include <cstddef>

namespace metrics {

inline std::size_t argmax(const float* row, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t j = 1; j < n; ++j) best = row[j] > row[best] ? j : best;
  return best;
}

}  // namespace metrics
