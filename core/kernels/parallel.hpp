/// @file
/// Threads for xgrad's kernels: GEMMs (blas::sgemm splits large products across them; each GEMM
/// engine runs on one thread) and the elementwise, softmax, layer-norm, dropout and optimizer
/// loops. One pool does all of it. Its threads watch for the next job for 0.2 ms after each one
/// (kernels come back to back within a step) and then sleep, so an idle process uses no CPU.
/// OpenBLAS's own threads spin for much longer between calls and took the cores from the
/// elementwise kernels (sched_yield was 8% of a 2-thread step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>

namespace xgrad {

/// The most threads set_num_threads accepts.
inline constexpr int kMaxThreads = 1024;
/// Threads used by the kernels and GEMMs (n >= 1). Until it is called: OpenBLAS's default
/// (OPENBLAS_NUM_THREADS, else every core), or as many of those as the system lets start. When the
/// system refuses a thread (RLIMIT_NPROC, address space for its stack), set_num_threads throws an
/// Error naming n, how many threads were running, the OS's reason and the limits that are set, and
/// the pool keeps its previous size.
/// n above kMaxThreads is an Error naming it, before any thread starts; so are n < 1 and a call
/// from inside a parallel_for body.
void set_num_threads(int n);
/// The threads the kernels use, the calling thread included (see set_num_threads).
int num_threads();

/// Runs body(begin, end) over disjoint ranges covering [0, n), on up to num_threads() threads,
/// each range at least `grain` long (so small inputs stay on the calling thread). The calling
/// thread takes part and returns when every range is done. Each index belongs to exactly one
/// range and a range is processed in order, so a body that writes only its own indices gives the
/// same result for every thread count. An exception thrown by a body is rethrown here. Calls
/// from inside a body run serially, and so does a call from another user thread while one call
/// holds the kernel threads (it never waits for them, so user threads cannot deadlock here).
void parallel_for(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& body);

// Grains (elements per range) for kernels of different cost: a wake-up of a sleeping thread
// costs tens of microseconds here, so a range should take longer than that.
inline constexpr std::size_t kGrainCheap = 1 << 15;   ///< grain for a few flops per element (copy, scale, add)
inline constexpr std::size_t kGrainCostly = 1 << 12;  ///< grain for tens of flops per element (erf, exp)
inline constexpr std::size_t kGrainGemm = std::size_t{1} << 20;  ///< grain in multiply-adds of matrix products

/// The grain in items (rows, heads, batch entries) when each item costs `cost` units of work and
/// a range should hold at least `grain` units: at least 1.
inline std::size_t grain_for(std::size_t grain, std::size_t cost) {
  return std::max<std::size_t>(1, grain / std::max<std::size_t>(cost, 1));
}

}  // namespace xgrad
