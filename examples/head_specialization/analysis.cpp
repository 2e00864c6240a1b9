// Accuracy, head statistics and ablations for the head-specialization example.
#include "analysis.hpp"

#include <algorithm>
#include <cmath>

#include <xtensor/xbuilder.hpp>

#include "common/argmax.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/inspect/head_importance.hpp"

namespace headspec {

using namespace xgrad;

std::vector<ShiftBatch> held_out(const ShiftTask& task, std::size_t count, std::size_t batch, std::uint64_t seed) {
  Generator gen(seed);
  std::vector<ShiftBatch> data;
  for (std::size_t i = 0; i < count; ++i) data.push_back(make_batch(task, batch, gen));
  return data;
}

Accuracy evaluate(const OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data) {
  NoGradGuard no_grad;
  const std::size_t K = task.offsets.size(), V = task.vocab;
  std::vector<std::size_t> hit(K, 0), total(K, 0);
  for (const ShiftBatch& batch : data) {
    const Tensor out = model.forward(batch.tokens).logits;  // held: nothing else keeps it alive
    const Array& logits = out.value();                      // (B, T, K, V)
    for (std::size_t i = 0; i < batch.targets.size(); ++i) {
      const std::int64_t target = batch.targets.data()[i];
      if (target == kIgnore) continue;
      hit[i % K] += static_cast<std::int64_t>(metrics::argmax(logits.data() + i * V, V)) == target;
      ++total[i % K];
    }
  }
  Accuracy acc;
  std::size_t h = 0, n = 0;
  for (std::size_t k = 0; k < K; ++k) {
    acc.per_offset.push_back(total[k] ? static_cast<double>(hit[k]) / static_cast<double>(total[k]) : 0.0);
    h += hit[k];
    n += total[k];
  }
  acc.overall = n ? static_cast<double>(h) / static_cast<double>(n) : 0.0;
  return acc;
}

std::vector<HeadStats> analyze_heads(OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const std::size_t L = model.layers.size(), H = model.options().heads;
  std::vector<std::vector<Array>> weights(L);  // per layer, one (B, H, T, S) array per batch
  for (const ShiftBatch& batch : data) {
    const OffsetOutput out = model.forward(batch.tokens);
    for (std::size_t l = 0; l < L; ++l) weights[l].push_back(out.attentions[l].value());
  }
  std::vector<HeadStats> stats;
  for (std::size_t l = 0; l < L; ++l) {
    Array all = weights[l][0];
    for (std::size_t i = 1; i < weights[l].size(); ++i) all = xt::concatenate(xt::xtuple(all, weights[l][i]), 0);
    std::vector<std::size_t> offsets;
    const std::vector<double> offset_scores = inspect::fixed_offset_scores(all, &offsets);
    for (std::size_t h = 0; h < H; ++h) {
      HeadStats s;
      s.layer = l;
      s.head = h;
      static_cast<inspect::HeadStatistics&>(s) = inspect::head_statistics(weights[l], h);
      s.specialized = s.argmax_fraction >= 0.9;
      s.detected_offset = offsets[h];
      s.offset_score = offset_scores[h];
      const std::size_t T = task.seq_len;
      s.pattern.assign(T, std::vector<double>(T));
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t k = 0; k < T; ++k) s.pattern[t][k] = weights[l][0](0, h, t, k);
      Array gates = xt::ones<float>({H});
      gates(h) = 0.f;
      const nn::HookHandle ablation = inspect::gate_heads(*model.layers[l], Tensor(gates));
      s.ablated = evaluate(model, task, data);
      stats.push_back(std::move(s));
    }
  }
  model.train(was_training);
  return stats;
}

bool every_offset_owned(const ShiftTask& task, const std::vector<HeadStats>& heads) {
  for (std::size_t k : task.offsets) {
    const bool owned = std::any_of(heads.begin(), heads.end(),
                                   [k](const HeadStats& s) { return s.specialized && s.dominant_offset == k; });
    if (!owned) return false;
  }
  return true;
}

}  // namespace headspec
