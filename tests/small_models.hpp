// The small models the nn tests build, and an independent reader of attention masks, in one
// place (header-only: each test executable includes what it uses).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "xgrad/core/random.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::testing {

// Vocabulary 7, d_model 8, 2 heads, 1 layer, max_len 6, no dropout.
inline nn::LanguageModelOptions tiny_lm(nn::Norm norm = nn::Norm::pre) {
  return nn::LanguageModelOptions(7, 8, 2, 1).max_len(6).dropout(0.f).norm(norm);
}

// Vocabulary 11, d_model 8, 2 heads, 2 layers, d_ff 16, max_len 8, no dropout: training is
// deterministic (the checkpoint tests train and resume it).
inline nn::LanguageModelOptions small_lm() {
  return nn::LanguageModelOptions(11, 8, 2, 2).d_ff(16).max_len(8).dropout(0.f);
}

// A model of these options initialized from `seed`, in eval mode.
inline std::unique_ptr<nn::LanguageModel> eval_lm(const nn::LanguageModelOptions& options, std::uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_unique<nn::LanguageModel>(options, gen);
  m->eval();
  return m;
}

// Every parameter that starts at a constant moved off it: norm weights (initially 1) to
// U(0.5, 1.5), every bias (initially 0) to N(0, 0.2^2). At the initial values some wrong
// computations give right answers (a final norm applied twice changes nothing when its weight is 1
// and its bias 0), so the inspection tests run on models like this.
inline void randomize_constant_parameters(nn::Module& m, std::uint64_t seed) {
  Generator g(seed);
  for (auto& [name, p] : m.named_parameters()) {
    const bool norm = name.find("norm") != std::string::npos;
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (!norm && !bias) continue;
    Tensor t = p;
    t.mutable_value() = norm && !bias ? g.uniform(t.shape(), 0.5f, 1.5f) : g.normal(t.shape(), 0.f, 0.2f);
  }
}

// Token ids (B, T), each uniform in [0, V), drawn from `seed`.
inline IndexArray uniform_ids(std::size_t B, std::size_t T, std::size_t V, std::uint64_t seed) {
  Generator gen(seed);
  IndexArray ids = IndexArray::from_shape({B, T});
  for (auto& v : ids) v = static_cast<std::int64_t>(gen.below(V));
  return ids;
}

// eval_lm with randomize_constant_parameters applied.
inline std::unique_ptr<nn::LanguageModel> randomized_lm(const nn::LanguageModelOptions& options, std::uint64_t seed) {
  auto m = eval_lm(options, seed);
  randomize_constant_parameters(*m, seed + 1000);
  return m;
}

// Whether key s is blocked for query t of batch b, head h, read from the mask's fields
// directly (independently of nn::combine_masks).
inline bool blocked_at(const nn::AttentionMask& m, std::size_t b, std::size_t h, std::size_t t, std::size_t s) {
  if (m.causal && s > t) return true;
  if (m.key_padding_mask && (*m.key_padding_mask)(b, s)) return true;
  if (m.attn_mask) {
    const Mask& a = *m.attn_mask;
    const std::size_t idx[4] = {b, h, t, s};
    const std::size_t r = a.dimension();
    std::size_t flat = 0;
    for (std::size_t k = 0; k < r; ++k) {
      const std::size_t n = a.shape()[k];
      flat = flat * n + (n == 1 ? 0 : idx[4 - r + k]);
    }
    if (a.data()[flat]) return true;
  }
  return false;
}

}  // namespace xgrad::testing
