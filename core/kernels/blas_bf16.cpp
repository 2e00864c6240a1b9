// blas::gemm and linear with a Precision: fp32 goes to sgemm and linear; bf16 rounds the operands
// to bf16 and accumulates in float32, on oneDNN's bf16 matmul (gemm_onednn_bf16.cpp) where it runs,
// else emulated (rounded values, then sgemm). Also the bf16 conversions and the choice of path
// (XGRAD_BF16).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <type_traits>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"
#include "xgrad/core/kernels/detail/target_clones.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad::blas {

// The conversion loops, compiled per target (detail/target_clones.hpp): integer operations only,
// so every copy gives the same bits. The baseline copy (SSE2, no 32-to-16-bit pack) ran at about
// 0.7 ns per element; the AVX2 one at a fraction of that.
namespace detail {

namespace {
// Branch-free to_bf16 that GCC vectorizes (the NaN case as a select).
XGRAD_KERNEL_INLINE std::uint16_t round_bits(std::uint32_t u) {
  const std::uint32_t nan = (u >> 16) | 0x40u;
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
}  // namespace

XGRAD_CLONES void to_bf16_serial(const float* x, std::size_t n, std::uint16_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    out[i] = round_bits(u);
  }
}

XGRAD_CLONES void from_bf16_serial(const std::uint16_t* x, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(x[i]) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
}

XGRAD_CLONES void round_serial(const float* x, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    const std::uint32_t r = static_cast<std::uint32_t>(round_bits(u)) << 16;
    std::memcpy(out + i, &r, sizeof r);
  }
}

}  // namespace detail

namespace {

using detail::from_bf16_serial;
using detail::round_serial;
using detail::to_bf16_serial;

template <class F>
void split(std::size_t n, F f) {
  if (n < 2 * kGrainCheap) return f(0, n);
  parallel_for(n, kGrainCheap, [&](std::size_t lo, std::size_t hi) { f(lo, hi); });
}

#ifdef XGRAD_HAS_ONEDNN
constexpr bool kHaveOnednn = true;
#else
constexpr bool kHaveOnednn = false;
#endif

constexpr int kUnset = -1;
std::atomic<int> chosen{kUnset};
std::atomic<bool> forced_emulated{false};  // XGRAD_BF16=emulated or set_bf16_path(emulated)

[[noreturn]] void no_hardware(const char* who) {
  fail(who, ": the hardware bf16 path cannot run here (",
       kHaveOnednn ? "oneDNN refuses a bf16 matmul on this CPU: it has no AVX512-BF16 or AMX"
                   : "this xgrad was built without oneDNN",
       "); use emulated or auto");
}

Bf16Path from_environment() {
  const char* text = std::getenv("XGRAD_BF16");
  const std::string value = text ? text : "";
  if (value.empty() || value == "auto") return bf16_hardware_available() ? Bf16Path::hardware : Bf16Path::emulated;
  if (value == "emulated") {
    forced_emulated.store(bf16_hardware_available());
    return Bf16Path::emulated;
  }
  if (value == "hardware") {
    if (!bf16_hardware_available()) no_hardware("XGRAD_BF16=hardware");
    return Bf16Path::hardware;
  }
  fail("XGRAD_BF16: '", value, "' is not a bf16 path (hardware, emulated or auto)");
}

// Said once per process, on the first bf16 product that is emulated.
void say_emulated() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (forced_emulated.load()) {
      std::cerr << "xgrad: bf16 products are emulated (XGRAD_BF16=emulated or set_bf16_path): operands are rounded "
                   "to bf16 and multiplied in fp32, which is not faster than fp32\n";
    } else if (!kHaveOnednn) {
      std::cerr << "xgrad: bf16 products are emulated (this xgrad was built without oneDNN): operands are rounded to "
                   "bf16 and multiplied in fp32, which is not faster than fp32\n";
    } else {
      std::cerr << "xgrad: bf16 products are emulated on this CPU (no AVX512-BF16 / oneDNN refused bf16): operands "
                   "are rounded to bf16 and multiplied in fp32, which is not faster than fp32\n";
    }
  });
}

// On the hardware path, products of fewer multiply-adds than this are emulated anyway (rounded
// values through sgemm): below it, oneDNN's per-call cost outweighs its faster kernel. Measured on
// one core with bench_gemm's bf16 table (an EPYC with AVX512-BF16, brg:avx512_core_bf16), both
// from fp32 operands, hardware against emulated in GFLOP/s: 64 x 64 x 32 86 vs 109, 64^3 127 vs
// 121, 128 x 128 x 64 253 vs 162, 256^3 348 vs 189 (fp32 sgemm: 160, 181, 198, 208). The rule
// reads the product's size only.
constexpr std::size_t kBf16MinWork = std::size_t{1} << 18;

// One operand as stored, rows x cols with row stride ld: float32 values, bf16 ones, or both.
struct Stored {
  const float* f = nullptr;
  const std::uint16_t* h = nullptr;
  std::size_t ld = 0;
};

// Scratch for the rounded copies of the operands, one pair per thread and kept between calls: a
// fresh buffer per product cost more than the rounding (its pages are faulted in on each call;
// 256^3 ran at 169 GFLOP/s against 206 with the buffers kept). Buffers past kKeptElements are
// freed after the call, so a thread never holds more than 2 x 64 MB.
constexpr std::size_t kKeptElements = std::size_t{1} << 24;

template <class T>
struct Scratch {
  std::vector<T>& buffer;
  explicit Scratch(std::vector<T>& b, std::size_t n) : buffer(b) {
    if (buffer.size() < n) buffer.resize(n);
  }
  ~Scratch() {
    if (buffer.size() > kKeptElements) std::vector<T>().swap(buffer);
  }
  T* data() { return buffer.data(); }
};

// Copies the stored operand (rows x cols, row stride x.ld) contiguous into `out`: as rounded
// float32 values (the emulated path) or as bf16 (float32 operands only).
template <class T>
void pack(const Stored& x, std::size_t rows, std::size_t cols, T* out) {
  const std::size_t ld = x.ld;
  split(rows * cols, [&](std::size_t lo, std::size_t hi) {
    // elements lo..hi of the contiguous copy, a row piece at a time
    for (std::size_t i = lo; i < hi;) {
      const std::size_t r = i / cols, c = i % cols, len = std::min(hi - i, cols - c);
      if constexpr (std::is_same_v<T, float>) {
        if (x.f) {
          round_serial(x.f + r * ld + c, len, out + i);
        } else {
          from_bf16_serial(x.h + r * ld + c, len, out + i);
        }
      } else {
        to_bf16_serial(x.f + r * ld + c, len, out + i);
      }
      i += len;
    }
  });
}

thread_local std::vector<float> scratch_f32[2];
thread_local std::vector<std::uint16_t> scratch_bf16[2];

#ifdef XGRAD_HAS_ONEDNN
// The hardware product, split across the kernel threads as sgemm splits fp32 ones (by rows of C
// when it is tall, by columns when it is wide; each piece over the full K).
void hardware(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const std::uint16_t* a,
              std::size_t lda, const std::uint16_t* b, std::size_t ldb, float beta, float* c, std::size_t ldc,
              const float* bias) {
  const std::size_t work = m * n * k;
  if (work < 2 * kGrainGemm)
    return detail::onednn_gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
  if (m >= n) {
    parallel_for(m, grain_for(kGrainGemm, work / m), [=](std::size_t lo, std::size_t hi) {
      const std::uint16_t* a_part = ta ? a + lo : a + lo * lda;
      detail::onednn_gemm_bf16(ta, tb, hi - lo, n, k, alpha, a_part, lda, b, ldb, beta, c + lo * ldc, ldc, bias);
    });
  } else {
    parallel_for(n, grain_for(kGrainGemm, work / n), [=](std::size_t lo, std::size_t hi) {
      const std::uint16_t* b_part = tb ? b + lo * ldb : b + lo;
      detail::onednn_gemm_bf16(ta, tb, m, hi - lo, k, alpha, a, lda, b_part, ldb, beta, c + lo, ldc,
                               bias ? bias + lo : nullptr);
    });
  }
}
#endif

void add_bias(std::size_t rows, std::size_t out, const float* bias, float* y) {
  if (!bias) return;
  parallel_for(rows, grain_for(kGrainCheap, out), [=](std::size_t lo, std::size_t hi) {
    for (std::size_t r = lo; r < hi; ++r) {
      float* row = y + r * out;
      for (std::size_t j = 0; j < out; ++j) row[j] += bias[j];
    }
  });
}

// C = alpha op(A) op(B) + beta C, plus `bias` on every row when given (linear's form: alpha 1,
// beta 0).
void run(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, Stored a, Stored b, float beta,
         float* c, std::size_t ldc, const float* bias = nullptr) {
  const Bf16Path path = bf16_path();  // read (and XGRAD_BF16 checked) even for an empty product
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (std::size_t j = 0; j < n; ++j) row[j] = beta == 0.f ? 0.f : beta * row[j];
    }
    return add_bias(m, n, bias, c);
  }
  a.ld = std::max<std::size_t>(a.ld, 1);
  b.ld = std::max<std::size_t>(b.ld, 1);
  const std::size_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (detail::few_rows_take(ta, tb, m)) {
    // A decoding step's product, A B^T with one to four rows of A: the few-rows kernel on A rounded
    // and B in bf16 (a weight's copy, read at half the bytes of fp32; a float32 B rounded first), on
    // either path, so that a product gives the same bits whichever form its operands come in.
    Scratch<float> af(scratch_f32[0], m * k);
    pack(a, m, k, af.data());
    Scratch<std::uint16_t> b_copy(scratch_bf16[1], b.h ? 0 : n * k);
    if (!b.h) pack(b, n, k, b_copy.data());
    detail::few_rows_columns(m, n, k, alpha, af.data(), k, b.h ? b.h : b_copy.data(), b.h ? b.ld : k, beta, c, ldc);
    return add_bias(m, n, bias, c);
  }
#ifdef XGRAD_HAS_ONEDNN
  if (path == Bf16Path::hardware && m * n * k >= kBf16MinWork) {
    const std::uint16_t* ah = a.h;
    const std::uint16_t* bh = b.h;
    std::size_t lda = a.ld, ldb = b.ld;
    Scratch<std::uint16_t> a_copy(scratch_bf16[0], ah ? 0 : a_rows * a_cols),
        b_copy(scratch_bf16[1], bh ? 0 : b_rows * b_cols);
    if (!ah) {
      pack(a, a_rows, a_cols, a_copy.data());
      ah = a_copy.data();
      lda = a_cols;
    }
    if (!bh) {
      pack(b, b_rows, b_cols, b_copy.data());
      bh = b_copy.data();
      ldb = b_cols;
    }
    return hardware(ta, tb, m, n, k, alpha, ah, lda, bh, ldb, beta, c, ldc, bias);  // the bias added in the product
  }
#endif
  if (path == Bf16Path::emulated) say_emulated();
  Scratch<float> af(scratch_f32[0], a_rows * a_cols), bf(scratch_f32[1], b_rows * b_cols);
  pack(a, a_rows, a_cols, af.data());
  pack(b, b_rows, b_cols, bf.data());
  sgemm(ta, tb, m, n, k, alpha, af.data(), a_cols, bf.data(), b_cols, beta, c, ldc);
  add_bias(m, n, bias, c);
}

}  // namespace

void detail::check_operands(const char* who, Precision precision, std::size_t work, const Operand& a, const Operand& b,
                            const char* a_name, const char* b_name) {
  // an operand with neither form is an empty one (a zero-size array's null data pointer): fine
  // when the product reads nothing
  if (work > 0 && ((!a.f && !a.h) || (!b.f && !b.h))) {
    fail(who, ": ", !a.f && !a.h ? a_name : b_name, " has no values (an Operand with neither float32 nor bf16 ",
         "values) in a product of ", work, " multiply-adds");
  }
  if (precision != Precision::fp32) return;
  const bool a_bf16_only = !a.f && a.h, b_bf16_only = !b.f && b.h;
  if (!a_bf16_only && !b_bf16_only) return;
  fail(who, ": an fp32 product of ", a_bf16_only ? a_name : b_name,
       ", which is held only in bf16 (Operand without float32 values); ask for Precision::bf16");
}

void to_bf16(const float* x, std::size_t n, std::uint16_t* out) {
  split(n, [=](std::size_t lo, std::size_t hi) { to_bf16_serial(x + lo, hi - lo, out + lo); });
}

void from_bf16(const std::uint16_t* x, std::size_t n, float* out) {
  split(n, [=](std::size_t lo, std::size_t hi) { from_bf16_serial(x + lo, hi - lo, out + lo); });
}

void round_to_bf16(const float* x, std::size_t n, float* out) {
  split(n, [=](std::size_t lo, std::size_t hi) { round_serial(x + lo, hi - lo, out + lo); });
}

bool bf16_hardware_available() {
#ifdef XGRAD_HAS_ONEDNN
  return detail::onednn_bf16_available();
#else
  return false;
#endif
}

Bf16Path bf16_path() {
  int p = chosen.load();
  if (p == kUnset) {
    int expected = kUnset;
    chosen.compare_exchange_strong(expected, static_cast<int>(from_environment()));
    p = chosen.load();
  }
  return static_cast<Bf16Path>(p);
}

void set_bf16_path(Bf16Path path) {
  if (path == Bf16Path::hardware && !bf16_hardware_available()) no_hardware("blas::set_bf16_path(hardware)");
  forced_emulated.store(path == Bf16Path::emulated && bf16_hardware_available());
  chosen.store(static_cast<int>(path));
}

std::string bf16_path_name(Bf16Path path) { return path == Bf16Path::hardware ? "hardware" : "emulated"; }

void gemm(Precision precision, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          Operand a, std::size_t lda, Operand b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  detail::check_operands("blas::gemm", precision, m * n * k, a, b);
  if (precision == Precision::fp32) {
    return sgemm(trans_a, trans_b, m, n, k, alpha, a.f, lda, b.f, ldb, beta, c, ldc);
  }
  run(trans_a, trans_b, m, n, k, alpha, {a.f, a.h, lda}, {b.f, b.h, ldb}, beta, c, ldc);
}

void linear(Precision precision, std::size_t rows, std::size_t out, std::size_t in, Operand x, Operand w,
            const float* bias, float* y) {
  detail::check_operands("blas::linear", precision, rows * out * in, x, w, "X", "W");
  if (precision == Precision::fp32) {
    return linear(rows, out, in, x.f, w.f, bias, y);
  }
  run(false, true, rows, out, in, 1.f, {x.f, x.h, in}, {w.f, w.h, in}, 0.f, y, out, bias);
}

}  // namespace xgrad::blas
