// SVG pictures of what a model does: attention heatmaps with a colour scale, grids of them, and
// line plots. SVG opens in any browser and carries UTF-8 labels as they are.
#pragma once

#include <string>
#include <vector>

namespace xgrad::inspect {

/// One heatmap: values by row and column, with labels (see heatmap_svg).
struct Heatmap {
  /// Drawn above the map.
  std::string title;
  std::vector<std::vector<double>> values;  ///< rows x columns; every row as long as the first (an Error otherwise)
  /// The label of each row (row_labels) and of each column (col_labels), in order; a row or column
  /// without one is unlabelled, and named by its index when a cell is hovered.
  std::vector<std::string> row_labels, col_labels;
  /// The names of the row axis (row_axis) and of the column axis (col_axis).
  std::string row_axis = "query", col_axis = "key";
};

/// One heatmap with labels and a colour bar from 0 to vmax (a vmax that is not a positive finite
/// number is taken as 1; NaN cells are grey, infinite ones take the end colours). Throws Error,
/// naming the map and row, when the rows differ in length.
std::string heatmap_svg(const Heatmap& map, double vmax = 1.0);
/// Several heatmaps side by side, `columns` per row (clamped to [1, maps.size()]), sharing one
/// colour bar with vmax as heatmap_svg takes it, and the same check of each map's rows.
std::string heatmap_grid_svg(const std::vector<Heatmap>& maps, std::size_t columns, double vmax = 1.0);

/// One line of a LinePlot: the points (x[i], y[i]); those with a non-finite y are left out.
struct Series {
  /// The name in the legend.
  std::string name;
  /// The x and the y coordinates, as many of each (the longer of the two is cut).
  std::vector<double> x, y;
};

/// A line plot of one or more series (see line_plot_svg).
struct LinePlot {
  /// The title, drawn above the plot, and the names of the x axis (x_label) and the y axis (y_label).
  std::string title, x_label, y_label;
  /// The lines, drawn in 6 colours that repeat.
  std::vector<Series> series;
  /// A logarithmic y axis (values below 1e-12 are drawn at 1e-12).
  bool log_y = false;
  /// A dot at every point.
  bool markers = false;
};

/// The plot with axes spanning the points drawn, and a legend of the series' names.
std::string line_plot_svg(const LinePlot& plot);

/// s with & < > " as entities: safe as XML or HTML text and inside double-quoted attributes.
std::string xml_escape(const std::string& s);

/// Writes text to path atomically (an earlier file survives a failure); throws xgrad::Error
/// naming the path.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace xgrad::inspect
