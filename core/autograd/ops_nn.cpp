// Neural-network functions as fused kernels (plain loops over contiguous buffers): softmax,
// masked_softmax, log_softmax, masked_fill, cross_entropy, embedding, dropout, layer_norm,
// rms_norm.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>

#include <xtensor/xbroadcast.hpp>

#include "xgrad/core/autograd/detail/axis_view.hpp"
#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/autograd/detail/cross_entropy_rows.hpp"
#include "xgrad/core/autograd/detail/dropout_key.hpp"
#include "xgrad/core/autograd/detail/keep_flags.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

// Calls f(base, stride) for every 1-D slice along the viewed axis, the slices split across the
// kernel threads (each slice is computed whole by one thread, so the split changes no value).
template <class F>
void for_each_slice(const AxisView& v, F f) {
  const std::size_t grain = grain_for(kGrainCostly, v.n);
  parallel_for(v.outer * v.inner, grain, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t q = lo; q < hi; ++q) {
      const std::size_t o = q / v.inner, j = q % v.inner;
      f(o * v.n * v.inner + j, v.inner);
    }
  });
}

// Softmax of every slice, skipping elements whose keep flag is 0 (keep == nullptr keeps all),
// by the kernels attention uses (kernels::masked_softmax_row and softmax_row_backward), so both
// give the same bits. A slice along an inner axis is gathered into a row and scattered back.
Tensor softmax_impl(const char* op, const Tensor& a, int axis, std::shared_ptr<std::vector<std::uint8_t>> keep) {
  check_defined(a, op);
  const AxisView v = view_around(a.shape(), normalize_axis(axis, a.ndim(), op));
  Array y = Array::from_shape(a.shape());
  const float* x = a.value().data();
  const std::uint8_t* k = keep ? keep->data() : nullptr;
  float* out = y.data();
  for_each_slice(v, [&](std::size_t b, std::size_t st) {
    // y_i = exp(x_i - max) / sum_j exp(x_j - max), over kept elements only
    if (st == 1) {
      std::copy(x + b, x + b + v.n, out + b);
      return kernels::masked_softmax_row(out + b, v.n, v.n, k ? k + b : nullptr);
    }
    thread_local std::vector<float> row;
    thread_local std::vector<std::uint8_t> kept;
    row.resize(v.n);
    kept.resize(k ? v.n : 0);
    for (std::size_t i = 0; i < v.n; ++i) row[i] = x[b + i * st];
    for (std::size_t i = 0; k && i < v.n; ++i) kept[i] = k[b + i * st];
    kernels::masked_softmax_row(row.data(), v.n, v.n, k ? kept.data() : nullptr);
    for (std::size_t i = 0; i < v.n; ++i) out[b + i * st] = row[i];
  });
  return record(op, std::move(y), {a}, [v](GradContext& ctx) {
    // dx_i = y_i (g_i - sum_j g_j y_j); zero wherever y is (masked elements)
    const float* y = ctx.output().data();
    const float* g = ctx.grad_out().data();
    Array dx = Array::from_shape(ctx.output().shape());
    float* d = dx.data();
    for_each_slice(v, [&](std::size_t b, std::size_t st) {
      if (st == 1) return kernels::softmax_row_backward(y + b, g + b, d + b, v.n);
      thread_local std::vector<float> rows;
      rows.resize(3 * v.n);
      float *yr = rows.data(), *gr = yr + v.n, *dr = gr + v.n;
      for (std::size_t i = 0; i < v.n; ++i) {
        yr[i] = y[b + i * st];
        gr[i] = g[b + i * st];
      }
      kernels::softmax_row_backward(yr, gr, dr, v.n);
      for (std::size_t i = 0; i < v.n; ++i) d[b + i * st] = dr[i];
    });
    ctx.accumulate(0, std::move(dx));
  });
}

}  // namespace

std::shared_ptr<std::vector<std::uint8_t>> keep_flags(const Mask& mask, const Shape& shape, const char* op) {
  const Shape& ms = mask.shape();
  bool fits = ms.size() <= shape.size();
  for (std::size_t k = 0; fits && k < ms.size(); ++k) {
    const std::size_t want = shape[shape.size() - ms.size() + k];
    fits = ms[k] == want || ms[k] == 1;
  }
  if (!fits) fail(op, ": mask of shape ", shape_str(ms), " does not broadcast to the input's shape ", shape_str(shape));
  const Mask full = xt::broadcast(mask, shape);
  auto keep = std::make_shared<std::vector<std::uint8_t>>(full.size());
  for (std::size_t i = 0; i < full.size(); ++i) (*keep)[i] = full.data()[i] ? 0 : 1;
  return keep;
}

Tensor softmax(const Tensor& a, int axis) { return softmax_impl("softmax", a, axis, nullptr); }

Tensor masked_softmax(const Tensor& a, const Mask& mask, int axis) {
  if (!a.defined()) fail("masked_softmax: input is an undefined tensor");
  return softmax_impl("masked_softmax", a, axis, keep_flags(mask, a.shape(), "masked_softmax"));
}

Tensor log_softmax(const Tensor& a, int axis) {
  check_defined(a, "log_softmax");
  const AxisView v = view_around(a.shape(), normalize_axis(axis, a.ndim(), "log_softmax"));
  Array y = Array::from_shape(a.shape());
  const float* x = a.value().data();
  float* out = y.data();
  for_each_slice(v, [&](std::size_t b, std::size_t st) {
    // y_i = x_i - max - log sum_j exp(x_j - max)
    const auto [m, lse] = detail::max_and_log_sum(x + b, v.n, st);
    for (std::size_t i = 0; i < v.n; ++i) out[b + i * st] = x[b + i * st] - m - lse;
  });
  return record("log_softmax", std::move(y), {a}, [v](GradContext& ctx) {
    // dx_i = g_i - exp(y_i) sum_j g_j
    const float* y = ctx.output().data();
    const float* g = ctx.grad_out().data();
    Array dx = Array::from_shape(ctx.output().shape());
    float* d = dx.data();
    for_each_slice(v, [&](std::size_t b, std::size_t st) {
      float gs = 0.f;
      for (std::size_t i = 0; i < v.n; ++i) gs += g[b + i * st];
      for (std::size_t i = 0; i < v.n; ++i) d[b + i * st] = g[b + i * st] - std::exp(y[b + i * st]) * gs;
    });
    ctx.accumulate(0, std::move(dx));
  });
}

namespace {

// a where keep, else fill(i).
template <class Fill>
Tensor masked_fill_with(const Tensor& a, const Mask& mask, Fill fill) {
  auto keep = keep_flags(mask, a.shape(), "masked_fill");  // backward reuses it
  Array y = a.value();
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!(*keep)[i]) y.data()[i] = fill(i);
  }
  return record("masked_fill", std::move(y), {a}, [keep](GradContext& ctx) {
    // dx = g where the mask is false, 0 where it is true
    Array dx = ctx.take_grad_out();
    for (std::size_t i = 0; i < dx.size(); ++i) {
      if (!(*keep)[i]) dx.data()[i] = 0.f;
    }
    ctx.accumulate(0, std::move(dx));
  });
}

}  // namespace

Tensor masked_fill(const Tensor& a, const Mask& mask, float value) {
  check_defined(a, "masked_fill");
  return masked_fill_with(a, mask, [value](std::size_t) { return value; });
}

Tensor masked_fill(const Tensor& a, const Mask& mask, const Array& values) {
  check_defined(a, "masked_fill");
  if (values.shape() != a.shape()) {
    fail("masked_fill: values of shape ", shape_str(values.shape()), " do not match the input's shape ",
         shape_str(a.shape()));
  }
  const float* v = values.data();
  return masked_fill_with(a, mask, [v](std::size_t i) { return v[i]; });
}

Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, std::int64_t ignore_index) {
  check_defined(logits, "cross_entropy");
  const Shape& s = logits.shape();
  if (s.empty()) fail("cross_entropy: logits must have a class axis, got a scalar");
  const Shape expect(s.begin(), s.end() - 1);
  if (targets.shape() != expect) {
    fail("cross_entropy: targets of shape ", shape_str(targets.shape()), " do not match logits ", shape_str(s),
         " (expected ", shape_str(expect), ")");
  }
  const std::size_t C = s.back(), rows = targets.size();
  std::size_t count = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int64_t t = targets.data()[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= static_cast<std::int64_t>(C)) {
      fail("cross_entropy: target ", t, " at flat position ", r, " is outside [0, ", C, ") (ignore_index ",
           ignore_index, ")");
    }
    ++count;
  }
  // loss = mean over kept rows of (log sum_j exp x_j) - x_target
  // (per-row terms across the kernel threads, then summed in row order). Rows of finite logits
  // take the vector kernel, the others (NaN or infinite logits) exact arithmetic (cross_entropy_rows.hpp);
  // backward reuses each row's log-sum-exp and path.
  const float* x = logits.value().data();
  const std::int64_t* tg = targets.data();
  std::vector<float> row_loss(rows, 0.f);
  auto lse = std::make_shared<std::vector<detail::RowLogSumExp>>(rows);
  float* rl = row_loss.data();
  detail::RowLogSumExp* ls = lse->data();
  parallel_for(rows, grain_for(kGrainCostly, C), [=](std::size_t lo, std::size_t hi) {
    for (std::size_t r = lo; r < hi; ++r) {
      if (tg[r] != ignore_index) rl[r] = detail::row_loss(x + r * C, C, tg[r], ls[r]);
    }
  });
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    if (tg[r] != ignore_index) total += static_cast<double>(rl[r]);
  }
  const float loss = count ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
  return record("cross_entropy", Array(loss), {logits}, [targets, ignore_index, count, C, lse](GradContext& ctx) {
    // dx_rj = g / count * (softmax(x_r)_j - [j == target_r]); ignored rows get 0
    if (count == 0) return;
    const float scale = ctx.grad_out().data()[0] / static_cast<float>(count);
    const float* x = ctx.input(0).data();
    float* dx = ctx.grad_buffer(0).data();
    const std::int64_t* tg = targets.data();
    const detail::RowLogSumExp* ls = lse->data();
    parallel_for(targets.size(), grain_for(kGrainCostly, C), [=](std::size_t lo, std::size_t hi) {
      for (std::size_t r = lo; r < hi; ++r) {
        if (tg[r] != ignore_index) detail::row_gradient(x + r * C, C, tg[r], ls[r], scale, dx + r * C, false);
      }
    });
  });
}

Tensor embedding(const Tensor& weight, const IndexArray& ids) {
  check_defined(weight, "embedding");
  if (weight.ndim() != 2) fail("embedding: weight must be (V, C), got ", shape_str(weight.shape()));
  const std::size_t V = weight.shape()[0], C = weight.shape()[1];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t t = ids.data()[i];
    if (t < 0 || t >= static_cast<std::int64_t>(V)) {
      fail("embedding: index ", t, " at flat position ", i, " is outside the table of ", V, " rows");
    }
  }
  Shape os(ids.shape().begin(), ids.shape().end());
  os.push_back(C);
  Array y = Array::from_shape(os);
  const float* w = weight.value().data();
  for (std::size_t i = 0; i < ids.size(); ++i) std::copy_n(w + ids.data()[i] * C, C, y.data() + i * C);
  return record("embedding", std::move(y), {weight}, [ids, C](GradContext& ctx) {
    // dW[id] += g[position] for every position holding id
    Array& dw = ctx.grad_buffer(0);
    const float* g = ctx.grad_out().data();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      float* d = dw.data() + ids.data()[i] * C;
      for (std::size_t j = 0; j < C; ++j) d[j] += g[i * C + j];
    }
  });
}

namespace {

// The keep flags' key and threshold for one dropout call: y = x * keep / (1 - p), keep ~
// Bernoulli(1 - p). The flags come from a counter-based hash (murmur3's 32-bit finalizer over the
// element index, keyed by one 64-bit draw from gen): the same generator state gives the same mask
// on every platform, and the loop vectorizes, where one mt19937 draw per element took a quarter
// of a small training step.
using detail::check_dropout_probability;
using detail::draw_dropout_key;
using detail::DropoutKey;

}  // namespace

namespace {

// Dropout of a (with_gelu: of gelu(a)) in training: y = f(x) * keep / (1 - p), one key drawn.
Tensor dropout_training(const char* op, const Tensor& a, float p, Generator& gen, bool with_gelu) {
  const DropoutKey key = draw_dropout_key(p, gen);
  const std::size_t n = a.size(), grain = with_gelu ? kGrainCostly : kGrainCheap;
  // every flag is written below: left uninitialized (zeroing n bytes ran serially, on one thread)
  const std::shared_ptr<std::uint8_t[]> keep(new std::uint8_t[n]);
  Array y = Array::from_shape(a.shape());
  const float* x = a.value().data();
  float* out = y.data();
  std::uint8_t* kp = keep.get();
  parallel_for(n, grain, [=](std::size_t lo, std::size_t hi) {
    const auto forward = with_gelu ? kernels::gelu_dropout_forward : kernels::dropout_forward;
    forward(x + lo, out + lo, kp + lo, lo, hi - lo, key.k0, key.k1, key.threshold, key.scale);
  });
  return record(op, std::move(y), {a}, BackwardReads{false, with_gelu ? 0u : 1u},
                [keep, n, scale = key.scale, grain, with_gelu](GradContext& ctx) {
    // dx = g * keep / (1 - p), times (Phi(x) + x phi(x)) with GELU; written over g, which this op
    // owns (a fresh buffer costs a read of each of its lines before the write: a quarter more
    // memory traffic in a pass that is bound by it)
    const float* x = with_gelu ? ctx.input(0).data() : nullptr;  // plain dropout saves no value
    Array dx = ctx.take_grad_out();
    const float* g = dx.data();
    float* d = dx.data();
    const std::uint8_t* kp = keep.get();
    parallel_for(n, grain, [=](std::size_t lo, std::size_t hi) {
      if (with_gelu) {
        kernels::gelu_dropout_backward(x + lo, g + lo, kp + lo, d + lo, hi - lo, scale);
      } else {
        kernels::dropout_backward(g + lo, kp + lo, d + lo, hi - lo, scale);
      }
    });
    ctx.accumulate(0, std::move(dx));
  });
}

}  // namespace

Tensor dropout(const Tensor& a, float p, bool training, Generator& gen) {
  check_defined(a, "dropout");
  check_dropout_probability("dropout", p);
  if (!training || p == 0.f) return a;
  return dropout_training("dropout", a, p, gen, false);
}

Tensor gelu_dropout(const Tensor& a, float p, bool training, Generator& gen) {
  check_defined(a, "gelu_dropout");
  check_dropout_probability("gelu_dropout", p);
  if (!training || p == 0.f) return gelu(a);
  // dropout(gelu(x)) in one pass, with the same draw and bits, and without keeping gelu(x) for
  // backward.
  return dropout_training("gelu_dropout", a, p, gen, true);
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  check_defined(x, "layer_norm");
  if (x.ndim() == 0) fail("layer_norm: input must have at least one axis");
  const std::size_t C = x.shape().back();
  const std::size_t rows = C ? x.size() / C : 0;
  for (const Tensor* p : {&gamma, &beta}) {
    if (p->defined() && (p->ndim() != 1 || p->shape()[0] != C)) {
      fail("layer_norm: ", p == &gamma ? "gamma" : "beta", " of shape ", shape_str(p->shape()),
           " does not match the normalized size (", C, ",) of input ", shape_str(x.shape()));
    }
  }
  if (!(eps > 0.f && std::isfinite(eps))) fail("layer_norm: eps must be finite and positive, got ", eps);
  // Per row: mean, rstd = 1 / sqrt(var + eps) (biased variance), xhat = (x - mean) rstd,
  // y = xhat * gamma + beta. mean and rstd are cached for backward.
  std::vector<float> mean(rows), rstd(rows);
  Array y = Array::from_shape(x.shape());
  const float* xs = x.value().data();
  const float* gm = gamma.defined() ? gamma.value().data() : nullptr;
  const float* bt = beta.defined() ? beta.value().data() : nullptr;
  float* ys = y.data();
  float* means = mean.data();
  float* rstds = rstd.data();
  parallel_for(rows, grain_for(kGrainCheap, C), [=](std::size_t lo, std::size_t hi) {
    kernels::layer_norm_forward(xs + lo * C, gm, bt, ys + lo * C, means + lo, rstds + lo, hi - lo, C, eps);
  });
  const bool has_gamma = gamma.defined();
  return record("layer_norm", std::move(y), {x, gamma, beta}, BackwardReads{false},
                [mean = std::move(mean), rstd = std::move(rstd), rows, C, has_gamma](GradContext& ctx) {
    // dxhat = g * gamma
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    // dgamma = sum_rows g * xhat,  dbeta = sum_rows g
    const float* xs = ctx.input(0).data();
    const float* g = ctx.grad_out().data();
    const float* gm = has_gamma ? ctx.input(1).data() : nullptr;
    float* dx = ctx.needs(0) ? ctx.grad_buffer(0).data() : nullptr;
    float* dg = ctx.needs(1) ? ctx.grad_buffer(1).data() : nullptr;
    float* db = ctx.needs(2) ? ctx.grad_buffer(2).data() : nullptr;
    const float* means = mean.data();
    const float* rstds = rstd.data();
    // Rows in fixed chunks, each with its own partial sums of dgamma and dbeta, added in chunk
    // order afterwards: one pass over x and g, and sums that do not depend on the thread count.
    constexpr std::size_t kChunkRows = 32;
    const std::size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    std::vector<float> part_g(dg ? chunks * C : 0, 0.f), part_b(db ? chunks * C : 0, 0.f);
    float* pg = part_g.data();
    float* pb = part_b.data();
    parallel_for(chunks, grain_for(kGrainCheap, kChunkRows * C), [=](std::size_t lo, std::size_t hi) {
      for (std::size_t c = lo; c < hi; ++c) {
        const std::size_t r0 = c * kChunkRows, n = std::min(rows, r0 + kChunkRows) - r0;
        kernels::layer_norm_backward(xs + r0 * C, g + r0 * C, gm, means + r0, rstds + r0, dx ? dx + r0 * C : nullptr,
                                     dg ? pg + c * C : nullptr, db ? pb + c * C : nullptr, n, C);
      }
    });
    if (dg) kernels::add_column_sums(pg, chunks, C, dg);
    if (db) kernels::add_column_sums(pb, chunks, C, db);
  });
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  check_defined(x, "rms_norm");
  if (x.ndim() == 0) fail("rms_norm: input must have at least one axis, got a scalar");
  const std::size_t C = x.shape().back();
  const std::size_t rows = C ? x.size() / C : 0;
  if (gamma.defined() && (gamma.ndim() != 1 || gamma.shape()[0] != C)) {
    fail("rms_norm: gamma of shape ", shape_str(gamma.shape()), " does not match the normalized size (", C,
         ",) of input ", shape_str(x.shape()));
  }
  if (!(eps > 0.f && std::isfinite(eps))) fail("rms_norm: eps must be finite and positive, got ", eps);
  // Per row: rstd = 1 / sqrt(mean(x^2) + eps), xhat = x rstd, y = xhat * gamma. rstd is cached
  // for backward.
  std::vector<float> rstd(rows);
  Array y = Array::from_shape(x.shape());
  const float* xs = x.value().data();
  const float* gm = gamma.defined() ? gamma.value().data() : nullptr;
  float* ys = y.data();
  float* rstds = rstd.data();
  parallel_for(rows, grain_for(kGrainCheap, C), [=](std::size_t lo, std::size_t hi) {
    kernels::rms_norm_forward(xs + lo * C, gm, ys + lo * C, rstds + lo, hi - lo, C, eps);
  });
  const bool has_gamma = gamma.defined();
  return record("rms_norm", std::move(y), {x, gamma}, BackwardReads{false},
                [rstd = std::move(rstd), rows, C, has_gamma](GradContext& ctx) {
    // dxhat = g * gamma
    // dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
    // dgamma = sum_rows g * xhat
    const float* xs = ctx.input(0).data();
    const float* g = ctx.grad_out().data();
    const float* gm = has_gamma ? ctx.input(1).data() : nullptr;
    float* dx = ctx.needs(0) ? ctx.grad_buffer(0).data() : nullptr;
    float* dg = ctx.needs(1) ? ctx.grad_buffer(1).data() : nullptr;
    const float* rstds = rstd.data();
    // Fixed chunks of rows with their own partial dgamma, added in chunk order, as in layer_norm:
    // the sums do not depend on the thread count.
    constexpr std::size_t kChunkRows = 32;
    const std::size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    std::vector<float> part_g(dg ? chunks * C : 0, 0.f);
    float* pg = part_g.data();
    parallel_for(chunks, grain_for(kGrainCheap, kChunkRows * C), [=](std::size_t lo, std::size_t hi) {
      for (std::size_t c = lo; c < hi; ++c) {
        const std::size_t r0 = c * kChunkRows, n = std::min(rows, r0 + kChunkRows) - r0;
        kernels::rms_norm_backward(xs + r0 * C, g + r0 * C, gm, rstds + r0, dx ? dx + r0 * C : nullptr,
                                   dg ? pg + c * C : nullptr, n, C);
      }
    });
    if (dg) kernels::add_column_sums(pg, chunks, C, dg);
  });
}

}  // namespace xgrad
