// attention_viewer_html: the patterns and tables as JSON inside one HTML page with its own script.
#include "xgrad/inspect/attention_viewer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/inspect/svg.hpp"

namespace xgrad::inspect {

namespace {

// JSON that may sit inside <script>: every < > & (inside strings, the only place JSON has
// them) as a \u escape, so no token can close the element or open a comment in it.
std::string script_safe(const std::string& json) {
  std::string out;
  for (char c : json) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

// Weights rounded to 4 decimals, the precision the page shows.
double rounded(float w) { return std::round(static_cast<double>(w) * 1e4) / 1e4; }

// A table's number as the page shows it: 4 significant digits ("0.1235", "-3.2e-05"; 0, never -0).
std::string four_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v + 0.0);
  return buf;
}

// One table as the page's script reads it, after checking it: labels, effects as numbers (for
// the colours) and as text, the fraction restored (when clean and corrupted differ), the limit of
// the colour scale (the largest |effect|, or 1 when every effect is 0) and the metrics.
nlohmann::json table_json(const ViewerTable& t, std::size_t n) {
  const std::string which = "attention_viewer_html: table " + std::to_string(n) + " '" + t.name + "'";
  const SweepResult& r = t.result;
  const Shape& s = r.effect.shape();
  if (s.size() != 2 || s[0] != r.rows.size() || s[1] != r.columns.size()) {
    fail(which, " has effect of shape ", shape_str(s), ", not (rows, columns) = (", r.rows.size(), ", ",
         r.columns.size(), ")");
  }
  if (r.rows.empty() || r.columns.empty())
    fail(which, " is empty: ", r.rows.size(), " rows, ", r.columns.size(), " columns");
  if (!std::isfinite(r.clean) || !std::isfinite(r.corrupted))
    fail(which, " has metric ", r.clean, " on the clean run and ", r.corrupted, " on the corrupted run");
  double limit = 0;
  for (std::size_t i = 0; i < s[0]; ++i) {
    for (std::size_t j = 0; j < s[1]; ++j) {
      const float v = r.effect(i, j);
      if (!std::isfinite(v)) fail(which, " has effect ", v, " at row '", r.rows[i], "', column '", r.columns[j], "'");
      limit = std::max(limit, std::abs(static_cast<double>(v)));
    }
  }
  if (limit == 0) limit = 1;
  const double range = r.clean - r.corrupted;
  nlohmann::json values = nlohmann::json::array(), text = nlohmann::json::array(), restored = nlohmann::json::array();
  for (std::size_t i = 0; i < s[0]; ++i) {
    nlohmann::json v_row = nlohmann::json::array(), t_row = nlohmann::json::array(), r_row = nlohmann::json::array();
    for (std::size_t j = 0; j < s[1]; ++j) {
      const std::string shown = four_digits(r.effect(i, j));
      v_row.push_back(std::stod(shown));
      t_row.push_back(shown);
      if (range != 0) r_row.push_back(four_digits(r.effect(i, j) / range));
    }
    values.push_back(std::move(v_row));
    text.push_back(std::move(t_row));
    restored.push_back(std::move(r_row));
  }
  return {{"name", t.name},
          {"rows", r.rows},
          {"columns", r.columns},
          {"values", std::move(values)},
          {"text", std::move(text)},
          {"restored", range != 0 ? std::move(restored) : nlohmann::json(nullptr)},
          {"limit", std::stod(four_digits(limit))},
          {"low", four_digits(-limit)},
          {"high", four_digits(limit)},
          {"clean", four_digits(r.clean)},
          {"corrupted", four_digits(r.corrupted)}};
}

const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>%TITLE%</title>
<style>
body { font-family: sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; }
h2 { font-size: 16px; margin: 28px 0 4px 0; }
#controls { margin-bottom: 10px; }
#controls select { margin: 0 12px 0 4px; }
.info { font-family: monospace; margin-left: 8px; }
.caption { font-size: 13px; margin-bottom: 6px; }
.legend { display: flex; align-items: center; font-size: 12px; margin: 6px 0 10px 0; }
.legend .bar { display: inline-block; width: 240px; height: 14px; margin: 0 6px; border: 1px solid #888; }
.legend .name { margin-right: 8px; }
table { border-collapse: collapse; }
th { font-weight: normal; font-size: 13px; padding: 2px 4px; }
th.key, th.column { writing-mode: vertical-rl; vertical-align: bottom; }
th.query, th.row { text-align: right; white-space: nowrap; }
td.cell { width: 24px; height: 24px; border: 1px solid #fff; }
td.cell:hover { outline: 2px solid #e33; }
</style>
</head>
<body>
<h1>%TITLE%</h1>
<div id="controls">layer<select id="layer"></select>head<select id="head"></select><span id="info" class="info">hover a cell</span></div>
<div class="legend" id="legend"></div>
<table id="grid"></table>
<div id="tables"></div>
<script id="attention-data" type="application/json">%DATA%</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("attention-data").textContent);
const layerBox = document.getElementById("layer"), headBox = document.getElementById("head");
const grid = document.getElementById("grid"), info = document.getElementById("info");
// Viridis at five stops for the weights (0 to 1); red, white, blue for the tables' effects
// (-limit to +limit), as RdBu reversed. Both interpolated linearly between the stops.
const viridis = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const diverging = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
function mix(stops, t) {
  t = Math.min(Math.max(t, 0), 1) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
  const c = stops[i].map((s, k) => Math.round(s + f * (stops[i + 1][k] - s)));
  return "rgb(" + c.join(",") + ")";
}
function colour(w) { return mix(viridis, w); }
function effectColour(v, limit) { return mix(diverging, 0.5 + 0.5 * v / limit); }
// A legend: its name, the low end, the colour bar (the stops as one gradient), the high end.
function legend(box, name, stops, low, high) {
  const parts = [["name", name], ["low", low], ["bar", ""], ["high", high]];
  for (const [cls, text] of parts) {
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = text;
    box.appendChild(span);
  }
  const at = stops.map((s, i) => "rgb(" + s.join(",") + ") " + (100 * i / (stops.length - 1)) + "%");
  box.querySelector(".bar").style.background = "linear-gradient(to right, " + at.join(", ") + ")";
}
function option(box, value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  box.appendChild(o);
}
// A heatmap into `table`: a header row of column labels, then one row per label in rowLabels;
// cell(td, r, c) colours and labels each cell.
function heatmap(table, columnClass, columns, rowClass, rowLabels, cell) {
  table.textContent = "";
  const top = table.insertRow();
  top.appendChild(document.createElement("th"));
  for (const label of columns) {
    const th = document.createElement("th");
    th.className = columnClass;
    th.textContent = label;
    top.appendChild(th);
  }
  rowLabels.forEach((label, r) => {
    const tr = table.insertRow();
    const th = document.createElement("th");
    th.className = rowClass;
    th.textContent = label;
    tr.appendChild(th);
    columns.forEach((_, c) => {
      const td = tr.insertCell();
      td.className = "cell";
      cell(td, r, c);
    });
  });
}
function draw() {
  const layer = data.layers[layerBox.value], weights = layer.heads[headBox.value];
  heatmap(grid, "key", data.tokens, "query", data.tokens, (td, q, k) => {
    const w = weights[q][k];
    td.style.background = colour(w);
    const text = data.tokens[q] + " \u2192 " + data.tokens[k] + ": " + w.toFixed(4);
    td.title = text;
    td.dataset.weight = w.toFixed(4);
    td.addEventListener("mouseenter", () => { info.textContent = layer.name + " head " + headBox.value + ", " + text; });
  });
  grid.dataset.layer = layerBox.value;
  grid.dataset.head = headBox.value;
}
function fillHeads() {
  const keep = headBox.value;
  headBox.textContent = "";
  data.layers[layerBox.value].heads.forEach((_, h) => option(headBox, h, h));
  if (keep !== "" && keep < headBox.options.length) headBox.value = keep;
}
// One table: heading, metrics, legend, hover line, and a cell per effect.
function drawTable(t, n) {
  const section = document.createElement("section");
  section.className = "sweep";
  section.id = "table-" + n;
  const h2 = document.createElement("h2");
  h2.textContent = t.name;
  const caption = document.createElement("div");
  caption.className = "caption";
  caption.textContent = "metric: clean " + t.clean + ", corrupted " + t.corrupted +
      "; a cell: the metric with that patch minus the corrupted run's";
  const box = document.createElement("div");
  box.className = "legend";
  legend(box, "effect", diverging, t.low, t.high);
  const hover = document.createElement("div");
  hover.className = "info";
  hover.textContent = "hover a cell";
  const table = document.createElement("table");
  heatmap(table, "column", t.columns, "row", t.rows, (td, r, c) => {
    td.style.background = effectColour(t.values[r][c], t.limit);
    const text = t.rows[r] + " \u00b7 position " + t.columns[c] + ": effect " + t.text[r][c] +
        (t.restored ? ", restored " + t.restored[r][c] : "");
    td.title = text;
    td.dataset.value = t.text[r][c];
    td.addEventListener("mouseenter", () => { hover.textContent = text; });
  });
  for (const e of [h2, caption, box, hover, table]) section.appendChild(e);
  document.getElementById("tables").appendChild(section);
}
legend(document.getElementById("legend"), "weight", viridis, "0", "1");
data.tables.forEach(drawTable);
data.layers.forEach((layer, l) => option(layerBox, l, layer.name));
const wanted = new URLSearchParams(location.hash.slice(1));
function index(key, count) {
  const n = Number(wanted.get(key));
  return wanted.has(key) && Number.isInteger(n) && n >= 0 && n < count ? n : 0;
}
layerBox.value = index("layer", data.layers.length);
fillHeads();
headBox.value = index("head", headBox.options.length);
layerBox.addEventListener("change", () => { fillHeads(); draw(); });
headBox.addEventListener("change", draw);
draw();
</script>
</body>
</html>
)HTML";

// The template with each placeholder replaced in one pass, so that a replacement is never
// searched again (a title may contain "%DATA%").
std::string fill(const std::string& page, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string out;
  for (std::size_t at = 0; at < page.size();) {
    bool replaced = false;
    for (const auto& [key, value] : values) {
      if (page.compare(at, key.size(), key) == 0) {
        out += value;
        at += key.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += page[at++];
  }
  return out;
}

}  // namespace

std::string attention_viewer_html(const ActivationCache& cache, const std::vector<std::string>& tokens,
                                  std::size_t batch, const std::string& title) {
  return attention_viewer_html(cache, tokens, AttentionViewerOptions().batch(batch).title(title));
}

std::string attention_viewer_html(const ActivationCache& cache, const std::vector<std::string>& tokens,
                                  const AttentionViewerOptions& options) {
  const std::size_t T = tokens.size(), batch = options.batch();
  nlohmann::json layers = nlohmann::json::array();
  for (const std::string& name : cache.names()) {
    const std::string suffix = "pattern";
    if (!nn::point_ends_with(name, suffix)) continue;
    const Array& p = cache.at(name);
    const Shape& s = p.shape();
    if (s.size() != 4 || s[2] != T || s[3] != T) {
      fail("attention_viewer_html: point '", name, "' has shape ", shape_str(s), ", not (B, H, T, T) with T = ", T,
           " tokens");
    }
    if (batch >= s[0]) fail("attention_viewer_html: sequence ", batch, " of point '", name, "', which holds ", s[0]);
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < s[1]; ++h) {
      nlohmann::json rows = nlohmann::json::array();
      for (std::size_t q = 0; q < T; ++q) {
        nlohmann::json row = nlohmann::json::array();
        const float* w = p.data() + ((batch * s[1] + h) * T + q) * T;
        for (std::size_t k = 0; k < T; ++k) {
          if (!std::isfinite(w[k])) {
            fail("attention_viewer_html: point '", name, "' has weight ", w[k], " at (", batch, ", ", h, ", ", q, ", ",
                 k, ")");
          }
          row.push_back(rounded(w[k]));
        }
        rows.push_back(std::move(row));
      }
      heads.push_back(std::move(rows));
    }
    layers.push_back(
        {{"name", name.size() > suffix.size() + 1 ? name.substr(0, name.size() - suffix.size() - 1) : name},
         {"heads", std::move(heads)}});
  }
  if (layers.empty()) fail("attention_viewer_html: the cache holds no '*.pattern' point (", cache.size(), " points)");
  nlohmann::json tables = nlohmann::json::array();
  for (std::size_t n = 0; n < options.tables().size(); ++n) tables.push_back(table_json(options.tables()[n], n));
  const nlohmann::json data = {{"tokens", tokens}, {"layers", std::move(layers)}, {"tables", std::move(tables)}};
  return fill(kPage, {{"%TITLE%", xml_escape(options.title())},
                      {"%DATA%", script_safe(data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))}});
}

}  // namespace xgrad::inspect
