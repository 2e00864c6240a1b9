// tokenizer.json's BPE model, its added tokens and its template, on small hand-written documents
// whose ids follow from Hugging Face's rules (tokenizers' models/bpe/model.rs, added_vocabulary.rs
// and processors/template.rs), worked out by hand in the comments.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "error_of.hpp"
#include "xgrad/text/hf_tokenizer.hpp"

using xgrad::text::HfTokenizer;
using xgrad::text::SpecialText;
using xgrad::text::TokenIds;
using Json = nlohmann::json;
using xgrad::testing::error_of;

namespace {

// A tokenizer.json with no normalizer, pre-tokenizer or decoder around `model`.
Json document(const Json& model, const Json& added = Json::array(), const Json& post = nullptr) {
  return Json{{"version", "1.0"},       {"truncation", nullptr}, {"padding", nullptr},
              {"added_tokens", added},  {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
              {"post_processor", post}, {"decoder", nullptr},    {"model", model}};
}

HfTokenizer make(const Json& doc, const Json& config = nullptr) {
  return HfTokenizer(doc.dump(), config.is_null() ? "" : config.dump(), "test");
}

std::string refusal(const Json& doc, const Json& config = nullptr) {
  return error_of([&] { make(doc, config); });
}

Json bpe(const Json& vocab, const Json& merges) {
  return Json{{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merges}};
}

}  // namespace

TEST_CASE("hf BPE: merges are a ranking in any order, lowest rank first, leftmost of equals", "[text]") {
  // "ab" is made only by a later merge than the one that uses it (Llama 3's files do this).
  const Json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"ab", 4}, {"bc", 5}};
  const HfTokenizer t = make(document(bpe(vocab, {"ab c", "a b", "b c"})));
  // "abc": pairs (a,b) rank 1 and (b,c) rank 2: a+b first, then (ab,c) rank 0 gives abc.
  CHECK(t.encode("abc") == TokenIds{3});
  // "bcab": (b,c) rank 2 and (a,b) rank 1 (c,a no merge): ab first, then bc: [bc, ab].
  CHECK(t.encode("bcab") == TokenIds{5, 4});
  // "aaa" has no merge at all; "abab": both (a,b) at rank 1, the leftmost first, then the other.
  CHECK(t.encode("aaa") == TokenIds{0, 0, 0});
  CHECK(t.encode("abab") == TokenIds{4, 4});
}

TEST_CASE("hf BPE: ids with gaps, and merges written as pairs", "[text]") {
  const Json vocab = {{"x", 0}, {"y", 7}, {"xy", 100}};
  const HfTokenizer t = make(document(bpe(vocab, Json::array({Json::array({"x", "y"})}))));
  CHECK(t.vocab_size() == 101);
  CHECK(t.encode("xyx") == TokenIds{100, 0});
  CHECK(t.decode({100, 0}) == "xy x");  // no decoder: tokens joined by spaces, as Hugging Face does
}

TEST_CASE("hf BPE: unk_token, fuse_unk, and characters dropped without an unk", "[text]") {
  Json model = bpe({{"<unk>", 0}, {"a", 1}}, Json::array());
  // Without an unk_token, a character outside the vocabulary gives no id (Hugging Face drops it).
  CHECK(make(document(model)).encode("a?a") == TokenIds{1, 1});
  model["unk_token"] = "<unk>";
  CHECK(make(document(model)).encode("a??a") == TokenIds{1, 0, 0, 1});
  model["fuse_unk"] = true;
  CHECK(make(document(model)).encode("a??a?") == TokenIds{1, 0, 1, 0});
}

TEST_CASE("hf BPE: byte_fallback gives a character's <0xNN> tokens", "[text]") {
  Json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  Json model = bpe(vocab, Json::array());
  model["byte_fallback"] = true;
  model["unk_token"] = "<unk>";
  // é is C3 A9: ids 2 + 0xC3 and 2 + 0xA9.
  CHECK(make(document(model)).encode("aé") == TokenIds{1, 2 + 0xC3, 2 + 0xA9});
  vocab.erase("<0x41>");
  model["vocab"] = vocab;
  CHECK_THAT(refusal(document(model)), Catch::Contains("byte_fallback") && Catch::Contains("<0x41>"));
}

TEST_CASE("hf BPE: continuing_subword_prefix and end_of_word_suffix", "[text]") {
  // With prefix "##": "abc" starts as [a, ##b, ##c]; the merge "a ##b" gives "ab" (the prefix of the
  // right part dropped), then "ab ##c" gives "abc".
  Json model = bpe({{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}, {"abc", 4}, {"b", 5}}, {"a ##b", "ab ##c"});
  model["continuing_subword_prefix"] = "##";
  const HfTokenizer t = make(document(model));
  CHECK(t.encode("abc") == TokenIds{4});
  // "bab" starts as [b, ##a, ##b]: "##a" is no token and there is no unk, so it is dropped.
  CHECK(t.encode("bab") == TokenIds{5, 1});
  // With suffix "</w>": the last character carries it.
  Json suffixed = bpe({{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"b", 3}}, {"a b</w>"});
  suffixed["end_of_word_suffix"] = "</w>";
  CHECK(make(document(suffixed)).encode("ab") == TokenIds{2});
  CHECK(make(document(suffixed)).encode("ba") == TokenIds{3});  // the final "a</w>" is no token: dropped
}

TEST_CASE("hf BPE: ignore_merges gives a piece that is a token at once", "[text]") {
  // "abc" is a token, but the merges make [ab, c] (no merge gives abc from them).
  Json model = bpe({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}}, {"a b"});
  CHECK(make(document(model)).encode("abc") == TokenIds{3, 2});
  model["ignore_merges"] = true;
  CHECK(make(document(model)).encode("abc") == TokenIds{4});
}

TEST_CASE("hf added tokens: matched longest first, special ones only when asked, lstrip and rstrip", "[text]") {
  const Json vocab = {{"a", 0}, {" ", 1}, {"b", 2}};
  const Json added = Json::array({{{"id", 3},
                                   {"content", "<s>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}},
                                  {{"id", 4},
                                   {"content", "<s>x"},
                                   {"special", false},
                                   {"normalized", false},
                                   {"lstrip", true},
                                   {"rstrip", true},
                                   {"single_word", false}},
                                  {{"id", 5},
                                   {"content", "ab"},
                                   {"special", false},
                                   {"normalized", true},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", true}}});
  const HfTokenizer t = make(document(bpe(vocab, Json::array()), added));
  CHECK(t.encode("a<s>b") == TokenIds{0, 3, 2});
  // With the special tokens as ordinary text, "<", "s", ">" are no tokens of this vocab: dropped.
  CHECK(t.encode("a<s>b", SpecialText::ordinary) == TokenIds{0, 2});
  // "<s>x" is longer than "<s>" at the same place; lstrip and rstrip eat the spaces around it.
  CHECK(t.encode("a  <s>x  b") == TokenIds{0, 4, 2});
  // single_word: "ab" alone is matched, inside "aab" it is not.
  CHECK(t.encode("ab a") == TokenIds{5, 1, 0});
  CHECK(t.encode("aab") == TokenIds{0, 0, 2});
}

TEST_CASE("hf post-processor: the template's tokens around the text, checked against tokenizer_config.json", "[text]") {
  const Json vocab = {{"a", 0}, {"<s>", 1}, {"</s>", 2}};
  const Json added = Json::array(
      {{{"id", 1}, {"content", "<s>"}, {"special", true}}, {{"id", 2}, {"content", "</s>"}, {"special", true}}});
  const Json post = {{"type", "TemplateProcessing"},
                     {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"pair", Json::array()},
                     {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  const Json doc = document(bpe(vocab, Json::array()), added, post);
  const HfTokenizer t = make(doc, {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}});
  CHECK(t.encode("aa") == TokenIds{0, 0});
  CHECK(t.encode_for_model("aa") == TokenIds{1, 0, 0});
  CHECK(t.special_tokens().bos == 1);
  CHECK(t.special_tokens().eos == 2);
  CHECK_THAT(refusal(doc, {{"add_eos_token", true}, {"eos_token", "</s>"}}),
             Catch::Contains("add_eos_token") && Catch::Contains("disagree"));
  CHECK_THAT(refusal(doc, {{"add_bos_token", false}, {"bos_token", "<s>"}}), Catch::Contains("add_bos_token"));
  CHECK_THAT(refusal(doc, {{"bos_token", "<start>"}}), Catch::Contains("bos_token") && Catch::Contains("<start>"));
}

TEST_CASE("hf tokenizer: a rebuilt tokenizer has the same identity and ids", "[text]") {
  const HfTokenizer t = make(document(bpe({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"})));
  const std::unique_ptr<xgrad::text::Tokenizer> back = xgrad::text::tokenizer_from_json(t.to_json());
  CHECK(back->kind() == "hf");
  CHECK(back->identity() == t.identity());
  CHECK(back->encode("abba") == t.encode("abba"));
}

TEST_CASE("hf tokenizer: what the file says that xgrad does not do is refused by name", "[text][bad_input]") {
  const Json good = document(bpe({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"}));
  const auto with = [&](const std::string& key, const Json& value) {
    Json d = good;
    d[key] = value;
    return refusal(d);
  };
  const auto with_model = [&](const std::string& key, const Json& value) {
    Json d = good;
    d["model"][key] = value;
    return refusal(d);
  };
  CHECK_THAT(with("truncation", {{"max_length", 5}}), Catch::Contains("truncation"));
  CHECK_THAT(with("padding", {{"strategy", "BatchLongest"}}), Catch::Contains("padding"));
  CHECK_THAT(with("extra_field", 1), Catch::Contains("extra_field"));
  CHECK_THAT(with_model("dropout", 0.1), Catch::Contains("model.dropout") && Catch::Contains("0.1"));
  CHECK_THAT(with_model("type", "WordPiece"), Catch::Contains("WordPiece"));
  CHECK_THAT(with_model("cache_capacity", 10), Catch::Contains("model.cache_capacity"));
  CHECK_THAT(with_model("merges", Json::array({"a c"})),
             Catch::Contains("model.merges[0]") && Catch::Contains("\"c\""));
  CHECK_THAT(with_model("merges", Json::array({"a b", "a b"})), Catch::Contains("repeats"));
  CHECK_THAT(with_model("merges", Json::array({"b a"})),
             Catch::Contains("\"ba\"") && Catch::Contains("not in model.vocab"));
  CHECK_THAT(with_model("vocab", {{"a", 0}, {"b", 0}}), Catch::Contains("both have the id 0"));
  CHECK_THAT(with_model("vocab", {{"a", 0}, {"b", 1}, {"ab", 4000000}}), Catch::Contains("4000000"));
  CHECK_THAT(with_model("unk_token", "<unk>"), Catch::Contains("unk_token") && Catch::Contains("<unk>"));
  // A vocab that gives one token twice: the JSON parser would keep one silently.
  std::string text = good.dump();
  text.replace(text.find("\"ab\":2"), 6, "\"ab\":2,\"a\":2");
  CHECK_THAT(error_of([&] { HfTokenizer(text, "", "test"); }),
             Catch::Contains("\"a\" twice") && Catch::Contains("model.vocab"));
  // Added tokens whose ids clash.
  CHECK_THAT(with("added_tokens", Json::array({{{"id", 0}, {"content", "<x>"}}})),
             Catch::Contains("added_tokens[0]") && Catch::Contains("model.vocab gives to \"a\""));
  CHECK_THAT(with("added_tokens", Json::array({{{"id", 5}, {"content", "<x>"}}, {{"id", 5}, {"content", "<y>"}}})),
             Catch::Contains("added_tokens[1]") && Catch::Contains("id 5"));
  CHECK_THAT(with("added_tokens", Json::array({{{"id", 5}, {"content", "ab"}}})),
             Catch::Contains("model.vocab gives it 2"));
  CHECK_THAT(with("added_tokens", Json::array({{{"id", 5}, {"content", "<x>"}, {"stripped", true}}})),
             Catch::Contains("added_tokens[0].stripped"));
  CHECK_THAT(with("post_processor", {{"type", "RobertaProcessing"}}), Catch::Contains("RobertaProcessing"));
  // Deep nesting is refused by the JSON reader before anything is built.
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(error_of([&] { HfTokenizer(deep, "", "test"); }), Catch::Contains("deeper than 64"));
  CHECK_THAT(error_of([&] { xgrad::text::load_hf_tokenizer("/nonexistent/dir"); }),
             Catch::Contains("load_hf_tokenizer") && Catch::Contains("does not exist"));
  // Files that are not files: the one reader of files refuses them by kind.
  CHECK_THAT(error_of([&] { xgrad::text::load_hf_tokenizer("/dev/zero"); }),
             Catch::Contains("/dev/zero") && Catch::Contains("not a regular file"));
  CHECK_THAT(error_of([&] { xgrad::text::load_hf_tokenizer("/"); }), Catch::Contains("'//tokenizer.json'"));
}
