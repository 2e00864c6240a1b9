// Rotary position embedding on the projections' layout (B, T, H*D), heads side by side in the
// channels as the attention ops take q and k. The pairing is rotate_half's: in each head, channel
// i < r/2 turns with channel i + r/2 by the angle position * theta^(-2i/r).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

struct RotaryShape {
  std::size_t B, T, H, D, C, r;
};

RotaryShape check_rotary(const Tensor& x, std::size_t heads, const IndexArray& positions, float theta,
                         std::size_t rotary_dim) {
  if (!x.defined()) fail("rotary_embedding: x is an undefined tensor");
  const Shape& s = x.shape();
  if (s.size() != 3) fail("rotary_embedding: x must be (B, T, C), got ", shape_str(s));
  if (heads == 0 || s[2] % heads != 0) {
    fail("rotary_embedding: ", s[2], " channels do not split into ", heads, " heads");
  }
  const std::size_t D = s[2] / heads;
  if (rotary_dim == 0 && D % 2 != 0) {
    fail("rotary_embedding: the head width ", D, " is odd; rotary_dim 0 (the whole head) needs it even");
  }
  const std::size_t r = rotary_dim == 0 ? D : rotary_dim;
  if (r % 2 != 0 || r > D) {
    fail("rotary_embedding: rotary_dim ", r, " must be even and at most the head width ", D);
  }
  if (!(std::isfinite(theta) && theta > 0.f)) fail("rotary_embedding: theta must be finite and > 0, got ", theta);
  const Shape ps(positions.shape().begin(), positions.shape().end());
  if (ps != Shape{s[0], s[1]} && ps != Shape{1, s[1]} && ps != Shape{s[1]}) {
    fail("rotary_embedding: positions must be (B, T) = (", s[0], ", ", s[1], "), (1, T) or (T) = (", s[1], "), got ",
         shape_str(ps));
  }
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (positions.data()[i] < 0) {
      fail("rotary_embedding: position ", positions.data()[i], " at flat index ", i, " is negative");
    }
  }
  return {s[0], s[1], heads, D, s[2], r};
}

// cos and sin of every position and frequency, (P, r/2) each, P = positions.size(): B*T for positions
// per row, T for positions every row shares (row q of x reads table row q % P). As the Hugging Face float32
// reference: inv_freq = 1 / theta^(2i/r) and the angle position * inv_freq are rounded to float;
// cos and sin of that float angle are evaluated in double and rounded once.
struct Table {
  std::size_t rows;
  std::vector<float> cos, sin;
};

// inv_freq, scaled as RopeScaling says; `length` is the call's max position + 1 (dynamic).
std::vector<float> frequencies(std::size_t r, float theta, const RopeScaling& s, std::size_t length) {
  using Type = RopeScaling::Type;
  if (s.type == Type::dynamic && length > s.original_max_len) {
    const double n = static_cast<double>(s.original_max_len), f = s.factor, rd = static_cast<double>(r);
    theta = static_cast<float>(theta * std::pow(f * static_cast<double>(length) / n - (f - 1), rd / (rd - 2)));
  }
  std::vector<float> inv_freq(r / 2);
  for (std::size_t i = 0; i < r / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(r);
    inv_freq[i] = 1.f / std::pow(theta, e);
  }
  if (s.type == Type::linear) {
    for (float& f : inv_freq) f /= s.factor;
  } else if (s.type == Type::llama3) {
    const float n = static_cast<float>(s.original_max_len), low = s.low_freq_factor, high = s.high_freq_factor;
    const float low_wavelen = n / low, high_wavelen = n / high;
    for (float& f : inv_freq) {
      const float wavelen = static_cast<float>(2 * 3.141592653589793) / f;  // 2 math.pi / inv_freq
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (n / wavelen - low) / (high - low);
        f = (1.f - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

// What a table was made from: two calls with the same key get the same table.
struct TableKey {
  std::size_t r = 0;
  float theta = 0.f;
  RopeScaling scaling;
  std::vector<std::int64_t> positions;
  bool same(std::size_t r2, float theta2, const RopeScaling& s, const IndexArray& p) const {
    return r == r2 && theta == theta2 && scaling.type == s.type && scaling.factor == s.factor &&
           scaling.low_freq_factor == s.low_freq_factor && scaling.high_freq_factor == s.high_freq_factor &&
           scaling.original_max_len == s.original_max_len && positions.size() == p.size() &&
           std::equal(positions.begin(), positions.end(), p.data());
  }
};

std::shared_ptr<const Table> make_table(const RotaryShape& d, const IndexArray& positions, float theta,
                                        const RopeScaling& scaling) {
  const std::size_t half = d.r / 2, rows = positions.size();
  const std::int64_t last = positions.size() ? *std::max_element(positions.begin(), positions.end()) : 0;
  const std::vector<float> inv_freq = frequencies(d.r, theta, scaling, static_cast<std::size_t>(last) + 1);
  // A theta far below 1 gives frequencies (or angles) past float32: cos and sin of them are NaN.
  const float top_freq = *std::max_element(inv_freq.begin(), inv_freq.end());
  const std::int64_t top_pos = positions.size() ? *std::max_element(positions.begin(), positions.end()) : 0;
  if (!std::isfinite(static_cast<float>(top_pos) * top_freq)) {
    fail("rotary_embedding: theta ", theta, " with rotary_dim ", d.r, " gives the frequency ", top_freq,
         " and, at position ", top_pos, ", an angle float32 cannot hold");
  }
  auto t = std::make_shared<Table>();
  t->rows = rows;
  t->cos.resize(rows * half);
  t->sin.resize(rows * half);
  parallel_for(rows, grain_for(kGrainCostly, half), [&](std::size_t lo, std::size_t hi) {
    for (std::size_t q = lo; q < hi; ++q) {
      const float p = static_cast<float>(positions.data()[q]);
      for (std::size_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p * inv_freq[i]);
        t->cos[q * half + i] = static_cast<float>(std::cos(a));
        t->sin[q * half + i] = static_cast<float>(std::sin(a));
      }
    }
  });
  return t;
}

// The table of the last call on this thread, reused while its key holds: a model's blocks turn q
// and k at the same positions, 2 L calls and one table (cos and sin had been 2.5% of a 128-token
// prompt's profile on the llama.cpp comparison's 4-layer model). Tables are immutable, so the ops
// that recorded one may share it.
std::shared_ptr<const Table> rotary_table(const RotaryShape& d, const IndexArray& positions, float theta,
                                          const RopeScaling& scaling) {
  thread_local TableKey key;
  thread_local std::shared_ptr<const Table> last;
  if (last && key.same(d.r, theta, scaling, positions)) return last;
  last.reset();
  std::shared_ptr<const Table> t = make_table(d, positions, theta, scaling);
  key = {d.r, theta, scaling, std::vector<std::int64_t>(positions.begin(), positions.end())};
  last = t;
  return t;
}

// y = R(sign * angle) x on every head of every token; sign -1 is the transpose (backward).
void rotate(const RotaryShape& d, const Table& t, const float* x, float* y, float sign) {
  const std::size_t half = d.r / 2, rows = d.B * d.T;
  parallel_for(rows, grain_for(kGrainCheap, d.C), [&](std::size_t lo, std::size_t hi) {
    for (std::size_t q = lo; q < hi; ++q) {
      const float* c = t.cos.data() + (q % t.rows) * half;
      const float* s = t.sin.data() + (q % t.rows) * half;
      for (std::size_t h = 0; h < d.H; ++h) {
        const float* xh = x + q * d.C + h * d.D;
        float* yh = y + q * d.C + h * d.D;
        for (std::size_t i = 0; i < half; ++i) {
          const float a = xh[i], b = xh[i + half], si = sign * s[i];
          yh[i] = a * c[i] - b * si;
          yh[i + half] = b * c[i] + a * si;
        }
        for (std::size_t i = d.r; i < d.D; ++i) yh[i] = xh[i];
      }
    }
  });
}

}  // namespace

void check_rope_scaling(const RopeScaling& s, const char* who) {
  using Type = RopeScaling::Type;
  if (s.type == Type::none) return;
  if (!(std::isfinite(s.factor) && s.factor >= 1.f)) fail(who, ": rope scaling factor ", s.factor, " must be >= 1");
  if (s.type == Type::linear) return;
  if (s.original_max_len == 0) fail(who, ": rope scaling needs original_max_len > 0 (the context trained on)");
  if (s.type == Type::llama3 &&
      !(std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0.f && s.low_freq_factor < s.high_freq_factor)) {
    fail(who, ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
         s.high_freq_factor);
  }
  if (s.type == Type::dynamic && s.original_max_len < 2) {
    fail(who, ": dynamic rope scaling needs original_max_len >= 2, got ", s.original_max_len);
  }
}

Tensor rotary_embedding(const Tensor& x, std::size_t heads, const IndexArray& positions, float theta,
                        std::size_t rotary_dim, const RopeScaling& scaling) {
  const RotaryShape d = check_rotary(x, heads, positions, theta, rotary_dim);
  check_rope_scaling(scaling, "rotary_embedding");
  if (scaling.type == RopeScaling::Type::dynamic && d.r < 4) {
    fail("rotary_embedding: dynamic rope scaling needs rotary_dim >= 4 (its exponent is r / (r - 2)), got ", d.r);
  }
  std::shared_ptr<const Table> table = rotary_table(d, positions, theta, scaling);
  Array y = Array::from_shape(x.shape());
  rotate(d, *table, x.value().data(), y.data(), 1.f);
  return record("rotary_embedding", std::move(y), {x}, [d, table](GradContext& ctx) {
    if (!ctx.needs(0)) return;
    Array g = Array::from_shape(ctx.grad_out().shape());
    rotate(d, *table, ctx.grad_out().data(), g.data(), -1.f);
    ctx.accumulate(0, std::move(g));
  });
}

}  // namespace xgrad
