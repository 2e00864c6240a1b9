// SVG heatmaps and line plots.
#include "xgrad/inspect/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace xgrad::inspect {

namespace {

// Viridis, sampled at five points and interpolated linearly; grey for NaN.
std::string colour(double v) {
  static const double stops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  if (std::isnan(v)) return "#999999";
  v = std::clamp(v, 0.0, 1.0) * 4.0;
  const int i = std::min(3, static_cast<int>(v));
  const double f = v - i;
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
                static_cast<int>(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
                static_cast<int>(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

constexpr double kCell = 22, kLabel = 46, kTitle = 30;

double map_width(const Heatmap& m) {
  const double cells = kLabel + kCell * (m.values.empty() ? 0 : m.values[0].size()) + 10;
  return std::max(cells, kLabel + 7.5 * static_cast<double>(m.title.size()));  // room for the title
}
double map_height(const Heatmap& m) { return kTitle + kCell * m.values.size() + kLabel; }

// Draws one heatmap with its top-left corner at (x0, y0).
void draw_map(std::ostringstream& os, const Heatmap& m, double x0, double y0, double vmax) {
  const std::size_t rows = m.values.size(), cols = rows ? m.values[0].size() : 0;
  os << "<text x='" << x0 + kLabel << "' y='" << y0 + 18 << "' font-size='13' font-weight='bold'>"
     << xml_escape(m.title) << "</text>\n";
  const double top = y0 + kTitle, left = x0 + kLabel;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const double v = m.values[r][c];
      os << "<rect x='" << left + c * kCell << "' y='" << top + r * kCell << "' width='" << kCell << "' height='"
         << kCell << "' fill='" << colour(vmax > 0 ? v / vmax : 0) << "'><title>" << xml_escape(m.row_axis) << ' '
         << (r < m.row_labels.size() ? xml_escape(m.row_labels[r]) : std::to_string(r)) << ", "
         << xml_escape(m.col_axis) << ' ' << (c < m.col_labels.size() ? xml_escape(m.col_labels[c]) : std::to_string(c))
         << ": " << num(v) << "</title></rect>\n";
    }
    if (r < m.row_labels.size()) {
      os << "<text x='" << left - 4 << "' y='" << top + r * kCell + kCell * 0.7 << "' font-size='11' text-anchor='end'>"
         << xml_escape(m.row_labels[r]) << "</text>\n";
    }
  }
  for (std::size_t c = 0; c < cols && c < m.col_labels.size(); ++c) {
    const double x = left + c * kCell + kCell * 0.5, y = top + rows * kCell + 6;
    os << "<text x='" << x << "' y='" << y << "' font-size='11' text-anchor='end' transform='rotate(-60 " << x << ' '
       << y << ")'>" << xml_escape(m.col_labels[c]) << "</text>\n";
  }
  os << "<text x='" << left + cols * kCell / 2 << "' y='" << top + rows * kCell + kLabel - 2
     << "' font-size='11' text-anchor='middle'>" << xml_escape(m.col_axis) << "</text>\n";
  os << "<text x='" << x0 + 10 << "' y='" << top + rows * kCell / 2
     << "' font-size='11' text-anchor='middle' transform='rotate(-90 " << x0 + 10 << ' ' << top + rows * kCell / 2
     << ")'>" << xml_escape(m.row_axis) << "</text>\n";
}

void draw_colour_bar(std::ostringstream& os, double x, double y, double height, double vmax) {
  const int steps = 50;
  for (int i = 0; i < steps; ++i) {
    const double v = 1.0 - static_cast<double>(i) / steps;
    os << "<rect x='" << x << "' y='" << y + i * height / steps << "' width='14' height='" << height / steps + 0.5
       << "' fill='" << colour(v) << "'/>\n";
  }
  for (int t = 0; t <= 4; ++t) {
    const double v = vmax * t / 4.0;
    os << "<text x='" << x + 18 << "' y='" << y + height - t * height / 4 + 4 << "' font-size='10'>" << num(v)
       << "</text>\n";
  }
}

std::string open_svg(double w, double h) {
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "' viewBox='0 0 " << w << ' '
     << h << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  return os.str();
}

// Every row is drawn as long as the first: a ragged map would be read past a row's end.
void check_rows(const std::vector<Heatmap>& maps, const char* who) {
  for (std::size_t i = 0; i < maps.size(); ++i) {
    const auto& v = maps[i].values;
    for (std::size_t r = 1; r < v.size(); ++r) {
      if (v[r].size() != v[0].size()) {
        fail(who, ": map ", i, " ('", maps[i].title, "') has rows of different lengths: row 0 has ", v[0].size(),
             " values and row ", r, " has ", v[r].size());
      }
    }
  }
}

std::string grid_svg(const std::vector<Heatmap>& maps, std::size_t columns, double vmax) {
  if (maps.empty()) return open_svg(10, 10) + "</svg>\n";
  if (!(vmax > 0) || !std::isfinite(vmax)) vmax = 1.0;
  columns = std::max<std::size_t>(1, std::min(columns, maps.size()));
  double cell_w = 0, cell_h = 0;
  for (const Heatmap& m : maps) {
    cell_w = std::max(cell_w, map_width(m));
    cell_h = std::max(cell_h, map_height(m));
  }
  const std::size_t rows = (maps.size() + columns - 1) / columns;
  const double w = cell_w * columns + 60, h = cell_h * rows + 10;
  std::ostringstream os;
  os << open_svg(w, h);
  for (std::size_t i = 0; i < maps.size(); ++i)
    draw_map(os, maps[i], (i % columns) * cell_w, (i / columns) * cell_h, vmax);
  draw_colour_bar(os, cell_w * columns + 6, kTitle, std::min(cell_h - kTitle - kLabel, 200.0), vmax);
  os << "</svg>\n";
  return os.str();
}

}  // namespace

std::string heatmap_svg(const Heatmap& m, double vmax) {
  check_rows({m}, "heatmap_svg");
  return grid_svg({m}, 1, vmax);
}

std::string heatmap_grid_svg(const std::vector<Heatmap>& maps, std::size_t columns, double vmax) {
  check_rows(maps, "heatmap_grid_svg");
  return grid_svg(maps, columns, vmax);
}

namespace {

// Round tick positions: steps of 1, 2 or 5 times a power of ten.
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

// Ticks for a log axis spanning log10 values [lo, hi]: 1, 2, 5 times powers of ten.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  const std::vector<double> mults = hi - lo < 1.2   ? std::vector<double>{1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9}
                                    : hi - lo < 2.5 ? std::vector<double>{1, 2, 5}
                                                    : std::vector<double>{1};
  for (int e = static_cast<int>(std::floor(lo)); e <= static_cast<int>(std::ceil(hi)); ++e) {
    for (double m : mults) {
      const double v = std::log10(m) + e;
      if (v >= lo && v <= hi) ticks.push_back(v);
    }
  }
  return ticks;
}

}  // namespace

std::string line_plot_svg(const LinePlot& p) {
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  const double plot_w = 560, H = 400, left = 70, legend = 190, top = 40, bottom = 55;
  const double W = left + plot_w + legend;
  double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
  auto ty = [&](double y) { return p.log_y ? std::log10(std::max(y, 1e-12)) : y; };
  for (const Series& s : p.series) {
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, ty(s.y[i]));
      ymax = std::max(ymax, ty(s.y[i]));
    }
  }
  if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  if (xmax == xmin) xmax = xmin + 1;
  if (ymax == ymin) ymax = ymin + 1;
  const double pad = (ymax - ymin) * 0.05;
  ymin -= pad;
  ymax += pad;
  auto X = [&](double x) { return left + (x - xmin) / (xmax - xmin) * plot_w; };
  auto Yt = [&](double v) { return H - bottom - (v - ymin) / (ymax - ymin) * (H - top - bottom); };
  std::ostringstream os;
  os << open_svg(W, H);
  os << "<text x='" << left + plot_w / 2 << "' y='24' font-size='15' font-weight='bold' text-anchor='middle'>"
     << xml_escape(p.title) << "</text>\n";
  os << "<rect x='" << left << "' y='" << top << "' width='" << plot_w << "' height='" << H - top - bottom
     << "' fill='none' stroke='#444'/>\n";
  for (double xv : nice_ticks(xmin, xmax)) {
    const double xp = X(xv);
    os << "<line x1='" << xp << "' y1='" << H - bottom << "' x2='" << xp << "' y2='" << H - bottom + 5
       << "' stroke='#444'/>\n";
    os << "<text x='" << xp << "' y='" << H - bottom + 18 << "' font-size='11' text-anchor='middle'>" << num(xv)
       << "</text>\n";
  }
  for (double yv : p.log_y ? log_ticks(ymin, ymax) : nice_ticks(ymin, ymax)) {
    const double yp = Yt(yv);
    os << "<line x1='" << left << "' y1='" << yp << "' x2='" << left + plot_w << "' y2='" << yp
       << "' stroke='#ddd'/>\n";
    os << "<text x='" << left - 6 << "' y='" << yp + 4 << "' font-size='11' text-anchor='end'>"
       << num(p.log_y ? std::pow(10.0, yv) : yv) << "</text>\n";
  }
  os << "<text x='" << left + plot_w / 2 << "' y='" << H - 12 << "' font-size='12' text-anchor='middle'>"
     << xml_escape(p.x_label) << "</text>\n";
  os << "<text x='16' y='" << (top + H - bottom) / 2
     << "' font-size='12' text-anchor='middle' transform='rotate(-90 16 " << (top + H - bottom) / 2 << ")'>"
     << xml_escape(p.y_label) << "</text>\n";
  for (std::size_t k = 0; k < p.series.size(); ++k) {
    const Series& s = p.series[k];
    const char* c = palette[k % 6];
    os << "<polyline fill='none' stroke='" << c << "' stroke-width='1.5' points='";
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (std::isfinite(s.y[i])) os << X(s.x[i]) << ',' << Yt(ty(s.y[i])) << ' ';
    }
    os << "'/>\n";
    if (p.markers) {
      for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (std::isfinite(s.y[i]))
          os << "<circle cx='" << X(s.x[i]) << "' cy='" << Yt(ty(s.y[i])) << "' r='3.5' fill='" << c << "'/>\n";
      }
    }
    os << "<rect x='" << left + plot_w + 14 << "' y='" << top + 10 + 20 * k << "' width='14' height='3' fill='" << c
       << "'/>"
       << "<text x='" << left + plot_w + 34 << "' y='" << top + 15 + 20 * k << "' font-size='11'>" << xml_escape(s.name)
       << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  write_file_atomically(path, text, "write_text_file");
}

}  // namespace xgrad::inspect
