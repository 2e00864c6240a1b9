// bf16 products on oneDNN's matmul primitive: bf16 src and weights, float32 dst, float32
// accumulation (brg:avx512_core_bf16 on CPUs with AVX512-BF16, AMX where there is AMX). On a CPU
// without them (AVX2 only, e.g. Zen 3) Debian's oneDNN 2.6.3 refuses to create the primitive; the
// probe below finds that out once and blas_bf16.cpp then emulates. As in gemm_onednn_batched.cpp,
// a primitive is built (JIT-compiled) once per shape, strides, alpha and beta and kept, and runs
// with a scratchpad of the calling thread's. Built only with oneDNN.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <dnnl.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/detail/onednn_primitives.hpp"

namespace xgrad::blas::detail {

namespace {

struct Built {
  bool ok = false;
  dnnl::matmul matmul;
  dnnl::memory::desc src, weights, bias, dst, scratch;
};

// (trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha's bits, beta's bits, with a bias)
using Key = std::array<std::int64_t, 11>;

// A program's products have a handful of shapes (and the pieces the kernel threads split them
// into); the cache is emptied past this many, so it cannot grow without bound.
constexpr std::size_t kMaxBuilt = 512;

// A (rows x cols) matrix stored row-major with row stride ld, or its transpose stored so.
dnnl::memory::desc matrix(std::int64_t rows, std::int64_t cols, bool trans, std::int64_t ld,
                          dnnl::memory::data_type type) {
  return dnnl::memory::desc({rows, cols}, type, trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

Built build(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
            std::int64_t ldc, float alpha, float beta, bool with_bias = false) {
  using dt = dnnl::memory::data_type;
  Built built;
  try {
    built.src = matrix(m, k, ta, lda, dt::bf16);
    built.weights = matrix(k, n, tb, ldb, dt::bf16);
    built.dst = matrix(m, n, false, ldc, dt::f32);
    if (with_bias) built.bias = matrix(1, n, false, n, dt::f32);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops sum;
      sum.append_sum(beta);
      attr.set_post_ops(sum);
    }
    const dnnl::matmul::desc desc = with_bias ? dnnl::matmul::desc(built.src, built.weights, built.bias, built.dst)
                                              : dnnl::matmul::desc(built.src, built.weights, built.dst);
    const dnnl::matmul::primitive_desc pd(desc, attr, onednn_cpu());
    // oneDNN's reference kernels are a loop in C, far slower than emulating: not a hardware path
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) return built;
    built.matmul = dnnl::matmul(pd);
    built.scratch = pd.scratchpad_desc();
    built.ok = true;
  } catch (const dnnl::error&) {
    built.ok = false;
  }
  return built;
}

Built built_for(const Key& key, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                float beta) {
  static PrimitiveCache<Key, Built> cache(kMaxBuilt);
  return cache.get(key, [&] { return build(ta, tb, m, n, k, key[5], key[6], key[7], alpha, beta, key[10] != 0); });
}

}  // namespace

bool onednn_bf16_available() {
  // Two small products, plain and with both operands transposed, accumulating into C: the forms
  // the autograd ops use.
  static const bool available = [] {
    const OnednnOnThisThread serial;
    return build(false, false, 16, 16, 16, 16, 16, 16, 1.f, 0.f).ok &&
           build(true, true, 16, 16, 16, 16, 16, 16, 1.f, 1.f).ok;
  }();
  return available;
}

void onednn_gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                      const std::uint16_t* a, std::size_t lda, const std::uint16_t* b, std::size_t ldb, float beta,
                      float* c, std::size_t ldc, const float* bias) {
  if (bias && (alpha != 1.f || beta != 0.f))
    fail("blas::gemm (bf16): a bias is added only with alpha 1 and beta 0, got ", alpha, " and ", beta);
  const OnednnOnThisThread serial;
  const auto M = static_cast<std::int64_t>(m), N = static_cast<std::int64_t>(n), K = static_cast<std::int64_t>(k);
  try {
    thread_local BoundOnThisThread<Key> bound(kMaxBuilt);
    const Key key = {trans_a,
                     trans_b,
                     M,
                     N,
                     K,
                     static_cast<std::int64_t>(lda),
                     static_cast<std::int64_t>(ldb),
                     static_cast<std::int64_t>(ldc),
                     float_bits(alpha),
                     float_bits(beta),
                     bias != nullptr};
    BoundPrimitive& matmul = bound.get(key, [&] {
      const Built use = built_for(key, trans_a, trans_b, M, N, K, alpha, beta);
      if (!use.ok) {
        fail("blas::gemm (bf16): oneDNN has no bf16 matmul for ", m, " x ", n, " x ", k, (trans_a ? " (A^T)" : ""),
             (trans_b ? " (B^T)" : ""), " on this CPU; set XGRAD_BF16=emulated");
      }
      if (bias) {
        return BoundPrimitive(use.matmul, {{DNNL_ARG_SRC, use.src},
                                           {DNNL_ARG_WEIGHTS, use.weights},
                                           {DNNL_ARG_DST, use.dst},
                                           {DNNL_ARG_BIAS, use.bias},
                                           {DNNL_ARG_SCRATCHPAD, use.scratch}});
      }
      return BoundPrimitive(use.matmul, {{DNNL_ARG_SRC, use.src},
                                         {DNNL_ARG_WEIGHTS, use.weights},
                                         {DNNL_ARG_DST, use.dst},
                                         {DNNL_ARG_SCRATCHPAD, use.scratch}});
    });
    if (bias) {
      matmul.run({a, b, c, bias});
    } else {
      matmul.run({a, b, c});
    }
  } catch (const dnnl::error& e) {
    fail("blas::gemm (bf16): oneDNN's bf16 matmul failed (", e.what(), ") on ", m, " x ", n, " x ", k);
  }
}

}  // namespace xgrad::blas::detail
