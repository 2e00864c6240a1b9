// A multi-index over the leading axes of an array, last axis fastest, with the element offset
// sum_k index[k] * stride[k] kept in step: the walk behind broadcast reductions, permute and
// matmul's batch offsets (a stride of 0 repeats a broadcast axis).
#pragma once

#include <cstddef>
#include <vector>

namespace xgrad {

class StridedOffsets {
 public:
  // Axes 0 .. axes - 1 of extent and stride (both hold at least `axes` entries).
  StridedOffsets(const std::size_t* extent, const std::size_t* stride, std::size_t axes)
      : extent_(extent), stride_(stride), index_(axes, 0) {}
  std::size_t offset() const { return offset_; }
  // Moves to the next index (after the last, back to all zeros).
  void next() {
    for (std::size_t k = index_.size(); k-- > 0;) {
      if (++index_[k] < extent_[k]) {
        offset_ += stride_[k];
        return;
      }
      offset_ -= stride_[k] * (extent_[k] - 1);
      index_[k] = 0;
    }
  }

 private:
  const std::size_t* extent_;
  const std::size_t* stride_;
  std::vector<std::size_t> index_;
  std::size_t offset_ = 0;
};

}  // namespace xgrad
