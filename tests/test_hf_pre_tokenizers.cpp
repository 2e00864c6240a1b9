// tokenizer.json's pre-tokenizers (text/hf_pre_tokenizers.cpp) and regular expressions
// (text/hf_pattern.cpp, text/hf_oniguruma.cpp) against Hugging Face's Rust tokenizers: the cases of
// tests/fixtures/hf_components/pre_tokenizer_cases.json (make_fixtures.mjs writes them from the Rust
// library's Node binding; each case's note says where the JavaScript port differs), the limits of
// matching, and every bad input of the factory.
#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include "error_of.hpp"
#include "fixture.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/detail/hf_components.hpp"

using namespace xgrad;
using namespace xgrad::text::detail;
using Catch::Contains;

namespace {

const JsonPlace kPlace{"test.json", "pre_tokenizer"};

std::vector<std::string> pieces_of(const Json& config, const std::string& text, std::size_t section = 0) {
  const std::unique_ptr<HfPreTokenizer> pre_tokenizer = make_hf_pre_tokenizer(config, kPlace);
  std::vector<std::string> pieces;
  pre_tokenizer->split(text, section, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

std::string refusal(const Json& config) {
  return testing::error_of([&] { make_hf_pre_tokenizer(config, kPlace); });
}

Json split(const Json& pattern, const char* behavior = "Isolated") {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", false}};
}

Json regex(const std::string& pattern) { return {{"Regex", pattern}}; }

const Json& cases() {
  static const Json doc = testing::load_fixture("hf_components/pre_tokenizer_cases.json");
  return doc;
}

// The config of the fixture's first case whose note starts with `note`.
Json config_of(const std::string& note) {
  for (const Json& c : cases())
    if (c.at("note").get<std::string>().rfind(note, 0) == 0) return c.at("config");
  throw std::runtime_error("no fixture case noted " + note);
}

}  // namespace

TEST_CASE("hf pre-tokenizers: every fixture case splits as Hugging Face's Rust tokenizers does", "[text]") {
  REQUIRE(cases().size() >= 160);
  for (const Json& c : cases()) {
    INFO(c.at("note").get<std::string>() << "\nconfig " << c.at("config").dump() << "\ntext " << c.at("text").dump());
    CHECK(pieces_of(c.at("config"), c.at("text").get<std::string>(), c.at("section").get<std::size_t>()) ==
          c.at("pieces").get<std::vector<std::string>>());
  }
}

TEST_CASE("hf pre-tokenizers: a null pre_tokenizer is none", "[text]") {
  CHECK(make_hf_pre_tokenizer(Json(nullptr), kPlace) == nullptr);
}

TEST_CASE("hf pre-tokenizers: Metaspace reads an old add_prefix_space false alone as never", "[text]") {
  // Files written before prepend_scheme existed say add_prefix_space: false for "prepend nothing"
  // (pre_tokenizers/metaspace.rs of tokenizers 0.13). Today's Rust refuses such a file, because
  // the absent prepend_scheme defaults to always before the check; xgrad reads what it meant.
  const Json old = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}};
  CHECK(pieces_of(old, "Hey friend") == std::vector<std::string>{"Hey", "\u2581friend"});
  const Json contradiction = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}, {"prepend_scheme", "always"}};
  CHECK_THAT(
      refusal(contradiction),
      Contains("test.json pre_tokenizer.add_prefix_space: is false, which contradicts prepend_scheme \"always\""));
}

TEST_CASE("hf pre-tokenizers: Sequences 60 deep split, 65 deep are refused by name", "[text][bad_input]") {
  Json deep = {{"type", "WhitespaceSplit"}};
  for (int i = 0; i < 60; ++i) deep = {{"type", "Sequence"}, {"pretokenizers", Json::array({deep})}};
  CHECK(pieces_of(deep, " a  b ") == std::vector<std::string>{"a", "b"});
  for (int i = 0; i < 5; ++i) deep = {{"type", "Sequence"}, {"pretokenizers", Json::array({deep})}};
  CHECK_THAT(refusal(deep), Contains("nests Sequences more than 64 deep"));
  CHECK_THAT(refusal(deep), Contains("pre_tokenizer.pretokenizers[0].pretokenizers[0]"));
}

TEST_CASE("hf pre-tokenizers: types and fields nobody implements are refused by name", "[text][bad_input]") {
  CHECK_THAT(refusal({{"type", "Foo"}}),
             Contains("test.json pre_tokenizer.type: is \"Foo\", which is no pre-tokenizer xgrad knows"));
  CHECK_THAT(refusal({{"type", "UnicodeScripts"}}),
             Contains("pre_tokenizer.type: is \"UnicodeScripts\", a pre-tokenizer xgrad does not implement"));
  CHECK_THAT(refusal({{"type", "Replace"}, {"pattern", regex(" ")}, {"content", "_"}}),
             Contains("is \"Replace\", which only the JavaScript port has as a pre-tokenizer"));
  CHECK_THAT(refusal({{"behavior", "Isolated"}}), Contains("test.json pre_tokenizer: has no field \"type\""));
  CHECK_THAT(refusal({{"type", "Whitespace"}, {"foo", 1}}),
             Contains("pre_tokenizer.foo: is a field xgrad does not implement for type Whitespace (value 1)"));
  CHECK_THAT(refusal(Json::array()), Contains("test.json pre_tokenizer: is [], not an object"));
  const Json nested = {{"type", "Sequence"},
                       {"pretokenizers", Json::array({{{"type", "Whitespace"}}, {{"type", "Bar"}}})}};
  CHECK_THAT(refusal(nested), Contains("test.json pre_tokenizer.pretokenizers[1].type: is \"Bar\""));
  CHECK_THAT(refusal({{"type", "Sequence"}, {"pretokenizers", {{"type", "Whitespace"}}}}),
             Contains("pre_tokenizer.pretokenizers: is {\"type\":\"Whitespace\"}, not a list"));
  CHECK_THAT(refusal({{"type", "Sequence"}, {"pretokenizers", Json::array({nullptr})}}),
             Contains("pre_tokenizer.pretokenizers[0]: is null, not a pre-tokenizer"));
  CHECK_THAT(refusal({{"type", "Sequence"}}), Contains("has no field \"pretokenizers\""));
}

TEST_CASE("hf pre-tokenizers: the fields Rust requires are required, and values are checked", "[text][bad_input]") {
  Json no_invert = split(regex(" "));
  no_invert.erase("invert");
  CHECK_THAT(refusal(no_invert), Contains("test.json pre_tokenizer: has no field \"invert\""));
  Json no_behavior = split(regex(" "));
  no_behavior.erase("behavior");
  CHECK_THAT(refusal(no_behavior), Contains("has no field \"behavior\""));
  CHECK_THAT(refusal(split(regex(" "), "isolated")),
             Contains("pre_tokenizer.behavior: is \"isolated\", not one of Removed, Isolated, MergedWithPrevious, "
                      "MergedWithNext, Contiguous"));
  CHECK_THAT(refusal({{"type", "ByteLevel"}, {"trim_offsets", true}}), Contains("has no field \"add_prefix_space\""));
  CHECK_THAT(refusal({{"type", "ByteLevel"}, {"add_prefix_space", true}}), Contains("has no field \"trim_offsets\""));
  CHECK_THAT(refusal({{"type", "ByteLevel"}, {"add_prefix_space", "yes"}, {"trim_offsets", true}}),
             Contains("pre_tokenizer.add_prefix_space: is \"yes\", not true or false"));
  CHECK_THAT(refusal({{"type", "Digits"}}), Contains("has no field \"individual_digits\""));
  CHECK_THAT(refusal({{"type", "Punctuation"}, {"behavior", "Merged"}}), Contains("is \"Merged\", not one of"));
  CHECK_THAT(refusal({{"type", "Metaspace"}}), Contains("has no field \"replacement\""));
  CHECK_THAT(refusal({{"type", "Metaspace"}, {"replacement", "ab"}}),
             Contains("pre_tokenizer.replacement: is \"ab\", not a single character"));
  CHECK_THAT(refusal({{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "First"}}),
             Contains("pre_tokenizer.prepend_scheme: is \"First\", not one of always, first, never"));
  CHECK_THAT(refusal({{"type", "CharDelimiterSplit"}, {"delimiter", ""}}), Contains("is \"\", not a single character"));
  CHECK_THAT(refusal({{"type", "FixedLength"}, {"length", 0}}),
             Contains("pre_tokenizer.length: is 0, not a length of at least 1"));
}

TEST_CASE("hf patterns: a pattern object is one Regex string or one String", "[text][bad_input]") {
  CHECK_THAT(refusal(split(Json::object())),
             Contains("test.json pre_tokenizer.pattern: has neither \"Regex\" nor \"String\""));
  CHECK_THAT(refusal(split({{"Regex", "a"}, {"String", "a"}})),
             Contains("pre_tokenizer.pattern: has both \"Regex\" and \"String\""));
  CHECK_THAT(refusal(split({{"Regex", 5}})), Contains("test.json pre_tokenizer.pattern.Regex: is 5, not a string"));
  CHECK_THAT(refusal(split({{"String", nlohmann::json::array()}})), Contains("pattern.String: is [], not a string"));
  CHECK_THAT(refusal(split({{"Regex", "a"}, {"Flags", "i"}})),
             Contains("pre_tokenizer.pattern.Flags: is a field xgrad does not implement"));
  CHECK_THAT(refusal(split("a b")), Contains("pre_tokenizer.pattern: is \"a b\", not an object"));
}

TEST_CASE("hf patterns: a pattern PCRE2 refuses is an Error with the place, offset and PCRE2's reason",
          "[text][bad_input]") {
  CHECK_THAT(refusal(split(regex("a(b"))),
             Contains("test.json pre_tokenizer.pattern.Regex: is not a pattern PCRE2 compiles: missing closing "
                      "parenthesis at offset 3"));
  CHECK_THAT(refusal(split(regex("\\p{Nonsense}"))), Contains("unknown property"));
  // Rewritten patterns quote the form PCRE2 saw, to which the offset belongs.
  CHECK_THAT(refusal(split(regex("\\s(?<=a+)"))), Contains("of its PCRE2 form"));
}

TEST_CASE("hf patterns: Oniguruma constructs without a translation are refused by name", "[text][bad_input]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"[[:alpha:]]+", "a POSIX bracket ([:name:]) at offset 1"},
      {"[a-z&&[^aeiou]]", "a class intersection (&&) at offset 4"},
      {"[^a[^b]]", "a negated class inside a class at offset 3"},
      {"[\\W_]", "the escape \\W inside a character class at offset 1"},
      {"[\\p{^Word}]", "a negated \\p{Word} inside a character class"},
      {"\\Q.\\E", "the escape \\Q at offset 0"},
      {"\\X", "the escape \\X"},
      {"\\y", "the escape \\y"},
      {"(?x: a b )", "the group option x at offset 2"},
      {"(?s:.)", "the group option s"},
      {"(?~abc)", "an absent group (?~...) at offset 0"},
      {"(?(1)a|b)", "a conditional group"},
      {"{2}a", "a repeat {n,m} with nothing to repeat at offset 0"},
      {"[abc", "an unterminated character class at offset 0"},
      {"\\u12", "\\u without four hexadecimal digits"},
      {"\\pL", "\\p without braces"},
  };
  for (const auto& [pattern, what] : refused) {
    INFO(pattern);
    const std::string message = refusal(split(regex(pattern)));
    CHECK_THAT(message, Contains("test.json pre_tokenizer.pattern.Regex: holds " + what));
    CHECK_THAT(message, Contains("which xgrad does not translate from Oniguruma's syntax to PCRE2's"));
  }
}

TEST_CASE("hf patterns: a match past PCRE2's backtracking limit is an Error naming the place", "[text][bad_input]") {
  const Json nested = split(regex("(a+)+$"));
  const std::string message = testing::error_of([&] { pieces_of(nested, std::string(40, 'a') + "b"); });
  CHECK_THAT(message, Contains("test.json pre_tokenizer.pattern.Regex: failed on a text of 41 bytes at byte 0: match "
                               "limit exceeded"));
}

TEST_CASE("hf patterns: a million characters through a repeated group are one match", "[text]") {
  // The JIT stack grows to what the run needs (Oniguruma keeps its backtracking on the heap).
  const std::vector<std::string> pieces = pieces_of(split(regex("(?:a|b)+")), std::string(1 << 20, 'a') + " ");
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0] == std::string(1 << 20, 'a'));
}

// A piece goes on to the next stage (and to the model) as soon as it is cut: a stage's stretches are
// still being walked while the stages after it split each of them, with buffers of their own.
TEST_CASE("hf pre-tokenizers: a Sequence hands each piece on as it is cut, stage within stage", "[text]") {
  const Json twice = {{"type", "Sequence"},
                      {"pretokenizers",
                       {split(regex(" "), "Removed"),
                        split(regex("b"), "Isolated"),
                        {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "first"}, {"split", true}}}}};
  const std::unique_ptr<HfPreTokenizer> pre_tokenizer = make_hf_pre_tokenizer(twice, kPlace);
  std::vector<std::string> order;
  pre_tokenizer->split("abc ab xbx", 0, [&](std::string_view piece) { order.emplace_back(piece); });
  CHECK(order == std::vector<std::string>{"_a", "b", "c", "a", "b", "x", "b", "x"});
  order.clear();
  pre_tokenizer->split("abc", 1, [&](std::string_view piece) { order.emplace_back(piece); });
  CHECK(order == std::vector<std::string>{"a", "b", "c"});  // "first": only the start of section 0
}

TEST_CASE("hf patterns: text that is not UTF-8 is refused, not read past", "[text][bad_input]") {
  const HfPattern pattern(regex("\\p{L}+"), kPlace.at("pattern"));
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  CHECK_THAT(testing::error_of([&] { pattern.find_all("ab\xC3", matches); }),
             Contains("pre_tokenizer.pattern.Regex: cannot match a text that is not valid UTF-8"));
  CHECK_THAT(testing::error_of([&] { pattern.find_all("\xED\xA0\x80", matches); }), Contains("not valid UTF-8"));
  const HfPattern literal({{"String", "b"}}, kPlace.at("pattern"));  // a literal compares bytes
  literal.find_all("ab\xC3", matches);
  CHECK(matches == std::vector<std::pair<std::size_t, std::size_t>>{{1, 2}});
}

TEST_CASE("hf pre-tokenizers: one pre-tokenizer splits on several threads at once", "[text]") {
  const Json config = config_of("Llama 3's pre_tokenizer");
  const std::unique_ptr<HfPreTokenizer> pre_tokenizer = make_hf_pre_tokenizer(config, kPlace);
  std::vector<const Json*> llama;
  for (const Json& c : cases())
    if (c.at("config") == config) llama.push_back(&c);
  REQUIRE(llama.size() >= 10);
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round)
        for (const Json* c : llama) {
          std::vector<std::string> pieces;
          pre_tokenizer->split(c->at("text").get<std::string>(), 0,
                               [&](std::string_view piece) { pieces.emplace_back(piece); });
          if (pieces != c->at("pieces").get<std::vector<std::string>>()) ++wrong[t];
        }
    });
  for (std::thread& t : threads) t.join();
  CHECK(wrong == std::vector<int>(4, 0));
}
