// Corrupt one token, restore one head at a time from the clean run, read the predictions.
#include "patching.hpp"

#include <algorithm>

#include "common/argmax.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/inspect/patching_sweep.hpp"

namespace headspec {

using namespace xgrad;

namespace {

// Per offset k, the fraction of sequences whose prediction for k at p + offsets[k] is want(b).
std::vector<double> restored_fraction(const OffsetModel& model, const ShiftTask& task, const IndexArray& tokens,
                                      const IndexArray& clean, std::size_t p) {
  const Array logits = model.forward(tokens).logits.value();  // (B, T, K, V)
  const std::size_t B = tokens.shape()[0], T = tokens.shape()[1], K = task.offsets.size(), V = task.vocab;
  std::vector<double> out(K, 0.0);
  for (std::size_t k = 0; k < K; ++k) {
    const std::size_t t = p + task.offsets[k];
    for (std::size_t b = 0; b < B; ++b) {
      const float* row = logits.data() + ((b * T + t) * K + k) * V;
      out[k] += static_cast<std::int64_t>(metrics::argmax(row, V)) == clean(b, p);
    }
    out[k] /= static_cast<double>(B);
  }
  return out;
}

}  // namespace

PatchingTable patch_each_head(OffsetModel& model, const ShiftTask& task, const std::vector<ShiftBatch>& data,
                              std::uint64_t seed) {
  const std::size_t longest = *std::max_element(task.offsets.begin(), task.offsets.end());
  if (longest >= task.seq_len)
    fail("patch_each_head: offset ", longest, " leaves no position in a length of ", task.seq_len);
  if (task.vocab < 2) fail("patch_each_head: a vocabulary of ", task.vocab, " has no other token to corrupt with");
  if (data.empty() || data[0].tokens.shape()[0] == 0) fail("patch_each_head: no held-out sequences");
  NoGradGuard no_grad;
  const nn::EvalGuard eval(model);
  PatchingTable table;
  table.position = task.seq_len - 1 - longest;
  const std::size_t p = table.position, L = model.layers.size(), H = model.options().heads, K = task.offsets.size();
  table.restored.assign(L * H, std::vector<double>(K, 0.0));
  table.clean.assign(K, 0.0);
  table.corrupted.assign(K, 0.0);
  Generator gen(seed);
  for (const ShiftBatch& batch : data) {
    const IndexArray& clean = batch.tokens;
    IndexArray corrupt = clean;
    for (std::size_t b = 0; b < clean.shape()[0]; ++b) {
      const auto shift = static_cast<std::int64_t>(1 + gen.next_u64() % (task.vocab - 1));  // never the same token
      corrupt(b, p) = (clean(b, p) + shift) % static_cast<std::int64_t>(task.vocab);
    }
    const inspect::ActivationCache source = inspect::cache_activations(
        model, [&] { model.forward(clean); }, inspect::points_ending_with({".context"}));
    const auto add = [](std::vector<double>& to, const std::vector<double>& x) {
      for (std::size_t k = 0; k < to.size(); ++k) to[k] += x[k];
    };
    add(table.clean, restored_fraction(model, task, clean, clean, p));
    add(table.corrupted, restored_fraction(model, task, corrupt, clean, p));
    for (std::size_t l = 0; l < L; ++l) {
      for (std::size_t h = 0; h < H; ++h) {
        const inspect::PatchSet patch(model, source, {{"layers." + std::to_string(l) + ".context", h, {}}});
        add(table.restored[l * H + h], restored_fraction(model, task, corrupt, clean, p));
      }
    }
  }
  const auto average = [&data](std::vector<double>& v) {
    for (double& x : v) x /= static_cast<double>(data.size());
  };
  average(table.clean);
  average(table.corrupted);
  for (auto& row : table.restored) average(row);
  return table;
}

AttributionAgreement compare_attribution(OffsetModel& model, const ShiftTask& task, const ShiftBatch& batch,
                                         std::uint64_t seed) {
  const std::size_t longest = *std::max_element(task.offsets.begin(), task.offsets.end());
  if (longest >= task.seq_len || task.vocab < 2) fail("compare_attribution: no position to corrupt");
  const std::size_t p = task.seq_len - 1 - longest, K = task.offsets.size();
  const IndexArray& clean = batch.tokens;
  const std::size_t B = clean.shape()[0], T = clean.shape()[1];
  IndexArray corrupt = clean;
  Generator gen(seed);
  for (std::size_t b = 0; b < B; ++b) {
    const auto shift = static_cast<std::int64_t>(1 + gen.next_u64() % (task.vocab - 1));
    corrupt(b, p) = (clean(b, p) + shift) % static_cast<std::int64_t>(task.vocab);
  }
  Array pick = xt::zeros<float>({B, T, K, task.vocab});  // the clean token at each reading prediction
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t k = 0; k < K; ++k)
      pick(b, p + task.offsets[k], k, static_cast<std::size_t>(clean(b, p))) = 1.f / B;
  }
  const Tensor weights(pick);
  const inspect::Metric metric = [weights](const Tensor& logits) { return sum(logits * weights); };
  inspect::SweepSpec spec;
  for (std::size_t l = 0; l < model.layers.size(); ++l)
    spec.points.push_back("layers." + std::to_string(l) + ".context");
  spec.by_head = spec.by_position = true;
  auto run_clean = [&] { return model.forward(clean).logits; };
  auto run_corrupt = [&] { return model.forward(corrupt).logits; };
  const inspect::SweepResult real = inspect::patching_sweep(model, run_clean, run_corrupt, metric, spec);
  const inspect::SweepResult estimate = inspect::attribution_patching(model, run_clean, run_corrupt, metric, spec);
  return {inspect::effect_correlation(real, estimate), real.seconds, estimate.seconds, real, estimate};
}

bool each_offset_restored_by_its_own_head(const ShiftTask& task, const std::vector<HeadStats>& heads,
                                          const PatchingTable& table) {
  for (std::size_t k = 0; k < task.offsets.size(); ++k) {
    std::size_t owners = 0;
    for (std::size_t i = 0; i < heads.size(); ++i) {
      const double r = table.restored[i][k];
      const bool own = heads[i].specialized && heads[i].dominant_offset == task.offsets[k];
      if (own && r >= 0.9) ++owners;
      if (!own && r > 0.1) return false;
    }
    if (owners != 1) return false;
  }
  return true;
}

}  // namespace headspec
