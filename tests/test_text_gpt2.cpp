// GPT-2's byte-level BPE against js-tiktoken's ids (tests/fixtures/gpt2_tokenizer, written by
// make_fixtures.mjs), its file formats, and every bad input of its loaders.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"
#include "xgrad/text/gpt2_files.hpp"

using namespace xgrad;
using namespace xgrad::text;
using Catch::Contains;

namespace {

std::string fixture(const std::string& name) { return testing::fixture_path("gpt2_tokenizer/" + name); }

struct Case {
  std::string name, text;
  TokenIds ids;
};

const nlohmann::json& reference() {
  static const nlohmann::json doc = testing::load_fixture("gpt2_tokenizer/cases.json");
  return doc;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& c : reference()["cases"])
    out.push_back({c["name"].get<std::string>(), c["text"].get<std::string>(), c["ids"].get<TokenIds>()});
  return out;
}

const ByteLevelBpe& gpt2() {
  static const std::unique_ptr<ByteLevelBpe> t = load_byte_level_bpe(testing::fixture_path("gpt2_tokenizer"));
  return *t;
}

bool same_vocabulary(const BpeVocabulary& a, const BpeVocabulary& b) {
  return a.tokens == b.tokens && a.merges == b.merges && a.special_tokens == b.special_tokens;
}

// A small vocabulary in GPT-2's file form: the 256 bytes (ids 0..255 by byte value), the merges
// h e, l l, he ll, hell o (ids 256..259) and <|endoftext|> (260). Tests spoil one part of it.
struct SmallFiles {
  std::vector<std::pair<std::string, std::string>> vocab;  // printable key, JSON value
  std::vector<std::string> merge_lines{"#version: 0.2", "h e", "l l", "he ll", "hell o"};

  SmallFiles() {
    for (int b = 0; b < 256; ++b)
      vocab.emplace_back(gpt2_printable_from_bytes(std::string(1, static_cast<char>(b))), std::to_string(b));
    int id = 256;
    for (const char* t : {"he", "ll", "hell", "hello", "<|endoftext|>"}) vocab.emplace_back(t, std::to_string(id++));
  }
  void write(const testing::TempDir& dir) const {
    std::string v = "{";
    for (std::size_t i = 0; i < vocab.size(); ++i)
      v += (i ? ", " : "") + nlohmann::json(vocab[i].first).dump() + ": " + vocab[i].second;
    testing::write_bytes(dir.file("vocab.json"), v + "}");
    std::string m;
    for (const auto& line : merge_lines) m += line + "\n";
    testing::write_bytes(dir.file("merges.txt"), m);
  }
  BpeVocabulary load(const testing::TempDir& dir) const {
    write(dir);
    return load_gpt2_vocabulary(dir.file("vocab.json"), dir.file("merges.txt"));
  }
};

BpeVocabulary small_vocabulary() {
  testing::TempDir dir("xgrad_gpt2_small");
  return SmallFiles().load(dir);
}

// GPT-2's tokenizer.json with one field changed, written to `dir`/tokenizer.json.
std::string edited_tokenizer_json(const testing::TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(fixture("tokenizer.json")));
  edit(doc);
  testing::write_bytes(dir.file("tokenizer.json"), doc.dump());
  return dir.file("tokenizer.json");
}

}  // namespace

TEST_CASE(
    "GPT-2's byte-level BPE gives js-tiktoken's ids for every case of the corpus, and decode gives back the text") {
  const ByteLevelBpe& t = gpt2();
  CHECK(t.vocab_size() == 50257);
  CHECK(t.kind() == "byte_bpe");
  const auto all = cases();
  REQUIRE(all.size() > 150);
  std::size_t ids = 0;
  for (const Case& c : all) {
    INFO("case " << c.name << ": " << readable_bytes(c.text));
    CHECK(t.encode(c.text) == c.ids);
    CHECK(t.encode(c.text, SpecialText::match) == c.ids);  // no case holds a special token's text
    CHECK(t.decode(c.ids) == c.text);
    ids += c.ids.size();
  }
  CHECK(ids > 20000);
  // Spot checks anyone can redo with tiktoken (and docs/text.md's): "Hello" 15496, " world" 995, " the" 262.
  CHECK(t.encode("Hello world the") == TokenIds{15496, 995, 262});
  CHECK(t.token_strings({15496, 995}) == std::vector<std::string>{"Hello", " world"});
  CHECK(t.token_bytes(995) == " world");
}

TEST_CASE("GPT-2's <|endoftext|> is matched whole only when asked, and is bos and eos") {
  const ByteLevelBpe& t = gpt2();
  const auto& s = reference()["specials"];
  const std::string text = s["text"].get<std::string>();
  CHECK(t.encode(text, SpecialText::match) == s["ids_match"].get<TokenIds>());
  CHECK(t.encode(text) == s["ids_ordinary"].get<TokenIds>());
  CHECK(t.encode(text, SpecialText::ordinary) == s["ids_ordinary"].get<TokenIds>());
  CHECK(t.decode(s["ids_match"].get<TokenIds>()) == text);
  CHECK(t.decode(s["ids_ordinary"].get<TokenIds>()) == text);
  CHECK(t.encode("<|endoftext|>", SpecialText::match) == TokenIds{50256});
  // docs/text.md's example; the ids are js-tiktoken's encode(text, [], []) and encode(text, "all").
  CHECK(t.encode("a<|endoftext|>b") == TokenIds{64, 27, 91, 437, 1659, 5239, 91, 29, 65});
  CHECK(t.encode("a<|endoftext|>b", SpecialText::match) == TokenIds{64, 50256, 65});
  CHECK(t.vocabulary().special_tokens == TokenIds{50256});
  CHECK(t.token_bytes(50256) == "<|endoftext|>");
  const SpecialTokens roles = t.special_tokens();
  CHECK(roles.bos == 50256);
  CHECK(roles.eos == 50256);
  CHECK_FALSE(roles.pad.has_value());
  CHECK_FALSE(roles.unk.has_value());
}

TEST_CASE("special tokens take their roles by their texts, and the longest text wins where two start") {
  BpeVocabulary v = small_vocabulary();  // 260 is <|endoftext|>
  for (const char* text : {"<s>", "</s>", "<pad>", "<unk>", "<s>x"}) {
    v.special_tokens.push_back(static_cast<std::int64_t>(v.tokens.size()));
    v.tokens.emplace_back(text);
  }
  const ByteLevelBpe t(v);
  const SpecialTokens roles = t.special_tokens();
  CHECK(roles.bos == 261);  // <s> before <|endoftext|>
  CHECK(roles.eos == 262);
  CHECK(roles.pad == 263);
  CHECK(roles.unk == 264);
  CHECK(t.encode("<s>x<s>hello</s>", SpecialText::match) == TokenIds{265, 261, 259, 262});
  CHECK(t.encode("<s>", SpecialText::ordinary) == TokenIds{'<', 's', '>'});
  CHECK(t.encode("hello", SpecialText::match) == TokenIds{259});
  CHECK(t.encode("hellohe") == TokenIds{259, 256});
  CHECK(t.encode("hel lo") == TokenIds{256, 'l', ' ', 'l', 'o'});
}

TEST_CASE("a piece that is a token its merges do not make merges by rank all the same") {
  BpeVocabulary v = small_vocabulary();
  const auto add = [&](const char* text, std::int64_t left, std::int64_t right) {
    v.tokens.emplace_back(text);
    v.merges.emplace_back(left, right);
    return static_cast<std::int64_t>(v.tokens.size() - 1);
  };
  const std::int64_t yz = add("yz", 'y', 'z');
  const std::int64_t xy = add("xy", 'x', 'y');
  const std::int64_t xyz = add("xyz", xy, 'z');  // "xyz" merges to x + yz: y z ranks before x y
  const ByteLevelBpe t(v);
  CHECK(t.encode("xyz") == TokenIds{'x', yz});
  CHECK(t.encode("xyzz") == TokenIds{'x', yz, 'z'});
  CHECK(t.encode("xyxy") == TokenIds{xy, xy});
  CHECK(t.decode({xyz}) == "xyz");
}

TEST_CASE("GPT-2's tokenizer.json, with merges as strings or as pairs, loads to the same vocabulary and ids") {
  const BpeVocabulary hf = load_hf_tokenizer_json(fixture("tokenizer.json"));
  CHECK(same_vocabulary(hf, gpt2().vocabulary()));
  testing::TempDir dir("xgrad_gpt2_hf");
  const std::string pairs = edited_tokenizer_json(dir, [](nlohmann::json& doc) {
    for (auto& m : doc["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
    doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {doc["pre_tokenizer"]}}};
  });
  CHECK(same_vocabulary(load_hf_tokenizer_json(pairs), hf));
  const auto t = load_byte_level_bpe(fixture("tokenizer.json"));
  CHECK(t->identity() == gpt2().identity());
  for (const Case& c : cases()) {
    INFO("case " << c.name);
    CHECK(t->encode(c.text) == c.ids);
  }
}

// Hugging Face's tokenizers split the added tokens out of the text before the pre-tokenizer and the
// BPE see it (tokenizer/added_vocabulary.rs, extract_and_normalize): the ones that are not special
// in any text; the BPE encodes the text between them as text of its own.
TEST_CASE("tokenizer.json's added tokens that are not special are matched in any text, as Hugging Face does") {
  testing::TempDir dir("xgrad_gpt2_added");
  const auto added = [](std::int64_t id, const std::string& content, bool special, bool normalized) {
    return nlohmann::json{{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
  };
  const auto t = load_byte_level_bpe(edited_tokenizer_json(dir, [&](nlohmann::json& d) {
    d["added_tokens"].push_back(added(50257, "<tool>", false, true));
    d["added_tokens"].push_back(added(31373, "hello", false, true));  // model.vocab's "hello": its id
    d["added_tokens"].push_back(added(50258, " the", false, true));   // the bytes of "Ġthe" (262), another id
  }));
  const auto bpe = [&](const std::string& text) { return gpt2().encode(text); };
  const auto join = [](std::initializer_list<TokenIds> parts) {
    TokenIds out;
    for (const TokenIds& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  CHECK(t->vocab_size() == 50259);
  CHECK(t->vocabulary().added_tokens == TokenIds{31373, 50257, 50258});
  CHECK(t->vocabulary().special_tokens == TokenIds{50256});
  for (const SpecialText mode : {SpecialText::ordinary, SpecialText::match}) {
    CHECK(t->encode("a<tool>b", mode) == TokenIds{64, 50257, 65});
    CHECK(t->encode("say<tool><tool> x", mode) == join({bpe("say"), {50257, 50257}, bpe(" x")}));
    CHECK(t->encode("ahellob", mode) == TokenIds{64, 31373, 65});
    CHECK(t->encode("a the b", mode) == TokenIds{64, 50258, 275});
    CHECK(t->encode("Hello world", mode) == TokenIds{15496, 995});
  }
  CHECK(t->encode("<tool><|endoftext|>") == join({{50257}, bpe("<|endoftext|>")}));
  CHECK(t->encode("<tool><|endoftext|>", SpecialText::match) == TokenIds{50257, 50256});
  CHECK(t->decode({64, 50257, 50258, 31373}) == "a<tool> thehello");
  CHECK(gpt2().encode("ahellob") != TokenIds{64, 31373, 65});  // without the added token: one piece
  CHECK(gpt2().encode("a the b") == TokenIds{64, 262, 275});

  // The document rebuilds the same tokenizer; GPT-2's files cannot hold added tokens.
  const auto back = ByteLevelBpe::from_json(t->to_json(), "test");
  CHECK(back->identity() == t->identity());
  CHECK(back->encode("a<tool>b") == TokenIds{64, 50257, 65});
  CHECK(t->identity() != gpt2().identity());
  CHECK_THROWS_WITH(
      save_gpt2_vocabulary(t->vocabulary(), dir.file("out")),
      Contains("save_gpt2_vocabulary: the vocabulary has added tokens (the first is id 31373 \"hello\")"));
}

// Hugging Face matches the added tokens with "normalized": false over the whole text first, then
// those with true in the text between (extract_and_normalize's two passes); one pass when all agree.
TEST_CASE("added tokens are matched in Hugging Face's two passes: normalized false first, then true") {
  testing::TempDir dir("xgrad_gpt2_added_passes");
  const auto with = [&](bool special_normalized) {
    return load_byte_level_bpe(edited_tokenizer_json(dir, [&](nlohmann::json& d) {
      d["added_tokens"][0]["normalized"] = special_normalized;
      d["added_tokens"].push_back({{"id", 50257}, {"content", "a<|end"}, {"special", false}, {"normalized", true}});
    }));
  };
  const TokenIds rest = gpt2().encode("oftext|>");
  TokenIds a_then_rest{50257};
  a_then_rest.insert(a_then_rest.end(), rest.begin(), rest.end());
  // <|endoftext|> (normalized false) first; "a<|end" is then looked for in "a" only.
  const auto two_passes = with(false);
  CHECK(two_passes->vocabulary().matched_later == TokenIds{50257});
  CHECK(two_passes->encode("a<|endoftext|>", SpecialText::match) == TokenIds{64, 50256});
  CHECK(two_passes->encode("a<|endoftext|>") == a_then_rest);
  // Both normalized (GPT-2's file has <|endoftext|> so): one pass, the leftmost match wins.
  const auto one_pass = with(true);
  CHECK(one_pass->vocabulary().matched_later.empty());
  CHECK(one_pass->encode("a<|endoftext|>", SpecialText::match) == a_then_rest);
  CHECK(one_pass->encode("x<|endoftext|>", SpecialText::match) == TokenIds{87, 50256});
  CHECK(ByteLevelBpe::from_json(two_passes->to_json(), "test")->encode("a<|endoftext|>", SpecialText::match) ==
        TokenIds{64, 50256});
}

// model.ignore_merges (Hugging Face's tokenizers, models/bpe/model.rs, tokenize_with_cache): a
// pre-tokenized word that is itself in model.vocab is that token, without merging; other words
// merge as before.
TEST_CASE("tokenizer.json's model.ignore_merges: a piece that is a vocab token is that token, unmerged") {
  testing::TempDir dir("xgrad_gpt2_ignore_merges");
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_printable_from_bytes(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::string> made = {"he", "ll", "hell", "hello", "yz", "xy", "xyz"};
  for (std::size_t i = 0; i < made.size(); ++i) vocab[made[i]] = 256 + i;
  vocab["abc"] = 263;   // made by no merge
  vocab["Ġabc"] = 264;  // neither
  const nlohmann::json merges = {"h e", "l l", "he ll", "hell o", "y z", "x y", "xy z"};
  const auto load = [&](const nlohmann::json& ignore_merges) {
    const nlohmann::json doc = {
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", ignore_merges}}}};
    testing::write_bytes(dir.file("tokenizer.json"), doc.dump());
    return load_byte_level_bpe(dir.file("tokenizer.json"));
  };
  const auto t = load(true);
  CHECK(t->vocabulary().ignore_merges);
  CHECK(t->vocabulary().special_tokens.empty());  // abc and Ġabc are ordinary: a piece can be them
  CHECK(t->encode("xyz") == TokenIds{262});       // merging gives x + yz (y z ranks first)
  CHECK(t->encode("abc") == TokenIds{263});
  CHECK(t->encode("abc abc") == TokenIds{263, 264});
  CHECK(t->encode("hello xyz") == TokenIds{259, ' ', 'x', 260});  // " xyz" is no token: merged
  CHECK(t->encode("xyzz") == TokenIds{'x', 260, 'z'});
  CHECK(t->decode({262, 264}) == "xyz abc");
  const auto back = ByteLevelBpe::from_json(t->to_json(), "test");
  CHECK(back->identity() == t->identity());
  CHECK(back->encode("xyz abc") == TokenIds{262, 264});
  CHECK_THROWS_WITH(save_gpt2_vocabulary(t->vocabulary(), dir.file("out")),
                    Contains("save_gpt2_vocabulary: the vocabulary ignores the merges"));

  const auto merging = load(false);  // the same vocabulary merging every piece
  CHECK(merging->encode("xyz") == TokenIds{'x', 260});
  CHECK(merging->encode("abc abc") == TokenIds{'a', 'b', 'c', ' ', 'a', 'b', 'c'});
  CHECK(merging->vocabulary().special_tokens == TokenIds{263, 264});
  CHECK(load(nullptr)->encode("xyz") == TokenIds{'x', 260});
  CHECK(merging->identity() != t->identity());
  CHECK_THROWS_WITH(load("yes"),
                    Contains(dir.file("tokenizer.json") + "': model.ignore_merges is \"yes\", not true or false"));
}

TEST_CASE("bad input: an added token's options xgrad does not implement, or an id Hugging Face would not give") {
  testing::TempDir dir("xgrad_gpt2_added_bad");
  const std::string file = dir.file("tokenizer.json");
  const auto load_with = [&](const nlohmann::json& token) {
    return load_hf_tokenizer_json(
        edited_tokenizer_json(dir, [&](nlohmann::json& d) { d["added_tokens"].push_back(token); }));
  };
  const nlohmann::json tool = {{"id", 50257}, {"content", "<tool>"}, {"special", false}, {"normalized", true}};
  for (const char* option : {"single_word", "lstrip", "rstrip"}) {
    nlohmann::json t = tool;
    t[option] = true;
    CHECK_THROWS_WITH(load_with(t), Contains(file + "': added_tokens[1] \"<tool>\" has " + option +
                                             " true, which xgrad does not implement"));
    t[option] = "no";
    CHECK_THROWS_WITH(load_with(t),
                      Contains(std::string("added_tokens[1].") + option + " is \"no\", not true or false"));
  }
  nlohmann::json t = tool;
  t["special"] = 1;
  CHECK_THROWS_WITH(load_with(t), Contains("added_tokens[1].special is 1, not true or false"));
  t = tool;
  t["content"] = "hello";
  CHECK_THROWS_WITH(load_with(t), Contains("added_tokens[1] \"hello\" has the id 50257, but Hugging Face's "
                                           "tokenizers give it the id 31373 (the id of model.vocab's token"));
  t = tool;
  t["id"] = 50258;
  CHECK_THROWS_WITH(load_with(t), Contains("added_tokens[1] \"<tool>\" has the id 50258, but Hugging Face's "
                                           "tokenizers give it the id 50257 (the next id after model.vocab's 50257 "
                                           "tokens and the added ones before)"));
  t = tool;
  t["content"] = "<|endoftext|>";
  t["id"] = 50256;
  CHECK_THROWS_WITH(load_with(t), Contains(file + "': added_tokens[1] \"<|endoftext|>\" repeats the text of "
                                                  "added_tokens[0]"));
}

TEST_CASE("from_json(to_json()) rebuilds a tokenizer of the same identity and ids") {
  const std::string doc = gpt2().to_json();
  CHECK(doc.find(R"({"kind":"byte_bpe",)") == 0);
  const auto back = ByteLevelBpe::from_json(doc, "test");
  CHECK(back->identity() == gpt2().identity());
  CHECK(back->to_json() == doc);
  CHECK(same_vocabulary(back->vocabulary(), gpt2().vocabulary()));
  for (const Case& c : cases()) CHECK(back->encode(c.text) == c.ids);
  CHECK(back->special_tokens().eos == 50256);
}

TEST_CASE("save_gpt2_vocabulary writes GPT-2's merges.txt and a vocab.json that load back to the same vocabulary") {
  testing::TempDir dir("xgrad_gpt2_save");
  const std::string out = dir.file("saved/inner");
  save_gpt2_vocabulary(gpt2().vocabulary(), out);
  CHECK(testing::read_bytes(out + "/merges.txt") == testing::read_bytes(fixture("merges.txt")));
  const BpeVocabulary back = load_gpt2_vocabulary(out + "/vocab.json", out + "/merges.txt");
  CHECK(same_vocabulary(back, gpt2().vocabulary()));
  CHECK(nlohmann::json::parse(testing::read_bytes(out + "/vocab.json")) ==
        nlohmann::json::parse(testing::read_bytes(fixture("vocab.json"))));
  // A vocabulary whose special token texts need GPT-2's byte form (a space) comes back too.
  BpeVocabulary v = small_vocabulary();
  v.special_tokens.push_back(static_cast<std::int64_t>(v.tokens.size()));
  v.tokens.emplace_back("<my token>\n");
  save_gpt2_vocabulary(v, dir.file("small"));
  CHECK(same_vocabulary(load_gpt2_vocabulary(dir.file("small/vocab.json"), dir.file("small/merges.txt")), v));
}

TEST_CASE("bytes that are not UTF-8 encode byte by byte through the byte tokens and decode back") {
  const ByteLevelBpe& t = gpt2();
  const auto byte_id = [&](unsigned char b) {
    const auto& tokens = t.vocabulary().tokens;
    return static_cast<std::int64_t>(std::find(tokens.begin(), tokens.end(), std::string(1, static_cast<char>(b))) -
                                     tokens.begin());
  };
  CHECK(t.encode("\xFF") == TokenIds{byte_id(0xFF)});
  CHECK(t.encode("\xC0\xAF") == TokenIds{byte_id(0xC0), byte_id(0xAF)});
  CHECK(t.encode("\xE4\xB8\xAD") == TokenIds{40792});                     // "中" whole, as js-tiktoken gives it
  CHECK(t.encode("\xE4\xB8") == TokenIds{byte_id(0xE4), byte_id(0xB8)});  // cut: not GPT-2's token 10310 "\xE4\xB8"
  CHECK(t.token_bytes(10310) == "\xE4\xB8");
  const std::string cut = "a\xE4\xB8 b\xED\xA0\x80 \xF5\x80\x80\x80z\x80";
  CHECK(t.encode(cut) == TokenIds{64, byte_id(0xE4), byte_id(0xB8), 275, byte_id(0xED), byte_id(0xA0), byte_id(0x80),
                                  220, byte_id(0xF5), byte_id(0x80), byte_id(0x80), byte_id(0x80), 89, byte_id(0x80)});
  CHECK(t.decode(t.encode(cut)) == cut);
  std::mt19937 gen(7);
  for (int round = 0; round < 300; ++round) {
    std::string s(std::uniform_int_distribution<int>(1, 300)(gen), '\0');
    for (char& c : s) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(gen));
    if (round % 2) s = "Some text " + s + " and more, \xE4\xB8\xAD\xE6\x96\x87.";
    const TokenIds ids = t.encode(s, round % 3 ? SpecialText::ordinary : SpecialText::match);
    for (std::int64_t id : ids) REQUIRE((id >= 0 && id < 50257));
    REQUIRE(t.decode(ids) == s);
  }
}

TEST_CASE("several threads encoding with one tokenizer at once agree with one thread") {
  const auto all = cases();
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round)
        for (std::size_t i = k; i < all.size() + k; ++i) {
          const Case& c = all[i % all.size()];
          if (gpt2().encode(c.text) != c.ids) ++wrong[k];
        }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong == std::vector<int>(4, 0));
}

TEST_CASE("bad input: vocab.json not JSON, an id that is not an integer, repeated or missing") {
  testing::TempDir dir("xgrad_gpt2_bad");
  {
    SmallFiles f;
    f.write(dir);
    testing::write_bytes(dir.file("vocab.json"), "{\"a\": 0, \"b\": ");
    CHECK_THROWS_WITH(load_gpt2_vocabulary(dir.file("vocab.json"), dir.file("merges.txt")),
                      Contains("load_gpt2_vocabulary") && Contains(dir.file("vocab.json")) && Contains("not JSON") &&
                          Contains("line 1, column 15"));
  }
  for (const char* value : {"1.5", "\"3\"", "true", "null"}) {
    SmallFiles f;
    f.vocab[258].second = value;
    CHECK_THROWS_WITH(f.load(dir), Contains(dir.file("vocab.json")) && Contains("\"hell\"") &&
                                       Contains(std::string("the value ") + value) && Contains("not an integer id"));
  }
  {
    SmallFiles f;
    f.vocab[258].second = "-4";
    CHECK_THROWS_WITH(f.load(dir), Contains("\"hell\" has the negative id -4"));
  }
  {
    SmallFiles f;
    f.vocab[258].second = "256";
    CHECK_THROWS_WITH(f.load(dir),
                      Contains(dir.file("vocab.json")) && Contains("\"he\" and \"hell\" both have the id 256"));
  }
  {  // a token given twice: the JSON parser keeps one, so its other id is a hole
    SmallFiles f;
    f.vocab[260].first = "he";
    CHECK_THROWS_WITH(f.load(dir), Contains("load_gpt2_vocabulary: '" + dir.file("vocab.json") +
                                            "': the token \"he\" is given twice, with the ids 256 and 260 (no "
                                            "token has the id 256"));
    f.vocab[260] = {"hell", "256"};  // given twice, and its second id is another token's
    CHECK_THROWS_WITH(f.load(dir), Contains("the token \"hell\" is given twice, with the ids 258 and 256 (the "
                                            "entries \"he\" and \"hell\" both have the id 256)"));
    f.vocab[260] = {"hell", "258"};  // given twice with one id: harmless, but no <|endoftext|>
    CHECK(f.load(dir).tokens.size() == 260);
    std::string hf = testing::read_bytes(fixture("tokenizer.json"));
    const std::string entry = "\"hello\":31373";
    REQUIRE(hf.find(entry) != std::string::npos);
    hf.replace(hf.find(entry), entry.size(), entry + ",\"hello\":50256");
    testing::write_bytes(dir.file("tokenizer.json"), hf);
    CHECK_THROWS_WITH(load_hf_tokenizer_json(dir.file("tokenizer.json")),
                      Contains(dir.file("tokenizer.json") + "' model.vocab: the token \"hello\" is given twice, with "
                                                            "the ids 31373 and 50256"));
  }
  {
    SmallFiles f;
    f.vocab[260].second = "270";  // <|endoftext|> past a hole at 260
    CHECK_THROWS_WITH(f.load(dir), Contains(dir.file("vocab.json")) && Contains("no token has the id 260") &&
                                       Contains("the largest is 270"));
  }
  {
    SmallFiles f;
    testing::write_bytes(dir.file("vocab.json"), "[1, 2]");
    f.merge_lines.clear();
    CHECK_THROWS_WITH(load_gpt2_vocabulary(dir.file("vocab.json"), dir.file("merges.txt")), Contains("not an object"));
  }
}

TEST_CASE(
    "bad input: merges.txt lines that are not two tokens, name unknown tokens or make none, ranks that do not match") {
  testing::TempDir dir("xgrad_gpt2_bad_merges");
  const std::string merges = dir.file("merges.txt");
  for (const char* line : {"he", "h e l", "h  e", " h", "", "he "}) {
    SmallFiles f;
    f.merge_lines.insert(f.merge_lines.begin() + 2, line);
    CHECK_THROWS_WITH(f.load(dir), Contains("load_gpt2_vocabulary") && Contains(merges) && Contains("line 3") &&
                                       Contains("not two tokens separated by one space"));
  }
  {
    SmallFiles f;
    f.merge_lines[3] = "he zz";
    CHECK_THROWS_WITH(f.load(dir), Contains(merges + "' line 4") && Contains("the token \"zz\" is not in") &&
                                       Contains(dir.file("vocab.json")));
  }
  {
    SmallFiles f;
    f.merge_lines.push_back("o h");  // "oh" is no token
    CHECK_THROWS_WITH(f.load(dir),
                      Contains(merges + "' line 6") && Contains("\"o\" + \"h\" gives \"oh\", which is not in"));
  }
  {
    SmallFiles f;
    std::swap(f.merge_lines[2], f.merge_lines[3]);  // "he ll" before "l l"
    CHECK_THROWS_WITH(f.load(dir), Contains(merges + "' line 3") && Contains("the token \"ll\"") &&
                                       Contains("only by the later line 4") && Contains("the ranks do not match"));
  }
  {
    SmallFiles f;
    f.merge_lines.push_back("h e");
    CHECK_THROWS_WITH(f.load(dir), Contains("line 6: repeats the merge of line 2"));
  }
  {  // without the "#version" line and with CRLF line ends the file reads the same
    SmallFiles f;
    const BpeVocabulary want = f.load(dir);
    f.merge_lines.erase(f.merge_lines.begin());
    for (auto& line : f.merge_lines) line += "\r";
    CHECK(same_vocabulary(f.load(dir), want));
  }
  {  // a special token whose key holds a character outside GPT-2's byte table is its UTF-8 text
    SmallFiles f;
    f.vocab.emplace_back("<|中文 x|>", "261");
    const BpeVocabulary v = f.load(dir);
    CHECK(v.tokens[261] == "<|中文 x|>");
    CHECK(v.special_tokens == TokenIds{260, 261});
  }
}

TEST_CASE("bad input: a tokenizer.json of another model type or with a normalizer or pre-tokenizer GPT-2 has not") {
  const std::string wordpiece = fixture("wordpiece_tokenizer.json");
  CHECK_THROWS_WITH(load_hf_tokenizer_json(wordpiece), Contains("load_hf_tokenizer_json") && Contains(wordpiece) &&
                                                           Contains("model.type is \"WordPiece\", not \"BPE\""));
  CHECK_THROWS_WITH(load_byte_level_bpe(wordpiece), Contains("model.type is \"WordPiece\""));
  testing::TempDir dir("xgrad_gpt2_bad_hf");
  CHECK_THROWS_WITH(load_hf_tokenizer_json(edited_tokenizer_json(dir, [](auto& d) { d["model"]["type"] = "Unigram"; })),
                    Contains("model.type is \"Unigram\""));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(
                        edited_tokenizer_json(dir, [](auto& d) { d["pre_tokenizer"]["add_prefix_space"] = true; })),
                    Contains("pre_tokenizer.add_prefix_space is true"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(edited_tokenizer_json(
                        dir,
                        [](auto& d) {
    d["pre_tokenizer"] = {{"type", "Whitespace"}};
                        })),
                    Contains("pre_tokenizer is Whitespace, not ByteLevel"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(edited_tokenizer_json(
                        dir,
                        [](auto& d) {
    d["normalizer"] = {{"type", "NFC"}};
                        })),
                    Contains("normalizer is NFC, not null"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(edited_tokenizer_json(dir, [](auto& d) { d["model"]["merges"][5] = "Ġt"; })),
                    Contains("model.merges[5]") && Contains("not two tokens"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(edited_tokenizer_json(dir, [](auto& d) { d["model"]["merges"][5] = 7; })),
                    Contains("model.merges[5]: 7 is neither"));
  CHECK_THROWS_WITH(
      load_hf_tokenizer_json(edited_tokenizer_json(dir, [](auto& d) { d["model"]["vocab"]["Ġthe"] = 1.5; })),
      Contains("model.vocab: the entry \"Ġthe\" has the value 1.5"));
  CHECK_THROWS_WITH(
      load_hf_tokenizer_json(edited_tokenizer_json(dir, [](auto& d) { d["added_tokens"][0]["id"] = 50300; })),
      Contains(dir.file("tokenizer.json") + "': added_tokens[0] \"<|endoftext|>\" has the id 50300") &&
          Contains("Hugging Face's tokenizers give it the id 50256 (the id of model.vocab's token of that text)"));
  testing::write_bytes(dir.file("cut.json"), testing::read_bytes(fixture("tokenizer.json")).substr(0, 5000));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(dir.file("cut.json")),
                    Contains(dir.file("cut.json")) && Contains("not JSON"));
  CHECK_THROWS_WITH(load_byte_level_bpe(dir.file("nothing")),
                    Contains("load_byte_level_bpe") && Contains("does not exist"));
  std::filesystem::create_directory(dir.file("empty"));
  CHECK_THROWS_WITH(load_byte_level_bpe(dir.file("empty")),
                    Contains("load_gpt2_vocabulary") && Contains(dir.file("empty/vocab.json")) && Contains("cannot"));
}

TEST_CASE(
    "bad input: a BpeVocabulary without every byte, with repeated bytes or a bad merge is refused naming the id or "
    "rank") {
  const BpeVocabulary good = small_vocabulary();
  BpeVocabulary v = good;
  v.tokens['A'] = "B";
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("ByteLevelBpe: ids 65 and 66 are both the bytes \"B\""));
  v = good;
  v.special_tokens.push_back('A');
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("no ordinary token is the single byte 0x41"));
  v = good;
  v.merges.emplace_back(256, 9999);
  CHECK_THROWS_WITH(ByteLevelBpe(v),
                    Contains("the merge of rank 4 names the id 9999, outside the vocabulary [0, 261)"));
  v = good;
  v.merges.emplace_back('o', 'h');
  CHECK_THROWS_WITH(ByteLevelBpe(v),
                    Contains("the merge of rank 4 (ids 111 + 104) gives \"oh\", which is no ordinary token"));
  v = good;
  v.merges.emplace_back(260, 'h');
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the merge of rank 4 names the special token 260"));
  v = good;
  std::swap(v.merges[1], v.merges[2]);
  CHECK_THROWS_WITH(ByteLevelBpe(v),
                    Contains("the merge of rank 1 uses the id 257 \"ll\", which only the later merge of rank 2 makes"));
  v = good;
  v.merges.push_back(v.merges[0]);
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the merge of rank 4 repeats the merge of rank 0"));
  v = good;
  v.special_tokens.push_back(400);
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("special token 1 has the id 400, outside the vocabulary"));
  v = good;
  v.special_tokens.push_back(260);
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the id 260 is listed twice"));
  v = good;
  v.tokens[260] = "";
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the token of id 260 is empty"));
  v = good;
  v.added_tokens = {260};
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the id 260 is both a special and an added token"));
  v = good;
  v.added_tokens = {259, 259};
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the id 259 is listed twice as an added token"));
  v = good;
  v.matched_later = {259};
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the id 259 is matched later but is neither special nor added"));
  v = good;
  v.tokens.emplace_back("<|endoftext|>");  // an added token with the special token's text
  v.added_tokens = {261};
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("ids 261 and 260 are both matched as the text \"<|endoftext|>\""));
  v = good;
  v.tokens.emplace_back("xy");  // an added token no merge makes, used by a merge
  v.added_tokens = {261};
  v.tokens.emplace_back("xyz");
  v.merges.emplace_back(261, 'z');
  CHECK_THROWS_WITH(ByteLevelBpe(v), Contains("the merge of rank 4 names the added token 261 \"xy\", which is not an "
                                              "ordinary token"));
  CHECK_THROWS_WITH(gpt2().decode({15496, 50257}), Contains("id 50257 at position 1"));
  CHECK_THROWS_WITH(gpt2().token_bytes(-1), Contains("ByteLevelBpe::token_bytes") && Contains("id -1"));
}

TEST_CASE("bad input: a malformed byte_bpe document is refused naming the field") {
  const std::string who = "reader";
  CHECK_THROWS_WITH(ByteLevelBpe::from_json("{\"kind\":", who), Contains("reader:") && Contains("not JSON"));
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(R"({"kind":"bytes"})", who),
                    Contains("\"kind\" is \"bytes\", not \"byte_bpe\""));
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(R"({"kind":"byte_bpe","merges":[],"special_tokens":[]})", who),
                    Contains("no array field \"tokens\""));
  nlohmann::json doc = nlohmann::json::parse(ByteLevelBpe(small_vocabulary()).to_json());
  doc["merges"][2] = {256, "x"};
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who), Contains("\"merges\"[2][1] is \"x\", not an integer id"));
  doc = nlohmann::json::parse(ByteLevelBpe(small_vocabulary()).to_json());
  doc["tokens"][3] = "中";
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who),
                    Contains("\"tokens\"[3] \"中\" is not in GPT-2's printable byte form"));
  doc = nlohmann::json::parse(ByteLevelBpe(small_vocabulary()).to_json());
  doc["special_tokens"] = {999};
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who), Contains("reader: special token 0 has the id 999"));
  doc = nlohmann::json::parse(ByteLevelBpe(small_vocabulary()).to_json());
  doc["ignore_merges"] = 1;
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who),
                    Contains("reader: \"ignore_merges\" is 1, not true or false"));
  doc["ignore_merges"] = false;
  doc["added_tokens"] = "x";
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who), Contains("no array field \"added_tokens\""));
  doc["added_tokens"] = {1000};
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(doc.dump(), who), Contains("reader: added token 0 has the id 1000"));
}

TEST_CASE(
    "bad input: save_gpt2_vocabulary writes nothing over an existing vocabulary or for a vocabulary the files cannot "
    "hold") {
  testing::TempDir dir("xgrad_gpt2_bad_save");
  save_gpt2_vocabulary(small_vocabulary(), dir.path);
  const std::string before = testing::read_bytes(dir.file("vocab.json"));
  CHECK_THROWS_WITH(save_gpt2_vocabulary(small_vocabulary(), dir.path),
                    Contains("save_gpt2_vocabulary") && Contains(dir.file("vocab.json")) && Contains("exists"));
  CHECK(testing::read_bytes(dir.file("vocab.json")) == before);
  std::filesystem::remove(dir.file("vocab.json"));
  CHECK_THROWS_WITH(save_gpt2_vocabulary(small_vocabulary(), dir.path),
                    Contains(dir.file("merges.txt")) && Contains("exists"));
  CHECK(dir.entries() == std::set<std::string>{"merges.txt"});
  BpeVocabulary v = small_vocabulary();
  v.special_tokens.push_back(static_cast<std::int64_t>(v.tokens.size()));
  v.tokens.emplace_back("hello");  // a special token with an ordinary token's bytes
  CHECK_THROWS_WITH(save_gpt2_vocabulary(v, dir.file("a")), Contains("ids 259 and 261 are both \"hello\""));
  v = small_vocabulary();
  v.tokens.emplace_back("xyz");  // ordinary, but no merge makes it
  CHECK_THROWS_WITH(save_gpt2_vocabulary(v, dir.file("a")),
                    Contains("the token of id 261 \"xyz\" is made by no merge"));
  v = small_vocabulary();
  v.merges.emplace_back('o', 'h');
  CHECK_THROWS_WITH(save_gpt2_vocabulary(v, dir.file("a")), Contains("save_gpt2_vocabulary: the merge of rank 4"));
  CHECK(dir.entries() == std::set<std::string>{"merges.txt"});
}
