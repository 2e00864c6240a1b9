// Pages rendered by a real browser, for the tests of the HTML viewer and of the SVG pictures:
// headless Chromium (Debian's chromium, which scripts/install_deps.sh installs) dumps the DOM its
// scripts built, or takes a screenshot that libpng reads back as RGBA pixels.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#ifndef XGRAD_TEST_NO_PNG
#include <png.h>
#endif

#include "xgrad/core/io/file_io.hpp"

#include "run_program.hpp"
#include "test_files.hpp"

namespace xgrad::testing {

inline const char* kChromium = "/usr/bin/chromium";

// Chromium's arguments for one headless run with its own profile in `dir`, then `what` and the page.
inline std::vector<std::string> headless(const TempDir& dir, const std::vector<std::string>& what,
                                         const std::string& url) {
  std::vector<std::string> args = {"--headless",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--disable-quic",
                                   "--no-first-run",
                                   "--disable-background-networking",
                                   "--disable-component-update",
                                   "--disable-sync",
                                   "--hide-scrollbars",
                                   "--user-data-dir=" + dir.file("profile")};
  args.insert(args.end(), what.begin(), what.end());
  args.push_back(url);
  return args;
}

inline Outcome run_chromium(const TempDir& dir, const std::vector<std::string>& args) {
  REQUIRE(::access(kChromium, X_OK) == 0);  // installed by scripts/install_deps.sh
  Limits limits;
  limits.seconds = 120;
  limits.memory = RLIM_INFINITY;
  const Outcome run = run_program(dir, kChromium, args, limits);
  INFO(run);
  REQUIRE(run.exited);
  REQUIRE(run.code == 0);
  return run;
}

// The page with `script` run after its own (before its closing </body>): a test's probe.
inline std::string with_script(const std::string& page, const std::string& script) {
  const std::size_t at = page.rfind("</body>");
  REQUIRE(at != std::string::npos);
  return page.substr(0, at) + "<script>\n" + script + "\n</script>\n" + page.substr(at);
}

// "--window-size=W,H": the window that both rendered_dom and screenshot lay the page out in.
inline std::string window_size(std::size_t width, std::size_t height) {
  return "--window-size=" + std::to_string(width) + "," + std::to_string(height);
}

// The DOM Chromium builds from the page, opened at `fragment` ("#layer=1&head=1"), in a window
// of width x height CSS pixels.
inline std::string rendered_dom(const std::string& page, const std::string& fragment = "", std::size_t width = 800,
                                std::size_t height = 600) {
  TempDir dir("xgrad_chromium");
  write_file_atomically(dir.file("view.html"), page, "test");
  return run_chromium(dir, headless(dir, {"--dump-dom", window_size(width, height)},
                                    "file://" + dir.file("view.html") + fragment))
      .out;
}

// RGBA pixels, row by row from the top.
struct Image {
  std::size_t width = 0, height = 0;
  std::vector<std::uint8_t> rgba;
  const std::uint8_t* at(std::size_t x, std::size_t y) const { return rgba.data() + 4 * (y * width + x); }
  // The pixels of the rectangle [x, x + w) x [y, y + h), clipped to the image, as one RGBA string.
  std::string crop(std::size_t x, std::size_t y, std::size_t w, std::size_t h) const {
    std::string out;
    for (std::size_t r = y; r < y + h && r < height; ++r) {
      for (std::size_t c = x; c < x + w && c < width; ++c) out.append(reinterpret_cast<const char*>(at(c, r)), 4);
    }
    return out;
  }
};

inline Image read_png(const std::string& path) {
#ifdef XGRAD_TEST_NO_PNG
  FAIL("the tests were configured without libpng (libpng-dev, which scripts/install_deps.sh installs): cannot read "
       << path);
  return {};
#else
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&png, path.c_str()) != 0);
  png.format = PNG_FORMAT_RGBA;
  Image image;
  image.width = png.width;
  image.height = png.height;
  image.rgba.resize(PNG_IMAGE_SIZE(png));
  REQUIRE(png_image_finish_read(&png, nullptr, image.rgba.data(), 0, nullptr) != 0);
  return image;
#endif
}

// A screenshot of the page (a window of width x height CSS pixels, `scale` device pixels to one).
inline Image screenshot(const std::string& page, std::size_t width, std::size_t height, int scale = 1) {
  TempDir dir("xgrad_chromium");
  write_file_atomically(dir.file("view.html"), page, "test");
  run_chromium(dir, headless(dir,
                             {"--screenshot=" + dir.file("shot.png"), window_size(width, height),
                              "--force-device-scale-factor=" + std::to_string(scale)},
                             "file://" + dir.file("view.html")));
  const Image image = read_png(dir.file("shot.png"));
  REQUIRE(image.width == width * scale);
  REQUIRE(image.height == height * scale);
  return image;
}

}  // namespace xgrad::testing
