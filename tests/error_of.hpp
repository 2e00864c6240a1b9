// The message of the xgrad::Error a call throws, for tests that look inside it.
#pragma once

#include <functional>
#include <string>

#include "xgrad/core/error.hpp"

namespace xgrad::testing {

// The message of the Error f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace xgrad::testing
