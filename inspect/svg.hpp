// SVG pictures of what a model does: attention heatmaps with a colour scale, grids of them, and
// line plots. SVG opens in any browser and carries UTF-8 labels as they are.
#pragma once

#include <string>
#include <vector>

namespace xgrad::inspect {

struct Heatmap {
  std::string title;
  std::vector<std::vector<double>> values;  // rows x columns
  std::vector<std::string> row_labels, col_labels;
  std::string row_axis = "query", col_axis = "key";
};

// One heatmap with labels and a colour bar from 0 to vmax (a vmax that is not a positive finite
// number is taken as 1; NaN cells are grey, infinite ones take the end colours).
std::string heatmap_svg(const Heatmap& map, double vmax = 1.0);
// Several heatmaps side by side, `columns` per row, sharing one colour bar.
std::string heatmap_grid_svg(const std::vector<Heatmap>& maps, std::size_t columns, double vmax = 1.0);

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;
  bool markers = false;
};

std::string line_plot_svg(const LinePlot& plot);

// s with & < > " as entities: safe as XML or HTML text and inside double-quoted attributes.
std::string xml_escape(const std::string& s);

// Writes text to path atomically (an earlier file survives a failure); throws xgrad::Error
// naming the path.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace xgrad::inspect
