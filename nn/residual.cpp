// The residual connection shared by attention and feed-forward sublayers.
#include "xgrad/nn/residual.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/core/ops.hpp"

namespace xgrad::nn {

Tensor residual_connection(const Module& owner, const std::string& name, const Tensor& x, Norm norm,
                           const LayerNorm* layer_norm, const std::function<Tensor(const Tensor&)>& sublayer) {
  if (norm != Norm::none && !layer_norm) fail("residual_connection: '", name, "' needs a LayerNorm for its placement");
  Tensor skip = x, branch = x;
  if (owner.probing()) {
    owner.probe(name + ".in", x);
    skip = identity(x);
    branch = identity(x);
    owner.probe(name + ".skip", skip);
    owner.probe(name + ".branch", branch);
  }
  Tensor f, y;
  switch (norm) {
    case Norm::pre:
      f = sublayer(layer_norm->forward(branch));
      y = skip + f;
      break;
    case Norm::post:
      f = sublayer(branch);
      y = layer_norm->forward(skip + f);
      break;
    case Norm::none:
      f = sublayer(branch);
      y = f;
      break;
  }
  owner.probe(name + ".sublayer", f);
  owner.probe(name + ".out", y);
  return y;
}

}  // namespace xgrad::nn
