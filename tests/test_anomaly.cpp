// Anomaly mode: a NaN or Inf in a forward value or a gradient is reported with the op that
// produced it and the tensor's name; without the guard nothing is checked.
#include <catch2/catch.hpp>

#include <cmath>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"

using namespace xgrad;

TEST_CASE("anomaly mode names the op and the tensor behind a NaN in a forward value") {
  Tensor x(Array{1.f, -2.f, 3.f}, true);
  x.set_name("x");
  {
    AnomalyGuard guard;
    REQUIRE_THROWS_WITH(log(x), Catch::Contains("anomaly: forward of log") && Catch::Contains("'x'") &&
                                    Catch::Contains("flat position 1"));
  }
  // Off again: the NaN passes silently, as without the guard.
  REQUIRE_FALSE(anomaly_enabled());
  const Tensor y = log(x);
  REQUIRE(std::isnan(y.value()(1)));
}

TEST_CASE("anomaly mode names the op whose backward produced an infinite gradient") {
  Tensor x(Array{0.f, 4.f}, true);
  x.set_name("x");
  AnomalyGuard guard;
  const Tensor loss = sum(sqrt(x));  // sqrt(0) = 0 is finite; its derivative 1 / (2 sqrt 0) is not
  REQUIRE_THROWS_WITH(loss.backward(), Catch::Contains("anomaly: backward of sqrt") && Catch::Contains("'x'") &&
                                           Catch::Contains("flat position 0"));
}

TEST_CASE("anomaly mode catches a NaN that a hook puts into a gradient") {
  Tensor x(Array{1.f, 2.f}, true);
  AnomalyGuard guard;
  Tensor h = mul(x, 3.f);
  h.set_name("h");
  h.register_hook([](Array& g) { g(1) = std::nanf(""); });
  const Tensor loss = sum(tanh(h));
  REQUIRE_THROWS_WITH(loss.backward(), Catch::Contains("'h'") && Catch::Contains("after its hooks ran"));
}

TEST_CASE("anomaly guards nest and restore the previous mode, also through exceptions") {
  REQUIRE_FALSE(anomaly_enabled());
  {
    AnomalyGuard outer;
    {
      AnomalyGuard inner;
      REQUIRE(anomaly_enabled());
    }
    REQUIRE(anomaly_enabled());
  }
  REQUIRE_FALSE(anomaly_enabled());
  try {
    AnomalyGuard guard;
    throw std::runtime_error("leaving the scope");
  } catch (const std::runtime_error&) {
  }
  REQUIRE_FALSE(anomaly_enabled());
}

TEST_CASE("with finite values anomaly mode changes nothing", "[gemm]") {
  Tensor a(Array{{0.5f, -1.f}, {2.f, 0.25f}}, true), b(Array{{1.f, 2.f}, {3.f, 4.f}}, true);
  const Tensor plain = sum(softmax(matmul(a, b)));
  plain.backward();
  const Array ga = a.grad();
  a.zero_grad();
  AnomalyGuard guard;
  const Tensor checked = sum(softmax(matmul(a, b)));
  checked.backward();
  REQUIRE(checked.item() == plain.item());
  REQUIRE(a.grad() == ga);
}
