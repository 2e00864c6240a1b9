// Branch-free float erf and exp that the compiler can vectorize (the C library's erff and expf
// are calls it cannot). Used by GELU, where they took a quarter of a small model's training
// step. Measured against the C library over [-6, 6] in steps of 1e-4: erf within 4.2e-7
// absolute, exp(-x^2/2) within 1.2e-7 relative.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace xgrad::fast {

// erf(x) as x P(x^2) / Q(x^2) on x clamped to [-4, 4] (beyond, erf is +-1 in float).
inline float erf(float x) {
  x = std::min(4.f, std::max(-4.f, x));
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
}

// e^x for x in [-87, 88]: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6 polynomial
// (Cephes' expf), 2^n built in the exponent bits.
inline float exp(float x) {
  x = std::min(88.f, std::max(-87.f, x));
  const float round = 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (x * 1.44269504088896341f + round) - round;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

}  // namespace xgrad::fast
