// The HTML attention viewer, rendered by a real browser: headless Chromium (Debian's chromium,
// which scripts/install_deps.sh installs) opens the page on a chosen layer and head and dumps
// the DOM its script built, or takes a screenshot; the test reads the cells, the legends, the
// patching and attribution tables and their colours back. The models have their norms and biases
// off their initial values (testing::randomized_lm), as every inspection test's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "xgrad/core/random.hpp"
#include "xgrad/inspect/attention_viewer.hpp"
#include "xgrad/nn/transformer.hpp"

#include "chromium.hpp"
#include "small_models.hpp"

using namespace xgrad;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;
using testing::rendered_dom;

namespace {

std::string four_decimals(float w) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", std::round(static_cast<double>(w) * 1e4) / 1e4);
  return buf;
}

std::vector<std::string> cell_weights(const std::string& dom) {
  const std::regex cell("<td class=\"cell\"[^>]*data-weight=\"([0-9.]+)\"");
  std::vector<std::string> weights;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), cell); it != std::sregex_iterator(); ++it) {
    weights.push_back((*it)[1]);
  }
  return weights;
}

}  // namespace

TEST_CASE("the attention viewer renders every cell of the chosen layer and head in Chromium", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 21);
  const IndexArray ids = {{1, 4, 2, 9, 9, 0, 3, 7}};
  const ActivationCache cache = cache_activations(
      *model, [&] { model->forward(ids); }, points_ending_with({"pattern"}));
  const std::vector<std::string> tokens = {"<s>", "我", "昨天", "去", "了", "北京", "a&b", "</script><b id=\"evil\">"};
  const std::string page = attention_viewer_html(cache, tokens, 0, "small model <test>");
  REQUIRE(page.find("http") == std::string::npos);  // nothing to fetch

  const std::string dom = rendered_dom(page, "#layer=1&head=1");
  REQUIRE_THAT(dom, Contains("data-layer=\"1\"") && Contains("data-head=\"1\""));
  REQUIRE_THAT(dom, Contains("北京") && Contains("small model &lt;test&gt;"));
  REQUIRE_THAT(dom, !Contains("<b id=\"evil\">"));  // a token is text, never markup
  const std::vector<std::string> weights = cell_weights(dom);
  REQUIRE(weights.size() == 64);
  const Array& pattern = cache.at("blocks.1.attn.pattern");
  for (std::size_t q = 0; q < 8; ++q) {
    for (std::size_t k = 0; k < 8; ++k) {
      INFO("query " << q << " key " << k);
      REQUIRE(weights[q * 8 + k] == four_decimals(pattern(0, 1, q, k)));
    }
  }
  // hovering shows the weight: each cell carries it in its title
  REQUIRE_THAT(dom, Contains("title=\"昨天 → 我: " + four_decimals(pattern(0, 1, 2, 1)) + "\""));
}

TEST_CASE("hostile tokens, titles and addresses cannot break the viewer", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 22);
  const IndexArray ids = {{1, 4, 2, 9, 9, 0, 3, 7}};
  const ActivationCache cache = cache_activations(
      *model, [&] { model->forward(ids); }, points_ending_with({"pattern"}));
  // "<!--<script>" would put the HTML parser in a state where the closing tag is not seen; an
  // image with onerror would run script if the title's "%DATA%" were filled in again
  const std::vector<std::string> tokens = {
      "<!--<script>", "<img src=x onerror=document.body.setAttribute('data-pwned',1)>",
      "&amp;",        "\"quoted\"",
      "%TITLE%",      "%DATA%",
      "\\u003c",      "x"};
  const std::string page = attention_viewer_html(cache, tokens, 0, "%DATA% <i>title</i>");
  // a layer that does not exist and a head that is not an integer open layer 0, head 0
  const std::string dom = rendered_dom(page, "#layer=-1&head=1.5");
  REQUIRE_THAT(dom, !Contains("data-pwned=\"1\"") && !Contains("<img") && !Contains("<i>"));
  REQUIRE_THAT(dom, Contains("data-layer=\"0\"") && Contains("data-head=\"0\""));
  const std::vector<std::string> weights = cell_weights(dom);
  REQUIRE(weights.size() == 64);
  const Array& pattern = cache.at("blocks.0.attn.pattern");
  for (std::size_t q = 0; q < 8; ++q)
    for (std::size_t k = 0; k < 8; ++k) REQUIRE(weights[q * 8 + k] == four_decimals(pattern(0, 0, q, k)));
  REQUIRE_THAT(dom, Contains("&lt;!--&lt;script&gt;") && Contains("%DATA% &lt;i&gt;title&lt;/i&gt;"));
}

TEST_CASE("the attention viewer refuses a cache it cannot draw", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 21);
  const IndexArray ids = {{1, 4, 2, 9, 9, 0, 3, 7}};
  const ActivationCache patterns = cache_activations(
      *model, [&] { model->forward(ids); }, points_ending_with({"pattern"}));
  const ActivationCache streams = cache_activations(
      *model, [&] { model->forward(ids); }, points_ending_with({"stream_out"}));
  const std::vector<std::string> eight(8, "x");
  REQUIRE_THROWS_WITH(attention_viewer_html(streams, eight),
                      Contains("attention_viewer_html: the cache holds no '*.pattern' point"));
  REQUIRE_THROWS_WITH(
      attention_viewer_html(patterns, std::vector<std::string>(5, "x")),
      Contains("point 'blocks.0.attn.pattern' has shape (1, 2, 8, 8), not (B, H, T, T) with T = 5 tokens"));
  REQUIRE_THROWS_WITH(attention_viewer_html(patterns, eight, 1),
                      Contains("sequence 1 of point 'blocks.0.attn.pattern', which holds 1"));
  ActivationCache with_nan;
  Array weights = patterns.at("blocks.0.attn.pattern");
  weights(0, 1, 4, 2) = std::numeric_limits<float>::quiet_NaN();
  with_nan.insert("blocks.0.attn.pattern", weights);
  REQUIRE_THROWS_WITH(attention_viewer_html(with_nan, eight),
                      Contains("point 'blocks.0.attn.pattern' has weight nan at (0, 1, 4, 2)"));
}

namespace {

using Rgb = std::array<int, 3>;

// The page's colour scales, written again: linear between the stops, t clamped to [0, 1].
const std::vector<Rgb> kViridis = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
const std::vector<Rgb> kDiverging = {{33, 102, 172}, {146, 197, 222}, {247, 247, 247}, {244, 165, 130}, {178, 24, 43}};

Rgb mix(const std::vector<Rgb>& stops, double t) {
  t = std::min(std::max(t, 0.0), 1.0) * static_cast<double>(stops.size() - 1);
  const std::size_t i = std::min(stops.size() - 2, static_cast<std::size_t>(std::floor(t)));
  const double f = t - static_cast<double>(i);
  Rgb c;
  for (std::size_t k = 0; k < 3; ++k)
    c[k] = static_cast<int>(std::round(stops[i][k] + f * (stops[i + 1][k] - stops[i][k])));
  return c;
}

std::string four_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v + 0.0);  // 0, never -0
  return buf;
}

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

Rect parse_rect(const std::string& text) {
  Rect r;
  REQUIRE(std::sscanf(text.c_str(), "%lf %lf %lf %lf", &r.x, &r.y, &r.w, &r.h) == 4);
  return r;
}

// A rendered table cell: its colour, hover text, shown value and place on the page.
struct Cell {
  Rgb colour;
  std::string title, value;
  Rect rect;
};

// The cells of the table section `id` ("table-0"), row by row.
std::vector<Cell> table_cells(const std::string& dom, const std::string& id) {
  const std::size_t from = dom.find("<section class=\"sweep\" id=\"" + id + "\"");
  REQUIRE(from != std::string::npos);
  const std::string section = dom.substr(from, dom.find("</section>", from) - from);
  const std::regex cell("<td class=\"cell\"[^>]*>");
  auto attribute = [](const std::string& tag, const std::string& name) {
    std::smatch m;
    REQUIRE(std::regex_search(tag, m, std::regex(" " + name + "=\"([^\"]*)\"")));
    return m[1].str();
  };
  std::vector<Cell> cells;
  for (auto it = std::sregex_iterator(section.begin(), section.end(), cell); it != std::sregex_iterator(); ++it) {
    const std::string tag = (*it)[0];
    Cell c;
    REQUIRE(std::sscanf(attribute(tag, "style").c_str(), "background: rgb(%d, %d, %d);", &c.colour[0], &c.colour[1],
                        &c.colour[2]) == 3);
    c.title = attribute(tag, "title");
    c.value = attribute(tag, "data-value");
    c.rect = parse_rect(attribute(tag, "data-rect"));
    cells.push_back(c);
  }
  return cells;
}

// The text of the first element of class `cls` inside the element whose id is `id`.
std::string text_in(const std::string& dom, const std::string& id, const std::string& cls) {
  const std::size_t from = dom.find("id=\"" + id + "\"");
  REQUIRE(from != std::string::npos);
  std::smatch m;
  const std::string rest = dom.substr(from);
  REQUIRE(std::regex_search(rest, m, std::regex("class=\"" + cls + "\"[^>]*>([^<]*)<")));
  return m[1];
}

// The place of the legend's colour bar inside the element whose id is `id`.
Rect legend_bar(const std::string& dom, const std::string& id) {
  const std::size_t from = dom.find("id=\"" + id + "\"");
  REQUIRE(from != std::string::npos);
  std::smatch m;
  const std::string rest = dom.substr(from);
  REQUIRE(std::regex_search(rest, m, std::regex("class=\"bar\"[^>]*data-rect=\"([^\"]*)\"")));
  return parse_rect(m[1]);
}

void require_colour(const testing::Image& shot, double x, double y, const Rgb& want, int tolerance) {
  const auto px = static_cast<std::size_t>(x), py = static_cast<std::size_t>(y);
  REQUIRE(px < shot.width);
  REQUIRE(py < shot.height);
  const std::uint8_t* got = shot.at(px, py);
  INFO("pixel (" << px << ", " << py << ") is rgb(" << int{got[0]} << ", " << int{got[1]} << ", " << int{got[2]}
                 << "), want rgb(" << want[0] << ", " << want[1] << ", " << want[2] << ")");
  for (std::size_t k = 0; k < 3; ++k) REQUIRE(std::abs(int{got[k]} - want[k]) <= tolerance);
}

// Every pixel column of the bar's inside at five places, against the scale at that place.
void require_legend_drawn(const testing::Image& shot, const Rect& bar, const std::vector<Rgb>& stops) {
  const double inside = bar.w - 2;  // a 1 px border
  for (double at : {0.02, 0.25, 0.5, 0.75, 0.98}) {
    const double x = std::floor(bar.x + 1 + at * inside);
    INFO("legend at " << at);
    require_colour(shot, x, bar.y + bar.h / 2, mix(stops, (x + 0.5 - bar.x - 1) / inside), 4);
  }
}

// The probe the tests add to the page: a hover on two table cells, and every legend bar's and
// table cell's place as data-rect="x y width height".
const char* kProbe = R"JS(
document.querySelector("#table-0 tr:nth-child(4) td:nth-of-type(6)").dispatchEvent(new MouseEvent("mouseenter"));
document.querySelector("#table-1 tr:nth-child(3) td:nth-of-type(4)").dispatchEvent(new MouseEvent("mouseenter"));
for (const e of document.querySelectorAll(".legend .bar, #tables td.cell")) {
  const r = e.getBoundingClientRect();
  e.dataset.rect = [r.x, r.y, r.width, r.height].join(" ");
})JS";

}  // namespace

TEST_CASE("the viewer's legends and its patching and attribution tables, drawn in Chromium", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 23);
  const IndexArray clean_ids = {{1, 4, 2, 9, 9, 0, 3, 7}}, corrupted_ids = {{1, 4, 6, 9, 9, 0, 3, 7}};
  const Metric metric = logit_difference(7, {3}, {5});
  auto clean = [&] { return model->forward(clean_ids).logits; };
  auto corrupted = [&] { return model->forward(corrupted_ids).logits; };
  const std::vector<SweepResult> results = {
      patching_sweep(*model, clean, corrupted, metric, every_head_position(*model)),
      attribution_patching(*model, clean, corrupted, metric, every_layer_position(*model))};
  const ActivationCache cache = cache_activations(
      *model, [&] { model->forward(clean_ids); }, points_ending_with({"pattern"}));
  const std::vector<std::string> tokens = {"<s>", "我", "昨天", "去", "了", "北京", "出差", "."};
  const std::string page = attention_viewer_html(cache, tokens,
                                                 AttentionViewerOptions()
                                                     .title("tables")
                                                     .table("activation patching <heads>", results[0])
                                                     .table("attribution patching", results[1]));
  REQUIRE(page.find("http") == std::string::npos);  // nothing to fetch
  REQUIRE(results[0].rows.size() == 4);
  REQUIRE(results[1].rows.size() == 2);

  const std::size_t width = 1000, height = 1400;
  const std::string probed = testing::with_script(page, kProbe);
  const std::string dom = rendered_dom(probed, "", width, height);
  const testing::Image shot = testing::screenshot(probed, width, height);

  // The attention's legend: 0 to 1 on viridis, drawn.
  REQUIRE(text_in(dom, "legend", "name") == "weight");
  REQUIRE(text_in(dom, "legend", "low") == "0");
  REQUIRE(text_in(dom, "legend", "high") == "1");
  require_legend_drawn(shot, legend_bar(dom, "legend"), kViridis);
  REQUIRE(cell_weights(dom).size() == 64);  // the attention grid is still there

  for (std::size_t n = 0; n < results.size(); ++n) {
    const SweepResult& r = results[n];
    const std::string id = "table-" + std::to_string(n);
    INFO(id);
    double limit = 0;
    for (float v : r.effect) limit = std::max(limit, std::abs(static_cast<double>(v)));
    REQUIRE(limit > 0);
    // The legend: -limit to +limit on the diverging scale, drawn.
    REQUIRE(text_in(dom, id, "low") == four_digits(-limit));
    REQUIRE(text_in(dom, id, "high") == four_digits(limit));
    require_legend_drawn(shot, legend_bar(dom, id), kDiverging);
    REQUIRE_THAT(text_in(dom, id, "caption"),
                 Contains("clean " + four_digits(r.clean) + ", corrupted " + four_digits(r.corrupted)));

    // Every cell: its value, hover text and colour in the DOM, and that colour on the screen.
    const std::vector<Cell> cells = table_cells(dom, id);
    REQUIRE(cells.size() == r.rows.size() * r.columns.size());
    const double range = r.clean - r.corrupted;
    REQUIRE(range != 0);
    const double shown_limit = std::stod(four_digits(limit));
    for (std::size_t i = 0; i < r.rows.size(); ++i) {
      for (std::size_t j = 0; j < r.columns.size(); ++j) {
        const Cell& c = cells[i * r.columns.size() + j];
        const float e = r.effect(i, j);
        INFO("row " << r.rows[i] << " column " << r.columns[j]);
        REQUIRE(c.value == four_digits(e));
        REQUIRE(c.title == r.rows[i] + " · position " + r.columns[j] + ": effect " + four_digits(e) + ", restored " +
                               four_digits(e / range));
        const Rgb want = mix(kDiverging, 0.5 + 0.5 * std::stod(four_digits(e)) / shown_limit);
        for (std::size_t k = 0; k < 3; ++k) REQUIRE(std::abs(c.colour[k] - want[k]) <= 1);
        require_colour(shot, c.rect.x + c.rect.w / 2, c.rect.y + c.rect.h / 2, c.colour, 2);
      }
    }
    // The largest |effect| takes an end colour.
    const std::size_t largest = static_cast<std::size_t>(
        std::max_element(r.effect.begin(), r.effect.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }) -
        r.effect.begin());
    REQUIRE((cells[largest].colour == kDiverging.front() || cells[largest].colour == kDiverging.back()));
  }
  // Hovering shows the cell's row, column and value.
  REQUIRE_THAT(dom, Contains("heads&gt;</h2>"));  // the name is text
  const std::size_t hover0 = 2 * results[0].columns.size() + 5, hover1 = 1 * results[1].columns.size() + 3;
  REQUIRE(text_in(dom, "table-0", "info") == table_cells(dom, "table-0")[hover0].title);
  REQUIRE(text_in(dom, "table-1", "info") == table_cells(dom, "table-1")[hover1].title);
  REQUIRE_THAT(text_in(dom, "table-1", "info"), Contains("blocks.1.stream_in · position 3: effect "));
}

TEST_CASE("the viewer refuses a table it cannot draw, naming it, before building the page", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 21);
  const IndexArray ids = {{1, 4, 2, 9, 9, 0, 3, 7}};
  const ActivationCache patterns = cache_activations(
      *model, [&] { model->forward(ids); }, points_ending_with({"pattern"}));
  const std::vector<std::string> eight(8, "x");
  SweepResult good;
  good.rows = {"a", "b"};
  good.columns = {"0", "1", "2"};
  good.effect = Array({{0.5f, -0.25f, 0.f}, {1.f, 0.125f, -2.f}});
  good.clean = 1;
  good.corrupted = -1;
  REQUIRE_NOTHROW(attention_viewer_html(patterns, eight, AttentionViewerOptions().table("good", good)));
  auto refused = [&](const SweepResult& bad) {
    return attention_viewer_html(patterns, eight, AttentionViewerOptions().table("good", good).table("bad", bad));
  };

  SweepResult shape = good;
  shape.columns.pop_back();
  REQUIRE_THROWS_WITH(refused(shape),
                      Contains("attention_viewer_html: table 1 'bad' has effect of shape (2, 3), not (rows, columns) "
                               "= (2, 2)"));
  SweepResult flat = good;
  flat.effect = Array::from_shape({6});
  REQUIRE_THROWS_WITH(refused(flat), Contains("table 1 'bad' has effect of shape (6), not (rows, columns) = (2, 3)"));
  SweepResult empty;
  empty.columns = {"all"};
  empty.effect = Array::from_shape({0, 1});
  REQUIRE_THROWS_WITH(refused(empty), Contains("attention_viewer_html: table 1 'bad' is empty: 0 rows, 1 columns"));
  SweepResult nan = good;
  nan.effect(1, 2) = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(refused(nan), Contains("table 1 'bad' has effect nan at row 'b', column '2'"));
  SweepResult inf = good;
  inf.effect(0, 1) = -std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(refused(inf), Contains("table 1 'bad' has effect -inf at row 'a', column '1'"));
  SweepResult metric = good;
  metric.clean = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(refused(metric),
                      Contains("table 1 'bad' has metric inf on the clean run and -1 on the corrupted run"));
  // the checks of the attention come first, and hold with tables too
  REQUIRE_THROWS_WITH(attention_viewer_html(patterns, eight, AttentionViewerOptions().batch(1).table("good", good)),
                      Contains("sequence 1 of point 'blocks.0.attn.pattern', which holds 1"));
}
