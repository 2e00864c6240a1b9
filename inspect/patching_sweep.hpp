// Activation patching as one call, and its first-order estimate. A sweep runs the corrupted input
// once per patch, with one region (a point, a head of it, a position of it, or a head at a
// position) restored from the clean run, and records how far the metric moves from the corrupted
// run's. Attribution patching estimates every such move from one clean forward, one corrupted
// forward and one backward: the gradient of the metric at the corrupted run's activations times
// the clean-minus-corrupted difference, summed over the region.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::inspect {

/// A scalar read from a run's output, e.g.\ a logit difference. Built from ops on the output, so
/// attribution patching can take its gradient; a metric that is not a scalar, or not finite, is an
/// error.
using Metric = std::function<Tensor(const Tensor& output)>;

/// On a language model's logits (B, T, V) at one position, averaged over the batch: the logit of
/// answer[b] minus the logit of wrong[b]. Ids that do not fit the logits are an error when it runs.
Metric logit_difference(std::size_t position, std::vector<std::int64_t> answer, std::vector<std::int64_t> wrong);
/// The probability of tokens[b] at one position, averaged over the batch (checked as logit_difference).
Metric token_probability(std::size_t position, std::vector<std::int64_t> tokens);
/// Minus the mean next-token cross-entropy against targets (B, T): higher is better, as for the others.
Metric negative_loss(IndexArray targets);

/// What a sweep patches: points in xgrad's or TransformerLens's spelling, and how each is split.
struct SweepSpec {
  std::vector<std::string> points;  ///< e.g. {"blocks.0.attn.z", "blocks.1.attn.hook_z"}
  bool by_head = false;             ///< one patch per head (attention points only)
  bool by_position = false;         ///< one patch per position (the query axis)
};

/// TransformerLens's three standard sweeps, on a language model: the stream entering each block
/// at each position (its get_act_patch_resid_pre), each head's z at every position
/// (get_act_patch_attn_head_out_all_pos), each head's z at each position (..._by_pos).
SweepSpec every_layer_position(const nn::LanguageModel& model);
SweepSpec every_head(const nn::LanguageModel& model);           ///< each head's z at every position
SweepSpec every_head_position(const nn::LanguageModel& model);  ///< each head's z at each position

/// A sweep's table: one row per point (and head), one column per position (or one, "all").
struct SweepResult {
  std::vector<std::string> rows;     ///< "blocks.0.attn.z", or "blocks.0.attn.z head 2"
  std::vector<std::string> columns;  ///< "0", "1", ... or "all"
  /// (rows, columns): metric of the patched run minus the corrupted run's (estimated, for
  /// attribution patching).
  Array effect;
  double clean = 0;      ///< the metric on the clean run
  double corrupted = 0;  ///< the metric on the corrupted run
  double seconds = 0;    ///< wall time of the whole call
  /// effect / (clean - corrupted): 1 where the patch restores the clean metric wholly.
  Array restored() const;
};

/// Runs clean_run and corrupted_run (each calls root's forward once, on inputs of one shape, and
/// returns the output the metric reads) in eval mode without recording, then corrupted_run once
/// per patch. Throws before the patched runs for: no points, a name that is not a point, a head
/// split of a point without heads, a metric that is not a finite scalar on either run, and a sweep
/// whose clean activations cannot be held in the memory left; and during them for a metric that
/// is not finite (naming the patch). The model's mode and parameters' gradients are left as they were.
SweepResult patching_sweep(nn::Module& root, const std::function<Tensor()>& clean_run,
                           const std::function<Tensor()>& corrupted_run, const Metric& metric, const SweepSpec& spec);

/// The same table estimated to first order from one clean forward, one corrupted forward and one
/// backward of the metric (gradients recorded whatever the grad mode; the parameters' gradients are
/// restored afterwards). The same checks as patching_sweep.
SweepResult attribution_patching(nn::Module& root, const std::function<Tensor()>& clean_run,
                                 const std::function<Tensor()>& corrupted_run, const Metric& metric,
                                 const SweepSpec& spec);

/// The Pearson correlation of two tables' effects over every cell; throws unless their rows and
/// columns match.
double effect_correlation(const SweepResult& a, const SweepResult& b);

/// The table as a heatmap of restored() (0 to 1; a cell below 0 takes the colour of 0).
std::string sweep_svg(const SweepResult& result, const std::string& title);
/// The table as tab-separated text: a header of the columns, then a row label and its effects.
std::string sweep_tsv(const SweepResult& result);

}  // namespace xgrad::inspect
