// rotary_embedding: hand-computed values, the rotation's invariants (pair norms, position 0, the
// relative-position property, cached and shared positions), gradcheck, agreement with PyTorch on
// tests/fixtures/rotary.json (make_rotary_fixtures.py writes it) and the Errors bad input gets.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <xtensor/xview.hpp>

#include "fixture.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

Array randn(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  return g.normal(shape, 0.f, 1.f);
}

// Positions 0 .. T-1 from `start`, shape (1, T).
IndexArray positions_from(std::int64_t start, std::size_t T) {
  IndexArray p = IndexArray::from_shape({1, T});
  for (std::size_t t = 0; t < T; ++t) p(0, t) = start + static_cast<std::int64_t>(t);
  return p;
}

// The one position p as (B, T) = (1, 1) (a braced {{p}} is ambiguous to xtensor).
IndexArray at(std::int64_t p) { return positions_from(p, 1); }

double dot(const Array& a, const Array& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a.data()[i]) * b.data()[i];
  return s;
}

}  // namespace

TEST_CASE("rotary_embedding turns channel i with i + D/2 of each head by position * theta^(-2i/D)", "[rotary]") {
  // Two heads of width 4 at position 2: pairs (0, 2) turn by 2 rad, pairs (1, 3) by 2 * 10000^(-1/2).
  Array x = Array::from_shape({1, 1, 8});
  for (std::size_t i = 0; i < 8; ++i) x.data()[i] = static_cast<float>(i + 1);
  const Array y = rotary_embedding(Tensor(x), 2, at(2)).value();
  const double a0 = 2.0, a1 = 2.0 * 0.01;
  for (std::size_t h = 0; h < 2; ++h) {
    INFO("head " << h);
    const double x0 = x(0, 0, 4 * h), x1 = x(0, 0, 4 * h + 1), x2 = x(0, 0, 4 * h + 2), x3 = x(0, 0, 4 * h + 3);
    CHECK(y(0, 0, 4 * h) == Approx(x0 * std::cos(a0) - x2 * std::sin(a0)).epsilon(1e-6).margin(1e-6));
    CHECK(y(0, 0, 4 * h + 1) == Approx(x1 * std::cos(a1) - x3 * std::sin(a1)).epsilon(1e-6).margin(1e-6));
    CHECK(y(0, 0, 4 * h + 2) == Approx(x2 * std::cos(a0) + x0 * std::sin(a0)).epsilon(1e-6).margin(1e-6));
    CHECK(y(0, 0, 4 * h + 3) == Approx(x3 * std::cos(a1) + x1 * std::sin(a1)).epsilon(1e-6).margin(1e-6));
  }
  // rotary_dim 2 of 4: only channels 0 and 1 turn, by 2 rad; channels 2 and 3 pass through.
  const Array p = rotary_embedding(Tensor(x), 2, at(2), 10000.f, 2).value();
  CHECK(p(0, 0, 0) == Approx(1.0 * std::cos(a0) - 2.0 * std::sin(a0)).epsilon(1e-6).margin(1e-6));
  CHECK(p(0, 0, 1) == Approx(2.0 * std::cos(a0) + 1.0 * std::sin(a0)).epsilon(1e-6).margin(1e-6));
  CHECK(p(0, 0, 2) == 3.f);
  CHECK(p(0, 0, 3) == 4.f);
  CHECK(p(0, 0, 7) == 8.f);
}

TEST_CASE("rotary_embedding keeps each pair's norm and is the identity at position 0", "[rotary]") {
  const std::size_t B = 2, T = 5, H = 3, D = 10, r = 6;
  const Array x = randn({B, T, H * D}, 11);
  IndexArray pos = {{0, 1, 2, 3, 4}, {0, 0, 9, 40, 1000}};
  const Array y = rotary_embedding(Tensor(x), H, pos, 10000.f, r).value();
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t o = h * D;
        for (std::size_t i = 0; i < r / 2; ++i) {
          const double nx = std::hypot(x(b, t, o + i), x(b, t, o + i + r / 2));
          const double ny = std::hypot(y(b, t, o + i), y(b, t, o + i + r / 2));
          CHECK(ny == Approx(nx).epsilon(1e-6));
        }
        for (std::size_t i = r; i < D; ++i) CHECK(y(b, t, o + i) == x(b, t, o + i));
        if (pos(b, t) == 0) {
          for (std::size_t i = 0; i < D; ++i) CHECK(y(b, t, o + i) == x(b, t, o + i));
        }
      }
    }
  }
  // A rotation that is not the identity: position 1 moves the first pair.
  CHECK(y(0, 1, 0) != x(0, 1, 0));
}

TEST_CASE("rotary_embedding: q at m and k at n have a dot product that depends only on m - n", "[rotary]") {
  const std::size_t D = 16;
  const Tensor q(randn({1, 1, D}, 3)), k(randn({1, 1, D}, 4));
  const auto score = [&](std::int64_t m, std::int64_t n) {
    return dot(rotary_embedding(q, 1, at(m)).value(), rotary_embedding(k, 1, at(n)).value());
  };
  const double s3 = score(3, 0);
  CHECK(score(5, 2) == Approx(s3).epsilon(1e-5));
  CHECK(score(103, 100) == Approx(s3).epsilon(1e-5));
  CHECK(score(0, 0) == Approx(dot(q.value(), k.value())).epsilon(1e-6));
  const double s2 = score(2, 0);
  CHECK(score(12, 10) == Approx(s2).epsilon(1e-5));
  CHECK(std::abs(s2 - s3) > 1e-3);  // another offset, another score
}

TEST_CASE("rotary_embedding: per-row positions serve the cache, (T) and (1, T) positions are shared by every row",
          "[rotary]") {
  const std::size_t H = 2, D = 8;
  const Array x = randn({2, 6, H * D}, 21);
  const Array full = rotary_embedding(Tensor(x), H, IndexArray{{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}}).value();
  // The last three tokens alone, positions continuing from a cache of three.
  const Array tail = xt::view(x, xt::all(), xt::range(3, 6), xt::all());
  IndexArray cached = {{3, 4, 5}, {3, 4, 5}};
  const Array y = rotary_embedding(Tensor(tail), H, cached).value();
  REQUIRE((y == Array(xt::view(full, xt::all(), xt::range(3, 6), xt::all()))));
  // (T) and (1, T) positions are every row's.
  REQUIRE((rotary_embedding(Tensor(tail), H, IndexArray{3, 4, 5}).value() == y));
  REQUIRE((rotary_embedding(Tensor(tail), H, positions_from(3, 3)).value() == y));
  // Rows with their own positions: row 1 padded on the left by one token.
  IndexArray padded = {{0, 1, 2}, {0, 0, 1}};
  const Array p = rotary_embedding(Tensor(tail), H, padded).value();
  const Array row1_from0 =
      rotary_embedding(Tensor(Array(xt::view(tail, xt::range(1, 2), xt::range(1, 3), xt::all()))), H, IndexArray{0, 1})
          .value();
  REQUIRE((Array(xt::view(p, xt::range(1, 2), xt::range(1, 3), xt::all())) == row1_from0));
}

TEST_CASE("rotary_embedding passes gradcheck, full and partial", "[rotary][gradcheck]") {
  IndexArray pos = {{0, 3, 7}, {2, 2, 50}};
  for (std::size_t r : {std::size_t{0}, std::size_t{4}}) {
    INFO("rotary_dim " << r);
    const GradcheckResult res =
        gradcheck([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], 2, pos, 100.f, r); },
                  {Tensor(randn({2, 3, 12}, 5), true)});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked > 0);
  }
}

TEST_CASE(
    "rotary_embedding with scaled frequencies: linear divides them by the factor, dynamic changes nothing within the "
    "trained context, llama3 keeps the fast ones, and each passes gradcheck",
    "[rotary][gradcheck]") {
  using Type = RopeScaling::Type;
  // One head of 8 at position 6, theta 10000: inverse frequencies 1, 0.1, 0.01, 0.001.
  const Array x = randn({1, 1, 8}, 31);
  const auto turned = [&](const RopeScaling& s, std::int64_t p = 6) {
    return rotary_embedding(Tensor(x), 1, at(p), 10000.f, 0, s).value();
  };
  const Array plain = turned({});
  // linear: the angle of frequency i at position p is p f_i / factor; channel 0 turns by 6 / 2 rad
  const Array linear = turned({Type::linear, 2.f});
  CHECK(linear(0, 0, 0) == Approx(x(0, 0, 0) * std::cos(3.0) - x(0, 0, 4) * std::sin(3.0)).margin(1e-6));
  // dynamic: positions up to original_max_len turn as without scaling; past it, the base grows
  CHECK(bool(turned({Type::dynamic, 2.f, 1.f, 4.f, 7}) == plain));
  const Array dynamic = turned({Type::dynamic, 2.f, 1.f, 4.f, 6});  // length 7 > 6
  CHECK(dynamic(0, 0, 0) == plain(0, 0, 0));                        // frequency 1 whatever the base
  CHECK(std::abs(dynamic(0, 0, 1) - plain(0, 0, 1)) > 1e-4);
  // llama3 with original context 128, factors 1 and 4: wavelength 2 pi (channel 0) is kept
  const Array llama3 = turned({Type::llama3, 8.f, 1.f, 4.f, 128});
  CHECK(llama3(0, 0, 0) == plain(0, 0, 0));
  CHECK(std::abs(llama3(0, 0, 2) - plain(0, 0, 2)) > 1e-5);
  // each is the same rotation for its gradient
  IndexArray pos = {{0, 3, 7}, {2, 2, 50}};
  for (const RopeScaling& s : {RopeScaling{Type::linear, 3.f}, RopeScaling{Type::dynamic, 2.f, 1.f, 4.f, 10},
                               RopeScaling{Type::llama3, 8.f, 1.f, 4.f, 128}}) {
    const GradcheckResult res =
        gradcheck([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], 2, pos, 100.f, 4, s); },
                  {Tensor(randn({2, 3, 12}, 5), true)});
    INFO(res.report);
    REQUIRE(res.ok);
  }
  CHECK_THROWS_WITH(turned({Type::linear, 0.5f}),
                    Catch::Contains("rotary_embedding: rope scaling factor 0.5 must be >= 1"));
  CHECK_THROWS_WITH(turned({Type::llama3, 8.f, 1.f, 4.f, 0}),
                    Catch::Contains("rotary_embedding: rope scaling needs original_max_len > 0"));
}

TEST_CASE("rotary_embedding reuses a call's angles only for the same positions, theta, rotary_dim and scaling",
          "[rotary]") {
  // Each call right after the first differs from it in one thing; each must give what it gives as
  // the first call on a thread of its own (whose angles are made afresh).
  using Type = RopeScaling::Type;
  const Array x = randn({1, 3, 8}, 41);
  struct Call {
    IndexArray positions;
    float theta;
    std::size_t rotary_dim;
    RopeScaling scaling;
  };
  const Call first{positions_from(5, 3), 100.f, 0, {Type::llama3, 8.f, 1.f, 4.f, 64}};
  std::vector<Call> calls(7, first);
  calls[0].positions = positions_from(6, 3);
  calls[1].theta = 101.f;
  calls[2].rotary_dim = 4;
  calls[3].scaling.factor = 2.f;
  calls[4].scaling.low_freq_factor = 2.f;
  calls[5].scaling.high_freq_factor = 3.f;
  calls[6].scaling.original_max_len = 128;
  const auto turn = [&](const Call& c) {
    return rotary_embedding(Tensor(x), 1, c.positions, c.theta, c.rotary_dim, c.scaling).value();
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    INFO("call " << i);
    Array alone;
    std::thread([&] { alone = turn(calls[i]); }).join();
    turn(first);
    const Array after = turn(calls[i]);
    CHECK(bool(after == alone));
    CHECK_FALSE(bool(after == turn(first)));
  }
}

// ---------------------------------------------------------------------------------------------
// Agreement with PyTorch

TEST_CASE("torch agreement: rotary_embedding against Hugging Face's rotate_half in float32", "[rotary][torch]") {
  static const json j = testing::load_fixture("rotary.json");
  const json& cases = j.at("cases");
  REQUIRE(cases.size() == 4);
  for (const auto& [name, c] : cases.items()) {
    INFO("case " << name);
    const Tensor x(testing::to_array(c.at("inputs").at("x")), true);
    const Tensor y = rotary_embedding(x, c.at("heads").get<std::size_t>(), testing::to_index_array(c.at("positions")),
                                      c.at("theta").get<float>(), c.at("rotary_dim").get<std::size_t>());
    const Array want = testing::to_array(c.at("output"));
    REQUIRE(y.shape() == want.shape());
    CHECK(testing::rel_error(y.value(), want) <= 1e-6);
    y.backward(testing::to_array(c.at("grad_out")));
    CHECK(testing::rel_error(x.grad(), testing::to_array(c.at("grads").at("x"))) <= 1e-6);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST_CASE("bad input: rotary_embedding names the op and the value", "[rotary][bad]") {
  const Tensor x(randn({2, 3, 8}, 1));
  const IndexArray pos = {{0, 1, 2}, {0, 1, 2}};
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, 10000.f, 3),
                      "rotary_embedding: rotary_dim 3 must be even and at most the head width 4");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, 10000.f, 6),
                      "rotary_embedding: rotary_dim 6 must be even and at most the head width 4");
  REQUIRE_THROWS_WITH(rotary_embedding(Tensor(randn({1, 1, 6}, 1)), 2, at(0)),
                      "rotary_embedding: the head width 3 is odd; rotary_dim 0 (the whole head) needs it even");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 3, pos), "rotary_embedding: 8 channels do not split into 3 heads");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 0, pos), "rotary_embedding: 8 channels do not split into 0 heads");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, 0.f), "rotary_embedding: theta must be finite and > 0, got 0");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, -5.f), "rotary_embedding: theta must be finite and > 0, got -5");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, std::numeric_limits<float>::infinity()),
                      "rotary_embedding: theta must be finite and > 0, got inf");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, pos, std::numeric_limits<float>::quiet_NaN()),
                      Catch::StartsWith("rotary_embedding: theta must be finite and > 0, got "));
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, IndexArray{{0, 1}, {0, 1}}),
                      "rotary_embedding: positions must be (B, T) = (2, 3), (1, T) or (T) = (3), got (2, 2)");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, IndexArray{0, 1}),
                      "rotary_embedding: positions must be (B, T) = (2, 3), (1, T) or (T) = (3), got (2)");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, IndexArray{{{0, 1, 2}}, {{0, 1, 2}}}),
                      "rotary_embedding: positions must be (B, T) = (2, 3), (1, T) or (T) = (3), got (2, 1, 3)");
  REQUIRE_THROWS_WITH(rotary_embedding(x, 2, IndexArray{{0, 1, 2}, {0, -1, 2}}),
                      "rotary_embedding: position -1 at flat index 4 is negative");
  REQUIRE_THROWS_WITH(rotary_embedding(Tensor(randn({2, 8}, 1)), 2, pos),
                      "rotary_embedding: x must be (B, T, C), got (2, 8)");
  REQUIRE_THROWS_WITH(rotary_embedding(Tensor(), 2, pos), "rotary_embedding: x is an undefined tensor");
}
