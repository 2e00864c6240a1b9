// PatchSet: one forward hook per patched point, replacing the chosen region with cached values.
#include "xgrad/inspect/patching.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/nn/attention.hpp"

namespace xgrad::inspect {

namespace {

enum class Layout { plain, heads_in_columns, heads_on_axis1, heads_on_axis2 };

struct Region {
  std::optional<std::size_t> head, position;
};

struct PointPatch {
  std::string point;
  Layout layout = Layout::plain;
  std::size_t heads = 0;
  Array source;
  std::vector<Region> regions;
};

// The attention that owns `point` (its path is the point minus the last name), or null.
const nn::Attention* owning_attention(nn::Module& root, const std::string& point) {
  const std::size_t dot = point.rfind('.');
  const std::string path = dot == std::string::npos ? "" : point.substr(0, dot);
  for (const auto& [name, module] : root.named_modules()) {
    if (name == path) return dynamic_cast<const nn::Attention*>(module);
  }
  return nullptr;
}

// By the point's own name, the last of its dotted path (a root attention's points have no dot).
Layout layout_of(const std::string& point) {
  const std::string name = point.substr(point.rfind('.') + 1);
  if (name == "q" || name == "k" || name == "v" || name == "rot_q" || name == "rot_k" || name == "context") {
    return Layout::heads_in_columns;
  }
  if (name == "pattern" || name == "scores") return Layout::heads_on_axis1;
  if (name == "z" || name == "result") return Layout::heads_on_axis2;
  return Layout::plain;
}

// True where the value takes the source: the union of the regions, for a value of `shape`.
Mask region_mask(const PointPatch& p, const Shape& shape) {
  const std::size_t rank = shape.size();
  const std::size_t position_axis = p.layout == Layout::heads_on_axis1 ? 2 : 1;
  Mask mask = xt::zeros<bool>(shape);
  for (const Region& r : p.regions) {
    if (r.position && (rank <= position_axis || *r.position >= shape[position_axis])) {
      fail("PatchSet: position ", *r.position, " is outside point '", p.point, "' of shape ", shape_str(shape));
    }
    if (r.head && p.layout == Layout::heads_in_columns && (rank != 3 || shape[2] % p.heads != 0)) {
      fail("PatchSet: point '", p.point, "' of shape ", shape_str(shape), " is not (B, T, C) with C divisible by ",
           p.heads, " heads");
    }
    // Walks every element by its multi-index; patching is for analysis, not for speed.
    std::vector<std::size_t> index(rank, 0);
    for (std::size_t flat = 0; flat < mask.size(); ++flat) {
      bool in = true;
      if (r.position) in = index[position_axis] == *r.position;
      if (in && r.head) {
        if (p.layout == Layout::heads_in_columns) {
          in = index[2] / (shape[2] / p.heads) == *r.head;
        } else {
          in = index[p.layout == Layout::heads_on_axis1 ? 1 : 2] == *r.head;
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

}  // namespace

PatchSet::PatchSet(nn::Module& root, const ActivationCache& source, const std::vector<Patch>& patches) {
  if (patches.empty()) fail("PatchSet: no patches given");
  std::map<std::string, std::shared_ptr<PointPatch>> by_point;
  std::vector<std::shared_ptr<PointPatch>> order;
  for (const Patch& asked : patches) {
    Patch patch = asked;
    patch.point = resolve_point(root, asked.point, "PatchSet");  // xgrad's or TransformerLens's spelling
    if (!source.has(patch.point)) fail("PatchSet: the source cache holds no point '", patch.point, "'");
    auto& p = by_point[patch.point];
    if (!p) {
      p = std::make_shared<PointPatch>();
      p->point = patch.point;
      p->layout = layout_of(patch.point);
      p->source = source.at(patch.point);
      order.push_back(p);
    }
    if (patch.head) {
      const nn::Attention* attention = p->layout == Layout::plain ? nullptr : owning_attention(root, patch.point);
      if (!attention) fail("PatchSet: point '", patch.point, "' has no heads (head ", *patch.head, " asked)");
      // k, v and rot_k hold the key/value heads (fewer than the query heads in grouped-query attention).
      const std::string name = patch.point.substr(patch.point.rfind('.') + 1);
      const bool kv = name == "k" || name == "v" || name == "rot_k";
      p->heads = kv ? attention->options().kv_heads() : attention->options().num_heads();
      if (*patch.head >= p->heads) {
        fail("PatchSet: head ", *patch.head, " at point '", patch.point, "', whose attention has ", p->heads,
             kv ? " key/value heads" : " heads");
      }
    }
    p->regions.push_back({patch.head, patch.position});
  }
  for (const auto& p : order) {
    hooks_.push_back(root.add_forward_hook(p->point, [p](const Tensor& value) {
      if (value.shape() != p->source.shape()) {
        fail("PatchSet: point '", p->point, "' has shape ", shape_str(value.shape()), " in this run but ",
             shape_str(p->source.shape()), " in the source cache");
      }
      return masked_fill(value, region_mask(*p, value.shape()), p->source);
    }));
  }
}

}  // namespace xgrad::inspect
