// Training and measuring sparse autoencoders (sae_training.hpp).
#include "xgrad/inspect/sae_training.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/optim/adam.hpp"

namespace xgrad::inspect {

namespace {

void check_options(const SaeTrainOptions& o) {
  const char* who = "train_sae";
  if (o.steps() == 0 || o.batch_rows() == 0)
    fail(who, ": steps ", o.steps(), " and batch_rows ", o.batch_rows(), " must be > 0");
  if (o.buffer_rows() < o.batch_rows())
    fail(who, ": buffer_rows ", o.buffer_rows(), " is below batch_rows ", o.batch_rows());
  if (!(o.lr() > 0) || !std::isfinite(o.lr())) fail(who, ": lr ", o.lr(), " must be finite and > 0");
  if (!(o.l1_coefficient() >= 0) || !std::isfinite(o.l1_coefficient())) {
    fail(who, ": l1_coefficient ", o.l1_coefficient(), " must be finite and >= 0");
  }
  if (!(o.aux_k_coefficient() >= 0) || !std::isfinite(o.aux_k_coefficient())) {
    fail(who, ": aux_k_coefficient ", o.aux_k_coefficient(), " must be finite and >= 0");
  }
  if (o.lr_warm_up_steps() + o.lr_decay_steps() > o.steps()) {
    fail(who, ": lr_warm_up_steps ", o.lr_warm_up_steps(), " and lr_decay_steps ", o.lr_decay_steps(),
         " add up to more than steps ", o.steps());
  }
  if (o.dead_feature_window() == 0) fail(who, ": dead_feature_window must be > 0");
}

// Rows drawn from a source into a shuffled buffer, served batch by batch.
class RowBuffer {
 public:
  RowBuffer(const ActivationSource& source, std::size_t width, std::size_t capacity, std::uint64_t seed)
      : source_(source), width_(width), capacity_(capacity), gen_(seed) {}

  // The next (rows, width) batch, refilling and reshuffling when fewer remain.
  Array next(std::size_t rows) {
    if (order_.size() - served_ < rows) refill();
    Array batch = Array::from_shape({rows, width_});
    for (std::size_t r = 0; r < rows; ++r) {
      std::copy_n(data_.begin() + order_[served_ + r] * width_, width_, batch.begin() + r * width_);
    }
    served_ += rows;
    return batch;
  }
  const std::vector<float>& data() const { return data_; }
  std::size_t rows() const { return order_.size(); }

  void refill() {
    data_.clear();
    while (data_.size() < capacity_ * width_) {
      const Array a = source_();
      if (a.dimension() == 0 || a.shape().back() != width_) {
        fail("train_sae: the source gave activations of shape ", shape_str(a.shape()), ", not (..., ", width_, ")");
      }
      if (a.size() == 0) fail("train_sae: the source gave no activations");
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a.data()[i])) fail("train_sae: the source gave ", a.data()[i], " at element ", i);
      }
      data_.insert(data_.end(), a.begin(), a.end());
    }
    order_.resize(data_.size() / width_);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[gen_.below(i)]);
    served_ = 0;
  }

 private:
  const ActivationSource& source_;
  std::size_t width_, capacity_;
  Generator gen_;
  std::vector<float> data_;
  std::vector<std::size_t> order_;
  std::size_t served_ = 0;
};

float ramp(std::size_t step, std::size_t warm_up) {
  return warm_up == 0 ? 1.f : std::min(1.f, static_cast<float>(step + 1) / static_cast<float>(warm_up));
}

// Each row of w (rows, cols) scaled to norm 1.
void unit_rows(Array& w) {
  for (std::size_t r = 0; r < w.shape()[0]; ++r) {
    double sq = 0;
    for (std::size_t c = 0; c < w.shape()[1]; ++c) sq += double(w(r, c)) * w(r, c);
    if (sq == 0) continue;
    const float scale = static_cast<float>(1 / std::sqrt(sq));
    for (std::size_t c = 0; c < w.shape()[1]; ++c) w(r, c) *= scale;
  }
}

// The TopK paper's AuxK: the k_aux largest pre-activations among dead features (N, d_sae), zero
// elsewhere, decoded without b_dec, should reconstruct the residual x - recons.
Tensor aux_k_loss(const SparseAutoencoder& sae, const SparseAutoencoder::Parts& p, const std::vector<bool>& dead,
                  std::size_t num_dead) {
  const std::size_t half = std::max<std::size_t>(1, sae.config().d_in / 2);
  const std::size_t k_aux = std::min(half, num_dead);
  const float scale = std::min(1.f, static_cast<float>(num_dead) / static_cast<float>(half));
  const Array& pre = p.pre.value();
  const std::size_t rows = pre.shape()[0], width = pre.shape()[1];
  Mask dropped = xt::ones<bool>(pre.shape());
  std::vector<std::size_t> candidates;
  for (std::size_t j = 0; j < width; ++j) {
    if (dead[j]) candidates.push_back(j);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    std::partial_sort(
        candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k_aux), candidates.end(),
        [&](std::size_t a, std::size_t b) { return pre(r, a) > pre(r, b) || (pre(r, a) == pre(r, b) && a < b); });
    for (std::size_t i = 0; i < k_aux; ++i) dropped(r, candidates[i]) = false;
  }
  const Tensor residual = (p.rows - p.recons).detach();
  const Tensor predicted = matmul(masked_fill(p.pre, dropped, 0.f), sae.W_dec());
  const Tensor err = predicted - residual;
  return mean(sum(err * err, {1})) * scale;
}

// While it lives, the SAE trains; on every way out (the last step, a step refused, an exception)
// it goes back to its mode and, with the normalization factor folded into its weights
// (SAELens's fold_activation_norm_scaling_factor), reads the raw activations.
class Training {
 public:
  Training(SparseAutoencoder& sae, double factor) : sae_(sae), factor_(factor), was_training_(sae.is_training()) {
    sae_.train();
  }
  ~Training() {
    sae_.train(was_training_);
    if (factor_ == 1.) return;
    const float f = static_cast<float>(factor_);
    sae_.W_enc().mutable_value() *= f;
    sae_.W_dec().mutable_value() /= f;
    sae_.b_dec().mutable_value() /= f;
  }
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

 private:
  SparseAutoencoder& sae_;
  double factor_;
  bool was_training_;
};

// Before the optimizer step: a loss or a gradient that is not finite stops training with the
// weights as the last step left them.
void check_finite_step(const SparseAutoencoder& sae, double mse, double sparsity, std::size_t step) {
  if (!std::isfinite(mse) || !std::isfinite(sparsity)) {
    fail("train_sae: the loss is not finite at step ", step, " (mse ", mse, ", sparsity ", sparsity,
         "): lower lr; the SAE keeps its weights from before that step");
  }
  for (const auto& [name, p] : sae.named_parameters()) {
    if (!p.has_grad()) continue;
    const Array& g = p.grad();
    if (const std::size_t i = first_non_finite(g); i < g.size()) {
      fail("train_sae: the gradient of ", name, " holds ", g.data()[i], " at flat position ", i, " at step ", step,
           ": lower lr; the SAE keeps its weights from before that step");
    }
  }
}

}  // namespace

ActivationSource activations_at(nn::LanguageModel& model, const std::string& point,
                                std::function<IndexArray()> next_ids) {
  const std::string name = resolve_point(model, point, "activations_at");
  if (!next_ids) fail("activations_at: no batches (next_ids is empty)");
  return [&model, name, next_ids = std::move(next_ids)]() {
    const nn::EvalGuard eval(model);
    const NoGradGuard no_grad;
    const IndexArray ids = next_ids();
    const ActivationCache cache = cache_activations(
        model, [&] { model.forward(ids); }, points_named({name}), true);
    return cache.at(name);
  };
}

SaeTrainingReport train_sae(SparseAutoencoder& sae, const ActivationSource& source, const SaeTrainOptions& o) {
  check_options(o);
  if (!source) fail("train_sae: no source");
  const auto start = std::chrono::steady_clock::now();
  const SaeConfig& c = sae.config();
  // The factor folded in at the end would change what a normalizing SAE computes.
  if (c.normalization != SaeNormalization::none) {
    fail("train_sae: the SAE normalizes its input at run time (",
         c.normalization == SaeNormalization::layer_norm ? "layer_norm" : "constant_norm_rescale",
         "); train_sae trains SAEs without run-time normalization only");
  }
  const bool topk = c.architecture == SaeArchitecture::topk;
  check_available_memory(4. * static_cast<double>(o.buffer_rows()) * static_cast<double>(c.d_in), "train_sae",
                         "a buffer of " + std::to_string(o.buffer_rows()) + " rows");
  RowBuffer buffer(source, c.d_in, o.buffer_rows(), o.seed());
  buffer.refill();

  // SAELens's estimate_norm_scaling_factor and b_dec's start, on the first buffer.
  const std::vector<float>& first = buffer.data();
  const std::size_t n0 = buffer.rows();
  double norms = 0;
  std::vector<double> mean_row(c.d_in, 0.);
  for (std::size_t r = 0; r < n0; ++r) {
    double sq = 0;
    for (std::size_t j = 0; j < c.d_in; ++j) {
      const double v = first[r * c.d_in + j];
      sq += v * v;
      mean_row[j] += v;
    }
    norms += std::sqrt(sq);
  }
  const double factor = o.normalize_activations() && norms > 0 ? std::sqrt(double(c.d_in)) * double(n0) / norms : 1.;
  optim::Adam opt(sae.named_parameters(), optim::AdamOptions(o.lr()));
  SaeTrainingReport report;
  std::vector<std::size_t> silent(c.d_sae, 0);  // steps since each feature last fired
  std::vector<bool> dead(c.d_sae, false);
  const Training training(sae, factor);
  if (o.init_b_dec_to_mean()) {
    Array& b = sae.b_dec().mutable_value();
    for (std::size_t j = 0; j < c.d_in; ++j) b(j) = static_cast<float>(mean_row[j] / double(n0) * factor);
  }
  for (std::size_t step = 0; step < o.steps(); ++step) {
    float lr = o.lr() * ramp(step, o.lr_warm_up_steps());
    if (o.lr_decay_steps() > 0 && step + o.lr_decay_steps() >= o.steps()) {
      lr *= static_cast<float>(o.steps() - step) / static_cast<float>(o.lr_decay_steps());
    }
    opt.set_lr(lr);

    Array rows = buffer.next(o.batch_rows());
    if (factor != 1.) rows *= static_cast<float>(factor);
    const SparseAutoencoder::Parts p = sae.parts(Tensor(std::move(rows)));
    const Tensor err = p.recons - p.rows;
    const Tensor mse = mean(sum(err * err, {1}));
    Tensor sparsity;
    std::size_t num_dead = 0;
    for (bool d : dead) num_dead += d;
    if (!topk) {
      const Tensor decoder_norms = sqrt(sum(sae.W_dec() * sae.W_dec(), {1}));
      sparsity = mean(sum(p.features * decoder_norms, {1})) * (o.l1_coefficient() * ramp(step, o.l1_warm_up_steps()));
    } else if (num_dead > 0 && o.aux_k_coefficient() > 0) {
      sparsity = aux_k_loss(sae, p, dead, num_dead) * o.aux_k_coefficient();
    } else {
      sparsity = Tensor::scalar(0.f);
    }
    const double mse_value = mse.item(), sparsity_value = sparsity.item();
    opt.zero_grad();
    if (std::isfinite(mse_value) && std::isfinite(sparsity_value)) (mse + sparsity).backward();
    check_finite_step(sae, mse_value, sparsity_value, step);
    opt.step();
    if (topk) unit_rows(sae.W_dec().mutable_value());

    // Features active per row, and which fired at all (one pass over (rows, d_sae), no branches).
    const float* f = p.features.value().data();
    std::size_t active = 0;
    std::vector<std::uint32_t> fired(c.d_sae, 0);
    for (std::size_t r = 0; r < o.batch_rows(); ++r, f += c.d_sae) {
      for (std::size_t j = 0; j < c.d_sae; ++j) {
        const std::uint32_t on = f[j] > 0;
        fired[j] += on;
        active += on;
      }
    }
    for (std::size_t j = 0; j < c.d_sae; ++j) {
      silent[j] = fired[j] > 0 ? 0 : silent[j] + 1;
      dead[j] = silent[j] >= o.dead_feature_window();
    }
    report.mse.push_back(mse_value);
    report.sparsity.push_back(sparsity_value);
    report.l0.push_back(double(active) / double(o.batch_rows()));
  }
  for (bool d : dead) report.dead_features += d;
  report.normalization_factor = factor;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

SaeEvaluation evaluate_sae(nn::LanguageModel& model, const SparseAutoencoder& sae,
                           const std::vector<std::pair<IndexArray, IndexArray>>& batches, const std::string& point) {
  const char* who = "evaluate_sae";
  if (batches.empty()) fail(who, ": no batches");
  const std::string& asked = point.empty() ? sae.config().hook_name : point;
  if (asked.empty()) fail(who, ": no point given, and the SAE's config names none");
  const std::string name = resolve_point(model, asked, who);
  const nn::EvalGuard eval(model);
  const NoGradGuard no_grad;
  const std::size_t d_in = sae.config().d_in, d_sae = sae.config().d_sae;

  SaeEvaluation e;
  double sq_err = 0, sum_sq = 0, loss = 0;
  std::vector<double> sum(d_in, 0.);
  std::vector<bool> fired(d_sae, false);
  std::size_t rows = 0, active = 0;
  for (const auto& [ids, targets] : batches) {
    const ActivationCache cache = cache_activations(
        model, [&] { loss += model.loss(ids, targets).item(); }, points_named({name}));
    const Array& x = cache.at(name);
    if (x.dimension() == 0 || x.shape().back() != d_in) {
      fail(who, ": point '", name, "' holds ", shape_str(x.shape()), ", but the SAE reads d_in = ", d_in);
    }
    const SparseAutoencoder::Parts p = sae.parts(Tensor(x));
    const Array& r = p.rows.value();
    const Array& y = p.recons.value();
    const Array& f = p.features.value();
    for (std::size_t i = 0; i < r.shape()[0]; ++i, ++rows) {
      for (std::size_t j = 0; j < d_in; ++j) {
        const double v = r(i, j), d = y(i, j) - v;
        sq_err += d * d;
        sum_sq += v * v;
        sum[j] += v;
      }
      for (std::size_t j = 0; j < d_sae; ++j) {
        if (f(i, j) > 0) {
          fired[j] = true;
          ++active;
        }
      }
    }
  }
  double centred = sum_sq;  // sum |x - mean|^2 = sum |x|^2 - N |mean|^2
  Array mean_value = Array::from_shape({d_in});
  for (std::size_t j = 0; j < d_in; ++j) {
    centred -= sum[j] * sum[j] / double(rows);
    mean_value(j) = static_cast<float>(sum[j] / double(rows));
  }
  e.mse = sq_err / double(rows * d_in);
  e.explained_variance = 1 - sq_err / centred;
  e.mean_l0 = double(active) / double(rows);
  for (bool f : fired) e.dead_features += !f;
  e.loss = loss / double(batches.size());

  const auto loss_with = [&](const std::function<Tensor(const Tensor&)>& replace) {
    const nn::HookHandle h = model.add_forward_hook(name, replace);
    double total = 0;
    for (const auto& [ids, targets] : batches) total += model.loss(ids, targets).item();
    return total / double(batches.size());
  };
  e.loss_spliced = loss_with([&](const Tensor& v) { return sae.forward(v); });
  e.loss_zero_ablated = loss_with([](const Tensor& v) { return Tensor::zeros(v.shape()); });
  e.loss_mean_ablated = loss_with([&](const Tensor& v) { return Tensor(Array(xt::broadcast(mean_value, v.shape()))); });
  return e;
}

}  // namespace xgrad::inspect
