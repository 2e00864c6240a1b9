// Multi-head attention kernels on the projections' own layout, heads side by side in the
// channels: head h of q (B, T, H*D) is the column block q[b, :, h*D:(h+1)*D], which BLAS reads
// in place with row stride H*D. No head is ever split out, permuted or copied; the products of a
// block of heads are one call (blas::sgemm_batched), blocks are tasks for the kernel threads, and
// the tasks write disjoint parts of the outputs.
//
// Under a bf16 AutocastGuard the products take bf16 operands and accumulate in fp32, as Linear's
// do: q, k, v and the weights are rounded once each (their copies kept on their storage, for
// backward too), the incoming gradient once, and the scores' gradient block by block while it is
// in cache; softmax and its backward stay fp32.
//
// Shapes: B batch, T query length, S key length, H heads, D head width, C = H*D.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "xgrad/core/autograd/detail/bf16_cache.hpp"
#include "xgrad/core/autograd/detail/keep_flags.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

struct Heads {
  std::size_t B, T, S, H, D, C;
};

// Checks q (B, T, C) and kv (B, S, C) for `heads` heads of width C / heads.
Heads check_heads(const char* op, const Tensor& q, const Tensor& kv, std::size_t heads, const char* q_name,
                  const char* kv_name) {
  if (!q.defined() || !kv.defined()) fail(op, ": input is an undefined tensor");
  const Shape& qs = q.shape();
  const Shape& ks = kv.shape();
  if (qs.size() != 3 || ks.size() != 3) {
    fail(op, ": ", q_name, " and ", kv_name, " must be (B, T, C) and (B, S, C), got ", shape_str(qs), " and ",
         shape_str(ks));
  }
  if (heads == 0 || qs[2] % heads != 0) fail(op, ": ", qs[2], " channels do not split into ", heads, " heads");
  if (ks[0] != qs[0] || ks[2] != qs[2]) {
    fail(op, ": ", kv_name, " of shape ", shape_str(ks), " does not match ", q_name, " of shape ", shape_str(qs),
         " in batch and channels");
  }
  return {qs[0], qs[1], ks[1], heads, qs[2] / heads, qs[2]};
}

// Scores of about this many bytes are computed per block, so that the elementwise pass after a
// block's products (softmax, or its backward before them) finds them still in cache.
constexpr std::size_t kBlockBytes = std::size_t{512} << 10;

// Heads h0 .. h1 - 1 of batch entries b0 .. b1 - 1.
struct HeadBlock {
  std::size_t b0, b1, h0, h1;
};

// Runs task(block) over every (entry, head), split across the kernel threads by entries (all
// heads of each) when there are at least as many entries as threads, else by heads of each entry
// (generation has one), in blocks of about kBlockBytes of scores. A block's products are one
// blas::sgemm_batched call, whose engine depends on the product's size only: no split changes a
// bit.
template <class F>
void for_each_head_block(const Heads& d, std::size_t work_per_head, F task) {
  const std::size_t head_bytes = std::max<std::size_t>(1, d.T * d.S * sizeof(float));
  if (d.B >= static_cast<std::size_t>(num_threads())) {
    const std::size_t entries = std::max<std::size_t>(1, kBlockBytes / (d.H * head_bytes));
    parallel_for(d.B, grain_for(kGrainGemm, work_per_head * d.H), [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b0 = lo; b0 < hi; b0 += entries) task(HeadBlock{b0, std::min(hi, b0 + entries), 0, d.H});
    });
    return;
  }
  const std::size_t heads = std::max<std::size_t>(1, kBlockBytes / head_bytes);
  for (std::size_t b = 0; b < d.B; ++b) {
    parallel_for(d.H, grain_for(kGrainGemm, work_per_head), [&](std::size_t lo, std::size_t hi) {
      for (std::size_t h0 = lo; h0 < hi; h0 += heads) task(HeadBlock{b, b + 1, h0, std::min(hi, h0 + heads)});
    });
  }
}

// The block's heads of a (B, L, C) tensor: head h of entry b is L x D at row stride C.
template <class T>
blas::Strided<T> heads_of(T* x, const Heads& d, std::size_t L, const HeadBlock& k) {
  return {x + k.b0 * L * d.C + k.h0 * d.D, d.C, L * d.C, d.D};
}
// The block's scores or weights in (B, H, T, S): contiguous T x S blocks.
template <class T>
blas::Strided<T> scores_of(T* w, const Heads& d, const HeadBlock& k) {
  return {w + (k.b0 * d.H + k.h0) * d.T * d.S, d.S, d.H * d.T * d.S, d.T * d.S};
}
// The block's first element in (B, H, T, S) and its count (a block is contiguous there).
std::size_t block_offset(const Heads& d, const HeadBlock& k) { return (k.b0 * d.H + k.h0) * d.T * d.S; }
std::size_t block_size(const Heads& d, const HeadBlock& k) {
  return ((k.b1 - 1) * d.H + k.h1) * d.T * d.S - block_offset(d, k);
}

// A product operand: its float32 values, and under bf16 their bf16 copy (else null).
using blas::Operand;
using Bf16Copy = std::shared_ptr<const blas::Bf16Vector>;

// An input's operand at `precision`: in bf16 with its copy, made once per value (kept on its
// storage, so backward finds it).
Operand operand_of(const Array& value, const Node& node, Precision precision, Bf16Copy& keep) {
  if (precision == Precision::bf16) keep = detail::activation_bf16(node);
  return detail::with_copy(value.data(), keep);
}
Operand operand_of(const Tensor& t, Precision precision, Bf16Copy& keep) {
  return operand_of(t.value(), *t.node(), precision, keep);
}

// One batched product of the block, in bf16 when both operands have bf16 copies (a, b: where the
// block's first matrix starts in each, with the strides `as` and `bs` of the float32 layout).
void batched(bool ta, bool tb, const HeadBlock& k, std::size_t m, std::size_t n, std::size_t depth, float alpha,
             Operand a, const blas::Strided<const float>& as, Operand b, const blas::Strided<const float>& bs,
             float beta, const blas::Strided<float>& c) {
  const std::size_t nb = k.b1 - k.b0, nh = k.h1 - k.h0;
  const Precision precision = a.h && b.h ? Precision::bf16 : Precision::fp32;  // copies exist under bf16 only
  blas::gemm_batched(precision, ta, tb, nb, nh, m, n, depth, alpha,
                     {a.at(as.data - a.f), as.ld, as.batch_stride, as.head_stride},
                     {b.at(bs.data - b.f), bs.ld, bs.batch_stride, bs.head_stride}, beta, c);
}

// Runs row(r) for every score row r (index into (B, H, T)) of the block.
template <class F>
void for_each_row(const Heads& d, const HeadBlock& k, F row) {
  for (std::size_t b = k.b0; b < k.b1; ++b) {
    for (std::size_t r = (b * d.H + k.h0) * d.T; r < (b * d.H + k.h1) * d.T; ++r) row(r);
  }
}

}  // namespace

namespace {

// The block's scores, scale q_h k_h^T (T x S) for each of its heads, into W.
void block_scores(const Heads& d, const HeadBlock& k, float scale, Operand Q, Operand K, float* W) {
  batched(false, true, k, d.T, d.S, d.D, scale, Q, heads_of(Q.f, d, d.T, k), K, heads_of(K.f, d, d.S, k), 0.f,
          scores_of(W, d, k));
}

// The scores' backward for one block, from dZ (the gradient at the scores): dq_h = scale dZ k_h,
// dk_h = scale dZ^T q_h; dQ or dK may be null.
void block_scores_backward(const Heads& d, const HeadBlock& k, float scale, Operand dZ, Operand Q, Operand K, float* dQ,
                           float dq_beta, float* dK) {
  if (dQ) {
    batched(false, false, k, d.T, d.D, d.S, scale, dZ, scores_of(dZ.f, d, k), K, heads_of(K.f, d, d.S, k), dq_beta,
            heads_of(dQ, d, d.T, k));
  }
  if (dK) {
    batched(true, false, k, d.S, d.D, d.T, scale, dZ, scores_of(dZ.f, d, k), Q, heads_of(Q.f, d, d.T, k), 1.f,
            heads_of(dK, d, d.S, k));
  }
}

// The gradient at the scores as a product operand: in bf16 (bits != null) each block is rounded
// into `bits` when its gradient is complete, while in cache.
Operand round_block(const float* dz, std::uint16_t* bits, const Heads& d, const HeadBlock& k) {
  if (!bits) return {dz, nullptr};
  const std::size_t at = block_offset(d, k);
  blas::to_bf16(dz + at, block_size(d, k), bits + at);  // serial inside a parallel_for body
  return {dz, bits};
}

// dQ's and dK's targets: dK's buffer first, so that when q and k are one tensor dQ's target is
// then that zeroed buffer.
struct ScoresGradTargets {
  float* dQ;
  float dq_beta;
  float* dK;
};
ScoresGradTargets scores_grad_targets(GradContext& ctx) {
  float* dK = ctx.needs(1) ? ctx.grad_buffer(1).data() : nullptr;
  const auto dq = ctx.needs(0) ? ctx.grad_target(0) : GradContext::GradTarget{nullptr, 0.f};
  return {dq.data, dq.beta, dK};
}

}  // namespace

Tensor attention_scores(const Tensor& q, const Tensor& k, std::size_t heads, float scale) {
  const Heads d = check_heads("attention_scores", q, k, heads, "q", "k");
  const Precision precision = autocast_precision();  // the forward's, for backward's products too
  Array w = Array::from_shape({d.B, d.H, d.T, d.S});
  Bf16Copy q16, k16;
  const Operand Q = operand_of(q, precision, q16), K = operand_of(k, precision, k16);
  float* W = w.data();
  if (d.D == 0) std::fill(W, W + w.size(), 0.f);  // K = 0: BLAS may leave the scores unwritten
  for_each_head_block(d, d.T * d.S * d.D, [&](const HeadBlock& k) { block_scores(d, k, scale, Q, K, W); });
  return record("attention_scores", std::move(w), {q, k}, [d, scale, precision](GradContext& ctx) {
    const bool bf16 = precision == Precision::bf16;
    Bf16Copy q16, k16;  // dk reads q, dq reads k
    const Operand Q = ctx.needs(1) ? operand_of(ctx.input(0), ctx.input_node(0), precision, q16) : Operand{};
    const Operand K = ctx.needs(0) ? operand_of(ctx.input(1), ctx.input_node(1), precision, k16) : Operand{};
    const Array& G = ctx.grad_out();
    blas::Bf16Vector g16(bf16 ? G.size() : 0);
    const ScoresGradTargets t = scores_grad_targets(ctx);
    for_each_head_block(d, 2 * d.T * d.S * d.D, [&](const HeadBlock& k) {
      const Operand dZ = round_block(G.data(), bf16 ? g16.data() : nullptr, d, k);
      block_scores_backward(d, k, scale, dZ, Q, K, t.dQ, t.dq_beta, t.dK);
    });
  });
}

Tensor attention_weights(const Tensor& q, const Tensor& k, std::size_t heads, float scale, bool causal,
                         const Mask* mask, std::size_t window) {
  const Heads d = check_heads("attention_weights", q, k, heads, "q", "k");
  if (window > 0 && !causal) fail("attention_weights: a window of ", window, " needs the causal mask");
  const Precision precision = autocast_precision();  // the forward's, for backward's products too
  const Shape ws = {d.B, d.H, d.T, d.S};
  std::shared_ptr<std::vector<std::uint8_t>> keep;
  if (mask) keep = keep_flags(*mask, ws, "attention_weights");
  Array w = Array::from_shape(ws);
  Bf16Copy q16, k16;
  const Operand Q = operand_of(q, precision, q16), K = operand_of(k, precision, k16);
  float* W = w.data();
  if (d.D == 0) std::fill(W, W + w.size(), 0.f);  // K = 0: BLAS may leave the scores unwritten
  const std::uint8_t* kp = keep ? keep->data() : nullptr;
  for_each_head_block(d, d.T * d.S * (d.D + 4), [&](const HeadBlock& k) {
    block_scores(d, k, scale, Q, K, W);
    // Row softmax over the kept keys (s <= t when causal, within the window, mask false); a row
    // with none kept is 0.
    for_each_row(d, k, [&](std::size_t r) {
      const std::size_t t = r % d.T, end = causal ? std::min(d.S, t + 1) : d.S;
      const std::size_t lo = window > 0 && t + 1 > window ? std::min(end, t + 1 - window) : 0;
      float* row = W + r * d.S;
      std::fill(row, row + lo, 0.f);
      kernels::masked_softmax_row(row + lo, d.S - lo, end - lo, kp ? kp + r * d.S + lo : nullptr);
    });
  });
  return record("attention_weights", std::move(w), {q, k}, [d, scale, precision](GradContext& ctx) {
    // dZ = P (dP - rowsum(dP P)) (zero where P is, so masked keys get nothing), then the scores'
    // backward from dZ
    const bool bf16 = precision == Precision::bf16;
    const float* P = ctx.output().data();
    const float* G = ctx.grad_out().data();
    Bf16Copy q16, k16;  // dk reads q, dq reads k
    const Operand Q = ctx.needs(1) ? operand_of(ctx.input(0), ctx.input_node(0), precision, q16) : Operand{};
    const Operand K = ctx.needs(0) ? operand_of(ctx.input(1), ctx.input_node(1), precision, k16) : Operand{};
    const ScoresGradTargets t = scores_grad_targets(ctx);
    Array dz_all = Array::from_shape(ctx.output().shape());
    blas::Bf16Vector dz16(bf16 ? dz_all.size() : 0);
    float* DZ = dz_all.data();
    for_each_head_block(d, d.T * d.S * (2 * d.D + 4), [&](const HeadBlock& k) {
      for_each_row(d, k,
                   [&](std::size_t r) { kernels::softmax_row_backward(P + r * d.S, G + r * d.S, DZ + r * d.S, d.S); });
      const Operand dZ = round_block(DZ, bf16 ? dz16.data() : nullptr, d, k);
      block_scores_backward(d, k, scale, dZ, Q, K, t.dQ, t.dq_beta, t.dK);
    });
  });
}

Tensor attend(const Tensor& weights, const Tensor& v, std::size_t heads) {
  if (!weights.defined() || !v.defined()) fail("attend: input is an undefined tensor");
  const Shape& ws = weights.shape();
  const Shape& vs = v.shape();
  if (ws.size() != 4 || vs.size() != 3) {
    fail("attend: weights and v must be (B, H, T, S) and (B, S, C), got ", shape_str(ws), " and ", shape_str(vs));
  }
  if (heads == 0 || vs[2] % heads != 0) fail("attend: ", vs[2], " channels of v do not split into ", heads, " heads");
  if (ws[0] != vs[0] || ws[1] != heads || ws[3] != vs[1]) {
    fail("attend: weights of shape ", shape_str(ws), " do not match v of shape ", shape_str(vs), " and ", heads,
         " heads (expected (", vs[0], ", ", heads, ", T, ", vs[1], "))");
  }
  const std::size_t T = ws[2];
  const Heads d{vs[0], T, vs[1], heads, vs[2] / heads, vs[2]};
  const Precision precision = autocast_precision();  // the forward's, for backward's products too
  Array out = Array::from_shape({d.B, T, d.C});
  Bf16Copy w16, v16;
  const Operand W = operand_of(weights, precision, w16), V = operand_of(v, precision, v16);
  float* O = out.data();
  if (d.S == 0) std::fill(O, O + out.size(), 0.f);
  for_each_head_block(d, d.T * d.S * d.D, [&](const HeadBlock& k) {
    // out_h = P v_h  (T x D), written into its column block of out
    batched(false, false, k, d.T, d.D, d.S, 1.f, W, scores_of(W.f, d, k), V, heads_of(V.f, d, d.S, k), 0.f,
            heads_of(O, d, d.T, k));
  });
  return record("attend", std::move(out), {weights, v}, BackwardReads{false}, [d, precision](GradContext& ctx) {
    // dP = dout_h v_h^T,  dv_h = P^T dout_h
    Bf16Copy w16, v16;  // dv reads the weights, dP reads v
    const Operand W = ctx.needs(1) ? operand_of(ctx.input(0), ctx.input_node(0), precision, w16) : Operand{};
    const Operand V = ctx.needs(0) ? operand_of(ctx.input(1), ctx.input_node(1), precision, v16) : Operand{};
    // G feeds both products: in bf16 it is rounded once
    const Array& g = ctx.grad_out();
    blas::Bf16Vector g16(precision == Precision::bf16 ? g.size() : 0);
    if (!g16.empty()) blas::to_bf16(g.data(), g.size(), g16.data());
    const Operand G{g.data(), g16.empty() ? nullptr : g16.data()};
    // Each head writes its own blocks of dW and dV once: new buffers need no zeros. (The weights
    // (B, H, T, S) and v (B, S, C) cannot be one tensor.)
    const auto none = GradContext::GradTarget{nullptr, 0.f};
    const auto dw = ctx.needs(0) ? ctx.grad_target(0) : none;
    const auto dv = ctx.needs(1) ? ctx.grad_target(1) : none;
    for_each_head_block(d, 2 * d.T * d.S * d.D, [&](const HeadBlock& k) {
      if (dw.data) {
        batched(false, true, k, d.T, d.S, d.D, 1.f, G, heads_of(G.f, d, d.T, k), V, heads_of(V.f, d, d.S, k), dw.beta,
                scores_of(dw.data, d, k));
      }
      if (dv.data) {
        batched(true, false, k, d.S, d.D, d.T, 1.f, W, scores_of(W.f, d, k), G, heads_of(G.f, d, d.T, k), dv.beta,
                heads_of(dv.data, d, d.S, k));
      }
    });
  });
}

}  // namespace xgrad
