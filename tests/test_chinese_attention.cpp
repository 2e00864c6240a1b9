// The Chinese attention example in small: its corpus and vocabulary, a short training run that
// beats the unigram baseline and repeats bit for bit, attention rows that are distributions over
// the past, the head reading on known patterns, the command line's refusals, and the pictures'
// Chinese labels drawn as characters (not missing-glyph boxes) in Chromium.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "chromium.hpp"
#include "command_line.hpp"
#include "common/cli.hpp"
#include "head_reading.hpp"
#include "report.hpp"
#include "trainer.hpp"
#include "xgrad/core/io/file_io.hpp"

using namespace zh;

namespace {

TrainOptions short_run(std::size_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch = 16;
  return o;
}

// cli::parse on the example's options; returns the exit code (-1: go on) and what went to stderr.
std::pair<int, std::string> parse_command(std::vector<std::string> args) {
  CLI::App app{"test", "chinese_attention"};
  CommandLine c;
  add_options(app, c);
  args.insert(args.begin(), "chinese_attention");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const std::string path = (std::filesystem::temp_directory_path() / "xgrad_test_chinese_attention_stderr").string();
  std::fflush(stderr);
  const int saved = dup(fileno(stderr));
  REQUIRE(std::freopen(path.c_str(), "w", stderr) != nullptr);
  const std::optional<int> code = cli::parse(app, static_cast<int>(argv.size()), argv.data());
  std::fflush(stderr);
  dup2(saved, fileno(stderr));
  close(saved);
  std::ifstream in(path);
  std::string first_line;
  std::getline(in, first_line);
  std::filesystem::remove(path);
  return {code ? *code : -1, first_line};
}

}  // namespace

TEST_CASE("the corpus holds the sentence's words, and sentences encode and decode round trip") {
  const CorpusSplit corpus = builtin_corpus();
  REQUIRE(corpus.train.size() == 1800);
  REQUIRE(corpus.held_out.size() == 200);
  const std::set<Sentence> train(corpus.train.begin(), corpus.train.end());
  for (const Sentence& s : corpus.held_out) REQUIRE(train.count(s) == 0);  // held out means unseen
  REQUIRE(builtin_corpus().held_out == corpus.held_out);                   // the same every time

  std::vector<Sentence> every = corpus.train;
  every.insert(every.end(), corpus.held_out.begin(), corpus.held_out.end());
  const Vocabulary vocab(every);
  for (const std::string& w : probe_sentence()) {
    INFO(w);
    REQUIRE(vocab.contains(w));
  }
  REQUIRE(vocab.word(Vocabulary::kBos) == "<s>");
  for (const Sentence& s : every) REQUIRE(vocab.words(vocab.encode(s)) == s);
  REQUIRE(split_words("我  昨天 去 了 北京 出差") == probe_sentence());
  REQUIRE(join_words(probe_sentence()) == "我 昨天 去 了 北京 出差");
  REQUIRE_THROWS_WITH(vocab.encode({"我", "火星"}), Catch::Contains("'火星' is not in the vocabulary"));
  REQUIRE_THROWS_WITH(vocab.words({1, static_cast<std::int64_t>(vocab.size())}), Catch::Contains("outside [0, "));

  // The tokenizer interface: words split at spaces, joined without them.
  const xgrad::text::TokenIds probe = vocab.encode(std::string_view("我 昨天 去 了 北京 出差"));
  REQUIRE(probe == vocab.encode(probe_sentence()));
  REQUIRE(vocab.decode(probe) == "我昨天去了北京出差");
  REQUIRE(vocab.token_strings(probe) == probe_sentence());
  REQUIRE(vocab.vocab_size() == vocab.size());
  REQUIRE(vocab.special_tokens().bos == Vocabulary::kBos);
  REQUIRE(vocab.special_tokens().eos == Vocabulary::kEos);
  REQUIRE(vocab.identity() == Vocabulary(every).identity());
  REQUIRE_THROWS_WITH(vocab.encode(std::string_view("我 </s>")), Catch::Contains("'</s>' is a special token"));
  REQUIRE(vocab.encode(std::string_view("<s> 我"), xgrad::text::SpecialText::match)[0] == Vocabulary::kBos);

  // <s> w1 .. wn </s> <pad>: targets w1 .. wn </s> ignore ignore.
  const Sentence shorter = {"我", "去"};
  const Batch b = make_batch(vocab, {&probe_sentence(), &shorter});
  REQUIRE(b.ids.shape() == xgrad::Shape{2, 7});
  REQUIRE(b.ids(1, 0) == Vocabulary::kBos);
  REQUIRE(b.targets(1, 1) == vocab.encode(Sentence{"去"})[0]);
  REQUIRE(b.targets(1, 2) == Vocabulary::kEos);
  REQUIRE(b.ids(1, 3) == Vocabulary::kEos);
  REQUIRE(b.targets(1, 3) == xgrad::kIgnoreIndex);
  REQUIRE(b.ids(1, 4) == Vocabulary::kPad);
  REQUIRE(b.targets(1, 4) == xgrad::kIgnoreIndex);
  REQUIRE(b.targets(0, 6) == Vocabulary::kEos);
}

TEST_CASE("a short training run brings the held-out loss well below the unigram baseline", "[gemm][long]") {
  const TrainResult r = train(short_run(200), builtin_corpus());
  INFO("held-out " << r.losses.held_out << ", untrained " << r.losses.held_out_before << ", unigram "
                   << r.losses.unigram);
  REQUIRE(r.losses.unigram > 3.0);  // about 80 words in use: a meaningful bar
  REQUIRE(r.losses.held_out_before > r.losses.unigram);
  REQUIRE(r.losses.held_out < 0.4 * r.losses.unigram);  // measured: 1.306 against 3.697
}

TEST_CASE("the same seed gives the same bits, another seed other weights", "[gemm]") {
  const CorpusSplit corpus = builtin_corpus();
  const TrainResult a = train(short_run(30), corpus), b = train(short_run(30), corpus);
  TrainOptions other = short_run(30);
  other.seed = 1;
  const TrainResult c = train(other, corpus);
  REQUIRE(a.step_losses.size() == 30);
  REQUIRE(a.step_losses == b.step_losses);  // bitwise
  REQUIRE(a.losses.held_out == b.losses.held_out);
  const auto pa = a.model->named_parameters(), pb = b.model->named_parameters(), pc = c.model->named_parameters();
  bool any_differs = false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].second.value() == pb[i].second.value());
    any_differs = any_differs || pa[i].second.value() != pc[i].second.value();
  }
  REQUIRE(any_differs);
  REQUIRE(a.step_losses != c.step_losses);
}

TEST_CASE("the attention rows over the sentence are causal distributions", "[gemm]") {
  const TrainResult r = train(short_run(40), builtin_corpus());
  // Trained, not as initialized: every norm weight has left 1 and every bias 0 (the inspection
  // tests run on such models, so that a norm or bias applied twice or not at all shows).
  for (const auto& [name, p] : r.model->named_parameters()) {
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (!bias && name.find("norm") == std::string::npos) continue;
    INFO(name);
    float moved = 0;
    for (float v : p.value()) moved = std::max(moved, std::abs(v - (bias ? 0.f : 1.f)));
    REQUIRE(moved > 1e-3f);
  }
  const std::vector<xgrad::Array> attention = attention_on(*r.model, r.vocab, probe_sentence());
  REQUIRE(attention.size() == 2);
  for (const xgrad::Array& w : attention) {
    REQUIRE(w.shape() == xgrad::Shape{4, 7, 7});
    for (std::size_t h = 0; h < 4; ++h) {
      for (std::size_t t = 0; t < 7; ++t) {
        double sum = 0;
        for (std::size_t s = 0; s < 7; ++s) {
          REQUIRE(w(h, t, s) >= 0.f);
          if (s > t) REQUIRE(w(h, t, s) == 0.f);  // no query sees a later word
          sum += w(h, t, s);
        }
        REQUIRE(std::abs(sum - 1.0) < 1e-5);
      }
    }
  }
  REQUIRE(attention[0](0, 0, 0) == Approx(1.f));  // <s> sees only itself
  REQUIRE(token_labels(probe_sentence()).front() == "<s>");
}

TEST_CASE("the head reading names known patterns") {
  // Head 0 attends to the previous token, head 1 to the first, head 2 to itself, head 3 evenly.
  const std::size_t T = 5;
  xgrad::Array w = xt::zeros<float>({std::size_t{4}, T, T});
  for (std::size_t t = 0; t < T; ++t) {
    w(0, t, t == 0 ? 0 : t - 1) = 1.f;
    w(1, t, 0) = 1.f;
    w(2, t, t) = 1.f;
    for (std::size_t s = 0; s <= t; ++s) w(3, t, s) = 1.f / static_cast<float>(t + 1);
  }
  const std::vector<HeadReading> r = read_heads({w});
  REQUIRE(r.size() == 4);
  CHECK(r[0].pattern == "previous token");
  CHECK(r[0].previous == Approx(1.0));
  CHECK(r[0].strongest_key == std::vector<std::size_t>{0, 0, 1, 2, 3});
  CHECK(r[1].pattern == "first token");
  CHECK(r[1].first == Approx(1.0));
  CHECK(r[2].pattern == "itself");
  CHECK(r[2].self == Approx(1.0));
  CHECK(r[3].pattern == "mixed");
  CHECK(r[3].previous == Approx((1.0 / 3 + 1.0 / 4 + 1.0 / 5) / 3));
  CHECK(describe(r[0], {"<s>", "a", "b", "c", "d"}).find("a→<s> 1.00  b→a 1.00  c→b 1.00  d→c 1.00") !=
        std::string::npos);
}

TEST_CASE("bad options fail with exit 2 and one line naming the option") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--steps", "-1"}, "--steps"}, {{"--steps", "0"}, "--steps"},     {{"--steps", "0x10"}, "--steps"},
      {{"--batch", "0"}, "--batch"},  {{"--lr", "nan"}, "--lr"},         {{"--lr", "0"}, "--lr"},
      {{"--seed", "-1"}, "--seed"},   {{"--threads", "0"}, "--threads"}, {{"--no-such-flag"}, "--no-such-flag"}};
  for (const auto& [args, option] : cases) {
    INFO(args[0] << (args.size() > 1 ? " " + args[1] : ""));
    const auto [code, message] = parse_command(args);
    CHECK(code == 2);
    CHECK(message.rfind("chinese_attention: error: ", 0) == 0);
    CHECK(message.find(option) != std::string::npos);
  }
  CHECK(parse_command({"--steps", "010", "--seed", "18446744073709551615"}).first == -1);  // valid: goes on

  const auto dir = std::filesystem::temp_directory_path() / "xgrad_test_chinese_attention";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  CommandLine c;
  c.out = (dir / "file" / "images").string();
  REQUIRE_THROWS_AS(check_before_run(c), cli::UsageError);
  REQUIRE_THROWS_WITH(check_before_run(c), Catch::Contains("chinese_attention: --out"));
  std::filesystem::remove_all(dir);
}

namespace {

// A label of the picture and where Chromium drew it (CSS pixels).
struct LabelBox {
  std::string text;
  double x, y, w, h;
};

// The unrotated <text> elements of an SVG page (the row labels and the title), read back from
// the DOM a probe script fills.
std::vector<LabelBox> label_boxes(const std::string& page, std::size_t width, std::size_t height) {
  const std::string dom = xgrad::testing::rendered_dom(xgrad::testing::with_script(page, R"JS(
const lines = [];
for (const t of document.querySelectorAll("text")) {
  if (t.hasAttribute("transform")) continue;
  const r = t.getBoundingClientRect();
  lines.push(["box", t.textContent, r.x, r.y, r.width, r.height].join("\t"));
}
const pre = document.createElement("pre");
pre.id = "boxes";
pre.textContent = lines.join("\n");
document.body.appendChild(pre);)JS"),
                                                       "", width, height);
  const std::regex line("box\t([^\t\n]*)\t([-0-9.e]+)\t([-0-9.e]+)\t([-0-9.e]+)\t([-0-9.e]+)");
  std::vector<LabelBox> boxes;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), line); it != std::sregex_iterator(); ++it) {
    boxes.push_back({(*it)[1], std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4]), std::stod((*it)[5])});
  }
  return boxes;
}

// The SVG as the only content of an HTML page, at its top left corner.
std::string svg_page(const std::string& svg) {
  return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><style>body { margin: 0; } svg { display: block; }"
         "</style></head><body>\n" +
         svg + "</body></html>\n";
}

// How many UTF-8 characters s holds.
std::size_t characters(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

TEST_CASE("the pictures of the sentence draw its Chinese characters in Chromium", "[gemm]") {
  // The heatmap the example writes for layer 0 head 0, from a trained model, and the same picture
  // with every Chinese label replaced by as many U+10FFFD (a private-use code point no font
  // covers: the missing-glyph box). With no CJK font, Chromium draws every Chinese character as
  // that same box: the labels' pixels then equal the reference's and each other's.
  const TrainResult r = train(short_run(40), builtin_corpus());
  const std::vector<xgrad::Array> attention = attention_on(*r.model, r.vocab, probe_sentence());
  const std::vector<std::string> labels = token_labels(probe_sentence());
  xgrad::testing::TempDir dir("xgrad_chinese_pictures");
  write_heatmaps(dir.path, attention, read_heads(attention), labels);
  const std::string svg = xgrad::read_file(dir.file("head_l0_h0.svg"), "test");
  std::string missing = svg;
  for (const std::string& word : probe_sentence()) {
    std::string boxes;
    for (std::size_t i = 0; i < characters(word); ++i) boxes += "\U0010FFFD";
    const std::string from = ">" + word + "<", to = ">" + boxes + "<";
    std::size_t replaced = 0;
    for (std::size_t at = missing.find(from); at != std::string::npos; at = missing.find(from, at + to.size())) {
      missing.replace(at, from.size(), to);
      ++replaced;
    }
    INFO(word);
    REQUIRE(replaced == 2);  // its row label and its column label
  }

  const std::smatch size = [&] {
    std::smatch m;
    REQUIRE(std::regex_search(svg, m, std::regex("width='([0-9.]+)' height='([0-9.]+)'")));
    return m;
  }();
  const auto width = static_cast<std::size_t>(std::ceil(std::stod(size[1]))),
             height = static_cast<std::size_t>(std::ceil(std::stod(size[2])));
  const int scale = 2;  // more pixels per stroke
  const xgrad::testing::Image drawn = xgrad::testing::screenshot(svg_page(svg), width, height, scale),
                              boxes = xgrad::testing::screenshot(svg_page(missing), width, height, scale);

  // Each Chinese row label's pixels, in the picture and in the reference at the same place.
  std::map<std::string, std::string> in_picture, in_reference;
  for (const LabelBox& b : label_boxes(svg_page(svg), width, height)) {
    if (std::find(probe_sentence().begin(), probe_sentence().end(), b.text) == probe_sentence().end()) continue;
    const auto x0 = static_cast<std::size_t>(std::max(0.0, std::floor(b.x * scale) - 1)),
               y0 = static_cast<std::size_t>(std::max(0.0, std::floor(b.y * scale) - 1));
    const auto w = static_cast<std::size_t>(std::ceil((b.x + b.w) * scale) + 1) - x0,
               h = static_cast<std::size_t>(std::ceil((b.y + b.h) * scale) + 1) - y0;
    in_picture[b.text] = drawn.crop(x0, y0, w, h);
    in_reference[b.text] = boxes.crop(x0, y0, w, h);
    std::size_t ink = 0;
    for (std::size_t k = 0; k < in_picture[b.text].size(); k += 4)
      ink += static_cast<unsigned char>(in_picture[b.text][k]) < 0x80;
    INFO(b.text << " at " << b.x << ", " << b.y);
    REQUIRE(ink > 3);  // the box holds the drawn label
  }
  REQUIRE(in_picture.size() == 6);
  const std::string hint = "no CJK font drew the label: install Debian's fonts-noto-cjk (scripts/install_deps.sh)";
  for (const auto& [word, pixels] : in_picture) {
    INFO(word << ": " << hint);
    const bool unlike_the_box = pixels != in_reference[word];
    CHECK(unlike_the_box);  // not the missing-glyph box
    for (const auto& [other, other_pixels] : in_picture) {
      // words of as many characters are as wide: with one font for all, only the glyphs differ
      if (other == word || characters(other) != characters(word)) continue;
      INFO("against " << other);
      const bool unlike_the_other = pixels != other_pixels;
      CHECK(unlike_the_other);
    }
  }
}
