// Gradient checks of modules (test_nn_gradcheck.cpp, test_attention_agreement.cpp): random
// inputs, LayerNorms moved away from their initial values, and gradcheck over a module's inputs
// and named parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::testing {

using Ins = std::vector<Tensor>;

// Checks d<forward(inputs), r>/d t for every input t that requires grad and for every named
// parameter of `module`, through the public gradcheck: parameters are perturbed in place and a
// failure names one by its dotted path. forward must be deterministic (re-seed any dropout
// generator inside it). A NaN or an infinity in the output or a gradient fails too.
inline GradcheckResult check_module_grads(nn::Module& module, const std::function<Tensor(const Ins&)>& forward,
                                          const Ins& inputs, const GradcheckOptions& opt = {}) {
  return gradcheck(forward, inputs, module.named_parameters(), opt);
}

#define REQUIRE_GRADS_OK(res)            \
  do {                                   \
    const GradcheckResult& res_ = (res); \
    INFO(res_.report);                   \
    REQUIRE(res_.ok);                    \
  } while (0)

// A leaf of N(0, scale^2) values that requires grad.
inline Tensor randn(const Shape& shape, std::uint64_t seed, float scale = 1.f) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, scale), true);
}

// LayerNorm starts at weight 1, bias 0, where some wrong gradients (e.g. one that ignores
// gamma) look right: give every LayerNorm parameter of `m` (the paths containing "norm")
// non-trivial values.
inline void randomize_norms(nn::Module& m, std::uint64_t seed) {
  Generator g(seed);
  for (auto& [name, p] : m.named_parameters()) {
    if (name.find("norm") == std::string::npos) continue;
    Tensor t = p;
    const bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    t.mutable_value() = is_weight ? g.uniform(t.shape(), 0.5f, 1.5f) : g.normal(t.shape(), 0.f, 0.2f);
  }
}

}  // namespace xgrad::testing
