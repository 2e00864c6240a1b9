// Gradient-flow measurement and the warm-up training comparison.
#include "flow.hpp"

#include <cmath>

#include "common/shift_task.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/init.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/optim/schedule.hpp"

namespace gradflow {

using namespace xgrad;

void validate(const FlowConfig& c) {
  nn::LanguageModel::check(nn::LanguageModelOptions(c.vocab, c.d_model, c.heads, c.layers).max_len(c.seq_len));
  if (c.vocab < 2) fail("vocabulary ", c.vocab, " must be at least 2");
  if (c.seq_len < 2) fail("sequence length ", c.seq_len, " must be at least 2");
  if (c.batches == 0 || c.batch == 0) fail("batches and batch must be at least 1");
}

std::vector<LmBatch> shift_batches(const FlowConfig& c, std::size_t count, Generator& gen) {
  const tasks::ShiftTask previous_token{c.vocab, c.seq_len, {1}};
  std::vector<LmBatch> out;
  for (std::size_t i = 0; i < count; ++i) {
    tasks::ShiftBatch b = tasks::make_batch(previous_token, c.batch, gen);
    b.targets.reshape({c.batch, c.seq_len});  // (B, T, 1) -> (B, T)
    out.push_back({std::move(b.tokens), std::move(b.targets)});
  }
  return out;
}

std::unique_ptr<nn::LanguageModel> make_model(const FlowConfig& c, nn::Norm norm, Generator& gen) {
  validate(c);
  auto model = std::make_unique<nn::LanguageModel>(nn::LanguageModelOptions(c.vocab, c.d_model, c.heads, c.layers)
                                                       .d_ff(c.d_ff ? c.d_ff : 4 * c.d_model)
                                                       .max_len(c.seq_len)
                                                       .dropout(0.f)
                                                       .norm(norm),
                                                   gen);
  nn::xavier_linears(*model, gen);
  return model;
}

namespace {
double norm_of(const Array& a) { return std::sqrt(sum_of_squares(a)); }

void add_flow(inspect::ResidualFlow& acc, const inspect::ResidualFlow& f, double w) {
  acc.name = f.name;
  acc.out += w * f.out;
  acc.skip += w * f.skip;
  acc.branch += w * f.branch;
  acc.total += w * f.total;
}
}  // namespace

FlowResult measure(nn::LanguageModel& model, const std::vector<LmBatch>& batches) {
  if (batches.empty()) fail("measure: no batches");
  const std::size_t L = model.blocks.size();
  const double w = 1.0 / static_cast<double>(batches.size());
  model.eval();
  std::vector<Array> ffn_sum(L);
  FlowResult r;
  r.layers.resize(L);
  inspect::ProbeSet probes(model);
  inspect::HeadImportance importance(model);
  for (const LmBatch& b : batches) {
    model.zero_grad();
    probes.clear();
    const Tensor loss = model.loss(b.ids, b.targets);
    loss.backward();
    importance.accumulate();
    r.loss += w * loss.item();
    const std::vector<inspect::ResidualFlow> flows = probes.residual_flows();  // attention, then FFN, per block
    if (flows.size() != 2 * L) fail("measure: expected ", 2 * L, " residual connections, probes saw ", flows.size());
    for (std::size_t l = 0; l < L; ++l) {
      const Array& g = model.blocks[l]->ffn->linear2->weight.grad();
      if (&b == &batches.front()) {
        ffn_sum[l] = g;
      } else {
        ffn_sum[l] += g;
      }
      r.layers[l].residual_grad_norm += w * norm_of(probes.gradient("blocks." + std::to_string(l) + ".stream_in"));
      add_flow(r.layers[l].attention, flows[2 * l], w);
      add_flow(r.layers[l].feed_forward, flows[2 * l + 1], w);
    }
  }
  for (std::size_t l = 0; l < L; ++l) {
    r.layers[l].layer = l;
    r.layers[l].ffn_weight_grad_norm = norm_of(ffn_sum[l]) * w;
  }
  r.heads = importance.scores();
  model.zero_grad();
  return r;
}

TrainCurve train_curve(const FlowConfig& c, nn::Norm norm, float lr, std::size_t warmup, std::size_t steps,
                       const std::function<void(std::size_t, float)>& on_step) {
  Generator weights(c.seed), data(c.seed + 1);
  auto model = make_model(c, norm, weights);
  model->train();
  optim::AdamW opt(model->named_parameters(), optim::AdamOptions(lr).weight_decay(0.01f));
  const optim::LrSchedule schedule(optim::ScheduleOptions(lr).warmup_steps(warmup));
  TrainCurve curve;
  curve.name = std::string(norm == nn::Norm::pre ? "Pre-Norm" : "Post-Norm") +
               (warmup ? ", warm-up " + std::to_string(warmup) : ", no warm-up");
  for (std::size_t step = 0; step < steps; ++step) {
    const LmBatch b = shift_batches(c, 1, data).front();
    const Tensor loss = model->loss(b.ids, b.targets);
    curve.losses.push_back(loss.item());
    opt.zero_grad();
    if (std::isfinite(loss.item())) loss.backward();
    try {
      optim::check_finite(step + 1, loss.item(), model->named_parameters());
    } catch (const Error& e) {
      curve.diverged = true;
      curve.divergence = e.what();
      break;
    }
    opt.set_lr(schedule.lr(step));
    opt.step();
    if (on_step) on_step(step + 1, loss.item());
  }
  return curve;
}

}  // namespace gradflow
