// flash_attention, the tiled kernel that never forms the (B, H, T, S) weights: agreement with
// attend(dropout(attention_weights(...))) forward and backward (with causal masks, ragged tiles,
// dropout regenerated in backward, rows with no key), finite differences, thread counts and bad
// options.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <xtensor/xview.hpp>

#include "random_tensors.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;

namespace {

using Ins = std::vector<Tensor>;

using testing::randn;

// The blocked keys of a bottom-right causal mask: query t sees keys s <= S - T + t.
Mask causal_mask(std::size_t T, std::size_t S) {
  Mask m = xt::zeros<bool>(Shape{1, 1, T, S});
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t s = 0; s < S; ++s) m(0, 0, t, s) = s + T > S + t;
  return m;
}

// The unfused formula flash_attention computes.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t heads, float scale, bool causal,
                 float p = 0.f, Generator* gen = nullptr) {
  const std::size_t T = q.shape()[1], S = k.shape()[1];
  Tensor w;
  if (causal && T != S) {
    const Mask m = causal_mask(T, S);
    w = attention_weights(q, k, heads, scale, false, &m);
  } else {
    w = attention_weights(q, k, heads, scale, causal);
  }
  if (p > 0.f) w = dropout(w, p, true, *gen);
  return attend(w, v, heads);
}

double max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - b.data()[i]));
  return m;
}

struct Run {
  Array out, dq, dk, dv;
};

// Forward and the gradients of sum(out * r) for a fixed r.
template <class F>
Run run(F f, const Tensor& q, const Tensor& k, const Tensor& v) {
  Tensor q1(q.value(), true), k1(k.value(), true), v1(v.value(), true);
  const Tensor out = f(q1, k1, v1);
  Generator g(99);
  const Tensor r(g.normal(out.shape(), 0.f, 1.f));
  sum(out * r).backward();
  return {out.value(), q1.grad(), k1.grad(), v1.grad()};
}

void require_close(const Run& a, const Run& b, double tol) {
  CHECK(max_abs_diff(a.out, b.out) < tol);
  CHECK(max_abs_diff(a.dq, b.dq) < tol);
  CHECK(max_abs_diff(a.dk, b.dk) < tol);
  CHECK(max_abs_diff(a.dv, b.dv) < tol);
}

struct KernelThreads {
  explicit KernelThreads(int n) : previous(num_threads()) { set_num_threads(n); }
  ~KernelThreads() { set_num_threads(previous); }
  int previous;
};

}  // namespace

TEST_CASE("flash_attention agrees with the unfused ops forward and backward, over tile shapes and masks",
          "[flash_attention][gemm]") {
  struct Case {
    std::size_t B, T, S, H, C, tq, tk;
    bool causal;
  };
  const std::vector<Case> cases = {
      {2, 7, 7, 2, 8, 3, 2, true},      // ragged tiles on the diagonal
      {2, 7, 7, 2, 8, 64, 64, false},   // one tile
      {1, 33, 33, 4, 16, 8, 16, true},  // tiles of unequal sizes
      {2, 5, 9, 1, 4, 2, 4, false},     // cross-attention, S > T
      {1, 4, 10, 2, 8, 1, 3, true},     // a cache's next 4 positions: query t sees 0 .. 6 + t
      {1, 130, 130, 2, 16, 64, 64, true},
  };
  for (const Case& c : cases) {
    INFO("B " << c.B << " T " << c.T << " S " << c.S << " H " << c.H << " tiles " << c.tq << "x" << c.tk
              << (c.causal ? " causal" : ""));
    const Tensor q = randn({c.B, c.T, c.C}, 1), k = randn({c.B, c.S, c.C}, 2), v = randn({c.B, c.S, c.C}, 3);
    const float scale = 1.f / std::sqrt(float(c.C / c.H));
    FlashAttentionOptions o;
    o.query_tile = c.tq;
    o.key_tile = c.tk;
    const Run tiled =
        run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, c.H, scale, c.causal, o); }, q, k, v);
    const Run full = run([&](auto& a, auto& b, auto& d) { return reference(a, b, d, c.H, scale, c.causal); }, q, k, v);
    require_close(tiled, full, 2e-5);
  }
}

// The blocked keys of a bottom-right causal mask narrowed to a sliding window: query t (position
// S - T + t) sees keys S - T + t - window + 1 .. S - T + t.
Mask window_mask(std::size_t T, std::size_t S, std::size_t window) {
  Mask m = causal_mask(T, S);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t s = 0; s < S; ++s) m(0, 0, t, s) = m(0, 0, t, s) || s + T + window <= S + t;
  return m;
}

TEST_CASE(
    "a sliding window in flash_attention and attention_weights is the causal mask narrowed to the last keys, "
    "forward, backward and finite differences",
    "[flash_attention][gemm]") {
  struct Case {
    std::size_t T, S, window, tq, tk;
    float dropout;
  };
  const std::vector<Case> cases = {
      {9, 9, 3, 2, 2, 0.f},    // tiles wholly before the window are skipped
      {9, 9, 3, 4, 4, 0.f},    // the window starts inside a tile
      {9, 9, 1, 3, 2, 0.f},    // each query sees itself only
      {9, 9, 20, 4, 4, 0.f},   // a window wider than the keys: the causal mask
      {4, 10, 3, 1, 3, 0.f},   // a cache's next 4 positions
      {17, 17, 5, 4, 8, 0.3f}  // with dropout, its mask regenerated
  };
  for (const Case& c : cases) {
    INFO("T " << c.T << " S " << c.S << " window " << c.window << " tiles " << c.tq << "x" << c.tk);
    const Tensor q = randn({2, c.T, 8}, 21), k = randn({2, c.S, 8}, 22), v = randn({2, c.S, 8}, 23);
    const Mask m = window_mask(c.T, c.S, c.window);
    Generator g1(5), g2(5);
    FlashAttentionOptions o;
    o.query_tile = c.tq;
    o.key_tile = c.tk;
    o.window = c.window;
    o.dropout = c.dropout;
    o.generator = &g1;
    const Run tiled =
        run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.5f, true, o); }, q, k, v);
    const Run full = run(
        [&](auto& a, auto& b, auto& d) {
      Tensor w = attention_weights(a, b, 2, 0.5f, false, &m);
      if (c.dropout > 0.f) w = dropout(w, c.dropout, true, g2);
      return attend(w, d, 2);
        },
        q, k, v);
    require_close(tiled, full, 2e-5);
    if (c.T == c.S && c.dropout == 0.f) {  // the full kernel's own window (top-left, as its causal mask)
      const Run fused =
          run([&](auto& a, auto& b,
                  auto& d) { return attend(attention_weights(a, b, 2, 0.5f, true, nullptr, c.window), d, 2); },
              q, k, v);
      require_close(fused, full, 2e-5);
    }
    // the window changes the result unless it covers every key
    const Run causal = run([&](auto& a, auto& b, auto& d) { return reference(a, b, d, 2, 0.5f, true); }, q, k, v);
    if (c.window < c.S && c.dropout == 0.f) CHECK(max_abs_diff(causal.out, tiled.out) > 1e-3);
  }
  const Tensor q = randn({2, 6, 4}, 24), k = randn({2, 6, 4}, 25), v = randn({2, 6, 4}, 26);
  FlashAttentionOptions o;
  o.query_tile = 2;
  o.key_tile = 2;
  o.window = 3;
  REQUIRE_GRADCHECK([&](const Ins& in) { return flash_attention(in[0], in[1], in[2], 2, 0.7f, true, o); }, {q, k, v});
  REQUIRE_GRADCHECK([&](const Ins& in) { return attention_weights(in[0], in[1], 2, 0.7f, true, nullptr, 2); }, {q, k});
  CHECK_THROWS_WITH(attention_weights(q, k, 2, 0.7f, false, nullptr, 2),
                    Catch::Contains("attention_weights: a window of 2 needs the causal mask"));
  o.window = 4;
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, 0.7f, false, o),
                    Catch::Contains("flash_attention: a window of 4 needs the causal mask"));
}

TEST_CASE("flash_attention's dropout is the mask dropout draws on the weights, regenerated in backward",
          "[flash_attention][gemm]") {
  const Tensor q = randn({2, 19, 8}, 4), k = randn({2, 19, 8}, 5), v = randn({2, 19, 8}, 6);
  for (bool causal : {false, true}) {
    Generator g1(7), g2(7);
    FlashAttentionOptions o;
    o.query_tile = 4;
    o.key_tile = 8;
    o.dropout = 0.3f;
    o.generator = &g1;
    const Run tiled =
        run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.5f, causal, o); }, q, k, v);
    const Run full =
        run([&](auto& a, auto& b, auto& d) { return reference(a, b, d, 2, 0.5f, causal, 0.3f, &g2); }, q, k, v);
    require_close(tiled, full, 2e-5);
    CHECK(g1.next_u64() == g2.next_u64());  // one draw each
    // and the mask is not all ones: without dropout the output differs
    const Run plain =
        run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.5f, causal); }, q, k, v);
    CHECK(max_abs_diff(plain.out, tiled.out) > 1e-2);
  }
}

TEST_CASE("flash_attention passes finite differences, causal, cross and with q, k and v one tensor",
          "[flash_attention][gradcheck][gemm]") {
  const Tensor q = randn({2, 5, 4}, 8), k = randn({2, 6, 4}, 9), v = randn({2, 6, 4}, 10);
  FlashAttentionOptions o;
  o.query_tile = 2;
  o.key_tile = 4;
  REQUIRE_GRADCHECK([&](const Ins& in) { return flash_attention(in[0], in[1], in[2], 2, 0.7f, false, o); }, {q, k, v});
  REQUIRE_GRADCHECK([&](const Ins& in) { return flash_attention(in[0], in[1], in[2], 2, 0.7f, true, o); }, {q, k, v});
  REQUIRE_GRADCHECK([&](const Ins& in) { return flash_attention(in[0], in[0], in[0], 1, 0.5f, true, o); }, {q});
  // dropout with a fresh generator of one seed at every call: a fixed mask, so a function
  REQUIRE_GRADCHECK(
      [&](const Ins& in) {
    Generator g(11);
    FlashAttentionOptions d = o;
    d.dropout = 0.25f;
    d.generator = &g;
    return flash_attention(in[0], in[1], in[2], 2, 0.7f, true, d);
      },
      {q, k, v});
}

TEST_CASE("flash_attention gives a query with no key a zero context and no gradient, never NaN",
          "[flash_attention][gemm]") {
  // T > S with the bottom-right causal mask: queries 0 .. T - S - 1 see no key.
  const Tensor q = randn({1, 6, 4}, 12), k = randn({1, 3, 4}, 13), v = randn({1, 3, 4}, 14);
  FlashAttentionOptions o;
  o.query_tile = 4;
  o.key_tile = 2;
  const Run tiled = run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.5f, true, o); }, q, k, v);
  const Run full = run([&](auto& a, auto& b, auto& d) { return reference(a, b, d, 2, 0.5f, true); }, q, k, v);
  require_close(tiled, full, 2e-5);
  for (std::size_t t = 0; t < 3; ++t)
    for (std::size_t c = 0; c < 4; ++c) {
      CHECK(tiled.out(0, t, c) == 0.f);
      CHECK(tiled.dq(0, t, c) == 0.f);
    }
  for (float x : tiled.out) CHECK(std::isfinite(x));
}

TEST_CASE("flash_attention gives NaN where a query's scores hold NaN, as the unfused softmax does",
          "[flash_attention][gemm]") {
  Tensor q = randn({1, 3, 4}, 15);
  const Tensor k = randn({1, 3, 4}, 16), v = randn({1, 3, 4}, 17);
  q.mutable_value()(0, 1, 0) = std::numeric_limits<float>::quiet_NaN();
  const Tensor out = flash_attention(q, k, v, 2, 0.5f, false);
  const Tensor ref = reference(q, k, v, 2, 0.5f, false);
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(std::isnan(out.value()(0, 1, c)));  // head 0 of query 1
    CHECK(std::isnan(ref.value()(0, 1, c)));
  }
  CHECK(std::isfinite(out.value()(0, 0, 0)));
  CHECK(std::isfinite(out.value()(0, 1, 2)));  // head 1 never sees the NaN
}

TEST_CASE("flash_attention gives the same bits on one and two threads", "[flash_attention][threads][gemm]") {
  const Tensor q = randn({2, 100, 32}, 18), k = randn({2, 100, 32}, 19), v = randn({2, 100, 32}, 20);
  FlashAttentionOptions o;
  o.query_tile = 16;
  o.key_tile = 32;
  o.dropout = 0.1f;
  auto f = [&](auto& a, auto& b, auto& d) {
    Generator g(21);
    FlashAttentionOptions p = o;
    p.generator = &g;
    return flash_attention(a, b, d, 4, 0.3f, true, p);
  };
  Run one, two;
  {
    KernelThreads threads(1);
    one = run(f, q, k, v);
  }
  {
    KernelThreads threads(2);
    two = run(f, q, k, v);
  }
  CHECK(max_abs_diff(one.out, two.out) == 0);
  CHECK(max_abs_diff(one.dq, two.dq) == 0);
  CHECK(max_abs_diff(one.dk, two.dk) == 0);
  CHECK(max_abs_diff(one.dv, two.dv) == 0);
}

TEST_CASE("flash_attention with keys reads the first keys positions of k and v, as the same op on those alone",
          "[flash_attention][cache][gemm]") {
  // k and v hold 37 positions per entry, the last 9 of which hold garbage (a cache's room): keys 28
  // gives the bits of flash_attention on the first 28 alone, and the garbage positions' gradients are zero.
  // 9 queries: more than a decoding step's, so that bf16 multiplies in bf16.
  const Tensor q = randn({2, 9, 16}, 30), k = randn({2, 37, 16}, 31), v = randn({2, 37, 16}, 32);
  const std::size_t S = 28;
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const bool causal : {false, true}) {
      INFO((precision == Precision::bf16 ? "bf16" : "fp32") << (causal ? ", causal" : ""));
      const AutocastGuard guard(precision);
      FlashAttentionOptions o;
      o.query_tile = 2;
      o.key_tile = 8;
      FlashAttentionOptions room = o;
      room.keys = S;
      const Run in_room =
          run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.4f, causal, room); }, q, k, v);
      const Run alone = run([&](auto& a, auto& b, auto& d) { return flash_attention(a, b, d, 2, 0.4f, causal, o); }, q,
                            slice(k, 1, 0, S), slice(v, 1, 0, S));
      CHECK(max_abs_diff(in_room.out, alone.out) == 0);
      CHECK(max_abs_diff(in_room.dq, alone.dq) == 0);
      const Array dk = xt::view(in_room.dk, xt::all(), xt::range(0, S), xt::all());
      const Array dv = xt::view(in_room.dv, xt::all(), xt::range(0, S), xt::all());
      CHECK(max_abs_diff(dk, alone.dk) == 0);
      CHECK(max_abs_diff(dv, alone.dv) == 0);
      CHECK(xt::amax(xt::abs(xt::view(in_room.dk, xt::all(), xt::range(S, 37), xt::all())))() == 0.f);
      CHECK(xt::amax(xt::abs(xt::view(in_room.dv, xt::all(), xt::range(S, 37), xt::all())))() == 0.f);
    }
  }
  FlashAttentionOptions past;
  past.keys = 38;
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, 1.f, false, past),
                    Catch::Matchers::Contains("flash_attention: keys 38 is more than the 37 positions k and v hold"));
}

TEST_CASE("flash_attention names itself and the value for shapes, tiles and dropout out of range",
          "[flash_attention][bad_input]") {
  const Tensor q = randn({1, 4, 8}, 22), k = randn({1, 5, 8}, 23), v = randn({1, 5, 8}, 24);
  using Catch::Matchers::Contains;
  FlashAttentionOptions o;
  o.query_tile = 0;
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, 1.f, false, o), Contains("flash_attention: query_tile 0"));
  o.query_tile = 64;
  o.key_tile = 1025;
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, 1.f, false, o), Contains("key_tile 1025") && Contains("[1, 1024]"));
  o.key_tile = 64;
  o.dropout = 1.f;
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, 1.f, false, o), Contains("flash_attention: dropout: probability 1"));
  CHECK_THROWS_WITH(flash_attention(q, k, v, 3, 1.f), Contains("flash_attention: 8 channels do not split into 3"));
  CHECK_THROWS_WITH(flash_attention(q, k, randn({1, 4, 8}, 25), 2, 1.f), Contains("flash_attention: k of shape"));
  CHECK_THROWS_WITH(flash_attention(q, Tensor(), v, 2, 1.f), Contains("flash_attention: input is an undefined"));
  CHECK_THROWS_WITH(flash_attention(q, k, v, 2, std::numeric_limits<float>::infinity()),
                    Contains("flash_attention: scale inf"));
}
