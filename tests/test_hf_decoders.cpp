// tokenizer.json's decoders (text/hf_decoders.cpp): every case of
// tests/fixtures/hf_tokenizers/decoders_expected.json, which Hugging Face's JavaScript tokenizers
// wrote (make_decoders_expected.mjs beside it), including the Sequences of Llama 2 / Mistral and
// Gemma and the ByteLevel of GPT-2 / Llama 3; then the cases where xgrad follows Rust instead of
// the JS, checked by hand against the Rust source each names; then the decoders and options xgrad
// refuses.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "error_of.hpp"
#include "test_files.hpp"
#include "xgrad/text/detail/hf_components.hpp"

using namespace xgrad::text::detail;
using Catch::Contains;
using xgrad::testing::error_of;
using xgrad::testing::read_bytes;

namespace {

const JsonPlace kPlace{"load_hf_tokenizer: 'dir/tokenizer.json'", "decoder"};

struct Decoded {
  std::vector<std::string> tokens;
  std::vector<bool> added;
};

Decoded decode(const Json& config, std::vector<std::string> tokens, std::vector<bool> added = {}) {
  added.resize(tokens.size(), false);
  const auto decoder = make_hf_decoder(config, kPlace);
  REQUIRE(decoder != nullptr);
  decoder->decode_chain(tokens, added);
  return {tokens, added};
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("decoders: every case of the JavaScript reference", "[text]") {
  const Json doc = Json::parse(read_bytes(std::string(XGRAD_FIXTURE_DIR) + "/hf_tokenizers/decoders_expected.json"));
  const Json& cases = doc.at("cases");
  REQUIRE(cases.size() >= 50);
  for (const Json& c : cases) {
    INFO(c.at("name").get<std::string>() << ": " << c.at("decoder").dump() << " on " << c.at("tokens").dump());
    const Strings tokens = c.at("tokens").get<Strings>();
    const auto added_contents = c.at("added").get<std::set<std::string>>();
    std::vector<bool> added;
    for (const std::string& t : tokens) added.push_back(added_contents.count(t) > 0);  // the JS finds them by content
    const Decoded out = decode(c.at("decoder"), tokens, added);
    CHECK(out.tokens == c.at("expected").get<Strings>());
    CHECK(out.added.size() == out.tokens.size());
  }
}

TEST_CASE("decoders: added tokens keep their flag through ByteLevel and ByteFallback", "[text]") {
  const Json byte_level = Json::parse(R"({"type": "ByteLevel"})");
  const Decoded b =
      decode(byte_level, {"<|a|>", "Hello", "Ġworld", "<|b|>", "<|c|>", "Ċ"}, {true, false, false, true, true, false});
  CHECK(b.tokens == Strings{"<|a|>", "Hello world", "<|b|>", "<|c|>", "\n"});
  CHECK(b.added == std::vector<bool>{true, false, true, true, false});

  const Decoded f = decode(Json::parse(R"({"type": "ByteFallback"})"), {"<s>", "<0x61>", "<0x62>", "x", "<0x63>"},
                           {true, false, false, false, false});
  CHECK(f.tokens == Strings{"<s>", "ab", "x", "c"});
  CHECK(f.added == std::vector<bool>{true, false, false, false});

  // Fuse: one token, an added one only when it was the only token.
  CHECK(decode(Json::parse(R"({"type": "Fuse"})"), {"<s>"}, {true}).added == std::vector<bool>{true});
  CHECK(decode(Json::parse(R"({"type": "Fuse"})"), {"<s>", "a"}, {true, false}).added == std::vector<bool>{false});
  // Flags shorter than the tokens are read as false (no decoder reads past them).
  std::vector<std::string> tokens{"Ġa", "Ġb"};
  std::vector<bool> none;
  make_hf_decoder(byte_level, kPlace)->decode_chain(tokens, none);
  CHECK(tokens == Strings{" a b"});
  CHECK(none == std::vector<bool>{false});
}

// Where the JS and Rust differ and xgrad follows Rust; each expected value is read off the Rust
// source named (huggingface/tokenizers, tokenizers/src/...), and the JS's value is given beside it.
TEST_CASE("decoders: where xgrad follows Rust rather than the JS", "[text]") {
  SECTION("ByteLevel: a token with a character outside GPT-2's table gives its own UTF-8 bytes") {
    // pre_tokenizers/byte_level.rs decode_chain: .unwrap_or_else(|| t.as_bytes().to_vec()) for the
    // whole token; the JS maps the character to byte 0 ("a\u0000b").
    const Json config = Json::parse(R"({"type": "ByteLevel"})");
    CHECK(decode(config, {"a你b"}).tokens == Strings{"a你b"});
    CHECK(decode(config, {"Ġa", "你Ġ", "Ġb"}).tokens == Strings{" a你Ġ b"});
    // Bytes that are not UTF-8 in such a token are replaced like any others.
    CHECK(decode(config, {"\xFF\xFE"}).tokens == Strings{"\xEF\xBF\xBD\xEF\xBF\xBD"});
  }
  SECTION("ByteFallback: a byte order mark at the start of a run is kept") {
    // decoders/byte_fallback.rs: String::from_utf8 keeps U+FEFF; the JS's TextDecoder drops it ("a").
    CHECK(decode(Json::parse(R"({"type": "ByteFallback"})"), {"<0xEF>", "<0xBB>", "<0xBF>", "<0x61>"}).tokens ==
          Strings{"\xEF\xBB\xBF"
                  "a"});
  }
  SECTION("ByteFallback: only two hexadecimal digits make a byte token") {
    // The JS's parseInt takes "<0x1z>" and "<0x+1>" as 1, "<0x 9>" as 9 and "<0x-1>" as 255; Rust's
    // u8::from_str_radix would take "+1" too. xgrad takes two hexadecimal digits only.
    const Strings tokens{"<0x1z>", "<0x+1>", "<0x 9>", "<0x-1>"};
    CHECK(decode(Json::parse(R"({"type": "ByteFallback"})"), tokens).tokens == tokens);
  }
  SECTION("Metaspace with prepend_scheme never removes no leading space") {
    // pre_tokenizers/metaspace.rs, test decode(): PrependScheme::Never gives [" Hey", " friend!"];
    // the JS ignores the scheme ("Hey").
    CHECK(decode(Json::parse(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})"),
                 {"▁Hey", "▁friend!"})
              .tokens == Strings{" Hey", " friend!"});
    // An old file's add_prefix_space false means the scheme "never" (metaspace.rs, Deserialize).
    CHECK(decode(Json::parse(R"({"type": "Metaspace", "replacement": "▁", "add_prefix_space": false})"),
                 {"▁Hey", "▁friend!"})
              .tokens == Strings{" Hey", " friend!"});
    CHECK(decode(Json::parse(R"({"type": "Metaspace", "replacement": "▁", "add_prefix_space": false,
                                 "prepend_scheme": "never"})"),
                 {"▁Hey"})
              .tokens == Strings{" Hey"});
  }
}

TEST_CASE("bad input: decoders and options xgrad does not implement are refused by name", "[text][bad_input]") {
  const auto error = [](const char* json) { return error_of([&] { make_hf_decoder(Json::parse(json), kPlace); }); };
  const std::string file = "load_hf_tokenizer: 'dir/tokenizer.json' ";
  for (const char* type : {"WordPiece", "BPEDecoder", "CTC"}) {
    INFO(type);
    CHECK_THAT(error((std::string(R"({"type": ")") + type + "\"}").c_str()),
               Contains(file + "decoder.type: is \"" + type + "\", a decoder xgrad does not implement"));
  }
  CHECK_THAT(error(R"({"type": "Lowercase"})"),
             Contains(file + "decoder.type: is \"Lowercase\", not a decoder type of tokenizer.json"));
  CHECK_THAT(error(R"({"replacement": "▁"})"), Contains(file + "decoder: has no \"type\""));
  CHECK_THAT(error(R"({"type": 7})"), Contains("decoder.type: is 7, not a string"));
  CHECK_THAT(error(R"("ByteLevel")"), Contains(file + "decoder: is \"ByteLevel\", not an object"));
  CHECK_THAT(error(R"({"type": "Fuse", "fuse_all": true})"),
             Contains(file + "decoder.fuse_all: is a field xgrad does not implement for type Fuse (value true)"));
  CHECK_THAT(error(R"({"type": "ByteLevel", "add_prefix_space": "yes"})"),
             Contains("decoder.add_prefix_space: is \"yes\", not true or false"));
  CHECK_THAT(error(R"({"type": "ByteLevel", "trim_offsets": false, "offsets": 1})"),
             Contains("decoder.offsets: is a field xgrad does not implement for type ByteLevel"));

  // Replace: a regular expression (xgrad's Replace decoder takes {"String": ...} only), an empty or
  // missing pattern, a pattern of another kind, no content.
  CHECK_THAT(
      error(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})"),
      Contains(file + "decoder.pattern.Regex: is a regular expression; xgrad's Replace decoder implements only"));
  CHECK_THAT(error(R"({"type": "Replace", "pattern": {"String": ""}, "content": " "})"),
             Contains("decoder.pattern.String: is \"\"; a Replace decoder needs a pattern to find"));
  CHECK_THAT(error(R"({"type": "Replace", "pattern": {"Glob": "*"}, "content": " "})"),
             Contains("decoder.pattern: has no field \"String\""));
  CHECK_THAT(error(R"({"type": "Replace", "pattern": {"String": "a", "Flags": "i"}, "content": " "})"),
             Contains("decoder.pattern.Flags: is a field xgrad does not implement"));
  CHECK_THAT(error(R"({"type": "Replace", "pattern": "▁", "content": " "})"),
             Contains("decoder.pattern: is \"▁\", not an object"));
  CHECK_THAT(error(R"({"type": "Replace", "pattern": {"String": "▁"}})"),
             Contains("decoder: has no field \"content\""));
  CHECK_THAT(error(R"({"type": "Replace", "content": " "})"), Contains("decoder: has no field \"pattern\""));

  // Strip: content of one character, counts that are not negative integers.
  CHECK_THAT(error(R"({"type": "Strip", "content": "ab", "start": 1, "stop": 0})"),
             Contains("decoder.content: is \"ab\"; it must be exactly one character"));
  CHECK_THAT(error(R"({"type": "Strip", "content": "", "start": 1, "stop": 0})"),
             Contains("decoder.content: is \"\"; it must be exactly one character"));
  CHECK_THAT(error(R"({"type": "Strip", "start": 1, "stop": 0})"), Contains("decoder: has no field \"content\""));
  CHECK_THAT(error(R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})"),
             Contains("decoder.start: is -1, not a count of characters"));
  CHECK_THAT(error(R"({"type": "Strip", "content": " ", "start": 1, "stop": 1.5})"),
             Contains("decoder.stop: is 1.5, not an integer"));

  // Metaspace: one replacement character, a known scheme, add_prefix_space that agrees with it.
  CHECK_THAT(error(R"({"type": "Metaspace", "replacement": "__"})"),
             Contains("decoder.replacement: is \"__\"; it must be exactly one character"));
  CHECK_THAT(error(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"})"),
             Contains("decoder.prepend_scheme: is \"sometimes\", not \"always\", \"first\" or \"never\""));
  CHECK_THAT(
      error(R"({"type": "Metaspace", "replacement": "▁", "add_prefix_space": false, "prepend_scheme": "always"})"),
      Contains("decoder.add_prefix_space: is false but prepend_scheme is \"always\""));
  CHECK_THAT(error(R"({"type": "Metaspace", "replacement": "▁", "add_prefix_space": 1})"),
             Contains("decoder.add_prefix_space: is 1, not true or false"));

  // Sequence: an array of decoders, each checked at its own path.
  CHECK_THAT(error(R"({"type": "Sequence", "decoders": {"type": "Fuse"}})"),
             Contains("decoder.decoders: is {\"type\":\"Fuse\"}, not an array"));
  CHECK_THAT(error(R"({"type": "Sequence"})"), Contains("decoder: has no field \"decoders\""));
  CHECK_THAT(error(R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, null]})"),
             Contains("decoder.decoders[1]: is null, not a decoder"));
  CHECK_THAT(
      error(
          R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Sequence", "decoders": [{"type": "CTC"}]}]})"),
      Contains(file + "decoder.decoders[1].decoders[0].type: is \"CTC\", a decoder xgrad does not implement"));
  // A null decoder is no decoder.
  CHECK(make_hf_decoder(Json(nullptr), kPlace) == nullptr);
}
