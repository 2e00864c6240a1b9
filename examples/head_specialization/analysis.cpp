// Accuracy, head statistics and ablations for the head-specialization example.
#include "analysis.hpp"

#include <algorithm>
#include <cmath>

#include "common/argmax.hpp"
#include "xgrad/core/tape.hpp"
#include "xgrad/nn/head_importance.hpp"

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
    const Array& logits = out.value();                    // (B, T, K, V)
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

namespace {

double entropy_of(const double* p, std::size_t n) {
  double e = 0;
  for (std::size_t i = 0; i < n; ++i) e -= p[i] * std::log(p[i] + 1e-9);
  return e;
}

// Statistics of head h from attention weights w (B, H, T, S) of all held-out batches.
void accumulate_stats(HeadStats& s, const std::vector<Array>& weights, std::size_t h) {
  const std::size_t T = weights[0].shape()[2];
  std::vector<double> mass(T, 0.0), count(T, 0.0);
  double entropy = 0, query_entropy = 0, sequences = 0, queries = 0;
  std::vector<double> row(T), mean_row(T);
  for (const Array& w : weights) {
    const std::size_t B = w.shape()[0], H = w.shape()[1];
    for (std::size_t b = 0; b < B; ++b) {
      std::fill(mean_row.begin(), mean_row.end(), 0.0);
      for (std::size_t t = 0; t < T; ++t) {
        const float* r = w.data() + ((b * H + h) * T + t) * T;
        for (std::size_t k = 0; k < T; ++k) {
          row[k] = r[k];
          mean_row[k] += r[k] / static_cast<double>(T);
        }
        for (std::size_t o = 0; o <= t; ++o) {
          mass[o] += row[t - o];
          count[o] += 1;
        }
        query_entropy += entropy_of(row.data(), T);
        queries += 1;
      }
      entropy += entropy_of(mean_row.data(), T);
      sequences += 1;
    }
  }
  s.offset_mass.resize(T);
  for (std::size_t o = 0; o < T; ++o) s.offset_mass[o] = count[o] ? mass[o] / count[o] : 0.0;
  s.dominant_offset = static_cast<std::size_t>(std::max_element(s.offset_mass.begin(), s.offset_mass.end()) - s.offset_mass.begin());
  s.dominant_mass = s.offset_mass[s.dominant_offset];
  s.entropy = entropy / sequences;
  s.query_entropy = query_entropy / queries;

  double on_target = 0, confidence = 0, considered = 0;
  for (const Array& w : weights) {
    const std::size_t B = w.shape()[0], H = w.shape()[1];
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t t = s.dominant_offset; t < T; ++t) {
        const float* r = w.data() + ((b * H + h) * T + t) * T;
        const std::size_t best = static_cast<std::size_t>(std::max_element(r, r + t + 1) - r);
        on_target += best == t - s.dominant_offset;
        confidence += r[best];
        considered += 1;
      }
    }
  }
  s.argmax_fraction = considered ? on_target / considered : 0.0;
  s.confidence = considered ? confidence / considered : 0.0;
  s.specialized = s.argmax_fraction >= 0.9;
  const Array& first = weights[0];
  s.pattern.assign(T, std::vector<double>(T));
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t k = 0; k < T; ++k) s.pattern[t][k] = first(0, h, t, k);
}

}  // namespace

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
    for (std::size_t h = 0; h < H; ++h) {
      HeadStats s;
      s.layer = l;
      s.head = h;
      accumulate_stats(s, weights[l], h);
      Array gates = xt::ones<float>({H});
      gates(h) = 0.f;
      const nn::HookHandle ablation = nn::gate_heads(*model.layers[l], Tensor(gates));
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
