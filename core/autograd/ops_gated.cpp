// Gated units act(gate) * up in one kernel each way: SwiGLU (SiLU) and GeGLU (exact or tanh GELU),
// the middle of a gated feed-forward layer.
#include <utility>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/vector_kernels.hpp"
#include "xgrad/core/kernels/parallel.hpp"

namespace xgrad {

namespace {

// The kernels' activation code (see kernels::gated_forward).
int activation_code(GatedActivation activation) {
  switch (activation) {
    case GatedActivation::silu:
      return 0;
    case GatedActivation::gelu:
      return 1;
    case GatedActivation::gelu_tanh:
      return 2;
  }
  fail("gated_unit: unknown activation ", static_cast<int>(activation));
}

}  // namespace

Tensor gated_unit(const Tensor& gate, const Tensor& up, GatedActivation activation) {
  if (!gate.defined()) fail("gated_unit: gate is an undefined tensor");
  if (!up.defined()) fail("gated_unit: up is an undefined tensor");
  if (gate.shape() != up.shape())
    fail("gated_unit: gate ", shape_str(gate.shape()), " and up ", shape_str(up.shape()), " must have the same shape");
  const int act = activation_code(activation);
  Array y = Array::from_shape(gate.shape());
  const float* gs = gate.value().data();
  const float* us = up.value().data();
  float* ys = y.data();
  parallel_for(y.size(), kGrainCostly, [=](std::size_t lo, std::size_t hi) {
    kernels::gated_forward(gs + lo, us + lo, ys + lo, hi - lo, act);
  });
  // y = act(gate) up; dgate = g up act'(gate), dup = g act(gate), both from one pass
  return record("gated_unit", std::move(y), {gate, up}, BackwardReads{false}, [act](GradContext& ctx) {
    const float* gs = ctx.input(0).data();
    const float* us = ctx.input(1).data();
    const float* g = ctx.grad_out().data();
    Array dgate = Array::from_shape(ctx.input(0).shape()), dup = Array::from_shape(ctx.input(1).shape());
    float* dg = dgate.data();
    float* du = dup.data();
    parallel_for(dgate.size(), kGrainCostly, [=](std::size_t lo, std::size_t hi) {
      kernels::gated_backward(gs + lo, us + lo, g + lo, dg + lo, du + lo, hi - lo, act);
    });
    if (ctx.needs(0)) ctx.accumulate(0, std::move(dgate));
    if (ctx.needs(1)) ctx.accumulate(1, std::move(dup));
  });
}

}  // namespace xgrad
