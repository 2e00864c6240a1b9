// Heads and positions of a point's value (detail/regions.hpp).
#include "xgrad/inspect/detail/regions.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/nn/attention.hpp"

namespace xgrad::inspect::detail {

namespace {

// The attention that owns `point` (its path is the point minus the last name), or null.
const nn::Attention* owning_attention(nn::Module& root, const std::string& point) {
  const std::size_t dot = point.rfind('.');
  const std::string path = dot == std::string::npos ? "" : point.substr(0, dot);
  for (const auto& [name, module] : root.named_modules()) {
    if (name == path) return dynamic_cast<const nn::Attention*>(module);
  }
  return nullptr;
}

std::string own_name(const std::string& point) { return point.substr(point.rfind('.') + 1); }

}  // namespace

Layout layout_of(const std::string& point) {
  const std::string name = own_name(point);
  if (name == "q" || name == "k" || name == "v" || name == "rot_q" || name == "rot_k" || name == "context") {
    return Layout::heads_in_columns;
  }
  if (name == "pattern" || name == "scores") return Layout::heads_on_axis1;
  if (name == "z" || name == "result") return Layout::heads_on_axis2;
  return Layout::plain;
}

std::size_t heads_of(nn::Module& root, const std::string& point, const char* who) {
  const nn::Attention* attention = layout_of(point) == Layout::plain ? nullptr : owning_attention(root, point);
  if (!attention) fail(who, ": point '", point, "' has no heads");
  // k, v and rot_k hold the key/value heads (fewer than the query heads in grouped-query attention).
  const std::string name = own_name(point);
  const bool kv = name == "k" || name == "v" || name == "rot_k";
  return kv ? attention->options().kv_heads() : attention->options().num_heads();
}

Mask region_mask(const std::string& point, Layout layout, std::size_t heads, const std::vector<Region>& regions,
                 const Shape& shape, const char* who) {
  const std::size_t rank = shape.size(), at = position_axis(layout);
  Mask mask = xt::zeros<bool>(shape);
  for (const Region& r : regions) {
    if (r.position && (rank <= at || *r.position >= shape[at])) {
      fail(who, ": position ", *r.position, " is outside point '", point, "' of shape ", shape_str(shape));
    }
    if (r.head && layout == Layout::heads_in_columns && (rank != 3 || shape[2] % heads != 0)) {
      fail(who, ": point '", point, "' of shape ", shape_str(shape), " is not (B, T, C) with C divisible by ", heads,
           " heads");
    }
    if (r.head && layout != Layout::heads_in_columns &&
        (rank <= 2 || *r.head >= shape[layout == Layout::heads_on_axis1 ? 1 : 2])) {
      fail(who, ": head ", *r.head, " is outside point '", point, "' of shape ", shape_str(shape));
    }
    // Walks every element by its multi-index; patching is for analysis, not for speed.
    std::vector<std::size_t> index(rank, 0);
    for (std::size_t flat = 0; flat < mask.size(); ++flat) {
      bool in = true;
      if (r.position) in = index[at] == *r.position;
      if (in && r.head) {
        if (layout == Layout::heads_in_columns) {
          in = index[2] / (shape[2] / heads) == *r.head;
        } else {
          in = index[layout == Layout::heads_on_axis1 ? 1 : 2] == *r.head;
        }
      }
      if (in) mask.data()[flat] = true;
      for (std::size_t a = rank; a-- > 0;) {
        if (++index[a] < shape[a]) break;
        index[a] = 0;
      }
    }
  }
  return mask;
}

}  // namespace xgrad::inspect::detail
