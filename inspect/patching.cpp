// PatchSet: one forward hook per patched point, replacing the chosen region with cached values.
#include "xgrad/inspect/patching.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/detail/regions.hpp"
#include "xgrad/inspect/hook_names.hpp"

namespace xgrad::inspect {

namespace {

using detail::Layout;

struct PointPatch {
  std::string point;
  Layout layout = Layout::plain;
  std::size_t heads = 0;
  Array source;
  std::vector<detail::Region> regions;
};

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
      p->layout = detail::layout_of(patch.point);
      p->source = source.at(patch.point);
      order.push_back(p);
    }
    if (patch.head) {
      p->heads = detail::heads_of(root, patch.point, "PatchSet");
      if (*patch.head >= p->heads) {
        const std::string name = patch.point.substr(patch.point.rfind('.') + 1);
        const bool kv = name == "k" || name == "v" || name == "rot_k";
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
      return masked_fill(
          value, detail::region_mask(p->point, p->layout, p->heads, p->regions, value.shape(), "PatchSet"), p->source);
    }));
  }
}

}  // namespace xgrad::inspect
