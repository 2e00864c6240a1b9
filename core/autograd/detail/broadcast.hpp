// numpy broadcasting of shapes, and the reduction that carries a gradient back to an input
// whose shape was broadcast.
#pragma once

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad {

// The numpy broadcast of two shapes; throws naming `op` when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// dst += g summed over the axes along which dst's shape was broadcast to g's shape.
void add_reduced(Array& dst, const Array& g);

}  // namespace xgrad
