// tokenizer.json's normalizers (text/hf_normalizers.cpp) against Hugging Face's Rust tokenizers (the
// cases of tests/fixtures/hf_components/normalizer_cases.json, which make_fixtures.mjs writes; each
// case's note says where the JavaScript port differs), the UTF-8 repair and JavaScript's trim against
// node's TextDecoder and String.prototype.trimStart / trimEnd, and every bad input of the factory.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "error_of.hpp"
#include "fixture.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/detail/hf_components.hpp"

using namespace xgrad;
using namespace xgrad::text::detail;
using Catch::Contains;

namespace {

const JsonPlace kPlace{"test.json", "normalizer"};

std::string normalized(const Json& config, const std::string& text) {
  return make_hf_normalizer(config, kPlace)->normalize(text);
}

std::string refusal(const Json& config) {
  return testing::error_of([&] { make_hf_normalizer(config, kPlace); });
}

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (const int v : values) out += static_cast<char>(v);
  return out;
}

}  // namespace

TEST_CASE("hf normalizers: every fixture case normalizes as Hugging Face's Rust tokenizers does", "[text]") {
  const Json cases = testing::load_fixture("hf_components/normalizer_cases.json");
  REQUIRE(cases.size() >= 30);
  for (const Json& c : cases) {
    INFO(c.at("note").get<std::string>() << "\nconfig " << c.at("config").dump() << "\ntext " << c.at("text").dump());
    CHECK(normalized(c.at("config"), c.at("text").get<std::string>()) == c.at("normalized").get<std::string>());
  }
}

TEST_CASE("hf normalizers: a null normalizer is none", "[text]") {
  CHECK(make_hf_normalizer(Json(nullptr), kPlace) == nullptr);
}

TEST_CASE("hf normalizers: a long ASCII text comes back as it is from every form", "[text]") {
  const std::string text(1 << 20, 'x');
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD"}) CHECK(normalized({{"type", form}}, text) == text);
}

TEST_CASE("hf normalizers: invalid UTF-8 becomes U+FFFD as node's TextDecoder makes it", "[text][bad_input]") {
  // Each expected value is node 20's new TextDecoder("utf-8").decode() of the bytes (one U+FFFD for
  // each maximal subpart of an ill-formed sequence, as the WHATWG Encoding standard says).
  const std::string R = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {bytes({0x61, 0x80, 0x62}), "a" + R + "b"},                          // a lone continuation byte
      {bytes({0x80, 0x80, 0x80}), R + R + R},                              // three of them
      {bytes({0xC0, 0x80}), R + R},                                        // an overlong NUL
      {bytes({0xC1, 0xBF}), R + R},                                        // an overlong two-byte form
      {bytes({0xE0, 0x80, 0x80}), R + R + R},                              // an overlong three-byte form
      {bytes({0xE0, 0x9F, 0xBF}), R + R + R},                              // the last overlong three-byte form
      {bytes({0xED, 0xA0, 0x80}), R + R + R},                              // a surrogate
      {bytes({0xED, 0x9F, 0xBF}), bytes({0xED, 0x9F, 0xBF})},              // U+D7FF, the last before them
      {bytes({0xF4, 0x90, 0x80, 0x80}), R + R + R + R},                    // past U+10FFFF
      {bytes({0xF4, 0x8F, 0xBF, 0xBF}), bytes({0xF4, 0x8F, 0xBF, 0xBF})},  // U+10FFFF
      {bytes({0xF5, 0x80}), R + R},                                        // F5 leads nothing
      {bytes({0xFF, 0xFE}), R + R},
      {bytes({0xF8, 0x88, 0x80, 0x80, 0x80}), R + R + R + R + R},  // an old five-byte form
      {bytes({0xC2}), R},                                          // cut short at the end
      {bytes({0xE2, 0x82}), R},
      {bytes({0xE2, 0x82, 0x61}), R + "a"},  // cut short, then ASCII
      {bytes({0xE0, 0xA0}), R},
      {bytes({0xF0, 0x9F, 0x98}), R},
      {bytes({0xF0, 0x90, 0x80}), R},
      {bytes({0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80"},    // U+1F600, valid
      {bytes({0xC3, 0xA9, 0xE9, 0x61}), "\xC3\xA9" + R + "a"},  // Latin-1 é inside UTF-8
      {"\xEF\xBF\xBD", "\xEF\xBF\xBD"},                         // U+FFFD itself
      {"", ""},
  };
  for (const auto& [in, out] : cases) {
    INFO(Json(out).dump());
    CHECK(replace_invalid_utf8(in) == out);
  }
}

TEST_CASE("hf normalizers: JavaScript's trim whitespace, as trimStart and trimEnd have it", "[text]") {
  // node 20: ("x" + c).trimEnd() and (c + "x").trimStart() drop c for exactly these.
  const std::vector<std::string> trimmed = {"\t",     "\n",     "\v",     "\f",     "\r",     " ",
                                            "\u00A0", "\u1680", "\u2000", "\u200A", "\u2028", "\u2029",
                                            "\u202F", "\u205F", "\u3000", "\uFEFF"};
  for (const std::string& c : trimmed) {
    INFO(Json(c).dump());
    CHECK(leading_js_space(c + "x") == c.size());
    CHECK(trailing_js_space("x" + c) == c.size());
  }
  for (const std::string c : {"\u0085", "\u180E", "\u200B", "x", "\xC2\xA9"}) {
    INFO(Json(c).dump());
    CHECK(leading_js_space(c + " ") == 0);
    CHECK(trailing_js_space(" " + c) == 0);
  }
  CHECK(leading_js_space(" \u3000\t a ") == 6);
  CHECK(trailing_js_space(" a \uFEFF\n") == 5);
  CHECK(leading_js_space(" \u00A0 ") == 4);
  CHECK(trailing_js_space("") == 0);
}

TEST_CASE("hf normalizers: Sequences 60 deep normalize, 65 deep are refused by name", "[text][bad_input]") {
  Json deep = {{"type", "Lowercase"}};
  for (int i = 0; i < 60; ++i) deep = {{"type", "Sequence"}, {"normalizers", Json::array({deep})}};
  CHECK(normalized(deep, "ABC") == "abc");
  for (int i = 0; i < 5; ++i) deep = {{"type", "Sequence"}, {"normalizers", Json::array({deep})}};
  CHECK_THAT(refusal(deep), Contains("nests Sequences more than 64 deep"));
}

TEST_CASE("hf normalizers: types and fields nobody implements are refused by name", "[text][bad_input]") {
  CHECK_THAT(refusal({{"type", "Foo"}}),
             Contains("test.json normalizer.type: is \"Foo\", which is no normalizer xgrad knows"));
  for (const char* type : {"BertNormalizer", "Precompiled", "Nmt"}) {
    INFO(type);
    CHECK_THAT(refusal({{"type", type}}),
               Contains("normalizer.type: is \"" + std::string(type) + "\", a normalizer xgrad does not implement"));
  }
  CHECK_THAT(refusal(Json::object()), Contains("test.json normalizer: has no field \"type\""));
  CHECK_THAT(refusal({{"type", "NFC"}, {"form", "C"}}),
             Contains("normalizer.form: is a field xgrad does not implement for type NFC (value \"C\")"));
  CHECK_THAT(refusal({{"type", "Lowercase"}, {"locale", "tr"}}), Contains("normalizer.locale: is a field"));
  CHECK_THAT(refusal("NFC"), Contains("test.json normalizer: is \"NFC\", not an object"));
  const Json nested = {{"type", "Sequence"}, {"normalizers", Json::array({{{"type", "NFC"}}, {{"type", "Bar"}}})}};
  CHECK_THAT(refusal(nested), Contains("test.json normalizer.normalizers[1].type: is \"Bar\""));
  CHECK_THAT(refusal({{"type", "Sequence"}, {"normalizers", "NFC"}}), Contains("normalizers: is \"NFC\", not a list"));
  CHECK_THAT(refusal({{"type", "Sequence"}, {"normalizers", Json::array({nullptr})}}),
             Contains("normalizer.normalizers[0]: is null, not a normalizer"));
}

TEST_CASE("hf normalizers: the fields Rust requires are required, and values are checked", "[text][bad_input]") {
  CHECK_THAT(refusal({{"type", "Sequence"}}), Contains("test.json normalizer: has no field \"normalizers\""));
  CHECK_THAT(refusal({{"type", "Prepend"}}), Contains("has no field \"prepend\""));
  CHECK_THAT(refusal({{"type", "Prepend"}, {"prepend", 1}}), Contains("normalizer.prepend: is 1, not a string"));
  CHECK_THAT(refusal({{"type", "Strip"}, {"strip_left", true}}), Contains("has no field \"strip_right\""));
  CHECK_THAT(refusal({{"type", "Strip"}, {"strip_left", 1}, {"strip_right", true}}),
             Contains("normalizer.strip_left: is 1, not true or false"));
  CHECK_THAT(refusal({{"type", "Replace"}, {"pattern", {{"String", " "}}}}), Contains("has no field \"content\""));
  CHECK_THAT(refusal({{"type", "Replace"}, {"content", "_"}}), Contains("has no field \"pattern\""));
  CHECK_THAT(
      refusal({{"type", "Replace"}, {"pattern", {{"Regex", "(a"}}}, {"content", "_"}}),
      Contains("test.json normalizer.pattern.Regex: is not a pattern PCRE2 compiles: missing closing parenthesis"));
  CHECK_THAT(refusal({{"type", "Replace"}, {"pattern", {{"Regex", "[[:alpha:]]"}}}, {"content", "_"}}),
             Contains("normalizer.pattern.Regex: holds a POSIX bracket"));
  CHECK_THAT(refusal({{"type", "Replace"}, {"pattern", {{"Regex", "a"}, {"String", "a"}}}, {"content", "_"}}),
             Contains("normalizer.pattern: has both \"Regex\" and \"String\""));
}
