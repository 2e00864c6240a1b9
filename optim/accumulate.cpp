// Gradient accumulation over micro-batches, each weighted by its share of the targets.
#include "xgrad/optim/accumulate.hpp"

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::optim {

double accumulate_gradients(const std::vector<std::size_t>& targets,
                            const std::function<Tensor(std::size_t)>& loss_of) {
  if (targets.empty()) fail("accumulate_gradients: no micro-batch");
  double total = 0;
  for (std::size_t n : targets) total += static_cast<double>(n);
  if (total == 0) fail("accumulate_gradients: the micro-batches hold no target");
  double mean = 0;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    if (targets[k] == 0) continue;
    const Tensor loss = loss_of(k);
    check_defined(loss, "accumulate_gradients: a micro-batch's loss");
    if (loss.size() != 1)
      fail("accumulate_gradients: micro-batch ", k, "'s loss has shape ", shape_str(loss.shape()), ", not one value");
    const double share = static_cast<double>(targets[k]) / total;
    mean += share * static_cast<double>(loss.item());
    // loss_k * n_k / N: d/dtheta sums to d(mean over all N targets)/dtheta
    mul(loss, static_cast<float>(share)).backward();
  }
  return mean;
}

}  // namespace xgrad::optim
