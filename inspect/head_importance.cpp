// Head gates on the attention's "context" hook point, and their accumulated gradients.
#include "xgrad/inspect/head_importance.hpp"

#include <cmath>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::inspect {

nn::HookHandle gate_heads(nn::Attention& attention, const Tensor& gates) {
  const std::size_t H = attention.options().num_heads();
  if (!gates.defined() || gates.shape() != Shape{H}) {
    fail("gate_heads: gates of shape ", gates.defined() ? shape_str(gates.shape()) : std::string("(undefined)"),
         " is not (H,) = (", H, ",)");
  }
  return attention.add_forward_hook("context", [gates, H](const Tensor& context) {
    // (B, T, C) -> (B, T, H, D) * gates (1, 1, H, 1) -> (B, T, C)
    const auto b = static_cast<std::int64_t>(context.shape()[0]), t = static_cast<std::int64_t>(context.shape()[1]);
    const auto c = static_cast<std::int64_t>(context.shape()[2]), h = static_cast<std::int64_t>(H);
    return reshape(reshape(context, {b, t, h, c / h}) * reshape(gates, {1, 1, h, 1}), {b, t, c});
  });
}

HeadImportance::HeadImportance(nn::Module& root) {
  for (auto& [path, m] : root.named_modules()) {
    auto* attention = dynamic_cast<nn::Attention*>(m);
    if (!attention) continue;
    const std::size_t H = attention->options().num_heads();
    Tensor gate(xt::ones<float>({H}), true);
    nn::HookHandle hook = gate_heads(*attention, gate);
    gates_.push_back({path, gate, std::vector<double>(H, 0.0), std::move(hook)});
  }
  if (gates_.empty()) fail("HeadImportance: no attention in the module tree");
}

void HeadImportance::accumulate() {
  for (Gate& g : gates_) {
    if (!g.gate.has_grad())
      fail("HeadImportance::accumulate: no gradient reached the gates of '", g.path, "' (call it after backward)");
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

const Tensor& HeadImportance::gates(std::size_t i) const {
  if (i >= gates_.size())
    fail("HeadImportance::gates: index ", i, " is out of range for ", gates_.size(), " attentions");
  return gates_[i].gate;
}

}  // namespace xgrad::inspect
