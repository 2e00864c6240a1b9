// Elementwise ops: broadcasting arithmetic, scalar variants and unary functions.
// Binary ops broadcast as numpy does; their backward sums the gradient back to each input's
// shape (GradContext::accumulate_reduced).
#include <cmath>

#include "xgrad/core/autograd/detail/broadcast.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

// What a unary op's backward reads besides the gradient (x, y, both or neither): it reads only
// those, so only they count as saved (GradContext checks them for in-place writes).
enum Saves : unsigned { kSavesNothing = 0, kSavesX = 1, kSavesY = 2 };

// y = f(x) elementwise; backward dx = df(x, y, g). Both run as plain loops, split across the
// kernel threads in ranges of at least `grain` elements.
template <unsigned saves, class Fwd, class Bwd>
Tensor unary(const char* op, const Tensor& a, Fwd fwd, Bwd bwd, std::size_t grain = kGrainCheap) {
  check_defined(a, op);
  const Array& x = a.value();
  Array y = Array::from_shape(x.shape());
  const float* xs = x.data();
  float* ys = y.data();
  parallel_for(x.size(), grain, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) ys[i] = fwd(xs[i]);
  });
  const BackwardReads reads{(saves & kSavesY) != 0, (saves & kSavesX) ? 0u : 1u};
  return record(op, std::move(y), {a}, reads, [bwd, grain](GradContext& ctx) {
    // dx written over g, element by element (see dropout's backward)
    Array dx = ctx.take_grad_out();
    const float* gs = dx.data();
    // an argument that is not saved points at g, and bwd ignores it
    const float* xs = (saves & kSavesX) ? ctx.input(0).data() : gs;
    const float* ys = (saves & kSavesY) ? ctx.output().data() : gs;
    float* d = dx.data();
    parallel_for(dx.size(), grain, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) d[i] = bwd(xs[i], ys[i], gs[i]);
    });
    ctx.accumulate(0, std::move(dx));
  });
}

// Checks that two inputs broadcast and computes y = f(a, b): a plain loop split across the
// kernel threads when the shapes are equal (the residual sums), else xtensor's broadcasting
// expression `expr`.
template <class F, class Expr>
Array binary_value(const char* op, const Tensor& a, const Tensor& b, F f, Expr expr) {
  check_defined(a, op);
  check_defined(b, op);
  broadcast_shapes(a.shape(), b.shape(), op);
  if (a.shape() != b.shape()) return expr(a.value(), b.value());
  Array y = Array::from_shape(a.shape());
  const float* x = a.value().data();
  const float* z = b.value().data();
  float* out = y.data();
  parallel_for(y.size(), kGrainCheap, [=](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) out[i] = f(x[i], z[i]);
  });
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  // y = a + b
  Array y = binary_value(
      "add", a, b, [](float x, float z) { return x + z; },
      [](const Array& x, const Array& z) -> Array { return x + z; });
  return record("add", std::move(y), {a, b}, BackwardReads{false, 3u}, [](GradContext& ctx) {
    // da = g, db = g (each summed over its broadcast axes); g moves on to a, the last use
    if (ctx.needs(1)) ctx.accumulate_reduced(1, ctx.grad_out());
    if (ctx.needs(0)) ctx.pass_grad_out(0);
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  // y = a - b
  Array y = binary_value(
      "sub", a, b, [](float x, float z) { return x - z; },
      [](const Array& x, const Array& z) -> Array { return x - z; });
  return record("sub", std::move(y), {a, b}, BackwardReads{false, 3u}, [](GradContext& ctx) {
    // da = g, db = -g; g moves on to a, the last use
    if (ctx.needs(1)) ctx.accumulate_reduced(1, Array(-ctx.grad_out()));
    if (ctx.needs(0)) ctx.pass_grad_out(0);
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  // y = a * b
  Array y = binary_value(
      "mul", a, b, [](float x, float z) { return x * z; },
      [](const Array& x, const Array& z) -> Array { return x * z; });
  return record("mul", std::move(y), {a, b}, [](GradContext& ctx) {
    // da = g * b, db = g * a
    if (ctx.needs(0)) ctx.accumulate_reduced(0, Array(ctx.grad_out() * ctx.input(1)));
    if (ctx.needs(1)) ctx.accumulate_reduced(1, Array(ctx.grad_out() * ctx.input(0)));
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  // y = a / b
  Array y = binary_value(
      "div", a, b, [](float x, float z) { return x / z; },
      [](const Array& x, const Array& z) -> Array { return x / z; });
  return record("div", std::move(y), {a, b}, [](GradContext& ctx) {
    // da = g / b, db = -g * a / b^2 = -g * y / b
    if (ctx.needs(0)) ctx.accumulate_reduced(0, Array(ctx.grad_out() / ctx.input(1)));
    if (ctx.needs(1)) ctx.accumulate_reduced(1, Array(-ctx.grad_out() * ctx.output() / ctx.input(1)));
  });
}

Tensor add(const Tensor& a, float s) {
  return unary<kSavesNothing>(
      "add_scalar", a, [s](float x) { return x + s; }, [](float, float, float g) { return g; });
}

Tensor sub(const Tensor& a, float s) { return add(a, -s); }

Tensor rsub(float s, const Tensor& a) {
  return unary<kSavesNothing>(
      "rsub_scalar", a, [s](float x) { return s - x; }, [](float, float, float g) { return -g; });
}

Tensor mul(const Tensor& a, float s) {
  return unary<kSavesNothing>(
      "mul_scalar", a, [s](float x) { return x * s; }, [s](float, float, float g) { return g * s; });
}

Tensor div(const Tensor& a, float s) {
  if (s == 0.f) fail("div: division of a tensor of shape ", shape_str(a.shape()), " by the scalar 0");
  return unary<kSavesNothing>(
      "div_scalar", a, [s](float x) { return x / s; }, [s](float, float, float g) { return g / s; });
}

Tensor rdiv(float s, const Tensor& a) {
  // y = s / x; dx = -s / x^2 = -y / x
  return unary<kSavesX | kSavesY>(
      "rdiv_scalar", a, [s](float x) { return s / x; }, [](float x, float y, float g) { return -g * y / x; });
}

Tensor neg(const Tensor& a) {
  return unary<kSavesNothing>(
      "neg", a, [](float x) { return -x; }, [](float, float, float g) { return -g; });
}

Tensor exp(const Tensor& a) {
  // y = e^x; dx = g * y
  return unary<kSavesY>(
      "exp", a, [](float x) { return std::exp(x); }, [](float, float y, float g) { return g * y; });
}

Tensor log(const Tensor& a) {
  // y = ln x; dx = g / x
  return unary<kSavesX>(
      "log", a, [](float x) { return std::log(x); }, [](float x, float, float g) { return g / x; });
}

Tensor sqrt(const Tensor& a) {
  // y = sqrt(x); dx = g / (2 y)
  return unary<kSavesY>(
      "sqrt", a, [](float x) { return std::sqrt(x); }, [](float, float y, float g) { return g * 0.5f / y; });
}

Tensor pow(const Tensor& a, float p) {
  // y = x^p; dx = g * p * x^(p-1)
  return unary<kSavesX>(
      "pow", a, [p](float x) { return std::pow(x, p); },
      [p](float x, float, float g) { return p == 0.f ? 0.f : g * p * std::pow(x, p - 1.f); });
}

Tensor tanh(const Tensor& a) {
  // y = tanh x; dx = g * (1 - y^2)
  return unary<kSavesY>(
      "tanh", a, [](float x) { return std::tanh(x); }, [](float, float y, float g) { return g * (1.f - y * y); });
}

Tensor sigmoid(const Tensor& a) {
  // y = 1 / (1 + e^-x), written to avoid overflow of e^-x for very negative x; dx = g y (1 - y)
  return unary<kSavesY>(
      "sigmoid", a,
      [](float x) {
    if (x >= 0) return 1.f / (1.f + std::exp(-x));
    const float e = std::exp(x);
    return e / (1.f + e);
      },
      [](float, float y, float g) { return g * y * (1.f - y); });
}

Tensor relu(const Tensor& a) {
  // y = max(x, 0); dx = g where x > 0 (0 at the kink, as PyTorch)
  return unary<kSavesX>(
      "relu", a, [](float x) { return x > 0.f ? x : 0.f; }, [](float x, float, float g) { return x > 0.f ? g : 0.f; });
}

namespace {

// y = forward(x) and dx = backward(x, g) by one vector kernel each way, split across the kernel threads.
using VectorForward = void (*)(const float*, float*, std::size_t);
using VectorBackward = void (*)(const float*, const float*, float*, std::size_t);

Tensor vector_unary(const char* name, const Tensor& a, VectorForward forward, VectorBackward backward) {
  check_defined(a, name);
  Array y = Array::from_shape(a.shape());
  const float* xs = a.value().data();
  float* ys = y.data();
  parallel_for(y.size(), kGrainCostly, [=](std::size_t lo, std::size_t hi) { forward(xs + lo, ys + lo, hi - lo); });
  return record(name, std::move(y), {a}, BackwardReads{false}, [backward](GradContext& ctx) {
    const float* xs = ctx.input(0).data();
    Array dx = ctx.take_grad_out();  // dx written over g, element by element
    const float* gs = dx.data();
    float* d = dx.data();
    parallel_for(dx.size(), kGrainCostly,
                 [=](std::size_t lo, std::size_t hi) { backward(xs + lo, gs + lo, d + lo, hi - lo); });
    ctx.accumulate(0, std::move(dx));
  });
}

}  // namespace

Tensor gelu(const Tensor& a, GeluApprox approx) {
  // exact: y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2; dy/dx = Phi(x) + x phi(x)
  if (approx == GeluApprox::exact) return vector_unary("gelu", a, kernels::gelu_forward, kernels::gelu_backward);
  // tanh: y = x (1 + tanh u) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3);
  // dy/dx = (1 + tanh u) / 2 + x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2
  return vector_unary("gelu_tanh", a, kernels::gelu_tanh_forward, kernels::gelu_tanh_backward);
}

}  // namespace xgrad
