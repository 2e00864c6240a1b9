// Training a sparse autoencoder on activations streamed from a hook point, and measuring it on
// a language model: reconstruction, sparsity, dead features, and the loss with it spliced in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/inspect/sparse_autoencoder.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::inspect {

/// Gives the next activations to train on, (..., d_in): each call a fresh batch.
using ActivationSource = std::function<Array()>;

/// The activations at `point` (xgrad's or TransformerLens's name) of model's forward on each
/// next_ids() (B, T) batch, run in eval mode without recording and stopped after the point.
/// Throws at once for a point the model lacks (listing near names).
ActivationSource activations_at(nn::LanguageModel& model, const std::string& point,
                                std::function<IndexArray()> next_ids);

/// The options of train_sae, set as in SaeTrainOptions().steps(2000).l1_coefficient(2.f).
/// Defaults follow SAELens's training practice where it has one.
struct SaeTrainOptions {
  XGRAD_ARG(std::size_t, steps, 1000);          ///< optimizer steps
  XGRAD_ARG(std::size_t, batch_rows, 1024);     ///< activation rows per step
  XGRAD_ARG(std::size_t, buffer_rows, 8192);    ///< rows drawn and shuffled together (>= batch_rows)
  XGRAD_ARG(float, lr, 3e-4f);                  ///< Adam's learning rate (betas 0.9, 0.999)
  XGRAD_ARG(std::size_t, lr_warm_up_steps, 0);  ///< linear warm-up of the rate from 0
  XGRAD_ARG(std::size_t, lr_decay_steps, 0);    ///< linear decay to 0 over the last steps
  /// ReLU SAEs: the L1 penalty's coefficient, on the features weighted by their decoder rows'
  /// norms (SAELens's scale_sparsity_penalty_by_decoder_norm).
  XGRAD_ARG(float, l1_coefficient, 1.f);
  XGRAD_ARG(std::size_t, l1_warm_up_steps, 0);  ///< linear warm-up of the L1 coefficient from 0
  /// TopK SAEs: the coefficient of the auxiliary loss that has the top d_in / 2 dead features
  /// reconstruct what the live ones miss (the TopK paper's AuxK; 0 turns it off).
  XGRAD_ARG(float, aux_k_coefficient, 1.f / 32.f);
  /// A feature is dead once it has not fired for this many steps (SAELens's dead_feature_window).
  XGRAD_ARG(std::size_t, dead_feature_window, 200);
  /// SAELens's "expected_average_only_in": scale the inputs so their mean norm is sqrt(d_in)
  /// (the factor estimated on the first buffer), and fold the factor into the weights at the end.
  XGRAD_ARG(bool, normalize_activations, true);
  XGRAD_ARG(bool, init_b_dec_to_mean, true);  ///< b_dec starts at the first buffer's mean
  XGRAD_ARG(std::uint64_t, seed, 0);          ///< the buffer's shuffles
};

/// What train_sae returns: the losses along the way and the features that died.
struct SaeTrainingReport {
  std::vector<double> mse;          ///< per step: sum over d_in of squared error, mean over rows
  std::vector<double> sparsity;     ///< per step: the L1 penalty (ReLU) or the AuxK loss (TopK)
  std::vector<double> l0;           ///< per step: features active per row, on average
  std::size_t dead_features = 0;    ///< silent over the last dead_feature_window steps at the end
  double normalization_factor = 1;  ///< the factor folded into the weights (1 without normalization)
  double seconds = 0;               ///< wall time
};

/// Trains sae (in place) with Adam on rows from `source`, SAELens's way: rows gathered into a
/// buffer and shuffled, the inputs normalized if asked, the loss the summed squared error plus the
/// sparsity term. TopK SAEs keep unit-norm decoder rows (renormalized after each step). Throws
/// before the first step for options out of range, an SAE with run-time normalization, and
/// source activations whose last axis is not d_in or that hold a value that is not finite. A step
/// whose loss or gradient is not finite throws before the optimizer step, naming the step and the
/// value: the SAE keeps the weights the steps before it gave (the normalization factor folded in,
/// as at the end). On every way out, the SAE is back in the train/eval mode it came in.
SaeTrainingReport train_sae(SparseAutoencoder& sae, const ActivationSource& source,
                            const SaeTrainOptions& options = SaeTrainOptions());

/// The measurements of an SAE at a language model's hook point, over evaluation batches.
struct SaeEvaluation {
  double mse = 0;                 ///< mean over every element of (recons - x)^2
  double explained_variance = 0;  ///< 1 - sum |x - recons|^2 / sum |x - mean x|^2, over all rows
  double mean_l0 = 0;             ///< features active per row, on average
  std::size_t dead_features = 0;  ///< features that fire on no row
  double loss = 0;                ///< the model's loss as it is
  double loss_spliced = 0;        ///< with the point replaced by the reconstruction
  double loss_zero_ablated = 0;   ///< with the point replaced by zeros
  double loss_mean_ablated = 0;   ///< with the point replaced by its mean over the batches
  /// (zero-ablated - spliced) / (zero-ablated - loss): SAELens's "CE loss score", 1 when splicing
  /// costs nothing.
  double loss_recovered() const { return (loss_zero_ablated - loss_spliced) / (loss_zero_ablated - loss); }
};

/// Measures sae at `point` (its hook_name when empty) of model on (ids, targets) batches, in eval
/// mode without recording. Throws for no batches and as SaeSplice does.
SaeEvaluation evaluate_sae(nn::LanguageModel& model, const SparseAutoencoder& sae,
                           const std::vector<std::pair<IndexArray, IndexArray>>& batches,
                           const std::string& point = "");

}  // namespace xgrad::inspect
