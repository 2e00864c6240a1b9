// The training loop and its losses.
#include "trainer.hpp"

#include <chrono>
#include <cmath>

#include "common/memory.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/optim/schedule.hpp"

namespace zh {

using namespace xgrad;

void validate(const TrainOptions& o) {
  if (o.steps == 0) fail("--steps must be at least 1");
  if (o.batch == 0) fail("--batch must be at least 1");
  if (!(std::isfinite(o.lr) && o.lr > 0.f)) fail("--lr ", o.lr, " must be positive and finite");
  nn::LanguageModel::check(model_options(o, 8));
}

nn::LanguageModelOptions model_options(const TrainOptions& o, std::size_t vocab_size) {
  return nn::LanguageModelOptions(vocab_size, o.d_model, o.heads, o.layers)
      .max_len(16)
      .dropout(0.f)
      .norm(nn::Norm::pre)
      .positional(nn::Positional::learned);
}

double training_bytes(const TrainOptions& o, std::size_t vocab_size) {
  const nn::LanguageModelOptions m = model_options(o, vocab_size);
  cli::TransformerSize s;
  s.layers = static_cast<double>(o.layers);
  s.d_model = static_cast<double>(o.d_model);
  s.heads = static_cast<double>(o.heads);
  s.d_ff = static_cast<double>(4 * o.d_model);
  s.vocab = static_cast<double>(vocab_size);
  s.batch = static_cast<double>(o.batch);
  s.seq_len = static_cast<double>(m.max_len());
  return cli::transformer_training_bytes(s);
}

double sentence_loss(const nn::LanguageModel& model, const Vocabulary& vocab, const std::vector<Sentence>& sentences) {
  NoGradGuard no_grad;
  std::vector<const Sentence*> all;
  for (const Sentence& s : sentences) all.push_back(&s);
  const Batch b = make_batch(vocab, all);
  return model.loss(b.ids, b.targets).item();
}

double unigram_loss(const Vocabulary& vocab, const std::vector<Sentence>& counted,
                    const std::vector<Sentence>& evaluated) {
  // Predicted tokens are every word and </s>: V - 2 symbols (not <pad>, not <s>), add-one smoothed.
  std::vector<double> count(vocab.size(), 0.0);
  double total = 0;
  auto tally = [&](const Sentence& s, const std::function<void(std::int64_t)>& f) {
    for (std::int64_t id : vocab.encode(s)) f(id);
    f(Vocabulary::kEos);
  };
  for (const Sentence& s : counted)
    tally(s, [&](std::int64_t id) {
      count[static_cast<std::size_t>(id)] += 1;
      total += 1;
    });
  const double symbols = static_cast<double>(vocab.size() - 2);
  double loss = 0, tokens = 0;
  for (const Sentence& s : evaluated) {
    tally(s, [&](std::int64_t id) {
      loss -= std::log((count[static_cast<std::size_t>(id)] + 1) / (total + symbols));
      tokens += 1;
    });
  }
  return loss / tokens;
}

TrainResult train(const TrainOptions& o, const CorpusSplit& corpus,
                  const std::function<void(std::size_t, std::size_t, float)>& on_step) {
  validate(o);
  if (corpus.train.empty() || corpus.held_out.empty()) fail("train: the corpus needs training and held-out sentences");
  std::vector<Sentence> every = corpus.train;
  every.insert(every.end(), corpus.held_out.begin(), corpus.held_out.end());
  TrainResult r{corpus, Vocabulary(every), nullptr, {}, {}, 0};

  Generator init(o.seed), data(mix_seed(o.seed, 1));
  r.model = std::make_unique<nn::LanguageModel>(model_options(o, r.vocab.size()), init);
  r.losses.unigram = unigram_loss(r.vocab, corpus.train, corpus.held_out);
  r.losses.held_out_before = sentence_loss(*r.model, r.vocab, corpus.held_out);

  optim::AdamW optimizer(r.model->named_parameters(), optim::AdamOptions(o.lr).weight_decay(o.weight_decay));
  const optim::LrSchedule schedule(optim::ScheduleOptions(o.lr)
                                       .warmup_steps(o.steps / 10)
                                       .total_steps(o.steps)
                                       .decay(optim::Decay::cosine)
                                       .min_lr(o.lr / 10));
  r.model->train();
  const auto start = std::chrono::steady_clock::now();
  std::vector<const Sentence*> chosen(o.batch);
  for (std::size_t step = 0; step < o.steps; ++step) {
    for (const Sentence*& s : chosen) s = &corpus.train[data.below(corpus.train.size())];
    const Batch b = make_batch(r.vocab, chosen);
    const Tensor loss = r.model->loss(b.ids, b.targets);
    optimizer.zero_grad();
    loss.backward();
    optim::check_finite(step + 1, loss.item(), optimizer.params());
    if (o.clip > 0.f) optim::clip_grad_norm(optimizer.params(), o.clip);
    optimizer.set_lr(schedule.lr(step));
    optimizer.step();
    r.step_losses.push_back(loss.item());
    if (on_step) on_step(step + 1, o.steps, loss.item());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.model->eval();
  r.losses.held_out = sentence_loss(*r.model, r.vocab, corpus.held_out);
  r.losses.train = sentence_loss(*r.model, r.vocab, corpus.train);
  return r;
}

}  // namespace zh
