/// @file
/// The one exception type xgrad throws, and helpers that format shapes into its messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace xgrad {

/// Every error xgrad raises derives from Error; the message names the function and the
/// shapes or values that were wrong, e.g.\ "matmul: inner dimensions differ: (2, 3) @ (4, 5)".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// "(2, 3, 4)" for any container of integers ("()" for an empty one).
template <class Shape>
std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  bool first = true;
  for (auto d : shape) {
    if (!first) os << ", ";
    os << d;
    first = false;
  }
  os << ')';
  return os.str();
}

/// Builds a message from any streamable pieces and throws it as an Error: fail("matmul: ", a, " vs ", b).
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

}  // namespace xgrad
