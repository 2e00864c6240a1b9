// Where a point's heads and positions sit in its value, and the mask of a set of (head, position)
// regions: shared by PatchSet and the patching sweeps. Not API.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::inspect::detail {

/// heads_in_columns: q, k, v, rot_q, rot_k, context (B, T, heads x D); heads_on_axis1: pattern,
/// scores (B, H, T, S); heads_on_axis2: z, result (B, T, H, ...); plain: no heads.
enum class Layout { plain, heads_in_columns, heads_on_axis1, heads_on_axis2 };

/// By the point's own name, the last of its dotted path.
Layout layout_of(const std::string& point);

/// The axis of positions (queries): 2 for pattern and scores, 1 otherwise.
inline std::size_t position_axis(Layout layout) { return layout == Layout::heads_on_axis1 ? 2 : 1; }

/// The number of heads of `point` in `root` (the key/value heads for k, v and rot_k); throws,
/// naming `who` and the point, when it has none.
std::size_t heads_of(nn::Module& root, const std::string& point, const char* who);

/// A head and a position (either may be absent: all of them).
struct Region {
  std::optional<std::size_t> head, position;
};

/// True where a value of `shape` at `point` lies in one of `regions`; throws, naming `who`, for a
/// position outside the shape or a shape that cannot hold `heads` heads.
Mask region_mask(const std::string& point, Layout layout, std::size_t heads, const std::vector<Region>& regions,
                 const Shape& shape, const char* who);

}  // namespace xgrad::inspect::detail
