// REQUIRE_GRADCHECK(...): runs gradcheck with the given arguments and requires that it passed
// and compared at least one element (a check of nothing is not a pass).
#pragma once

#include <catch2/catch.hpp>

#include "xgrad/core/autograd/gradcheck.hpp"

#define REQUIRE_GRADCHECK(...)                                    \
  do {                                                            \
    const ::xgrad::GradcheckResult res_ = gradcheck(__VA_ARGS__); \
    INFO(res_.report);                                            \
    REQUIRE(res_.ok);                                             \
    REQUIRE(res_.checked > 0);                                    \
  } while (0)
