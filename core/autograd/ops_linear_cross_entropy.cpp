// linear_cross_entropy: a language model's head and loss over chunks of rows, so the (N, V) logits
// and their gradient are never held whole (at GPT-2's vocabulary and 1024 rows they are 206 MB each).
// Shapes: N rows, C features, V classes (the vocabulary), R rows in a chunk.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/detail/bf16_cache.hpp"
#include "xgrad/core/autograd/detail/bias_gradient.hpp"
#include "xgrad/core/autograd/detail/cross_entropy_rows.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

using Bf16Copy = std::shared_ptr<const blas::Bf16Vector>;

// R: at least 256 rows, so each chunk's products run nearly as fast as the whole batch's (the
// weight's gradient takes a rank-R update per chunk: 0.97x the unfused op at GPT-2's size), and up
// to 2^23 logits (32 MB) for small vocabularies. It depends on V only, so every thread count sums
// the same chunks.
std::size_t chunk_rows(std::size_t V) {
  return std::max<std::size_t>(256, (std::size_t{1} << 23) / std::max<std::size_t>(V, 1));
}

using detail::with_copy;

// The gradients forward computed, at a loss gradient of 1, of x, weight and bias; has[i] says
// which were asked for.
struct ForwardGrads {
  Array grad[3];
  bool has[3] = {false, false, false};
};

// d = beta d + g s over s's values (d may be s's own data).
void scaled_into(const Array& s, float g, float* d, float beta) {
  const float* src = s.data();
  parallel_for(s.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) d[i] = (beta == 0.f ? 0.f : beta * d[i]) + g * src[i];
  });
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const IndexArray& targets,
                            std::int64_t ignore_index) {
  if (!x.defined() || !weight.defined()) fail("linear_cross_entropy: input is an undefined tensor");
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  if (ws.size() != 2) fail("linear_cross_entropy: weight must be (V, C), got ", shape_str(ws));
  const std::size_t V = ws[0], C = ws[1];
  if (xs.empty() || xs.back() != C) {
    fail("linear_cross_entropy: input of shape ", shape_str(xs), " does not end in the weight's C = ", C, " (weight ",
         shape_str(ws), ")");
  }
  if (bias.defined() && bias.shape() != Shape{V}) {
    fail("linear_cross_entropy: bias of shape ", shape_str(bias.shape()), " is not (V,) = (", V, ",)");
  }
  const Shape expect(xs.begin(), xs.end() - 1);
  if (targets.shape() != expect) {
    fail("linear_cross_entropy: targets of shape ", shape_str(targets.shape()), " do not match input ", shape_str(xs),
         " (expected ", shape_str(expect), ")");
  }
  const std::size_t N = targets.size();
  const std::int64_t* tg = targets.data();
  std::size_t count = 0;
  for (std::size_t r = 0; r < N; ++r) {
    if (tg[r] == ignore_index) continue;
    if (tg[r] < 0 || tg[r] >= static_cast<std::int64_t>(V)) {
      fail("linear_cross_entropy: target ", tg[r], " at flat position ", r, " is outside [0, ", V, ") (ignore_index ",
           ignore_index, ")");
    }
    ++count;
  }
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad(),
             need_b = bias.defined() && bias.requires_grad();
  const bool grads = grad_enabled() && (need_x || need_w || need_b);
  const Precision precision = autocast_precision();
  const bool bf16 = precision == Precision::bf16;
  Bf16Copy w16, x16;  // bf16: a leaf weight's copy from the cache, and X's from its storage
  if (bf16) {
    if (!weight.node()->has_creator) w16 = detail::bf16_copy(*weight.node());
    x16 = detail::activation_bf16(*x.node());
  }
  auto saved = std::make_shared<ForwardGrads>();
  // dX and dW are written whole by the chunks' products when a row counts, and are zeros otherwise
  const bool need[3] = {need_x, need_w, need_b};
  const Shape shapes[3] = {xs, ws, Shape{V}};
  for (std::size_t i = 0; i < 3; ++i) {
    if (!grads || !need[i]) continue;
    saved->grad[i] = count && i < 2 ? Array::from_shape(shapes[i]) : Array(xt::zeros<float>(shapes[i]));
    saved->has[i] = true;
  }
  float* dX = saved->grad[0].data();
  float* dW = saved->grad[1].data();
  const float* X = x.value().data();
  const float* W = weight.value().data();
  const float* b = bias.defined() ? bias.value().data() : nullptr;
  const float scale = count ? 1.f / static_cast<float>(count) : 0.f;
  const std::size_t R = std::min(N, chunk_rows(V));
  Array logits = Array::from_shape({R, V});  // one chunk's logits, then their gradient
  std::vector<float> row_loss(N, 0.f);
  blas::Bf16Vector g16(bf16 && grads ? R * V : 0);
  for (std::size_t r0 = 0; r0 < N && count; r0 += R) {
    const std::size_t n = std::min(R, N - r0);
    float* Z = logits.data();
    // Z (n x V) = X_chunk W^T + b
    blas::linear(precision, n, V, C, with_copy(X, x16, r0 * C), with_copy(W, w16), b, Z);
    // each row's loss, and with gradients the row's dloss/dZ written over it (ignored rows: zeros)
    float* rl = row_loss.data() + r0;
    const std::int64_t* t = tg + r0;
    parallel_for(n, grain_for(kGrainCostly, V), [=](std::size_t lo, std::size_t hi) {
      for (std::size_t r = lo; r < hi; ++r) {
        float* z = Z + r * V;
        if (t[r] == ignore_index) {
          if (grads) std::fill(z, z + V, 0.f);
          continue;
        }
        detail::RowLogSumExp lse;
        rl[r] = detail::row_loss(z, V, t[r], lse);
        if (grads) detail::row_gradient(z, V, t[r], lse, scale, z, true);
      }
    });
    if (!grads) continue;
    // G = dZ:  dX_chunk = G W,  dW += G^T X_chunk,  db += the column sums of G
    const bool first = r0 == 0;
    // db's column sums as linear's backward sums them; in bf16 the same pass rounds G for both products
    if (need_b) detail::bias_gradient(Z, n, V, bf16 ? g16.data() : nullptr, saved->grad[2].data());
    if (bf16 && !need_b) blas::to_bf16(Z, n * V, g16.data());
    const blas::Operand G = bf16 ? blas::Operand(g16.data()) : blas::Operand(Z);
    if (need_x) blas::gemm(precision, false, false, n, C, V, 1.f, G, V, with_copy(W, w16), C, 0.f, dX + r0 * C, C);
    if (need_w) {
      blas::gemm(precision, true, false, V, C, n, 1.f, G, V, with_copy(X, x16, r0 * C), C, first ? 0.f : 1.f, dW, C);
    }
  }
  double total = 0;
  for (std::size_t r = 0; r < N; ++r) {
    if (tg[r] != ignore_index) total += static_cast<double>(row_loss[r]);
  }
  const float loss = count ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
  // backward hands on the gradients made above: it reads no value
  return record("linear_cross_entropy", Array(loss), {x, weight, bias}, BackwardReads{false, 7u},
                [saved](GradContext& ctx) {
    // the gradients at a loss gradient of 1, scaled by the one arriving; handed over when no later
    // pass needs them, so the weight's gradient is not held twice (154 MB each at GPT-2's size)
    const float g = ctx.grad_out().data()[0];
    for (std::size_t i = 0; i < 3; ++i) {
      if (!ctx.needs(i) || !saved->has[i]) continue;
      Array& s = saved->grad[i];
      if (ctx.retains_graph()) {
        const auto target = ctx.grad_target(i);
        scaled_into(s, g, target.data, target.beta);
      } else {
        if (g != 1.f) scaled_into(s, g, s.data(), 0.f);
        saved->has[i] = false;
        ctx.accumulate(i, std::move(s));
      }
    }
  });
}

}  // namespace xgrad
