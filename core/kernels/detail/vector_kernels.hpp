// The hottest elementwise loops, compiled three times on x86-64 (for AVX-512, AVX2 and the
// baseline SSE2) with the copy picked when the library loads, so one binary runs everywhere and
// uses the widest vectors the CPU has. Every copy does the same IEEE operations per element in the
// same order (no FMA contraction; sums in a fixed order of 32 partials), so they give the same bits
// (tests/test_kernel_targets.cpp). Each call handles elements [0, n) of its pointers;
// the ops split their work across threads and call these per range.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xgrad/core/kernels/detail/target_clones.hpp"

namespace xgrad::XGRAD_KERNELS_NS {

// y = x Phi(x), the exact (erf) GELU.
void gelu_forward(const float* x, float* y, std::size_t n);
// dx = g (Phi(x) + x phi(x)).
void gelu_backward(const float* x, const float* g, float* dx, std::size_t n);
// Gated units y = act(gate) up, act by `activation`: 0 SiLU (gate sigmoid(gate)), 1 the exact
// (erf) GELU, 2 the tanh GELU. The sigmoid and tanh are built on fast::exp, so no e^x overflows.
void gated_forward(const float* gate, const float* up, float* y, std::size_t n, int activation);
// dgate = g up act'(gate) and dup = g act(gate).
void gated_backward(const float* gate, const float* up, const float* g, float* dgate, float* dup, std::size_t n,
                    int activation);
// y = x (1 + tanh u) / 2, u = sqrt(2/pi) (x + 0.044715 x^3), the tanh GELU (tanh on fast::exp, as
// the gated units' code 2), and its backward dx = g dy/dx.
void gelu_tanh_forward(const float* x, float* y, std::size_t n);
void gelu_tanh_backward(const float* x, const float* g, float* dx, std::size_t n);
// Dropout's keep flags and output for elements first .. first + n - 1 of a tensor: keep = 1 when
// the keyed hash of the element's index is at least `threshold`, y = x keep scale.
void dropout_forward(const float* x, float* y, std::uint8_t* keep, std::size_t first, std::size_t n, std::uint32_t k0,
                     std::uint32_t k1, std::uint32_t threshold, float scale);
// dx = g keep scale.
void dropout_backward(const float* g, const std::uint8_t* keep, float* dx, std::size_t n, float scale);
// Dropout of GELU in one pass, the same bits as gelu_forward then dropout_forward:
// y = gelu(x) keep scale, and dx = (g keep scale) (Phi(x) + x phi(x)).
void gelu_dropout_forward(const float* x, float* y, std::uint8_t* keep, std::size_t first, std::size_t n,
                          std::uint32_t k0, std::uint32_t k1, std::uint32_t threshold, float scale);
void gelu_dropout_backward(const float* x, const float* g, const std::uint8_t* keep, float* dx, std::size_t n,
                           float scale);

// Softmax of one row of n scores in place, over the kept entries only: entry s is kept when
// s < end and keep (may be null) is nonzero there; the others become 0, and a row with none kept
// is all zeros. exp is fast::exp (within 1.2e-7 relative of the C library's).
void masked_softmax_row(float* row, std::size_t n, std::size_t end, const std::uint8_t* keep);
// dz = p (g - sum_s g p) for one row of softmax output p.
void softmax_row_backward(const float* p, const float* g, float* dz, std::size_t n);

// The tiled attention's online softmax on one row of a tile (ops_flash_attention.cpp): with *m the
// row's running max (-inf before its first keys), m' = max(*m, max z[0, kept)); z[s] becomes
// e^(z[s] - m') for s < kept and 0 for kept <= s < n; *m = m' and the sum of the exps is
// returned. NaN among z[0, kept) sets *nan (max skips it, and fast::exp would hide it).
// *correction = e^(m - m'), the factor for what was summed before (0 when m was -inf); computed
// here so the exp runs in this file's per-target copies, with their fused multiply-adds.
float online_softmax_row(float* z, std::size_t n, std::size_t kept, float* m, bool* nan, float* correction);
// z[s] = e^(z[s] - shift) for s < live, 0 for live <= s < n (the tiled backward's weights).
void exp_shifted_row(float* z, std::size_t n, std::size_t live, float shift);

// Cross-entropy's row of n logits: when every logit is finite, writes m = max_j x_j and
// l = log sum_j exp(x_j - m) (exp being fast::exp) and returns true; log sum_j exp(x_j) is m + l,
// kept apart because m + l rounds to m's ulp. Otherwise returns false and leaves the row to the
// caller's exact arithmetic (NaN and infinities propagate there).
bool log_sum_exp_finite(const float* x, std::size_t n, float* m, float* l);
// d += scale softmax(x) = scale exp((x_j - m) - l), for a row log_sum_exp_finite accepted.
void add_scaled_softmax(const float* x, std::size_t n, float m, float l, float scale, float* d);
// d = scale softmax(x), the same terms written instead of added; d may be x.
void scaled_softmax(const float* x, std::size_t n, float m, float l, float scale, float* d);

// Layer norm over rows of length C (see ops_nn.cpp for the formulas): y, and each row's mean and
// 1 / sqrt(var + eps); gamma and beta may be null. Row sums use 32 running partial sums (element j
// goes to partial j mod 32) added pairwise at the end, a fixed order that vectorizes.
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                        std::size_t rows, std::size_t C, float eps);
// Layer norm's backward over rows; any of dx, dgamma and dbeta may be null: dx += rstd (dh -
// mean(dh) - xhat mean(dh xhat)) with dh = g gamma (g when gamma is null), and, summed over the
// rows in order, dgamma += g xhat and dbeta += g.
void layer_norm_backward(const float* x, const float* g, const float* gamma, const float* mean, const float* rstd,
                         float* dx, float* dgamma, float* dbeta, std::size_t rows, std::size_t C);

// RMS norm over rows of length C: y = x rstd gamma (x rstd when gamma is null), with each row's
// rstd = 1 / sqrt(mean(x^2) + eps); the row sum uses the 32 partials of layer_norm_forward.
void rms_norm_forward(const float* x, const float* gamma, float* y, float* rstd, std::size_t rows, std::size_t C,
                      float eps);
// RMS norm's backward over rows; dx and dgamma may be null: dx += rstd (dh - xhat mean(dh xhat))
// with xhat = x rstd and dh = g gamma (g when gamma is null), and, summed over the rows in order,
// dgamma += g xhat.
void rms_norm_backward(const float* x, const float* g, const float* gamma, const float* rstd, float* dx, float* dgamma,
                       std::size_t rows, std::size_t C);

// sums[j] += sum over r < rows of x[r * cols + j], adding the rows in order.
void add_column_sums(const float* x, std::size_t rows, std::size_t cols, float* sums);

}  // namespace xgrad::XGRAD_KERNELS_NS
