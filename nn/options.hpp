// Choices shared by the nn modules' options structs (built with XGRAD_ARG).
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/nn/norm.hpp"

namespace xgrad::nn {

/// Where the norm sits around a residual sublayer f:
///   pre:  y = x + f(norm(x))      post: y = norm(x + f(x))      none: y = f(x) (no residual, no norm)
///   sandwich: y = x + post_norm(f(norm(x))) (Gemma 2 and 3: a norm before and after f)
enum class Norm { pre, post, none, sandwich };

/// The activation of a feed-forward sublayer.
/// gelu: the exact (erf) GELU; gelu_tanh: its tanh approximation (GPT-2's); relu. The gated
/// units multiply act(gate(x)) by a second projection up(x): swiglu (act = SiLU, Llama's),
/// geglu (exact GELU) and geglu_tanh (tanh GELU).
enum class Activation { gelu, gelu_tanh, relu, swiglu, geglu, geglu_tanh };

/// Whether `a` is a gated unit (swiglu, geglu, geglu_tanh).
constexpr bool is_gated(Activation a) {
  return a == Activation::swiglu || a == Activation::geglu || a == Activation::geglu_tanh;
}

}  // namespace xgrad::nn
