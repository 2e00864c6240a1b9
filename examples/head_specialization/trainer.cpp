// AdamW training on the shift task.
#include "trainer.hpp"

#include <chrono>

#include "common/argmax.hpp"

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/optim/schedule.hpp"

namespace headspec {

using namespace xgrad;

Tensor shift_loss(const Tensor& logits, const IndexArray& targets) { return cross_entropy(logits, targets, kIgnore); }

namespace {
// Fraction of (position, offset) targets whose arg-max logit is right. logits (B, T, K, V).
double batch_accuracy(const Array& logits, const IndexArray& targets) {
  const std::size_t V = logits.shape()[3];
  std::size_t hit = 0, total = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets.data()[i] == kIgnore) continue;
    hit += static_cast<std::int64_t>(metrics::argmax(logits.data() + i * V, V)) == targets.data()[i];
    ++total;
  }
  return total ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}
}  // namespace

TrainResult train(OffsetModel& model, const ShiftTask& task, const TrainOptions& o, Generator& data,
                  const std::function<void(const Progress&)>& on_progress) {
  model.train();
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(o.lr).weight_decay(o.weight_decay));
  const optim::LrSchedule schedule(optim::ScheduleOptions(o.lr).warmup_steps(o.warmup));
  TrainResult result;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (std::size_t step = 0; step < o.steps; ++step) {
    const ShiftBatch batch = make_batch(task, o.batch, data);
    AutocastGuard autocast(o.precision);  // forward, loss and backward; closed before the step
    const OffsetOutput out = model.forward(batch.tokens);
    const Tensor loss = shift_loss(out.logits, batch.targets);
    opt.zero_grad();
    loss.backward();
    autocast.close();
    try {
      optim::check_finite(step + 1, loss.item(), model.named_parameters());
    } catch (const Error& e) {
      fail("train: ", e.what(), "; training stopped before this step's update");
    }
    opt.set_lr(schedule.lr(step));
    opt.step();
    result.losses.push_back(loss.item());
    if (on_progress) {
      Progress p;
      p.step = step + 1;
      p.steps = o.steps;
      p.loss = loss.item();
      p.accuracy = batch_accuracy(out.logits.value(), batch.targets);
      p.seconds = std::chrono::duration<double>(clock::now() - start).count();
      p.tokens_per_s = static_cast<double>(p.step * o.batch * task.seq_len) / std::max(p.seconds, 1e-9);
      p.seconds_left = p.seconds / static_cast<double>(p.step) * static_cast<double>(o.steps - p.step);
      on_progress(p);
    }
  }
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  model.eval();
  return result;
}

}  // namespace headspec
