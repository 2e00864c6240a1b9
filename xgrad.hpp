// Everything xgrad offers, in one include.
#pragma once

#include "xgrad/core/blas.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/gradcheck.hpp"
#include "xgrad/core/ops.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/core/tape.hpp"
#include "xgrad/core/tensor.hpp"
