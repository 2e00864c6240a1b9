// The peak resident size of this process from a chosen point on, for tests that measure in a child
// process what one call allocates: reset_peak_rss() lowers the peak (VmHWM) to the current resident
// size through /proc/self/clear_refs, so neither the parent's peak (inherited across fork and exec)
// nor earlier work hides the call's.
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace xgrad::testing {

// A "Vm...:" field of /proc/self/status in KiB, or -1.
inline long status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// False when the kernel cannot reset the peak (then a measurement would mean nothing). The
// resident count the kernel reports is approximate: since Linux 6.2 it is a per-CPU counter read
// without summing the CPUs' unfolded parts, each up to max(32, 2 x CPUs) pages (a reset that stayed
// more than 64 KiB above VmRSS ten times running was seen on a loaded 2-CPU machine). So the reset is
// taken when the peak is within 1 MiB of the resident size, far below any bound a test measures,
// and is tried again a few times with a pause while a large release settles.
inline bool reset_peak_rss() {
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.close();
    if (!out) return false;
    if (status_kib("VmHWM") <= status_kib("VmRSS") + 1024) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// AddressSanitizer's redzones and quarantine hold freed memory back, so a peak measured under it
// says nothing of what the code itself holds: tests skip their memory bounds then.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// How far the peak resident size rose above `baseline_kib` (a VmRSS read right after the reset).
inline long peak_rise_kib(long baseline_kib) { return status_kib("VmHWM") - baseline_kib; }

}  // namespace xgrad::testing
