// End-to-end learning: a 2-layer LanguageModel trained with AdamW on a copy task (the target
// at position t is the token at t - 2) must reach near-zero loss and near-perfect held-out
// accuracy within a fixed step budget, Pre-Norm and Post-Norm alike.
//
// Shapes: B batch, T sequence length, V vocabulary.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/schedule.hpp"

using namespace xgrad;

namespace {

constexpr std::size_t kV = 12, kT = 12, kB = 16, kLag = 2;
constexpr std::int64_t kIgnore = kIgnoreIndex;

struct Batch {
  IndexArray ids;      // (B, T) uniform random tokens
  IndexArray targets;  // (B, T): ids[b, t - 2], or -100 for t < 2
};

Batch copy_batch(std::size_t B, Generator& gen) {
  Batch b{IndexArray::from_shape({B, kT}), IndexArray::from_shape({B, kT})};
  for (std::size_t i = 0; i < B; ++i)
    for (std::size_t t = 0; t < kT; ++t) b.ids(i, t) = static_cast<std::int64_t>(gen.below(kV));
  for (std::size_t i = 0; i < B; ++i)
    for (std::size_t t = 0; t < kT; ++t) b.targets(i, t) = t < kLag ? kIgnore : b.ids(i, t - kLag);
  return b;
}

nn::LanguageModel make_model(nn::Norm norm, std::uint64_t seed) {
  Generator gen(seed);
  return nn::LanguageModel(nn::LanguageModelOptions(kV, 32, 4, 2).max_len(kT).dropout(0.f).norm(norm), gen);
}

// Loss and arg-max accuracy (over targets that are not ignored) on a held-out batch, in eval
// mode without recording.
struct Eval {
  double loss = 0;
  double accuracy = 0;
};

Eval evaluate(nn::LanguageModel& lm, const Batch& b) {
  const bool was_training = lm.is_training();
  lm.eval();
  NoGradGuard no_grad;
  const Tensor logits = lm.forward(b.ids).logits;  // (B, T, V)
  Eval e;
  e.loss = cross_entropy(logits, b.targets).item();
  const Array& l = logits.value();
  std::size_t hit = 0, total = 0;
  for (std::size_t i = 0; i < b.targets.size(); ++i) {
    if (b.targets.data()[i] == kIgnore) continue;
    const float* row = l.data() + i * kV;
    std::size_t best = 0;
    for (std::size_t v = 1; v < kV; ++v) best = row[v] > row[best] ? v : best;
    hit += static_cast<std::int64_t>(best) == b.targets.data()[i];
    ++total;
  }
  e.accuracy = static_cast<double>(hit) / static_cast<double>(total);
  lm.train(was_training);
  return e;
}

struct RunResult {
  std::vector<float> losses;  // training loss of every step
  double seconds = 0;
};

// AdamW on fresh random batches; the learning rate of step s is schedule.lr(s).
RunResult train(nn::LanguageModel& lm, const optim::LrSchedule& schedule, std::size_t steps, float lr,
                std::uint64_t data_seed) {
  lm.train();
  optim::AdamW opt(lm.named_parameters(), optim::AdamW::defaults(lr));
  Generator data(data_seed);
  RunResult r;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t step = 0; step < steps; ++step) {
    const Batch b = copy_batch(kB, data);
    const Tensor loss = lm.loss(b.ids, b.targets);
    opt.zero_grad();
    loss.backward();
    opt.set_lr(schedule.lr(step));
    opt.step();
    r.losses.push_back(loss.item());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

double mean_of_last(const std::vector<float>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

void run_copy_task(nn::Norm norm, const optim::ScheduleOptions& sched, std::size_t steps) {
  nn::LanguageModel lm = make_model(norm, 1);
  Generator held_out_gen(12345);  // a different stream from the training batches
  const Batch held_out = copy_batch(256, held_out_gen);

  // Untrained: the loss is near ln V (uniform guessing), so the final threshold means something.
  const Eval before = evaluate(lm, held_out);
  INFO("untrained loss " << before.loss << ", ln V " << std::log(static_cast<double>(kV)) << ", accuracy "
                         << before.accuracy);
  // (The head's U(-1/sqrt(C), 1/sqrt(C)) weights on layer-normalized features give logits of
  // variance about 1/3, which costs about 1/6 nat above ln V: measured 2.62 to 2.67 for seeds 1-5.)
  const double ln_v = std::log(static_cast<double>(kV));
  REQUIRE(before.loss > ln_v - 0.05);
  REQUIRE(before.loss < ln_v + 0.3);
  REQUIRE(before.accuracy < 0.2);  // chance is 1/12

  const RunResult run = train(lm, optim::LrSchedule(sched), steps, sched.base_lr(), 7);
  const Eval after = evaluate(lm, held_out);
  INFO("after " << steps << " steps (" << run.seconds << " s): train loss (mean of last 20) "
                << mean_of_last(run.losses, 20) << ", held-out loss " << after.loss << ", accuracy " << after.accuracy);
  REQUIRE(mean_of_last(run.losses, 20) < 0.05);
  REQUIRE(after.loss < 0.05);
  REQUIRE(after.accuracy >= 0.99);
}

}  // namespace

// Measured with model seeds 1-4 (Release, this machine): the mean training loss of 20 steps
// first drops below 0.05 after 87-96 steps for both placements at lr 3e-3 without warm-up, and
// is about 0.006 at step 200; 250 steps leave a margin of 2.5x and take well under a second.
TEST_CASE("a Pre-Norm LanguageModel learns the copy task", "[training][gemm]") {
  run_copy_task(nn::Norm::pre, optim::ScheduleOptions(3e-3f), 250);
}

// Post-Norm needs no warm-up at this depth (2 layers) and learning rate: a 50-step linear
// warm-up only delayed convergence (to 106-114 steps), so the schedule is constant here too.
TEST_CASE("a Post-Norm LanguageModel learns the copy task", "[training][gemm][long]") {
  run_copy_task(nn::Norm::post, optim::ScheduleOptions(3e-3f), 250);
}
