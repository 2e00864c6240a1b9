// blas::sgemm_batched and gemm_batched (bf16) on oneDNN's matmul primitive: one call computes a
// whole batch of products whose operands sit at regular strides (attention's heads), so oneDNN's
// per-call cost is paid once per batch instead of once per head. The operands are float32 or
// bf16; C is float32. A primitive is built (and JIT-compiled, about 1.5 ms) once per operand type,
// shape (batch count included: a model's calls have a handful), strides, alpha and beta, and
// kept. Built only with oneDNN.
//
// Threads: each primitive runs with a scratchpad the caller provides (scratchpad_mode::user), one
// per thread. oneDNN's own scratchpad belongs to the thread that created the primitive, so a
// cached primitive run by two threads at once would have them write over each other's
// (tests/test_gemm_engines.cpp fails that way).
#include <array>
#include <cstdint>
#include <vector>

#include <dnnl.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/detail/onednn_primitives.hpp"

namespace xgrad::blas::detail {

namespace {

struct Built {
  bool ok = false;  // oneDNN refused these descriptors: the caller loops over sgemm instead
  dnnl::matmul matmul;
  dnnl::memory::desc src, weights, dst, scratch;
};

using Key = std::array<std::int64_t, 19>;

// Shapes seen by one program are few (a model has a handful); the cache is emptied if a program
// cycles through more than this many, so it cannot grow without bound.
constexpr std::size_t kMaxBuilt = 512;
// Dims (B, H, rows, cols) of an operand stored row-major with row stride ld, or transposed.
// Strides of an operand, in elements.
struct Steps {
  std::size_t ld, batch_stride, head_stride;
};
template <class T>
Steps steps_of(const Strided<T>& s) {
  return {s.ld, s.batch_stride, s.head_stride};
}

dnnl::memory::desc operand(std::int64_t B, std::int64_t H, std::int64_t rows, std::int64_t cols, bool trans,
                           const Steps& s, dnnl::memory::data_type type) {
  const auto ld = static_cast<std::int64_t>(s.ld), bs = static_cast<std::int64_t>(s.batch_stride),
             hs = static_cast<std::int64_t>(s.head_stride);
  return dnnl::memory::desc({B, H, rows, cols}, type,
                            trans ? dnnl::memory::dims{bs, hs, 1, ld} : dnnl::memory::dims{bs, hs, ld, 1});
}

Built build(dnnl::memory::data_type type, bool ta, bool tb, std::int64_t B, std::int64_t H, std::int64_t m,
            std::int64_t n, std::int64_t k, float alpha, const Steps& a, const Steps& b, float beta, const Steps& c) {
  Built built;
  try {
    built.src = operand(B, H, m, k, ta, a, type);
    built.weights = operand(B, H, k, n, tb, b, type);
    built.dst = operand(B, H, m, n, false, c, dnnl::memory::data_type::f32);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops sum;
      sum.append_sum(beta);
      attr.set_post_ops(sum);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(built.src, built.weights, built.dst), attr, onednn_cpu());
    built.matmul = dnnl::matmul(pd);
    built.scratch = pd.scratchpad_desc();
    built.ok = true;
  } catch (const dnnl::error&) {
    built.ok = false;  // descriptors or a primitive oneDNN does not support: the caller loops
  }
  return built;
}

Built built_for(const Key& key, dnnl::memory::data_type type, bool ta, bool tb, std::int64_t B, std::int64_t H,
                std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const Steps& a, const Steps& b, float beta,
                const Steps& c) {
  static PrimitiveCache<Key, Built> cache(kMaxBuilt);
  return cache.get(key, [&] { return build(type, ta, tb, B, H, m, n, k, alpha, a, b, beta, c); });
}

// The batch on oneDNN, with operands of `type` at a and b.
bool run_batched(dnnl::memory::data_type type, const char* who, bool trans_a, bool trans_b, std::size_t batches,
                 std::size_t heads, std::size_t m, std::size_t n, std::size_t k, float alpha, const void* a,
                 const Steps& as, const void* b, const Steps& bs, float beta, float* c, const Steps& cs) {
  const OnednnOnThisThread serial;
  const auto B = static_cast<std::int64_t>(batches), H = static_cast<std::int64_t>(heads);
  const auto M = static_cast<std::int64_t>(m), N = static_cast<std::int64_t>(n), K = static_cast<std::int64_t>(k);
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  const Key key = {static_cast<std::int64_t>(type),
                   trans_a,
                   trans_b,
                   B,
                   H,
                   M,
                   N,
                   K,
                   i64(as.ld),
                   i64(as.batch_stride),
                   i64(as.head_stride),
                   i64(bs.ld),
                   i64(bs.batch_stride),
                   i64(bs.head_stride),
                   i64(cs.ld),
                   i64(cs.batch_stride),
                   i64(cs.head_stride),
                   float_bits(alpha),
                   float_bits(beta)};
  try {
    const Built use = built_for(key, type, trans_a, trans_b, B, H, M, N, K, alpha, as, bs, beta, cs);
    if (!use.ok) return false;
    thread_local dnnl::stream stream(onednn_cpu());
    thread_local std::vector<std::uint8_t> scratch;
    if (scratch.size() < use.scratch.get_size()) scratch.resize(use.scratch.get_size());
    dnnl::memory src(use.src, onednn_cpu(), const_cast<void*>(a)),
        weights(use.weights, onednn_cpu(), const_cast<void*>(b)), dst(use.dst, onednn_cpu(), c),
        pad(use.scratch, onednn_cpu(), scratch.data());
    use.matmul.execute(
        stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, pad}});
    stream.wait();
  } catch (const dnnl::error& e) {
    fail(who, ": oneDNN's matmul failed (", e.what(), ") on ", batches, " x ", heads, " products of ", m, " x ", n,
         " x ", k);
  }
  return true;
}

}  // namespace

bool onednn_sgemm_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m,
                          std::size_t n, std::size_t k, float alpha, Strided<const float> a, Strided<const float> b,
                          float beta, Strided<float> c) {
  return run_batched(dnnl::memory::data_type::f32, "blas::sgemm_batched", trans_a, trans_b, batches, heads, m, n, k,
                     alpha, a.data, steps_of(a), b.data, steps_of(b), beta, c.data, steps_of(c));
}

bool onednn_gemm_bf16_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m,
                              std::size_t n, std::size_t k, float alpha, Strided<const std::uint16_t> a,
                              Strided<const std::uint16_t> b, float beta, Strided<float> c) {
  return run_batched(dnnl::memory::data_type::bf16, "blas::gemm_batched", trans_a, trans_b, batches, heads, m, n, k,
                     alpha, a.data, steps_of(a), b.data, steps_of(b), beta, c.data, steps_of(c));
}

}  // namespace xgrad::blas::detail
