/// @file
/// How much memory this process can still allocate, so that a request that cannot fit is refused
/// with its size before it is made (Linux overcommits: an allocation past the memory there is may
/// succeed and the process be killed later, when the pages are touched).
#pragma once

#include <string>

namespace xgrad {

/// What available_memory() found: how many bytes, and which limit sets that number.
struct MemoryAvailable {
  double bytes;       ///< the least of the limits below
  std::string limit;  ///< which limit, e.g.\ "RLIMIT_AS of 1.0 GiB, 310.2 MiB of it in use"
};

/// The least of: the memory the system reports available (MemAvailable in /proc/meminfo, else the
/// physical memory), what RLIMIT_AS leaves beyond the address space already in use, and what a
/// cgroup v2 memory.max leaves beyond memory.current.
MemoryAvailable available_memory();

/// Sizes up to this many bytes pass check_available_memory without reading the limits.
inline constexpr double kUncheckedBytes = 1 << 20;
/// Throws an Error `"<who>: <what> needs <size>, more than the <size> this process can still
/// allocate (<limit>)"` when `bytes` exceeds available_memory(); a NaN or infinite size is refused too.
/// Sizes up to kUncheckedBytes pass without reading the limits (which costs tens of microseconds).
void check_available_memory(double bytes, const std::string& who, const std::string& what);

/// "1.5 GiB", "312 bytes": a size for a message ("an unbounded size" for a NaN or an infinity).
std::string bytes_str(double bytes);

}  // namespace xgrad
