// Training and evaluating the head-count experiment's models on a fixed training set.
#include "heads.hpp"

#include <chrono>

#include "common/argmax.hpp"
#include "shift_model.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/finite.hpp"

namespace claims {

using namespace xgrad;
using tasks::ShiftBatch;

void validate(const HeadsConfig& c) {
  if (!c.task.offsets.empty() && c.task.offsets.back() >= c.task.seq_len) {
    fail("--offsets ", c.task.offsets.back(), " must be less than --seq-len ", c.task.seq_len);
  }
  tasks::validate(c.task);
  if (c.head_counts.empty()) fail("--heads: no head counts given");
  for (std::size_t h : c.head_counts) {
    if (h == 0 || c.d_model % h != 0) fail("--heads ", h, " does not divide --d-model ", c.d_model);
  }
  if (c.batch > c.train_size)
    fail("--batch ", c.batch, " is more than the ", c.train_size, " sequences of --train-size");
  if (c.seeds.empty()) fail("--seeds: no seeds given");
}

namespace {

// Rows `rows[begin, end)` of `set`, in that order.
ShiftBatch gather(const ShiftBatch& set, const std::vector<std::size_t>& rows, std::size_t begin, std::size_t end) {
  const std::size_t T = set.tokens.shape()[1], K = set.targets.shape()[2];
  ShiftBatch out{IndexArray::from_shape({end - begin, T}), IndexArray::from_shape({end - begin, T, K})};
  for (std::size_t i = begin; i < end; ++i) {
    const std::size_t r = rows[i];
    for (std::size_t t = 0; t < T; ++t) {
      out.tokens(i - begin, t) = set.tokens(r, t);
      for (std::size_t k = 0; k < K; ++k) out.targets(i - begin, t, k) = set.targets(r, t, k);
    }
  }
  return out;
}

void shuffle(std::vector<std::size_t>& rows, Generator& gen) {
  for (std::size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[gen.below(i)]);
}

std::vector<std::size_t> identity(std::size_t n) {
  std::vector<std::size_t> rows(n);
  for (std::size_t i = 0; i < n; ++i) rows[i] = i;
  return rows;
}

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// Mean cross-entropy and arg-max accuracy over every target of `set`, in eval mode.
Evaluation evaluate(const ShiftModel& model, const ShiftBatch& set) {
  NoGradGuard no_grad;
  const std::size_t n = set.tokens.shape()[0], chunk = 256;
  const std::vector<std::size_t> rows = identity(n);
  double loss_sum = 0;
  std::size_t hits = 0, targets = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const ShiftBatch part = gather(set, rows, begin, std::min(n, begin + chunk));
    const Tensor logits = model.forward(part.tokens);  // (B, T, K, V)
    const std::size_t V = logits.shape()[3];
    std::size_t counted = 0;
    for (std::size_t i = 0; i < part.targets.size(); ++i) {
      const std::int64_t target = part.targets.data()[i];
      if (target == tasks::kIgnore) continue;
      ++counted;
      hits += static_cast<std::int64_t>(metrics::argmax(logits.value().data() + i * V, V)) == target;
    }
    loss_sum +=
        static_cast<double>(cross_entropy(logits, part.targets, tasks::kIgnore).item()) * static_cast<double>(counted);
    targets += counted;
  }
  return {loss_sum / static_cast<double>(targets), static_cast<double>(hits) / static_cast<double>(targets)};
}

}  // namespace

HeadsRun run_heads(const HeadsConfig& c, std::size_t heads, std::uint64_t seed) {
  // Separate streams, so the data and the initial weights do not depend on the head count.
  Generator data(mix_seed(seed, 1)), weights(mix_seed(seed, 2)), order(mix_seed(seed, 3));
  const ShiftBatch train_set = tasks::make_batch(c.task, c.train_size, data);
  const ShiftBatch val_set = tasks::make_batch(c.task, c.val_size, data);
  ShiftModelOptions mo;
  mo.vocab = c.task.vocab;
  mo.seq_len = c.task.seq_len;
  mo.offsets = c.task.offsets.size();
  mo.d_model = c.d_model;
  mo.heads = heads;
  mo.layers = c.layers;
  ShiftModel model(mo, weights);

  HeadsRun run;
  run.heads = heads;
  run.head_size = c.d_model / heads;
  run.seed = seed;
  run.params = model.num_parameters();
  model.train();
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  std::vector<std::size_t> rows = identity(c.train_size);
  std::size_t next = c.train_size;  // a fresh shuffle at the first step
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t step = 0; step < c.steps; ++step) {
    if (next + c.batch > c.train_size) {
      shuffle(rows, order);
      next = 0;
    }
    const ShiftBatch batch = gather(train_set, rows, next, next + c.batch);
    next += c.batch;
    const Tensor loss = cross_entropy(model.forward(batch.tokens), batch.targets, tasks::kIgnore);
    opt.zero_grad();
    loss.backward();
    optim::check_finite(step + 1, loss.item(), model.named_parameters());
    opt.step();
    run.losses.push_back(loss.item());
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.epochs = static_cast<double>(c.steps * c.batch) / static_cast<double>(c.train_size);
  model.eval();
  const Evaluation train_eval = evaluate(model, train_set), val_eval = evaluate(model, val_set);
  run.train_loss = train_eval.loss;
  run.train_accuracy = train_eval.accuracy;
  run.val_loss = val_eval.loss;
  run.val_accuracy = val_eval.accuracy;
  return run;
}

std::vector<HeadsRun> run_head_sweep(const HeadsConfig& c, const std::function<void(const HeadsRun&)>& on_done) {
  std::vector<HeadsRun> runs;
  for (std::uint64_t seed : c.seeds) {
    for (std::size_t h : c.head_counts) {
      runs.push_back(run_heads(c, h, seed));
      if (on_done) on_done(runs.back());
    }
  }
  return runs;
}

}  // namespace claims
