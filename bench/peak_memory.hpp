// Peak resident memory of a stretch of work, as the benchmarks measure it: /proc/self/status's
// VmHWM after clear_refs has lowered it to the resident size (VmRSS) at the start.
#pragma once

#include <fstream>
#include <string>

namespace bench {

// A field of /proc/self/status in KiB (VmRSS, VmHWM); -1 when it is missing.
inline long status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
  return -1;
}

// Lowers the peak resident size (VmHWM) to the current one; false where the kernel cannot.
inline bool reset_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.close();
  return static_cast<bool>(out);
}

}  // namespace bench
