// The HTML attention viewer, rendered by a real browser: headless Chromium (Debian's chromium,
// which scripts/install_deps.sh installs) opens the page on a chosen layer and head and dumps
// the DOM its script built; the test reads the cells back.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/attention_viewer.hpp"
#include "xgrad/nn/transformer.hpp"

#include "run_program.hpp"
#include "small_models.hpp"
#include "test_files.hpp"

using namespace xgrad;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;

namespace {

const char* kChromium = "/usr/bin/chromium";

std::vector<std::string> headless(const std::string& what) {
  return {"--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
          what};
}

std::string four_decimals(float w) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", std::round(static_cast<double>(w) * 1e4) / 1e4);
  return buf;
}

// The DOM Chromium builds from the page, opened at `fragment` ("#layer=1&head=1").
std::string rendered_dom(const std::string& page, const std::string& fragment) {
  testing::TempDir dir("xgrad_viewer");
  write_file_atomically(dir.file("view.html"), page, "test");
  std::vector<std::string> args = headless("--dump-dom");
  args.insert(args.begin(), "--user-data-dir=" + dir.file("profile"));
  args.push_back("file://" + dir.file("view.html") + fragment);
  testing::Limits limits;
  limits.seconds = 120;
  limits.memory = RLIM_INFINITY;
  const testing::Outcome run = testing::run_program(dir, kChromium, args, limits);
  INFO(run);
  REQUIRE(run.exited);
  REQUIRE(run.code == 0);
  return run.out;
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

TEST_CASE("the attention viewer renders every cell of the chosen layer and head in Chromium") {
  REQUIRE(::access(kChromium, X_OK) == 0);  // installed by scripts/install_deps.sh
  auto model = testing::eval_lm(testing::small_lm(), 21);
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

TEST_CASE("hostile tokens, titles and addresses cannot break the viewer") {
  REQUIRE(::access(kChromium, X_OK) == 0);
  auto model = testing::eval_lm(testing::small_lm(), 22);
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

TEST_CASE("the attention viewer refuses a cache it cannot draw") {
  auto model = testing::eval_lm(testing::small_lm(), 21);
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
