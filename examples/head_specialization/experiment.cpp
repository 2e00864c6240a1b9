// Training both models and measuring the multi-head one.
#include "experiment.hpp"

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

namespace headspec {

using namespace xgrad;

void validate(const ExperimentConfig& c) {
  validate(c.task);
  nn::Attention::check(nn::MultiHeadAttentionOptions(c.d_model, c.heads).dropout(c.dropout));
  if (c.layers == 0) fail("layers must be at least 1");
  if (c.train.steps == 0) fail("steps must be at least 1");
  if (c.train.batch == 0) fail("batch must be at least 1");
  if (c.eval_batches == 0) fail("eval batches must be at least 1");
  if (!(c.train.lr > 0.f)) fail("learning rate ", c.train.lr, " must be positive");
}

OffsetModelOptions model_options(const ExperimentConfig& c, std::size_t heads) {
  OffsetModelOptions o;
  o.vocab = c.task.vocab;
  o.seq_len = c.task.seq_len;
  o.offsets = c.task.offsets.size();
  o.d_model = c.d_model;
  o.heads = heads;
  o.layers = c.layers;
  o.norm = c.norm;
  o.dropout = c.dropout;
  return o;
}

ExperimentResult run_experiment(const ExperimentConfig& c, const ProgressFn& on_progress) {
  validate(c);
  ExperimentResult r;
  for (std::size_t t = 0; t < c.task.seq_len; ++t) r.position_labels.push_back("t" + std::to_string(t));
  const std::vector<ShiftBatch> data = held_out(c.task, c.eval_batches, c.train.batch, c.seed + 1000003);

  auto report = [&](const char* label) {
    return [&, label](const Progress& p) {
      if (on_progress) on_progress(label, p);
    };
  };
  // Weights and training batches come from separate generators, so both models see the same data.
  Generator weights(c.seed), batches(c.seed + 1);
  OffsetModel model(model_options(c, c.heads), weights);
  r.training = train(model, c.task, c.train, batches, report("multi-head"));
  // The measurements run at the training's precision.
  AutocastGuard autocast(c.train.precision);
  r.accuracy = evaluate(model, c.task, data);
  r.heads = analyze_heads(model, c.task, data);
  r.every_offset_owned = every_offset_owned(c.task, r.heads);
  r.patching = patch_each_head(model, c.task, data, c.seed + 2000003);
  r.each_offset_restored = each_offset_restored_by_its_own_head(c.task, r.heads, r.patching);
  r.attribution = compare_attribution(model, c.task, data[0], c.seed + 3000017);
  {
    NoGradGuard no_grad;
    model.eval();
    const IndexArray first = xt::view(data[0].tokens, xt::range(0, 1), xt::all());
    r.first_sequence = inspect::cache_activations(
        model, [&] { model.forward(first); }, inspect::points_ending_with({".pattern"}));
    for (std::size_t t = 0; t < c.task.seq_len; ++t)
      r.first_tokens.push_back("t" + std::to_string(t) + " " + std::to_string(first(0, t)));
  }

  if (c.single_head && c.heads != 1) {
    Generator weights1(c.seed), batches1(c.seed + 1);
    OffsetModel single(model_options(c, 1), weights1);
    autocast.close();  // training refuses to step inside a bf16 guard
    r.single_training = train(single, c.task, c.train, batches1, report("single-head"));
    const AutocastGuard measure(c.train.precision);
    r.single_accuracy = evaluate(single, c.task, data);
  } else if (c.heads == 1) {
    r.single_training = r.training;
    r.single_accuracy = r.accuracy;
  }
  return r;
}

}  // namespace headspec
