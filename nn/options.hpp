// Choices shared by the nn modules' options structs (built with XGRAD_ARG).
#pragma once

#include "xgrad/core/arg.hpp"

namespace xgrad::nn {

/// Where LayerNorm sits around a residual sublayer f:
///   pre:  y = x + f(LN(x))      post: y = LN(x + f(x))      none: y = f(x) (no residual, no norm)
enum class Norm { pre, post, none };

/// The activation of a feed-forward sublayer.
/// gelu: the exact (erf) GELU; gelu_tanh: its tanh approximation (GPT-2's); relu.
enum class Activation { gelu, gelu_tanh, relu };

}  // namespace xgrad::nn
