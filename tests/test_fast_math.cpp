// The vectorizable erf and exp of the GELU, softmax and cross-entropy kernels against the C
// library, in double, at every 1e-4 step of their range.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "xgrad/core/kernels/detail/fast_math.hpp"

TEST_CASE("fast::erf is within 4e-7 of erf over [-6, 6] and exactly +-1 beyond 4", "[kernels][fast_math]") {
  double worst = 0;
  for (int i = -60000; i <= 60000; ++i) {
    const float x = static_cast<float>(i) * 1e-4f;
    worst = std::max(worst, std::fabs(static_cast<double>(xgrad::fast::erf(x)) - std::erf(static_cast<double>(x))));
  }
  INFO("worst absolute error " << worst);
  REQUIRE(worst < 4e-7);
  REQUIRE(worst > 0);  // a polynomial, not the library's erf
  REQUIRE(std::fabs(xgrad::fast::erf(7.f) - 1.f) < 1e-7f);
  REQUIRE(std::fabs(xgrad::fast::erf(-100.f) + 1.f) < 1e-7f);
}

TEST_CASE("fast::exp is within 1e-7 relative of exp over [-87, 88]", "[kernels][fast_math]") {
  double worst = 0;
  for (int i = -870000; i <= 880000; ++i) {
    const float x = static_cast<float>(i) * 1e-4f;
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(static_cast<double>(xgrad::fast::exp(x)) - exact) / exact);
  }
  INFO("worst relative error " << worst);
  REQUIRE(worst < 1e-7);
  REQUIRE(xgrad::fast::exp(0.f) == 1.f);
  REQUIRE(std::isfinite(xgrad::fast::exp(1000.f)));  // clamped to 88, not inf
  REQUIRE(xgrad::fast::exp(-1000.f) > 0.f);          // clamped to -87, not 0
}
