/// @file
/// The one door to matrix products. Behind it are two engines: OpenBLAS (always) and oneDNN (when
/// xgrad was configured with it; CMake says which it found). Only the engine files include the
/// engines' headers (`<cblas.h>` clashes with xtensor-blas's), so everything else calls sgemm here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace xgrad {

/// What a matrix product multiplies (blas::gemm, and the `linear`, `matmul`, `linear_activation`
/// and `flash_attention` ops under an AutocastGuard).
enum class Precision {
  fp32,  ///< float32 operands (the default)
  bf16,  ///< operands rounded to bfloat16 (round to nearest even), accumulated in float32
};

}  // namespace xgrad

/// The one door to matrix products (OpenBLAS, and oneDNN when built with it): sgemm, its batched
/// form, the Linear layer's product, the precision-aware gemm, and the choice of engine.
namespace xgrad::blas {

/// Row-major C (m x n) = alpha * op(A) op(B) + beta * C, where op(A) is m x k and op(B) is k x n;
/// op(X) = X^T when the flag is set. lda/ldb/ldc are the row strides of the stored matrices.
/// Large products are split across xgrad's kernel threads (parallel.hpp); a call from inside a
/// parallel_for body runs on its own thread. Every engine call runs on the thread that makes it.
/// Under the automatic engine, products that small_kernel_takes_plain names run on xgrad's own
/// small-product kernel instead of either engine.
void sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
           std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

/// Y (rows x out) = X (rows x in) W^T + bias, the Linear layer's product: W is stored out x in
/// (PyTorch's layout), all row-major and contiguous; bias (out) may be null. sgemm writes the
/// product, then the bias is added. (oneDNN's matmul primitive with the bias fused ran 1.2x faster
/// than this at in 64 alone, but made no measurable difference to the benchmark's step, so the
/// simpler path stays.)
void linear(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w, const float* bias,
            float* y);

/// Whether sgemm, linear and linear_activation give a product (op(A) m x k, C m x n) to xgrad's
/// small-product kernel (core/kernels/small_gemm.cpp) in column blocks of 64: under the automatic
/// engine, op(A) = A, m at least 1024, n at most 256 and k from 1 to 1024 (the linear layers of
/// narrow models, forward and input gradient; the measurements are in blas.cpp).
bool small_kernel_takes_plain(bool trans_a, std::size_t m, std::size_t n, std::size_t k);

/// What blas::linear_activation applies to the product plus bias: nothing, max(z, 0), the erf GELU
/// z Phi(z) or its tanh form (as xgrad::gelu's exact and tanh).
enum class Epilogue { none, relu, gelu, gelu_tanh };

/// Y (rows x out) = act(X W^T + bias), shapes as in linear; bias may be null. On the small-product
/// kernel (small_kernel_takes_plain): its product, then the bias and the activation per range of
/// rows. Under oneDNN (when engine_for picks it for the product): one call of its matmul primitive
/// per range of rows, the bias and the activation applied as post-ops while Y's tiles are in
/// registers (primitives kept per shape). Otherwise linear's product and bias, then the activation
/// over each range of rows while it is in cache. The paths agree to rounding (oneDNN's erf and tanh
/// are its own).
void linear_activation(std::size_t rows, std::size_t out, std::size_t in, const float* x, const float* w,
                       const float* bias, float* y, Epilogue act);

/// One operand of a batch of products over (b, h): matrix (b, h) starts at
/// data + b * batch_stride + h * head_stride and has row stride ld. Attention's heads sit side by
/// side in the channels, so the heads of a (B, T, H D) tensor are {data, H D, T H D, D}.
template <class T>
struct Strided {
  T* data;
  std::size_t ld, batch_stride, head_stride;
};

/// C(b, h) = alpha op(A(b, h)) op(B(b, h)) + beta C(b, h) for b < batches and h < heads, each as
/// in sgemm. Under the automatic engine, products with C at most 64 wide and at most 2^21
/// multiply-adds run on xgrad's own small-product kernel, which keeps a block of C in vector
/// registers (attention's short heads: tiny's training step 6.5% faster; see blas.cpp). Otherwise,
/// under oneDNN, products of 2^12 to 2^21 multiply-adds are one call of its matmul primitive per
/// range of b (attention's heads in the benchmarks ran 1.1x to 2.7x faster than a loop of sgemm);
/// others, and OpenBLAS, a loop of sgemm. Which engine computes a
/// product depends on its size only, so splitting a batch differently changes no bit. Ranges of b
/// are split across the kernel threads; a call from inside a parallel_for body runs on its own
/// thread.
void sgemm_batched(bool trans_a, bool trans_b, std::size_t batches, std::size_t heads, std::size_t m, std::size_t n,
                   std::size_t k, float alpha, Strided<const float> a, Strided<const float> b, float beta,
                   Strided<float> c);

/// @name bf16 products
/// bfloat16 numbers are held as their 16 bits (`std::uint16_t`): the top half of a float32 (sign,
/// 8 exponent bits, 7 mantissa bits). A bf16 product rounds its operands to bf16 (to nearest,
/// ties to even; NaN stays NaN) and accumulates in float32 into a float32 C, on one of two paths
/// (Bf16Path): oneDNN's bf16 matmul where it runs, else the same rounding followed by sgemm on
/// the rounded values, which gives the same numbers (up to the order of the fp32 additions) but
/// is no faster than fp32. gemm, linear and gemm_batched take a Precision and each operand in
/// whichever form its caller holds (Operand), so a product op states what it multiplies and the
/// door chooses precision, path and engine. Under the automatic engine, A B^T with one to four rows of A (a decoding
/// step's products) runs on xgrad's few-rows kernel on either path, reading a bf16 B at half the
/// bytes of a float32 one.
/// @{

/// x rounded to the nearest bf16 (ties to even); NaN stays a (quiet) NaN of the same sign, inf
/// stays inf, subnormals are rounded like any other value (not flushed).
inline std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/// The float32 a bf16 stands for (exact).
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
/// out[i] = to_bf16(x[i]) for i < n (a vectorizable loop, split across the kernel threads when long).
void to_bf16(const float* x, std::size_t n, std::uint16_t* out);
/// out[i] = from_bf16(x[i]) for i < n.
void from_bf16(const std::uint16_t* x, std::size_t n, float* out);
/// out[i] = from_bf16(to_bf16(x[i])): x rounded to bf16, kept in float32 (out may be x).
void round_to_bf16(const float* x, std::size_t n, float* out);

/// How bf16 products run. `hardware`: oneDNN's matmul primitive with bf16 inputs and float32
/// output (AVX512-BF16 or AMX kernels). `emulated`: operands rounded to bf16 in float32 buffers,
/// then sgemm; the same numerics, not faster than fp32.
enum class Bf16Path { hardware, emulated };

/// Whether this build and CPU have the hardware path: oneDNN is built in and creates a bf16
/// matmul primitive (probed once, then cached).
bool bf16_hardware_available();
/// The path bf16 products take: XGRAD_BF16 (hardware, emulated or auto; read on the first call)
/// or set_bf16_path, else hardware when available. XGRAD_BF16=hardware where the hardware path
/// cannot run, and a value that names no path, are Errors naming the variable. The first bf16
/// product on the emulated path prints one line on stderr saying so.
Bf16Path bf16_path();
/// Sets the path of every later bf16 product; hardware where it cannot run is an Error.
void set_bf16_path(Bf16Path path);
/// "hardware" or "emulated".
std::string bf16_path_name(Bf16Path path);

/// One operand of a product as its caller holds it: float32 values (f), their bf16 copy (h), or
/// both (the same numbers, the copy made once: a parameter's cached copy, an activation's kept
/// one). It converts from either pointer, so a product takes whichever form the caller has; the
/// precision the product is asked for, not the form, decides what is multiplied.
struct Operand {
  const float* f = nullptr;          ///< float32 values, or null
  const std::uint16_t* h = nullptr;  ///< bf16 values (a copy of f's, rounded, when both are given), or null
  /// No values (an operand a computation does not read).
  Operand() = default;
  /// float32 values only.
  Operand(const float* values) : f(values) {}  // NOLINT: implicit on purpose
  /// bf16 values only.
  Operand(const std::uint16_t* bf16) : h(bf16) {}  // NOLINT: implicit on purpose
  /// Both forms of the same numbers (bf16 may be null: float32 only).
  Operand(const float* values, const std::uint16_t* bf16) : f(values), h(bf16) {}
  /// The operand `offset` elements further on, in each form it has.
  Operand at(std::size_t offset) const { return {f ? f + offset : nullptr, h ? h + offset : nullptr}; }
};

/// C (m x n, float32) = alpha op(A) op(B) + beta C at `precision`, op(A) m x k and op(B) k x n with
/// row strides lda and ldb as in sgemm. fp32 multiplies the operands' float32 values (sgemm); an
/// operand held only in bf16 is an Error naming blas::gemm and the operand. bf16 multiplies bf16
/// values, each operand's copy when it has one, else its float32 values rounded on the fly, and
/// accumulates in float32, on the path bf16_path() names.
void gemm(Precision precision, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          Operand a, std::size_t lda, Operand b, std::size_t ldb, float beta, float* c, std::size_t ldc);

/// Y (rows x out, float32) = X W^T + bias at `precision`, shapes as in linear (X and W row-major and
/// contiguous, W stored out x in, bias float32 or null, added in float32). fp32 is linear's product.
void linear(Precision precision, std::size_t rows, std::size_t out, std::size_t in, Operand x, Operand w,
            const float* bias, float* y);

/// One operand of gemm_batched: matrix (b, h) starts `b * batch_stride + h * head_stride` elements
/// after `first`, in each form the operand has, with row stride ld (as Strided).
struct BatchedOperand {
  Operand first;                              ///< matrix (0, 0)
  std::size_t ld, batch_stride, head_stride;  ///< in elements
  /// Matrix (b, h).
  Operand at(std::size_t b, std::size_t h) const { return first.at(b * batch_stride + h * head_stride); }
};

/// C(b, h) = alpha op(A(b, h)) op(B(b, h)) + beta C(b, h) at `precision` for b < batches and
/// h < heads. fp32 is sgemm_batched (an operand held only in bf16 is an Error). bf16: with both
/// operands in bf16 on the hardware path, products of 2^12 to 2^21 multiply-adds are one call of
/// oneDNN's bf16 matmul primitive per range of b (as sgemm_batched's are of its float32 one);
/// others, and the emulated path, a loop of gemm.
void gemm_batched(Precision precision, bool trans_a, bool trans_b, std::size_t batches, std::size_t heads,
                  std::size_t m, std::size_t n, std::size_t k, float alpha, const BatchedOperand& a,
                  const BatchedOperand& b, float beta, Strided<float> c);
/// @}

/// Which library computes the products. `automatic` picks per call by size (see engine_for); the
/// others force one engine for every call, for comparison and debugging. The environment variable
/// XGRAD_GEMM (openblas, onednn or auto) sets the initial choice; set_engine overrides it.
/// Engines differ in rounding only (a few ulps); one engine at one thread count gives the same
/// bits on every run.
enum class Engine { automatic, openblas, onednn };

/// Sets the choice for every later product. Throws when `engine` is not built in (onednn
/// without oneDNN).
void set_engine(Engine engine);
/// The current choice (automatic unless XGRAD_GEMM or set_engine said otherwise). XGRAD_GEMM is
/// read on the first call; a value that names no engine, or onednn without oneDNN, is an Error.
Engine engine();
/// Whether this build has the engine (automatic and openblas: always).
bool has_engine(Engine engine);
/// The engine that computes one product of this size under the current choice: openblas or onednn.
Engine engine_for(std::size_t m, std::size_t n, std::size_t k);
/// "auto", "openblas", "onednn": the engine's name, as XGRAD_GEMM spells it; parse_engine reads
/// it back (and throws on anything else, naming the text).
std::string engine_name(Engine engine);
/// The Engine engine_name() names: "auto", "openblas" or "onednn"; anything else is an Error naming it.
Engine parse_engine(const std::string& name);

/// Threads OpenBLAS itself may use (0 keeps its default), and how many it uses now. xgrad keeps
/// it at 1 and threads GEMMs itself: use xgrad::set_num_threads.
void set_num_threads(int n);
/// How many threads OpenBLAS itself uses now (see set_num_threads).
int num_threads();

}  // namespace xgrad::blas
