// Which parameters take weight decay, decided by the type of the module that owns them.
#include "xgrad/nn/weight_decay.hpp"

#include <algorithm>
#include <vector>

#include "xgrad/nn/layers.hpp"

namespace xgrad::nn {

std::pair<NamedTensors, NamedTensors> split_for_weight_decay(Module& model) {
  std::vector<Tensor> exempt;  // owned by a module whose type says: no decay
  auto add = [&](const Tensor& t) {
    if (t.defined()) exempt.push_back(t);
  };
  for (const auto& [path, m] : model.named_modules()) {
    if (auto* l = dynamic_cast<Linear*>(m)) add(l->bias);
    if (auto* n = dynamic_cast<NormLayer*>(m)) {
      add(n->weight);
      add(n->bias);
    }
    if (auto* e = dynamic_cast<Embedding*>(m)) add(e->weight);
    if (auto* e = dynamic_cast<LearnedPositionalEncoding*>(m)) add(e->weight);
  }
  auto among = [](const std::vector<Tensor>& list, const Tensor& t) {
    return std::any_of(list.begin(), list.end(), [&](const Tensor& x) { return x.is_same(t); });
  };
  std::pair<NamedTensors, NamedTensors> split;
  std::vector<Tensor> seen;
  for (const auto& [name, p] : model.named_parameters()) {
    if (among(seen, p)) continue;
    seen.push_back(p);
    if (!p.requires_grad()) continue;
    const bool decays = p.ndim() >= 2 && !among(exempt, p);
    (decays ? split.first : split.second).emplace_back(name, p);
  }
  return split;
}

}  // namespace xgrad::nn
