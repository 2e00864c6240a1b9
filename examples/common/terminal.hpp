// Terminal output for the examples: a progress line that updates in place on a terminal (plain
// periodic lines otherwise), and attention patterns as shaded character grids.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace viz {

class ProgressLine {
 public:
  // `quiet` prints nothing. On a terminal the line is redrawn at most every 0.1 s; otherwise a
  // line is printed every `every` updates and at the end.
  ProgressLine(bool quiet, std::size_t every);
  void update(std::size_t step, std::size_t steps, const std::string& text);
  void finish();

 private:
  bool quiet_, tty_, open_ = false;
  std::size_t every_;
  std::chrono::steady_clock::time_point last_;
};

// Rows of shade characters (' ', '░', '▒', '▓', '█') for values in [0, vmax], with labels.
std::string shaded_grid(const std::vector<std::vector<double>>& values, const std::vector<std::string>& row_labels,
                        double vmax = 1.0);

// "1m 05s" or "4.2s".
std::string duration(double seconds);

}  // namespace viz
