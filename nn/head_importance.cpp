// Head gates and their accumulated gradients.
#include "xgrad/nn/head_importance.hpp"

#include <cmath>

#include "xgrad/core/error.hpp"

namespace xgrad::nn {

HeadImportance::HeadImportance(Module& root) {
  for (auto& [path, m] : root.named_modules()) {
    auto* mha = dynamic_cast<MultiHeadAttention*>(m);
    if (!mha) continue;
    if (mha->head_gates.defined()) fail("HeadImportance: '", path, "' already has head gates");
    const std::size_t H = mha->options().num_heads();
    Gate g{path, mha, Tensor(xt::ones<float>({H}), true), std::vector<double>(H, 0.0)};
    mha->head_gates = g.gate;
    gates_.push_back(std::move(g));
  }
  if (gates_.empty()) fail("HeadImportance: no MultiHeadAttention in the module tree");
}

HeadImportance::~HeadImportance() {
  for (Gate& g : gates_) g.module->head_gates = Tensor();
}

void HeadImportance::accumulate() {
  for (Gate& g : gates_) {
    if (!g.gate.has_grad()) fail("HeadImportance::accumulate: no gradient reached the gates of '", g.path, "' (call it after backward)");
    const Array& d = g.gate.grad();
    for (std::size_t h = 0; h < g.sum.size(); ++h) g.sum[h] += std::abs(d(h));
    g.gate.zero_grad();
  }
  ++batches_;
}

std::vector<HeadScore> HeadImportance::scores() const {
  std::vector<HeadScore> out;
  for (const Gate& g : gates_) {
    for (std::size_t h = 0; h < g.sum.size(); ++h) {
      out.push_back({g.path, h, batches_ ? g.sum[h] / static_cast<double>(batches_) : 0.0});
    }
  }
  return out;
}

}  // namespace xgrad::nn
