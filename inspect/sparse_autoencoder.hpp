// Sparse autoencoders (SAEs): a wide, sparse code for the activations at one hook point, in
// SAELens's two common architectures (ReLU, trained with an L1 penalty, and TopK) and its file
// format (a folder with cfg.json and sae_weights.safetensors), spliced into a model's hook point.
// Training is in sae_training.hpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/hook.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::inspect {

/// How the features are formed from the pre-activations (SAELens's "architecture").
enum class SaeArchitecture {
  standard,  ///< relu(pre): sparse through the L1 penalty of training
  topk,      ///< the k largest pre-activations of each row, through relu; every other feature 0
};

/// The input's run-time normalization (SAELens's "normalize_activations"), undone on the output.
enum class SaeNormalization {
  none,        ///< also what "expected_average_only_in" means at inference: its factor is folded into the weights
  layer_norm,  ///< (x - mean) / (std + 1e-5), std unbiased; out: y * std + mean
  constant_norm_rescale,  ///< x * sqrt(d_in) / |x|; out: y * |x| / sqrt(d_in)
};

/// What an SAE is and where it reads: the fields of SAELens's cfg.json that change its forward,
/// and the hook point it was trained on.
struct SaeConfig {
  std::size_t d_in = 0;                                      ///< the width of the hook point's last axis
  std::size_t d_sae = 0;                                     ///< the number of features
  SaeArchitecture architecture = SaeArchitecture::standard;  ///< ReLU or TopK
  std::size_t k = 0;                                         ///< TopK: the features kept per row, 1 <= k <= d_sae
  bool apply_b_dec_to_input = true;                          ///< subtract b_dec from the input before encoding
  SaeNormalization normalization = SaeNormalization::none;
  std::string hook_name;   ///< the point it reads, xgrad's or TransformerLens's name (may be empty)
  std::string model_name;  ///< the model it was trained on, as the file says (may be empty)
};

/// An SAE as a module. Parameters (SAELens's names and layouts): W_enc (d_in, d_sae), b_enc
/// (d_sae), W_dec (d_sae, d_in), b_dec (d_in). For x (..., d_in):
///
///     x' = norm(x) - b_dec (if apply_b_dec_to_input)      pre = x' W_enc + b_enc
///     f  = relu(pre), or relu of the k largest of pre     recons = norm⁻¹(f W_dec + b_dec)
///
/// Hook points, as SAELens's without "hook_": "sae_input" (x), "sae_acts_pre" (pre),
/// "sae_acts_post" (f), "sae_recons", "sae_error" (x - recons, spliced with the error term
/// only) and "sae_output". Cache the features with cache_activations on the SAE itself while
/// the model runs with it spliced in.
class SparseAutoencoder : public nn::Module {
 public:
  /// Checks the config (d_in, d_sae > 0; k in [1, d_sae] for TopK) and that the parameters fit
  /// in the memory left, and initializes as SAELens's
  /// training does: W_dec rows in random directions of norm 0.1 (ReLU) or 1 (TopK), W_enc =
  /// W_dec^T, zero biases. Deterministic in gen.
  explicit SparseAutoencoder(const SaeConfig& config, Generator& gen = default_generator());

  /// The config it was built or loaded with.
  const SaeConfig& config() const { return config_; }

  /// The features f (..., d_sae) of x (..., d_in); throws naming x's shape when its last axis is
  /// not d_in.
  Tensor encode(const Tensor& x) const;
  /// The reconstruction of features f (..., d_sae); without normalization (norm⁻¹ needs the
  /// input's statistics: use forward).
  Tensor decode(const Tensor& f) const;
  /// The reconstruction of x (..., d_in). With keep_error, the output is recons + (x - recons)
  /// with the error taken as a constant (SAELens's use_error_term): the value is x up to
  /// rounding, while the features and the gradient pass through the SAE.
  Tensor forward(const Tensor& x, bool keep_error = false) const;

  /// What one pass computes, as training reads it: x's rows (N, d_in), the pre-activations
  /// and features (N, d_sae) and the reconstruction (N, d_in), with x (..., d_in) taken as
  /// N rows.
  struct Parts {
    Tensor rows;      ///< x as (N, d_in), after the "sae_input" hook
    Tensor pre;       ///< pre-activations (N, d_sae)
    Tensor features;  ///< f (N, d_sae)
    Tensor recons;    ///< the reconstruction (N, d_in)
  };
  /// forward's pieces, without the error term; throws as encode does.
  Parts parts(const Tensor& x) const;

  Tensor W_enc() const { return w_enc_; }  ///< (d_in, d_sae)
  Tensor b_enc() const { return b_enc_; }  ///< (d_sae,)
  Tensor W_dec() const { return w_dec_; }  ///< (d_sae, d_in)
  Tensor b_dec() const { return b_dec_; }  ///< (d_in,)

 private:
  // x (N, d_in) already normalized; `shape` is the input's, for the hook points' values.
  Tensor encode_normalized(const Tensor& x, const Shape& shape, Tensor* pre) const;
  // rows (N, width) through the hook at `point`, which sees them in the input's leading shape.
  Tensor hook_rows(const char* point, const Tensor& rows, const Shape& shape, std::size_t width) const;
  // Parameters of the config's shapes, their values left unset (load_sae reads them from the
  // file); checks the config and that they fit in memory, errors naming `who`.
  SparseAutoencoder(const SaeConfig& config, const char* who);
  friend std::unique_ptr<SparseAutoencoder> load_sae(const std::string& dir);

  SaeConfig config_;
  Tensor w_enc_, b_enc_, w_dec_, b_dec_;
};

/// Writes `sae` as SAELens's save_model does: the folder `dir` (created if missing) with
/// cfg.json (SAELens's current layout, hook and model names under "metadata") and
/// sae_weights.safetensors (float32). Each file is written atomically; a failure leaves any
/// earlier file intact.
void save_sae(const std::string& dir, const SparseAutoencoder& sae);
/// Reads a folder SAELens (current or pre-6 layout of cfg.json) or save_sae wrote. Weights
/// stored as F16 or BF16 become float32, the hook point's type. The weights' shapes and dtypes in
/// the file's header are checked against cfg.json before the SAE is built (with no random
/// initialization: the parameters are read straight from the file). Throws, naming the file and the
/// field, for: a missing or malformed field, an architecture other than standard and topk, a
/// normalization or reshape it does not know, a dtype other than float32, float16 and bfloat16
/// or one the weights file does not hold, a weight missing or of the wrong shape, and a weight
/// value that is NaN or infinite (naming the tensor and its flat position).
std::unique_ptr<SparseAutoencoder> load_sae(const std::string& dir);

/// While it lives, replaces the value at `point` of root's forwards by sae's reconstruction
/// (SparseAutoencoder::forward, with or without the error term). The point is xgrad's or
/// TransformerLens's name, by default the SAE's hook_name. Throws, naming the point, for a point
/// root lacks (listing near names), and in forward for a value whose last axis is not d_in.
/// sae must outlive the splice. Not copyable; destroying it detaches the hook.
class SaeSplice {
 public:
  /// Splices sae in at `point` ("" for sae.config().hook_name).
  SaeSplice(nn::Module& root, const SparseAutoencoder& sae, const std::string& point = "", bool keep_error = false);
  SaeSplice(const SaeSplice&) = delete;
  SaeSplice& operator=(const SaeSplice&) = delete;
  /// The point, in xgrad's spelling.
  const std::string& point() const { return point_; }

 private:
  std::string point_;
  nn::HookHandle hook_;
};

}  // namespace xgrad::inspect
