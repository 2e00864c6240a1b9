// attention_viewer_html: the patterns as JSON inside one HTML page with its own script.
#include "xgrad/inspect/attention_viewer.hpp"

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

const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>%TITLE%</title>
<style>
body { font-family: sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; }
#controls { margin-bottom: 10px; }
#controls select { margin: 0 12px 0 4px; }
#info { font-family: monospace; margin-left: 8px; }
table { border-collapse: collapse; }
th { font-weight: normal; font-size: 13px; padding: 2px 4px; }
th.key { writing-mode: vertical-rl; vertical-align: bottom; }
th.query { text-align: right; }
td.cell { width: 24px; height: 24px; border: 1px solid #fff; }
td.cell:hover { outline: 2px solid #e33; }
</style>
</head>
<body>
<h1>%TITLE%</h1>
<div id="controls">layer<select id="layer"></select>head<select id="head"></select><span id="info">hover a cell</span></div>
<table id="grid"></table>
<script id="attention-data" type="application/json">%DATA%</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("attention-data").textContent);
const layerBox = document.getElementById("layer"), headBox = document.getElementById("head");
const grid = document.getElementById("grid"), info = document.getElementById("info");
// Viridis at five stops, interpolated.
const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(v) {
  v = Math.min(Math.max(v, 0), 1) * 4;
  const i = Math.min(3, Math.floor(v)), f = v - i;
  const c = stops[i].map((s, k) => Math.round(s + f * (stops[i + 1][k] - s)));
  return "rgb(" + c.join(",") + ")";
}
function option(box, value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  box.appendChild(o);
}
function draw() {
  const layer = data.layers[layerBox.value], weights = layer.heads[headBox.value];
  grid.textContent = "";
  const top = grid.insertRow();
  top.appendChild(document.createElement("th"));
  for (const token of data.tokens) {
    const th = document.createElement("th");
    th.className = "key";
    th.textContent = token;
    top.appendChild(th);
  }
  weights.forEach((row, q) => {
    const tr = grid.insertRow();
    const th = document.createElement("th");
    th.className = "query";
    th.textContent = data.tokens[q];
    tr.appendChild(th);
    row.forEach((w, k) => {
      const td = tr.insertCell();
      td.className = "cell";
      td.style.background = colour(w);
      const text = data.tokens[q] + " \u2192 " + data.tokens[k] + ": " + w.toFixed(4);
      td.title = text;
      td.dataset.weight = w.toFixed(4);
      td.addEventListener("mouseenter", () => { info.textContent = layer.name + " head " + headBox.value + ", " + text; });
    });
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
  const std::size_t T = tokens.size();
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
  const nlohmann::json data = {{"tokens", tokens}, {"layers", std::move(layers)}};
  return fill(kPage, {{"%TITLE%", xml_escape(title)},
                      {"%DATA%", script_safe(data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))}});
}

}  // namespace xgrad::inspect
