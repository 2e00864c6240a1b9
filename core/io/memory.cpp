// available_memory from /proc/meminfo, RLIMIT_AS with /proc/self/statm, and cgroup v2 files.
#include "xgrad/core/io/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

// The first number in a file, or a negative value when it cannot be read (or says "max").
double number_in(const std::string& path) {
  std::ifstream in(path);
  double v = -1;
  if (!(in >> v)) return -1;
  return v;
}

double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string bytes_str(double bytes) {
  if (!std::isfinite(bytes)) return "an unbounded size";
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  int u = 0;
  double v = bytes;
  while (v >= 1024 && u < 8) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

MemoryAvailable available_memory() {
  MemoryAvailable out{mem_available(), "the memory the system has available"};
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const double pages = number_in("/proc/self/statm");  // the address space in use, in pages
    const double used = pages > 0 ? pages * static_cast<double>(::sysconf(_SC_PAGESIZE)) : 0;
    const double left = std::max(0.0, static_cast<double>(rl.rlim_cur) - used);
    if (left < out.bytes)
      out = {left,
             "RLIMIT_AS of " + bytes_str(static_cast<double>(rl.rlim_cur)) + ", " + bytes_str(used) + " of it in use"};
  }
  const double max = number_in("/sys/fs/cgroup/memory.max"), current = number_in("/sys/fs/cgroup/memory.current");
  if (max >= 0 && current >= 0 && max - current < out.bytes) {
    out = {std::max(0.0, max - current),
           "the cgroup's memory.max of " + bytes_str(max) + ", " + bytes_str(current) + " of it in use"};
  }
  return out;
}

void check_available_memory(double bytes, const std::string& who, const std::string& what) {
  if (bytes <= kUncheckedBytes) return;
  const MemoryAvailable m = available_memory();
  if (!(bytes <= m.bytes)) {
    fail(who, ": ", what, " needs ", bytes_str(bytes), ", more than the ", bytes_str(m.bytes),
         " this process can still allocate (", m.limit, ")");
  }
}

}  // namespace xgrad
