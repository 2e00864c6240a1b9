// Batched matrix multiply and linear through blas::gemm and blas::linear (core/kernels/blas.hpp) at
// the precision of the open AutocastGuard (precision.hpp). Transposed operands are passed to BLAS as
// flags, never copied; backward accumulates straight into the gradient buffers (beta = 1), which
// also sums over broadcast batch axes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/detail/bf16_cache.hpp"
#include "xgrad/core/autograd/detail/bias_gradient.hpp"
#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/autograd/detail/strided_offsets.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/bf16_vector.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

// Dimensions of C = op(A) op(B) for stored A (..., ra, ca) and B (..., rb, cb).
struct Plan {
  bool ta = false, tb = false;
  std::size_t m = 0, n = 0, k = 0;
  std::size_t lda = 0, ldb = 0;           // stored row lengths
  Shape batch;                            // broadcast batch shape of the output
  std::vector<std::size_t> a_off, b_off;  // element offset of each batch's matrix
  bool folded = false;                    // B is 2-D and A untransposed: the batch folds into M
  bool a_whole = false, b_whole = false;  // the operand has its own matrix for every batch entry
};

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

// Offsets of each output batch's matrix inside an operand whose batch shape broadcasts to `batch`.
std::vector<std::size_t> batch_offsets(const Shape& own, const Shape& batch, std::size_t matrix) {
  const std::size_t n = batch.size();
  std::vector<std::size_t> stride(n, 0);
  std::size_t s = matrix;
  for (std::size_t k = n; k-- > 0;) {
    const std::size_t pos = k + own.size();
    const std::size_t d = pos >= n ? own[pos - n] : 1;
    stride[k] = d == 1 ? 0 : s;
    s *= d;
  }
  std::size_t count = 1;
  for (std::size_t d : batch) count *= d;
  std::vector<std::size_t> offs(count);
  StridedOffsets at(batch.data(), stride.data(), n);
  for (std::size_t q = 0; q < count; ++q, at.next()) offs[q] = at.offset();
  return offs;
}

Plan make_plan(const Shape& sa, const Shape& sb, bool ta, bool tb) {
  if (sa.size() < 2 || sb.size() < 2) {
    fail("matmul: operands need at least 2 axes, got ", shape_str(sa), " @ ", shape_str(sb));
  }
  Plan p;
  p.ta = ta;
  p.tb = tb;
  const std::size_t ra = sa[sa.size() - 2], ca = sa.back(), rb = sb[sb.size() - 2], cb = sb.back();
  p.m = ta ? ca : ra;
  p.k = ta ? ra : ca;
  const std::size_t kb = tb ? cb : rb;
  p.n = tb ? rb : cb;
  if (p.k != kb) {
    fail("matmul: inner dimensions differ: ", shape_str(sa), ta ? "^T" : "", " @ ", shape_str(sb), tb ? "^T" : "", " (",
         p.k, " vs ", kb, ")");
  }
  p.lda = ca;
  p.ldb = cb;
  try {
    p.batch = broadcast_shapes(batch_of(sa), batch_of(sb), "matmul");
  } catch (const Error&) {
    fail("matmul: batch shapes ", shape_str(batch_of(sa)), " and ", shape_str(batch_of(sb)), " of ", shape_str(sa),
         " @ ", shape_str(sb), " cannot be broadcast together");
  }
  p.folded = sb.size() == 2 && !ta;
  const auto count = [](const Shape& s) {
    std::size_t c = 1;
    for (std::size_t d : s) c *= d;
    return c;
  };
  const std::size_t nb = count(p.batch);
  p.a_whole = count(batch_of(sa)) == nb;
  p.b_whole = count(batch_of(sb)) == nb;
  if (!p.folded) {
    p.a_off = batch_offsets(batch_of(sa), p.batch, ra * ca);
    p.b_off = batch_offsets(batch_of(sb), p.batch, rb * cb);
  }
  return p;
}

std::size_t batch_count(const Plan& p) {
  std::size_t c = 1;
  for (std::size_t d : p.batch) c *= d;
  return c;
}

// Runs gemm(q) for every batch entry q, split across the kernel threads when the entries write
// disjoint outputs (`disjoint`); a broadcast operand's gradient gathers from several entries, so
// those run in order on one thread.
template <class F>
void for_each_batch(const Plan& p, std::size_t nb, bool disjoint, F gemm) {
  if (!disjoint) {
    for (std::size_t q = 0; q < nb; ++q) gemm(q);
    return;
  }
  parallel_for(nb, grain_for(kGrainGemm, p.m * p.n * std::max<std::size_t>(p.k, 1)),
               [&](std::size_t lo, std::size_t hi) {
    for (std::size_t q = lo; q < hi; ++q) gemm(q);
  });
}

// The products of matmul's forward and backward at the forward's precision: each operand in the
// forms its caller holds (blas::Operand: float32 values, a parameter's bf16 copy, or both), alpha 1.
struct Products {
  Precision precision;
  void operator()(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, blas::Operand a, std::size_t lda,
                  blas::Operand b, std::size_t ldb, float beta, float* c, std::size_t ldc) const {
    blas::gemm(precision, ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
  }
};

void matmul_forward(const Plan& p, std::size_t nb, blas::Operand A, blas::Operand B, float* C, Products gemm) {
  if (p.folded) {
    // (batch*M, K) @ op(B) in one call
    gemm(false, p.tb, nb * p.m, p.n, p.k, A, p.lda, B, p.ldb, 0.f, C, p.n);
  } else {
    for_each_batch(p, nb, true, [&](std::size_t q) {
      gemm(p.ta, p.tb, p.m, p.n, p.k, A.at(p.a_off[q]), p.lda, B.at(p.b_off[q]), p.ldb, 0.f, C + q * p.m * p.n, p.n);
    });
  }
}

// d op(A) = dC op(B)^T, added to dA
void matmul_grad_a(const Plan& p, std::size_t nb, const float* G, blas::Operand B, float* dA, Products gemm) {
  const std::size_t mn = p.m * p.n;
  if (p.folded) {
    gemm(false, !p.tb, nb * p.m, p.k, p.n, G, p.n, B, p.ldb, 1.f, dA, p.lda);
  } else {
    for_each_batch(p, nb, p.a_whole, [&](std::size_t q) {
      if (!p.ta) {  // dA (M x K) = dC op(B)^T
        gemm(false, !p.tb, p.m, p.k, p.n, G + q * mn, p.n, B.at(p.b_off[q]), p.ldb, 1.f, dA + p.a_off[q], p.lda);
      } else {  // dA (K x M) = op(B) dC^T
        gemm(p.tb, true, p.k, p.m, p.n, B.at(p.b_off[q]), p.ldb, G + q * mn, p.n, 1.f, dA + p.a_off[q], p.lda);
      }
    });
  }
}

// d op(B) = op(A)^T dC, added to dB
void matmul_grad_b(const Plan& p, std::size_t nb, const float* G, blas::Operand A, float* dB, Products gemm) {
  const std::size_t mn = p.m * p.n;
  if (p.folded) {
    if (!p.tb) {  // dB (K x N) = A^T dC over all batch rows
      gemm(true, false, p.k, p.n, nb * p.m, A, p.lda, G, p.n, 1.f, dB, p.ldb);
    } else {  // dB (N x K) = dC^T A
      gemm(true, false, p.n, p.k, nb * p.m, G, p.n, A, p.lda, 1.f, dB, p.ldb);
    }
  } else {
    for_each_batch(p, nb, p.b_whole, [&](std::size_t q) {
      if (!p.tb) {  // dB (K x N) = op(A)^T dC
        gemm(!p.ta, false, p.k, p.n, p.m, A.at(p.a_off[q]), p.lda, G + q * mn, p.n, 1.f, dB + p.b_off[q], p.ldb);
      } else {  // dB (N x K) = dC^T op(A)
        gemm(true, p.ta, p.n, p.k, p.m, G + q * mn, p.n, A.at(p.a_off[q]), p.lda, 1.f, dB + p.b_off[q], p.ldb);
      }
    });
  }
}

using Bf16Copy = std::shared_ptr<const blas::Bf16Vector>;

using detail::with_copy;

// Parameters (leaves that require grad) are converted once per update, through the cache;
// anything else is converted for each product.
bool cached_operand(const Tensor& t) { return !t.node()->has_creator && t.requires_grad(); }

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  if (!a.defined() || !b.defined()) fail("matmul: input is an undefined tensor");
  const Plan p = make_plan(a.shape(), b.shape(), transpose_a, transpose_b);
  Shape os = p.batch;
  os.push_back(p.m);
  os.push_back(p.n);
  // beta = 0 overwrites C, so it needs no zero-fill (unless K = 0, when BLAS may leave C as is).
  Array c = p.k == 0 ? Array(xt::zeros<float>(os)) : Array::from_shape(os);
  const std::size_t nb = batch_count(p);
  // The precision is the forward's, recorded with the op: backward uses it even after the guard closed.
  const Precision precision = autocast_precision();
  Bf16Copy a_kept, b_kept;  // bf16: parameters' copies (from the cache), kept for backward
  if (precision == Precision::bf16) {
    if (cached_operand(a)) a_kept = detail::bf16_copy(*a.node());
    if (cached_operand(b)) b_kept = detail::bf16_copy(*b.node());
  }
  // in bf16, operands rounded (parameters' copies reused) and products accumulated in fp32
  matmul_forward(p, nb, with_copy(a.value().data(), a_kept), with_copy(b.value().data(), b_kept), c.data(),
                 Products{precision});
  return record("matmul", std::move(c), {a, b}, [p, nb, precision, a_kept, b_kept](GradContext& ctx) {
    // C = op(A) op(B):  d op(A) = dC op(B)^T,  d op(B) = op(A)^T dC, at the forward's precision (in
    // bf16, G and activations rounded on the fly, parameters' copies reused from forward)
    // dA reads only B and dB only A: a value is read (and checked) only where it is used
    const float* G = ctx.grad_out().data();
    if (ctx.needs(0)) {
      matmul_grad_a(p, nb, G, with_copy(ctx.input(1).data(), b_kept), ctx.grad_buffer(0).data(), Products{precision});
    }
    if (ctx.needs(1)) {
      matmul_grad_b(p, nb, G, with_copy(ctx.input(0).data(), a_kept), ctx.grad_buffer(1).data(), Products{precision});
    }
  });
}

namespace detail {

void bias_gradient(const float* G, std::size_t rows, std::size_t out, std::uint16_t* g16, float* db) {
  constexpr std::size_t kChunkRows = 64;
  const std::size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  std::vector<float> partial(chunks * out, 0.f);
  float* part = partial.data();
  parallel_for(chunks, grain_for(kGrainCheap, kChunkRows * out), [=](std::size_t lo, std::size_t hi) {
    for (std::size_t c = lo; c < hi; ++c) {
      const std::size_t r0 = c * kChunkRows, n = std::min(rows, r0 + kChunkRows) - r0;
      if (g16) blas::to_bf16(G + r0 * out, n * out, g16 + r0 * out);  // serial inside a parallel_for body
      kernels::add_column_sums(G + r0 * out, n, out, part + c * out);
    }
  });
  kernels::add_column_sums(part, chunks, out, db);
}

}  // namespace detail

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!x.defined() || !weight.defined()) fail("linear: input is an undefined tensor");
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  if (ws.size() != 2) fail("linear: weight must be (out, in), got ", shape_str(ws));
  const std::size_t out = ws[0], in = ws[1];
  if (xs.empty() || xs.back() != in) {
    fail("linear: input of shape ", shape_str(xs), " does not end in the weight's in_features ", in, " (weight ",
         shape_str(ws), ")");
  }
  if (bias.defined() && bias.shape() != Shape{out}) {
    fail("linear: bias of shape ", shape_str(bias.shape()), " is not (out,) = (", out, ",)");
  }
  std::size_t rows = 1;
  for (std::size_t k = 0; k + 1 < xs.size(); ++k) rows *= xs[k];
  Shape ys = xs;
  ys.back() = out;
  Array y = Array::from_shape(ys);
  const float* b_data = bias.defined() ? bias.value().data() : nullptr;
  // The precision is the forward's, recorded with the op: backward uses it even after the guard closed.
  const Precision precision = autocast_precision();
  Bf16Copy w16, x16;  // bf16: a leaf weight's copy from the cache, and X's from its storage
  if (precision == Precision::bf16) {
    if (!weight.node()->has_creator) w16 = detail::bf16_copy(*weight.node());
    x16 = detail::activation_bf16(*x.node());
  }
  // Y (rows x out) = X (rows x in) W^T + b; in bf16 from rounded X and W, accumulated in fp32, the
  // bias added in fp32
  blas::linear(precision, rows, out, in, with_copy(x.value().data(), x16), with_copy(weight.value().data(), w16),
               b_data, y.data());
  if (!weight.requires_grad()) x16.reset();  // backward's dW reads it, and nothing else does
  // Backward reads X's bf16 copy when it has one, never X's values then, and never Y.
  const BackwardReads reads{false, x16 ? 1u : 0u};
  return record("linear", std::move(y), {x, weight, bias}, reads,
                [rows, in, out, precision, w16, x16](GradContext& ctx) {
    // dX = G W,  dW = G^T X,  db = sum over rows of G  (the products at the forward's precision;
    // in bf16, G, W and X rounded to bf16 and the products accumulated in fp32)
    const float* G = ctx.grad_out().data();
    const bool products = ctx.needs(0) || ctx.needs(1);
    // in bf16, G feeds both products: rounded to bf16 once (the same bits each product would round
    // to), in the same pass over G as the bias's column sums when the bias needs them
    blas::Bf16Vector g16(precision == Precision::bf16 && products ? rows * out : 0);
    bool bias_summed = false;
    if (!g16.empty() && ctx.needs(2)) {
      detail::bias_gradient(G, rows, out, g16.data(), ctx.grad_buffer(2).data());
      bias_summed = true;
    } else if (!g16.empty()) {
      blas::to_bf16(G, g16.size(), g16.data());
    }
    const blas::Operand dY = g16.empty() ? blas::Operand(G) : blas::Operand(g16.data());
    if (ctx.needs(0)) {
      const Array& W = ctx.input(1);  // checks that W was not written since forward
      const auto dx = ctx.grad_target(0);
      blas::gemm(precision, false, false, rows, in, out, 1.f, dY, out, with_copy(W.data(), w16), in, dx.beta, dx.data,
                 in);
    }
    if (ctx.needs(1)) {
      // X's bf16 copy alone when it has one (its values may have been freed), else its values
      blas::Operand X(x16 ? nullptr : ctx.input(0).data(), x16 ? x16->data() : nullptr);
      if (x16) ctx.check_unchanged(0);  // x16 is a copy of X as forward saw it
      const auto dw = ctx.grad_target(1);
      blas::gemm(precision, true, false, out, in, rows, 1.f, dY, out, X, in, dw.beta, dw.data, in);
    }
    if (ctx.needs(2) && !bias_summed) detail::bias_gradient(G, rows, out, nullptr, ctx.grad_buffer(2).data());
  });
}

}  // namespace xgrad
