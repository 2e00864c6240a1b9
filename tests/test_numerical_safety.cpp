// Numerical safety: softmax, log_softmax, cross_entropy and layer_norm stay finite and correct
// (values and gradients) for large logits and constant rows; masked softmax and attention with a
// query whose keys are all masked give exact zeros, never NaN; cross_entropy with every target
// ignored is 0 with zero gradient; sigmoid, exp and GELU at extreme inputs. References are
// computed in double in this file. Test cases tagged [bug] pin inputs that once went wrong (see BAD_INPUT.md).
//
// Shapes: N rows, C classes / channels, B batch, T query length, S key length, H heads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/head_importance.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/layers.hpp"

using namespace xgrad;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

// Rows of large logits, C = 4: one +1e4 and the rest -1e4, all equal (large, very negative, zero),
// mixed signs, tiny next to huge, two tied maxima, and large values 1 apart (the differences
// must survive the max shift).
Array large_rows() {
  return Array{{1e4f, -1e4f, -1e4f, -1e4f},  //
               {1e4f, 1e4f, 1e4f, 1e4f},     //
               {-1e4f, -1e4f, -1e4f, -1e4f}, {0.f, 0.f, 0.f, 0.f},       {1e4f, -5e3f, 3e3f, -1e4f},
               {0.f, 1e-4f, -1e4f, 1e4f},    {1e4f, 1e4f, -1e4f, -1e4f}, {9999.f, 1e4f, 9998.f, -1e4f}};
}

// A fixed, non-uniform upstream gradient of the same shape.
Array seed_like(const Array& a) {
  Array g = Array::from_shape(a.shape());
  for (std::size_t i = 0; i < g.size(); ++i)
    g.data()[i] = 0.5f + 0.25f * static_cast<float>(i % 5) - 0.3f * static_cast<float>(i % 3);
  return g;
}

bool all_finite(const Array& a) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a.data()[i])) return false;
  }
  return true;
}

bool all_zero(const Array& a) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a.data()[i] != 0.f) return false;
  }
  return true;
}

// Same shape, every element finite and within rel / abs of the reference.
void require_close(const Array& got, const std::vector<double>& want, double rel, double abs) {
  REQUIRE(got.size() == want.size());
  REQUIRE(all_finite(got));
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("flat index " << i);
    CHECK(got.data()[i] == Approx(want[i]).epsilon(rel).margin(abs));
  }
}

// softmax of one row in double
std::vector<double> softmax_ref(const double* x, std::size_t n) {
  double m = x[0];
  for (std::size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  std::vector<double> y(n);
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += y[i] = std::exp(x[i] - m);
  for (double& v : y) v /= s;
  return y;
}

std::vector<double> as_double(const Array& a) { return std::vector<double>(a.begin(), a.end()); }

}  // namespace

// =============================================================================================
// softmax, log_softmax, cross_entropy with |x| up to 1e4

TEST_CASE("softmax of large logits is exact and its gradient finite", "[numerical][softmax]") {
  const Array x = large_rows();
  const std::size_t N = x.shape()[0], C = x.shape()[1];
  const std::vector<double> xd = as_double(x);
  const Array g = seed_like(x);
  std::vector<double> want_y, want_dx;
  for (std::size_t r = 0; r < N; ++r) {
    const std::vector<double> y = softmax_ref(xd.data() + r * C, C);
    double dot = 0;
    for (std::size_t j = 0; j < C; ++j) dot += g(r, j) * y[j];
    for (std::size_t j = 0; j < C; ++j) {
      want_y.push_back(y[j]);
      want_dx.push_back(y[j] * (g(r, j) - dot));  // dx = y (g - sum g y)
    }
  }
  Tensor t(x, true);
  Tensor y = softmax(t);
  require_close(y.value(), want_y, 1e-5, 1e-7);
  // the closed forms spelled out
  CHECK(y.value()(0, 0) == 1.f);
  CHECK(y.value()(0, 1) == 0.f);
  CHECK(y.value()(1, 2) == Approx(0.25));
  CHECK(y.value()(6, 0) == Approx(0.5));
  CHECK(y.value()(7, 1) == Approx(1.0 / (1.0 + std::exp(-1.0) + std::exp(-2.0))));
  y.backward(g);
  require_close(t.grad(), want_dx, 1e-4, 1e-6);

  // along axis 0 as well (the strided path)
  Tensor tt(Array(xt::transpose(x)), true);
  Tensor y0 = softmax(tt, 0);
  REQUIRE(all_finite(y0.value()));
  CHECK(y0.value()(0, 0) == 1.f);
  sum(y0 * Tensor(Array(xt::transpose(g)))).backward();
  REQUIRE(all_finite(tt.grad()));
}

TEST_CASE("log_softmax of large logits is exact and its gradient finite", "[numerical][log_softmax]") {
  const Array x = large_rows();
  const std::size_t N = x.shape()[0], C = x.shape()[1];
  const std::vector<double> xd = as_double(x);
  const Array g = seed_like(x);
  std::vector<double> want_y, want_dx;
  for (std::size_t r = 0; r < N; ++r) {
    const std::vector<double> p = softmax_ref(xd.data() + r * C, C);
    double gs = 0;
    for (std::size_t j = 0; j < C; ++j) gs += g(r, j);
    for (std::size_t j = 0; j < C; ++j) {
      want_y.push_back(0);                     // filled in below
      want_dx.push_back(g(r, j) - p[j] * gs);  // dx = g - softmax * sum g
    }
    // log p_j = x_j - max - log sum exp(x - max), in double (exp underflows, the log does not)
    double m = xd[r * C];
    for (std::size_t j = 1; j < C; ++j) m = std::max(m, xd[r * C + j]);
    double s = 0;
    for (std::size_t j = 0; j < C; ++j) s += std::exp(xd[r * C + j] - m);
    for (std::size_t j = 0; j < C; ++j) want_y[r * C + j] = xd[r * C + j] - m - std::log(s);
  }
  Tensor t(x, true);
  Tensor y = log_softmax(t);
  require_close(y.value(), want_y, 1e-6, 1e-5);
  CHECK(y.value()(0, 0) == 0.f);
  CHECK(y.value()(0, 1) == -2e4f);
  CHECK(y.value()(2, 3) == Approx(-std::log(4.0)));
  y.backward(g);
  require_close(t.grad(), want_dx, 1e-5, 1e-6);
}

TEST_CASE("cross_entropy of large logits is finite, exact and has the closed-form gradient",
          "[numerical][cross_entropy]") {
  const Array x = large_rows();
  const std::size_t N = x.shape()[0], C = x.shape()[1];
  const std::vector<double> xd = as_double(x);
  // targets at the maximum, at a -1e4 entry, and between
  const IndexArray targets{0, 1, 2, 3, 3, 2, 1, 0};
  double total = 0;
  std::vector<double> want_dx;
  for (std::size_t r = 0; r < N; ++r) {
    double m = xd[r * C];
    for (std::size_t j = 1; j < C; ++j) m = std::max(m, xd[r * C + j]);
    double s = 0;
    for (std::size_t j = 0; j < C; ++j) s += std::exp(xd[r * C + j] - m);
    total += m + std::log(s) - xd[r * C + targets(r)];
    const std::vector<double> p = softmax_ref(xd.data() + r * C, C);
    for (std::size_t j = 0; j < C; ++j)
      want_dx.push_back((p[j] - (static_cast<std::int64_t>(j) == targets(r) ? 1.0 : 0.0)) / N);
  }
  Tensor t(x, true);
  Tensor loss = cross_entropy(t, targets);
  REQUIRE(std::isfinite(loss.item()));
  CHECK(loss.item() == Approx(total / N).epsilon(1e-6));
  loss.backward();
  require_close(t.grad(), want_dx, 1e-5, 1e-7);

  // a single row where the target sits at -1e4 and another logit at +1e4: loss 2e4
  Tensor one(Array{{1e4f, -1e4f}}, true);
  Tensor l1 = cross_entropy(one, IndexArray{1});
  CHECK(l1.item() == Approx(2e4));
  l1.backward();
  CHECK(one.grad()(0, 0) == Approx(1.0));
  CHECK(one.grad()(0, 1) == Approx(-1.0));
}

TEST_CASE("softmax of rows with -inf entries (masked_fill idiom) is finite with zero weight there",
          "[numerical][softmax]") {
  Tensor x(Array{{1e4f, 2.f, -1e4f, 0.f}, {-3.f, 1.f, 1.f, 5.f}}, true);
  const Mask blocked{{false, true, false, true}, {true, false, false, true}};
  Tensor y = softmax(masked_fill(x, blocked, -kInf));
  REQUIRE(all_finite(y.value()));
  CHECK(y.value()(0, 1) == 0.f);
  CHECK(y.value()(0, 3) == 0.f);
  CHECK(y.value()(0, 0) == 1.f);
  CHECK(y.value()(1, 1) == Approx(0.5));
  y.backward(seed_like(y.value()));
  REQUIRE(all_finite(x.grad()));
  CHECK(x.grad()(0, 1) == 0.f);
  CHECK(x.grad()(1, 0) == 0.f);
}

// =============================================================================================
// layer_norm: large values and constant rows

namespace {

// layer_norm forward and backward of one (N, C) batch in double.
struct LnRef {
  std::vector<double> y, dx, dgamma, dbeta;
};

LnRef layer_norm_ref(const Array& x, const Array& gamma, const Array& beta, const Array& g, double eps) {
  const std::size_t N = x.shape()[0], C = x.shape()[1];
  LnRef r;
  r.dgamma.assign(C, 0);
  r.dbeta.assign(C, 0);
  for (std::size_t i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (std::size_t j = 0; j < C; ++j) m += x(i, j);
    m /= C;
    for (std::size_t j = 0; j < C; ++j) v += (x(i, j) - m) * (x(i, j) - m);
    v /= C;
    const double rs = 1 / std::sqrt(v + eps);
    std::vector<double> h(C), dh(C);
    double sdh = 0, sdhh = 0;
    for (std::size_t j = 0; j < C; ++j) {
      h[j] = (x(i, j) - m) * rs;
      r.y.push_back(h[j] * gamma(j) + beta(j));
      dh[j] = g(i, j) * gamma(j);
      sdh += dh[j];
      sdhh += dh[j] * h[j];
      r.dgamma[j] += g(i, j) * h[j];
      r.dbeta[j] += g(i, j);
    }
    for (std::size_t j = 0; j < C; ++j) r.dx.push_back(rs * (dh[j] - sdh / C - h[j] * sdhh / C));
  }
  return r;
}

}  // namespace

TEST_CASE("layer_norm of large values matches the double reference, values and gradients", "[numerical][layer_norm]") {
  const Array x = large_rows();
  const Array gamma{1.5f, -0.5f, 2.f, 0.25f}, beta{0.1f, -0.2f, 0.3f, 0.4f};
  const Array g = seed_like(x);
  const LnRef ref = layer_norm_ref(x, gamma, beta, g, 1e-5);
  Tensor t(x, true), tg(gamma, true), tb(beta, true);
  Tensor y = layer_norm(t, tg, tb);
  require_close(y.value(), ref.y, 1e-4, 1e-4);
  y.backward(g);
  require_close(t.grad(), ref.dx, 1e-3, 1e-3);
  require_close(tg.grad(), ref.dgamma, 1e-4, 1e-4);
  require_close(tb.grad(), ref.dbeta, 1e-6, 1e-6);
}

TEST_CASE("layer_norm of a constant row gives beta and a finite gradient", "[numerical][layer_norm]") {
  // constant rows: values that are exact in float and values that are not (0.1, -3.3333)
  const Array x{{0.1f, 0.1f, 0.1f, 0.1f, 0.1f},
                {1e4f, 1e4f, 1e4f, 1e4f, 1e4f},
                {-1e4f, -1e4f, -1e4f, -1e4f, -1e4f},
                {-3.3333f, -3.3333f, -3.3333f, -3.3333f, -3.3333f},
                {0.f, 0.f, 0.f, 0.f, 0.f}};
  const Array gamma{2.f, -1.f, 0.5f, 3.f, 1.f}, beta{0.5f, -1.f, 2.f, 0.f, 3.f};
  const Array g = seed_like(x);
  const LnRef ref = layer_norm_ref(x, gamma, beta, g, 1e-5);
  Tensor t(x, true), tg(gamma, true), tb(beta, true);
  Tensor y = layer_norm(t, tg, tb);
  REQUIRE(all_finite(y.value()));
  for (std::size_t i = 0; i < x.shape()[0]; ++i) {
    for (std::size_t j = 0; j < x.shape()[1]; ++j) {
      INFO("row " << i << ", column " << j);
      CHECK(y.value()(i, j) == Approx(beta(j)).margin(1e-4));
    }
  }
  y.backward(g);
  // dx = rstd (dh - mean dh) with rstd = 1 / sqrt(eps): large (about 316 |dh|), but finite
  require_close(t.grad(), ref.dx, 1e-3, 1e-2);
  require_close(tg.grad(), ref.dgamma, 1e-3, 1e-3);  // xhat = 0: about 0

  // without the affine part the output is 0
  Tensor u(x, true);
  Tensor z = layer_norm(u, Tensor(), Tensor());
  for (std::size_t i = 0; i < z.size(); ++i) CHECK(z.value().data()[i] == Approx(0.0).margin(1e-4));
  sum(z * z).backward();
  REQUIRE(all_finite(u.grad()));
}

TEST_CASE("the LayerNorm module on constant rows gives its bias and finite parameter gradients",
          "[numerical][layer_norm]") {
  nn::LayerNorm ln(3);
  ln.bias.mutable_value() = Array{1.f, -2.f, 0.5f};
  Tensor x(Array{{{7.f, 7.f, 7.f}, {-1e4f, -1e4f, -1e4f}}}, true);  // (1, 2, 3)
  Tensor y = ln.forward(x);
  for (std::size_t t = 0; t < 2; ++t)
    for (std::size_t j = 0; j < 3; ++j) CHECK(y.value()(0, t, j) == Approx(ln.bias.value()(j)).margin(1e-4));
  sum(y * y).backward();
  REQUIRE(all_finite(x.grad()));
  REQUIRE(all_finite(ln.weight.grad()));
  REQUIRE(all_finite(ln.bias.grad()));
}

// =============================================================================================
// Masked softmax and attention with every key of a query masked

TEST_CASE("masked_softmax of a fully masked slice is exactly zero, forward and backward",
          "[numerical][masked_softmax]") {
  Tensor x(Array{{1e4f, -1e4f, 3.f}, {1.f, 2.f, 3.f}, {1e4f, 1e4f, -1e4f}}, true);
  const Mask m{{true, true, true}, {false, true, false}, {false, true, false}};
  Tensor y = masked_softmax(x, m);
  REQUIRE(all_finite(y.value()));
  for (std::size_t j = 0; j < 3; ++j) CHECK(y.value()(0, j) == 0.f);
  CHECK(y.value()(1, 1) == 0.f);
  CHECK(y.value()(1, 0) + y.value()(1, 2) == Approx(1.0));
  CHECK(y.value()(2, 0) == 1.f);  // the masked +1e4 does not take any weight
  CHECK(y.value()(2, 1) == 0.f);
  y.backward(seed_like(y.value()));
  REQUIRE(all_finite(x.grad()));
  for (std::size_t j = 0; j < 3; ++j) CHECK(x.grad()(0, j) == 0.f);
  CHECK(x.grad()(1, 1) == 0.f);

  // every slice masked, through a broadcast mask along axis 0
  Tensor z(Array{{1.f, 2.f}, {3.f, 4.f}}, true);
  const Mask column = xt::ones<bool>({2, 1});
  Tensor w = masked_softmax(z, column, 0);
  REQUIRE(all_zero(w.value()));
  sum(w).backward();
  REQUIRE(all_zero(z.grad()));
}

namespace {

// Attention weights of one query (b, t) over all heads and keys.
bool query_weights_zero(const Array& w, std::size_t b, std::size_t t) {
  for (std::size_t h = 0; h < w.shape()[1]; ++h)
    for (std::size_t s = 0; s < w.shape()[3]; ++s)
      if (w(b, h, t, s) != 0.f) return false;
  return true;
}

void require_rows_sum_to_one(const Array& w, std::size_t b, std::size_t t) {
  for (std::size_t h = 0; h < w.shape()[1]; ++h) {
    double s = 0;
    for (std::size_t k = 0; k < w.shape()[3]; ++k) s += w(b, h, t, k);
    CHECK(s == Approx(1.0));
  }
}

// Backward through output and weights; every gradient must be finite.
void require_finite_backward(nn::MultiHeadAttention& mha, const Tensor& x, const nn::AttentionOutput& out) {
  REQUIRE(all_finite(out.output.value()));
  REQUIRE(all_finite(out.weights.value()));
  Tensor loss = sum(out.output * out.output) + sum(out.weights * out.weights);
  loss.backward();
  REQUIRE(all_finite(x.grad()));
  for (const auto& [name, p] : mha.named_parameters()) {
    INFO("parameter " << name);
    REQUIRE(p.has_grad());
    REQUIRE(all_finite(p.grad()));
  }
}

}  // namespace

TEST_CASE("MultiHeadAttention with a query whose keys are all masked gives zero weights and no NaN",
          "[numerical][attention][gemm]") {
  Generator gen(21);
  const std::size_t B = 2, T = 3, C = 8;
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post, nn::Norm::none}) {
    INFO("norm " << static_cast<int>(norm));
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(C, 2).dropout(0.1f).norm(norm), gen);
    mha.eval();
    Tensor x(gen.normal({B, T, C}, 0.f, 1.f), true);

    SECTION("key_padding_mask pads every key of one batch element") {
      nn::AttentionMask mask;
      mask.key_padding_mask = Mask{{false, false, true}, {true, true, true}};
      const nn::AttentionOutput out = mha.forward(x, mask);
      for (std::size_t t = 0; t < T; ++t) {
        CHECK(query_weights_zero(out.weights.value(), 1, t));
        require_rows_sum_to_one(out.weights.value(), 0, t);
      }
      require_finite_backward(mha, x, out);
    }
    SECTION("causal mask with the first key padded: query 0 sees nothing") {
      nn::AttentionMask mask;
      mask.causal = true;
      mask.key_padding_mask = Mask{{true, false, false}, {false, false, false}};
      const Tensor gates = Tensor::ones({2}, true);  // the head-importance path too
      const nn::HookHandle gate = inspect::gate_heads(mha, gates);
      const nn::AttentionOutput out = mha.forward(x, mask);
      CHECK(query_weights_zero(out.weights.value(), 0, 0));
      require_rows_sum_to_one(out.weights.value(), 0, 1);
      require_rows_sum_to_one(out.weights.value(), 1, 0);
      require_finite_backward(mha, x, out);
      REQUIRE(all_finite(gates.grad()));
    }
    SECTION("attn_mask blocks every key of one query, in training mode with dropout") {
      mha.train();
      nn::AttentionMask mask;
      mask.attn_mask = Mask{{false, true, false}, {true, true, true}, {false, false, false}};  // (T, S)
      const nn::AttentionOutput out = mha.forward(x, mask);
      CHECK(query_weights_zero(out.weights.value(), 0, 1));
      CHECK(query_weights_zero(out.weights.value(), 1, 1));
      require_rows_sum_to_one(out.weights.value(), 1, 2);
      require_finite_backward(mha, x, out);
    }
  }
}

TEST_CASE("MultiHeadAttention stays finite for large inputs", "[numerical][attention][gemm]") {
  Generator gen(22);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f).norm(nn::Norm::none), gen);
  Tensor x(gen.normal({1, 4, 8}, 0.f, 1e3f), true);  // scores of order 1e6
  nn::AttentionMask mask;
  mask.causal = true;
  const nn::AttentionOutput out = mha.forward(x, mask);
  for (std::size_t t = 0; t < 4; ++t) require_rows_sum_to_one(out.weights.value(), 0, t);
  require_finite_backward(mha, x, out);
}

// =============================================================================================
// cross_entropy with every target ignored

TEST_CASE("cross_entropy with every target ignored is 0 with zero gradient", "[numerical][cross_entropy][gemm]") {
  SECTION("default ignore_index") {
    Tensor logits(Array{{1e4f, -1e4f, 0.f}, {1.f, 2.f, 3.f}}, true);
    Tensor loss = cross_entropy(logits, IndexArray{-100, -100});
    REQUIRE(loss.item() == 0.f);
    loss.backward();
    // no gradient reaches the logits (optimizers skip them), or a zero one
    if (logits.has_grad()) REQUIRE(all_zero(logits.grad()));
  }
  SECTION("a custom ignore_index, 3-D logits") {
    Tensor logits(Array::from_shape({2, 2, 3}), true);
    logits.mutable_value().fill(5.f);
    Tensor loss = cross_entropy(logits, IndexArray{{7, 7}, {7, 7}}, /*ignore_index=*/7);
    REQUIRE(loss.item() == 0.f);
    loss.backward();
    if (logits.has_grad()) REQUIRE(all_zero(logits.grad()));
  }
  SECTION("inside a larger graph the gradient is exactly the other term's") {
    Generator gen(23);
    nn::Linear head(4, 3, true, gen);
    Tensor h(gen.normal({2, 4}, 0.f, 1.f), true);
    Tensor loss = cross_entropy(head.forward(h), IndexArray{-100, -100}) + sum(h) * 0.5f;
    REQUIRE(loss.item() == Approx(0.5 * xt::sum(h.value())()));
    loss.backward();
    for (std::size_t i = 0; i < h.size(); ++i) CHECK(h.grad().data()[i] == 0.5f);
    if (head.weight.has_grad()) REQUIRE(all_zero(head.weight.grad()));
  }
  SECTION("some targets ignored: the mean is over the others only") {
    Tensor logits(Array{{0.f, 0.f}, {1e4f, -1e4f}}, true);
    Tensor loss = cross_entropy(logits, IndexArray{0, -100});
    CHECK(loss.item() == Approx(std::log(2.0)));
    loss.backward();
    CHECK(logits.grad()(1, 0) == 0.f);
    CHECK(logits.grad()(1, 1) == 0.f);
    CHECK(logits.grad()(0, 0) == Approx(-0.5));
  }
}

// =============================================================================================
// cross_entropy with non-finite logits: rows of finite logits take a vector kernel, the others
// the exact arithmetic, and the two must agree on what each row gives

TEST_CASE("cross_entropy rows with -inf, +inf or NaN logits follow exact arithmetic", "[numerical][cross_entropy]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  SECTION("a -inf logit (a class ruled out) adds nothing and gets an exactly zero gradient") {
    const Array x{{0.5f, -inf, 2.f, 1.f}, {1.f, 2.f, 3.f, 4.f}};
    const IndexArray targets{2, 0};
    Tensor t(x, true);
    Tensor loss = cross_entropy(t, targets);
    double want = 0;
    std::vector<double> want_dx;
    for (std::size_t r = 0; r < 2; ++r) {
      double m = -1e30, s = 0;
      for (std::size_t j = 0; j < 4; ++j) m = std::max(m, static_cast<double>(x(r, j)));
      for (std::size_t j = 0; j < 4; ++j) s += std::exp(static_cast<double>(x(r, j)) - m);
      want += m + std::log(s) - x(r, targets(r));
      for (std::size_t j = 0; j < 4; ++j) {
        const double p = std::exp(static_cast<double>(x(r, j)) - m) / s;
        want_dx.push_back((p - (static_cast<std::int64_t>(j) == targets(r) ? 1.0 : 0.0)) / 2);
      }
    }
    CHECK(loss.item() == Approx(want / 2).epsilon(1e-6));
    loss.backward();
    REQUIRE(t.grad()(0, 1) == 0.f);
    require_close(t.grad(), want_dx, 1e-5, 1e-7);
  }
  SECTION("a NaN logit makes the loss and the row's gradient NaN") {
    Tensor t(Array{{1.f, nan, 0.f}, {1.f, 2.f, 3.f}}, true);
    Tensor loss = cross_entropy(t, IndexArray{0, 1});
    REQUIRE(std::isnan(loss.item()));
    loss.backward();
    REQUIRE(std::isnan(t.grad()(0, 1)));
  }
  SECTION("a +inf logit away from the target makes the loss infinite") {
    Tensor t(Array{{1.f, inf, 0.f}}, true);
    REQUIRE(std::isinf(cross_entropy(t, IndexArray{0}).item()));
  }
}

// =============================================================================================
// sigmoid, exp, GELU at extreme inputs

TEST_CASE("sigmoid at +-100 and +-1e4 is finite with finite gradient", "[numerical][sigmoid]") {
  Tensor x(Array{-1e4f, -100.f, -20.f, 0.f, 20.f, 100.f, 1e4f}, true);
  Tensor y = sigmoid(x);
  REQUIRE(all_finite(y.value()));
  CHECK(y.value()(0) == 0.f);
  CHECK(y.value()(1) >= 0.f);
  CHECK(y.value()(1) < 1e-40f);
  CHECK(y.value()(3) == 0.5f);
  CHECK(y.value()(5) == 1.f);
  CHECK(y.value()(6) == 1.f);
  CHECK(y.value()(2) == Approx(1.0 / (1.0 + std::exp(20.0))).epsilon(1e-5));
  sum(y).backward();
  REQUIRE(all_finite(x.grad()));
  for (float d : x.grad()) {
    CHECK(d >= 0.f);
    CHECK(d <= 0.25f);
  }
}

TEST_CASE("exp at -100 is tiny and finite, at +100 it overflows to +inf, never NaN", "[numerical][exp]") {
  Tensor x(Array{-1e4f, -100.f, 0.f, 88.f, 100.f}, true);
  Tensor y = exp(x);
  CHECK(y.value()(0) == 0.f);
  CHECK(std::isfinite(y.value()(1)));
  // e^-100 = 3.72e-44 is a denormal in float (steps of 1.4e-45): within one step of it
  CHECK(std::abs(static_cast<double>(y.value()(1)) - std::exp(-100.0)) <= 1.5e-45);
  CHECK(y.value()(2) == 1.f);
  CHECK(std::isfinite(y.value()(3)));
  CHECK(y.value()(4) == kInf);  // e^100 is beyond float's range (about e^88.7)
  sum(y).backward();
  for (float d : x.grad()) CHECK(!std::isnan(d));
  CHECK(x.grad()(4) == kInf);
}

// ops.hpp says nothing about exp's range; the task accepts the overflow to inf only if documented.
TEST_CASE("exp's overflow to +inf for x above about 88.7 is documented in core/autograd/ops.hpp",
          "[numerical][exp][bug]") {
  std::ifstream in(std::string(XGRAD_SOURCE_DIR) + "/core/autograd/ops.hpp");
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  // the declaration of exp and the comment lines directly above it
  std::string doc;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find("Tensor exp(const Tensor& a") == std::string::npos) continue;
    doc = lines[i];
    for (std::size_t k = i; k-- > 0 && lines[k].find("//") != std::string::npos;) doc = lines[k] + "\n" + doc;
  }
  REQUIRE(!doc.empty());
  std::string lower = doc;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  INFO("documentation of exp in core/autograd/ops.hpp:\n" << doc);
  CHECK((lower.find("overflow") != std::string::npos || lower.find("inf") != std::string::npos));
}

TEST_CASE("GELU at +-1e4 is finite with limits x and 0 and a finite gradient", "[numerical][gelu]") {
  for (GeluApprox approx : {GeluApprox::exact, GeluApprox::tanh}) {
    INFO((approx == GeluApprox::exact ? "exact" : "tanh"));
    Tensor x(Array{-1e4f, -100.f, -30.f, 0.f, 30.f, 100.f, 1e4f}, true);
    Tensor y = gelu(x, approx);
    REQUIRE(all_finite(y.value()));
    CHECK(y.value()(0) == Approx(0.0).margin(1e-6));
    CHECK(y.value()(1) == Approx(0.0).margin(1e-6));
    CHECK(y.value()(2) == Approx(0.0).margin(1e-6));
    CHECK(y.value()(3) == 0.f);
    CHECK(y.value()(4) == Approx(30.0));
    CHECK(y.value()(5) == Approx(100.0));
    CHECK(y.value()(6) == Approx(1e4));
    sum(y).backward();
    REQUIRE(all_finite(x.grad()));
    CHECK(x.grad()(0) == Approx(0.0).margin(1e-6));
    CHECK(x.grad()(2) == Approx(0.0).margin(1e-6));
    CHECK(x.grad()(3) == Approx(0.5));
    CHECK(x.grad()(4) == Approx(1.0));
    CHECK(x.grad()(6) == Approx(1.0));
  }
}

// The tanh form's derivative has x (1 - tanh^2 u) (1 + 3 * 0.044715 x^2): for |x| > 1.8e19 the
// last factor overflows to inf and 0 * inf gives NaN, while the forward value is fine.
TEST_CASE("GELU gradients stay finite for finite inputs beyond 1e19", "[numerical][gelu][bug]") {
  for (GeluApprox approx : {GeluApprox::exact, GeluApprox::tanh}) {
    INFO((approx == GeluApprox::exact ? "exact" : "tanh"));
    Tensor x(Array{-1e30f, -1e20f, 1e20f, 1e30f}, true);
    Tensor y = gelu(x, approx);
    CHECK(all_finite(y.value()));
    sum(y).backward();
    INFO("gradient " << x.grad());
    CHECK(all_finite(x.grad()));
  }
}

// The attention softmax's exp is a fast polynomial that clamps its input; a NaN score must still
// come out as NaN (it used to become a weight of about 1e-38 and vanish).
TEST_CASE("a NaN in q makes that query's attention weights NaN, not a silent finite value",
          "[numerical][attention][bug][gemm]") {
  const std::size_t B = 1, T = 4, C = 4;
  Generator gen(31);
  Array q = gen.normal({B, T, C}, 0.f, 1.f), k = gen.normal({B, T, C}, 0.f, 1.f);
  q(0, 2, 1) = std::numeric_limits<float>::quiet_NaN();
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    const Array w = attention_weights(Tensor(q), Tensor(k), 2, 0.5f, causal).value();  // (B, H, T, S)
    for (std::size_t s = 0; s < T; ++s) {
      CHECK(std::isnan(w(0, 0, 2, s)));     // head 0 reads channel 1: its query 2 is NaN
      CHECK(std::isfinite(w(0, 1, 2, s)));  // head 1 reads channels 2, 3: untouched
      CHECK(std::isfinite(w(0, 0, 1, s)));  // other queries of head 0: untouched
    }
  }
}
