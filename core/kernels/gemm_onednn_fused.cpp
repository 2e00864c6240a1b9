// blas::linear_activation on oneDNN's matmul primitive: Y = act(X W^T + bias) in one call, the bias
// and the activation applied by the primitive (an eltwise post-op) while each tile of Y is still in
// registers, so Y is written once and never read back. A primitive is built (and JIT-compiled)
// once per shape, bias and activation, and kept, as in gemm_onednn_batched.cpp, with a scratchpad
// per thread (scratchpad_mode::user). The primitive chooses its weights' layout and W is reordered
// into it on each call: on W as stored ((out, in), the transposed operand) the primitive ran at
// half of dnnl_sgemm's rate (2048 x 256 -> 1024: 10.8 ms against 5.5 blocked, one thread), and the
// reorder costs 0.2 ms there (1 ms for standard's 2048 x 512). Built only with oneDNN.
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
  bool ok = false;  // oneDNN refused these descriptors: the caller takes the unfused path
  dnnl::matmul matmul;
  dnnl::memory::desc src, weights, bias, dst, scratch;
  dnnl::memory::desc stored;  // W as xgrad stores it, when the primitive wants another layout
  dnnl::reorder to_blocked;   // stored -> weights, when they differ
};

using Key = std::array<std::int64_t, 5>;  // rows, out, in, bias, activation

// A model has a handful of shapes (times the thread counts' row ranges); the cache is emptied if a
// program cycles through more than this many, so it cannot grow without bound.
constexpr std::size_t kMaxBuilt = 256;
Built build(std::int64_t M, std::int64_t N, std::int64_t K, bool with_bias, Epilogue act) {
  using dt = dnnl::memory::data_type;
  Built built;
  try {
    built.src = dnnl::memory::desc({M, K}, dt::f32, dnnl::memory::dims{K, 1});
    // W is stored (N, K) row-major: element (k, n) of the (K, N) operand sits at n K + k
    built.stored = dnnl::memory::desc({K, N}, dt::f32, dnnl::memory::dims{1, K});
    const dnnl::memory::desc any({K, N}, dt::f32, dnnl::memory::format_tag::any);
    built.dst = dnnl::memory::desc({M, N}, dt::f32, dnnl::memory::dims{N, 1});
    if (with_bias) built.bias = dnnl::memory::desc({1, N}, dt::f32, dnnl::memory::dims{N, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (act != Epilogue::none) {
      const auto alg = act == Epilogue::relu   ? dnnl::algorithm::eltwise_relu
                       : act == Epilogue::gelu ? dnnl::algorithm::eltwise_gelu_erf
                                               : dnnl::algorithm::eltwise_gelu_tanh;
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, alg, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc desc = with_bias ? dnnl::matmul::desc(built.src, any, built.bias, built.dst)
                                              : dnnl::matmul::desc(built.src, any, built.dst);
    const dnnl::matmul::primitive_desc pd(desc, attr, onednn_cpu());
    built.matmul = dnnl::matmul(pd);
    built.scratch = pd.scratchpad_desc();
    built.weights = pd.weights_desc();
    if (built.weights != built.stored) {
      built.to_blocked =
          dnnl::reorder(dnnl::reorder::primitive_desc(onednn_cpu(), built.stored, onednn_cpu(), built.weights));
    }
    built.ok = true;
  } catch (const dnnl::error&) {
    built.ok = false;
  }
  return built;
}

Built built_for(const Key& key, std::int64_t M, std::int64_t N, std::int64_t K, bool with_bias, Epilogue act) {
  static PrimitiveCache<Key, Built> cache(kMaxBuilt);
  return cache.get(key, [&] { return build(M, N, K, with_bias, act); });
}

}  // namespace

bool onednn_linear(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w, const float* bias,
                   float* y, Epilogue act) {
  const OnednnOnThisThread serial;
  const auto M = static_cast<std::int64_t>(rows), N = static_cast<std::int64_t>(out), K = static_cast<std::int64_t>(in);
  const Key key = {M, N, K, bias != nullptr, static_cast<std::int64_t>(act)};
  try {
    const Built use = built_for(key, M, N, K, bias != nullptr, act);
    if (!use.ok) return false;
    thread_local dnnl::stream stream(onednn_cpu());
    thread_local std::vector<std::uint8_t> scratch;
    if (scratch.size() < use.scratch.get_size()) scratch.resize(use.scratch.get_size());
    dnnl::memory src(use.src, onednn_cpu(), const_cast<float*>(x)), dst(use.dst, onednn_cpu(), y),
        pad(use.scratch, onednn_cpu(), scratch.data());
    dnnl::memory weights(use.stored, onednn_cpu(), const_cast<float*>(w));
    thread_local std::vector<float> blocked;
    if (use.weights != use.stored) {
      const std::size_t need = use.weights.get_size() / sizeof(float) + 1;
      if (blocked.size() < need) blocked.resize(need);
      dnnl::memory to(use.weights, onednn_cpu(), blocked.data());
      use.to_blocked.execute(stream, weights, to);
      weights = to;
    }
    if (bias) {
      dnnl::memory b(use.bias, onednn_cpu(), const_cast<float*>(bias));
      use.matmul.execute(stream, {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_WEIGHTS, weights},
                                  {DNNL_ARG_BIAS, b},
                                  {DNNL_ARG_DST, dst},
                                  {DNNL_ARG_SCRATCHPAD, pad}});
    } else {
      use.matmul.execute(
          stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, pad}});
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("blas::linear_activation: oneDNN's matmul failed (", e.what(), ") on ", rows, " x ", out, " x ", in);
  }
  return true;
}

}  // namespace xgrad::blas::detail
