// gated_unit (SwiGLU, GeGLU): hand-computed values and gradients, agreement with PyTorch on
// tests/fixtures/gated.json (make_gated_fixtures.py writes it), extreme and non-finite inputs against
// the unfused ops, and the Errors bad input gets. Gradcheck is in test_ops_gradcheck.cpp, the
// thread-count check in test_parallel.cpp and the targets' bits in test_kernel_targets.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "fixture.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Array row(const std::vector<float>& v) {
  Array a = Array::from_shape({v.size()});
  for (std::size_t i = 0; i < v.size(); ++i) a(i) = v[i];
  return a;
}

// Same NaN-ness, equal (infinities included), or within 1e-6 of b relative to max(1, |b|).
void require_close(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float x = a.data()[i], y = b.data()[i];
    INFO("element " << i << ": " << x << " against " << y);
    REQUIRE(std::isnan(x) == std::isnan(y));
    if (std::isnan(x) || x == y) continue;
    REQUIRE(std::fabs(x - y) <= 1e-6f * std::max(1.f, std::fabs(y)));
  }
}

struct Grads {
  Array y, dgate, dup;
};

// Value and gradients of f(gate, up) under the upstream gradient g.
template <class F>
Grads run(F f, const Array& gate, const Array& up, const Array& g) {
  const Tensor tg(gate, true), tu(up, true);
  const Tensor y = f(tg, tu);
  y.backward(g);
  return {y.value(), tg.grad(), tu.grad()};
}

}  // namespace

TEST_CASE("gated_unit: hand-computed values and gradients for SiLU, GELU and tanh GELU", "[gated]") {
  const Array ones = row({1.f, 1.f});
  // silu(1) = 0.7310585786, silu(-2) = -0.2384058440; silu' = s (1 + x (1 - s)): 0.9276705127, -0.0907842487
  Grads s = run([](const Tensor& g, const Tensor& u) { return gated_unit(g, u, GatedActivation::silu); },
                row({1.f, -2.f}), row({2.f, 0.5f}), ones);
  CHECK(s.y(0) == Approx(1.4621171573).epsilon(1e-6));
  CHECK(s.y(1) == Approx(-0.1192029220).epsilon(1e-6));
  CHECK(s.dgate(0) == Approx(1.8553410254).epsilon(1e-6));
  CHECK(s.dgate(1) == Approx(-0.0453921244).epsilon(1e-6));
  CHECK(s.dup(0) == Approx(0.7310585786).epsilon(1e-6));
  CHECK(s.dup(1) == Approx(-0.2384058440).epsilon(1e-6));
  // gelu(1) = Phi(1) = 0.8413447461, gelu(-1) = -0.1586552539; gelu' = Phi + x phi: 1.0833154706, -0.0833154706
  Grads e = run([](const Tensor& g, const Tensor& u) { return gated_unit(g, u, GatedActivation::gelu); },
                row({1.f, -1.f}), row({3.f, 2.f}), row({1.f, -2.f}));
  CHECK(e.y(0) == Approx(2.5240342383).epsilon(1e-6));
  CHECK(e.y(1) == Approx(-0.3173105078).epsilon(1e-6));
  CHECK(e.dgate(0) == Approx(3.2499464118).epsilon(1e-6));
  CHECK(e.dgate(1) == Approx(0.3332618824).epsilon(1e-6));  // -2 * 2 * -0.0833154706
  CHECK(e.dup(0) == Approx(0.8413447461).epsilon(1e-6));
  CHECK(e.dup(1) == Approx(0.3173105078).epsilon(1e-6));  // -2 * -0.1586552539
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) at 1 and -1: 0.8411919906, -0.1588080094
  Grads t = run([](const Tensor& g, const Tensor& u) { return gated_unit(g, u, GatedActivation::gelu_tanh); },
                row({1.f, -1.f}), ones, ones);
  CHECK(t.y(0) == Approx(0.8411919906).epsilon(1e-6));
  CHECK(t.y(1) == Approx(-0.1588080094).epsilon(1e-6));
  CHECK(t.dup(1) == Approx(-0.1588080094).epsilon(1e-6));
  // gelu_tanh'(x) + gelu_tanh'(-x) = 1, as for every x Phi(x)-shaped activation
  CHECK(t.dgate(0) + t.dgate(1) == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("gated_unit: only the inputs that require grad get one, and the shape is kept", "[gated]") {
  Generator gen(3);
  const Tensor gate(gen.normal({2, 3, 4}, 0.f, 1.f), true), up(gen.normal({2, 3, 4}, 0.f, 1.f));
  const Tensor y = gated_unit(gate, up, GatedActivation::silu);
  REQUIRE(y.shape() == Shape{2, 3, 4});
  y.backward(xt::ones<float>(y.shape()));
  // dgate = up silu'(gate), against sigmoid's own formula
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const float x = gate.value().data()[i], s = 1.f / (1.f + std::exp(-x));
    CHECK(gate.grad().data()[i] == Approx(up.value().data()[i] * (s + x * s * (1.f - s))).margin(1e-6));
  }
  CHECK_THROWS_WITH(up.grad(), "Tensor::grad: no gradient (not reached by backward yet)");
}

TEST_CASE("torch agreement: gated_unit against F.silu(g) * u and F.gelu(g) * u in float32", "[gated][torch]") {
  static const json j = testing::load_fixture("gated.json");
  const json& cases = j.at("cases");
  REQUIRE(cases.size() == 3);
  const std::vector<std::pair<const char*, GatedActivation>> acts = {
      {"silu", GatedActivation::silu}, {"gelu", GatedActivation::gelu}, {"gelu_tanh", GatedActivation::gelu_tanh}};
  for (const auto& [name, act] : acts) {
    INFO("case " << name);
    const json& c = cases.at(name);
    const Array want = testing::to_array(c.at("output"));
    Grads r = run([act = act](const Tensor& g, const Tensor& u) { return gated_unit(g, u, act); },
                  testing::to_array(c.at("inputs").at("gate")), testing::to_array(c.at("inputs").at("up")),
                  testing::to_array(c.at("grad_out")));
    REQUIRE(r.y.shape() == want.shape());
    CHECK(testing::rel_error(r.y, want) <= 1e-6);
    // The tanh GELU's slope near saturation: where torch's float32 tanh rounds to -1 (sech^2 = 0),
    // the kernel's tanh is one ulp inside and keeps sech^2 ~ 1e-7, closer to the exact value; that
    // element differs by 1.0e-6 of the largest gradient.
    const double tol = act == GatedActivation::gelu_tanh ? 2e-6 : 1e-6;
    CHECK(testing::rel_error(r.dgate, testing::to_array(c.at("grads").at("gate"))) <= tol);
    CHECK(testing::rel_error(r.dup, testing::to_array(c.at("grads").at("up"))) <= 1e-6);
  }
}

TEST_CASE("gated_unit: extreme, infinite and NaN inputs give what the unfused ops give", "[gated]") {
  const Array gate = row({1e4f, -1e4f, kInf, -kInf, kNaN, 100.f, -100.f, 50.f, -50.f, 1.f, 0.f});
  const Array up = row({1.5f, 1.5f, 1.5f, 1.5f, 1.5f, -2.f, -2.f, 0.5f, 0.5f, kNaN, 1.f});
  const Array g = row({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, -1.f, -1.f, 1.f, 1.f});
  const std::vector<std::pair<GatedActivation, Tensor (*)(const Tensor&)>> acts = {
      {GatedActivation::silu, [](const Tensor& x) { return mul(x, sigmoid(x)); }},
      {GatedActivation::gelu, [](const Tensor& x) { return gelu(x); }},
      {GatedActivation::gelu_tanh, [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }}};
  for (const auto& [act, unfused] : acts) {
    INFO("activation " << static_cast<int>(act));
    Grads fused = run([act = act](const Tensor& a, const Tensor& b) { return gated_unit(a, b, act); }, gate, up, g);
    Grads ref = run([f = unfused](const Tensor& a, const Tensor& b) { return mul(f(a), b); }, gate, up, g);
    require_close(fused.y, ref.y);
    require_close(fused.dgate, ref.dgate);
    require_close(fused.dup, ref.dup);
    CHECK(fused.y(0) == 1.5e4f);    // act(1e4) = 1e4
    CHECK(fused.y(1) == 0.f);       // act(-1e4) = 0, no overflow on the way
    CHECK(fused.y(2) == kInf);      // act(inf) = inf
    CHECK(std::isnan(fused.y(3)));  // -inf * 0
    CHECK(std::isnan(fused.y(4)));  // NaN gate
    CHECK(std::isnan(fused.y(9)));  // NaN up
    CHECK(std::isnan(fused.dgate(4)));
    CHECK(fused.dgate(0) == 1.5f);                       // act'(1e4) = 1
    CHECK(fused.dgate(1) == Approx(0.0).margin(1e-30));  // act'(-1e4) = 0
  }
}

TEST_CASE("bad input: gated_unit names the op and the shapes", "[gated][bad]") {
  const Tensor a(xt::ones<float>({2, 3})), b(xt::ones<float>({3, 2})), c(xt::ones<float>({1, 3}));
  REQUIRE_THROWS_WITH(gated_unit(a, b, GatedActivation::silu),
                      "gated_unit: gate (2, 3) and up (3, 2) must have the same shape");
  REQUIRE_THROWS_WITH(gated_unit(a, c, GatedActivation::gelu),
                      "gated_unit: gate (2, 3) and up (1, 3) must have the same shape");
  REQUIRE_THROWS_WITH(gated_unit(Tensor(), a, GatedActivation::silu), "gated_unit: gate is an undefined tensor");
  REQUIRE_THROWS_WITH(gated_unit(a, Tensor(), GatedActivation::gelu_tanh), "gated_unit: up is an undefined tensor");
  REQUIRE_THROWS_WITH(gated_unit(a, a, static_cast<GatedActivation>(7)), "gated_unit: unknown activation 7");
}
