// logit_lens: the cached residual streams read out through the final norm and head.
#include "xgrad/inspect/logit_lens.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/activation_cache.hpp"

namespace xgrad::inspect {

namespace {

void top_tokens(const Array& logits, std::size_t k, LensLayer& layer) {
  const Shape& s = logits.shape();  // (B, T, V)
  const std::size_t V = s[2], rows = s[0] * s[1];
  layer.top = IndexArray::from_shape({s[0], s[1], k});
  layer.top_prob = Array::from_shape({s[0], s[1], k});
  std::vector<std::size_t> order(V);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * V;
    const float m = *std::max_element(x, x + V);
    double z = 0;
    for (std::size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(x[v]) - m);
    std::iota(order.begin(), order.end(), std::size_t{0});
    // ties keep the lower id first
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [x](std::size_t a, std::size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (std::size_t j = 0; j < k; ++j) {
      layer.top.data()[r * k + j] = static_cast<std::int64_t>(order[j]);
      layer.top_prob.data()[r * k + j] = static_cast<float>(std::exp(static_cast<double>(x[order[j]]) - m) / z);
    }
  }
}

}  // namespace

std::vector<LensLayer> logit_lens(nn::LanguageModel& model, const IndexArray& ids, const IndexArray& targets,
                                  std::size_t top_k) {
  if (top_k == 0 || top_k > model.options().vocab_size()) {
    fail("logit_lens: top_k ", top_k, " is outside [1, ", model.options().vocab_size(), "] (the vocabulary)");
  }
  if (targets.shape() != ids.shape()) {
    fail("logit_lens: targets of shape ", shape_str(targets.shape()), " do not match ids ", shape_str(ids.shape()));
  }
  const auto vocab = static_cast<std::int64_t>(model.options().vocab_size());
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int64_t t = targets.data()[i];
    if (t != kIgnoreIndex && (t < 0 || t >= vocab)) {
      fail("logit_lens: target ", t, " at flat position ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  NoGradGuard no_grad;
  ActivationCache cache;
  {
    const nn::EvalGuard eval(model);
    cache = cache_activations(
        model, [&] { model.forward(ids); },
        [](const std::string& name) { return name == "embed" || nn::point_ends_with(name, ".stream_out"); });
  }
  std::vector<LensLayer> layers;
  for (const std::string& point : cache.names()) {
    const Tensor logits = model.unembed(Tensor(cache.at(point)));
    LensLayer layer;
    layer.point = point;
    layer.loss = cross_entropy(logits, targets).value()();
    top_tokens(logits.value(), top_k, layer);
    layers.push_back(std::move(layer));
  }
  return layers;
}

}  // namespace xgrad::inspect
