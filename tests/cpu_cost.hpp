// The cost of a call in CPU seconds, for tests that guard against a slow path by comparing the
// costs of two sizes of one job as a ratio (absolute times belong to bench/). Process CPU time
// (every thread, user and system), not wall time, so other processes on the machine move it
// little; the least of a few runs, so a stall moves it less.
#pragma once

#include <time.h>

#include <algorithm>
#include <limits>

namespace xgrad::testing {

inline double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class F>
double least_cpu_seconds(int runs, F&& f) {
  double least = std::numeric_limits<double>::infinity();
  for (int r = 0; r < runs; ++r) {
    const double start = process_cpu_seconds();
    f();
    least = std::min(least, process_cpu_seconds() - start);
  }
  return least;
}

}  // namespace xgrad::testing
