// Progress line and shaded grids.
#include "terminal.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace viz {

ProgressLine::ProgressLine(bool quiet, std::size_t every)
    : quiet_(quiet), tty_(::isatty(STDOUT_FILENO) != 0), every_(std::max<std::size_t>(every, 1)) {}

void ProgressLine::update(std::size_t step, std::size_t steps, const std::string& text) {
  if (quiet_) return;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (step != steps && open_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    std::printf("\r\033[K%s", text.c_str());
    std::fflush(stdout);
    open_ = true;
  } else if (step % every_ == 0 || step == steps) {
    std::printf("%s\n", text.c_str());
  }
}

void ProgressLine::finish() {
  if (!quiet_ && tty_ && open_) std::printf("\n");
  open_ = false;
}

std::string shaded_grid(const std::vector<std::vector<double>>& values, const std::vector<std::string>& row_labels,
                        double vmax) {
  static const char* shades[] = {" ", "\u2591", "\u2592", "\u2593", "\u2588"};
  std::size_t label_width = 0;
  for (const auto& l : row_labels) label_width = std::max(label_width, l.size());
  std::ostringstream os;
  for (std::size_t r = 0; r < values.size(); ++r) {
    std::string label = r < row_labels.size() ? row_labels[r] : std::to_string(r);
    os << std::string(label_width > label.size() ? label_width - label.size() : 0, ' ') << label << " |";
    for (double v : values[r]) {
      const int level = std::clamp(static_cast<int>(v / vmax * 4.0 + 0.5), 0, 4);
      os << shades[level] << shades[level];
    }
    os << "|\n";
  }
  return os.str();
}

std::string duration(double seconds) {
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else {
    std::snprintf(buf, sizeof buf, "%dm %02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  }
  return buf;
}

}  // namespace viz
