// checkpoint: a function's activations recomputed in backward instead of kept.
#include <algorithm>
#include <string>

#include "xgrad/core/autograd/detail/recompute.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

// The inputs as leaves of a graph of their own: parameters (leaves) themselves, activations
// detached, each requiring grad as it did (or as `needs` says).
std::vector<Tensor> as_leaves(const std::vector<Tensor>& inputs, const std::vector<bool>& needs = {}) {
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || inputs[i].is_leaf()) {
      out.push_back(inputs[i]);
      continue;
    }
    Tensor leaf = inputs[i].detach();
    leaf.set_requires_grad(needs.empty() ? inputs[i].requires_grad() : needs[i]);
    out.push_back(leaf);
  }
  return out;
}

}  // namespace

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  if (!fn) fail("checkpoint: the function is empty");
  const bool records = grad_enabled() && std::any_of(inputs.begin(), inputs.end(),
                                                     [](const Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!records) return fn(inputs);
  // Recorded and dropped rather than run without recording, so that the value is the one the
  // recomputation sees (some ops fuse differently without grad mode).
  Array value = detail::run_isolated([&] { return fn(as_leaves(inputs)); });
  // y = fn(inputs): backward differentiates fn again, from the inputs it saw
  // Backward recomputes at the forward's precision, as every op's backward uses its forward's.
  const Precision precision = autocast_precision();
  return record("checkpoint", std::move(value), inputs, [fn, inputs, precision](GradContext& ctx) {
    std::vector<bool> needs(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined()) continue;
      ctx.input(i);  // an Error if it was written in place since the forward
      needs[i] = ctx.needs(i);
    }
    // A parameter is the recomputed graph's leaf itself; an activation, a detached copy.
    const std::vector<Tensor> again = as_leaves(inputs, needs);
    auto grads = detail::recompute_gradients(
        [&] {
      const AutocastGuard autocast(precision);
      return fn(again);
        },
        ctx.grad_out());
    for (auto& [node, g] : grads) {
      std::size_t i = 0;
      while (i < again.size() && !(again[i].defined() && again[i].node() == node)) ++i;
      if (i == again.size()) {
        fail("checkpoint: the function read ", node->name.empty() ? "a tensor" : "'" + node->name + "'", " of shape ",
             shape_str(node->shape()),
             " that requires grad and is not among its inputs: pass it (every parameter the function uses) as an "
             "input");
      }
      if (ctx.needs(i)) ctx.accumulate(i, std::move(g));
    }
  });
}

}  // namespace xgrad
