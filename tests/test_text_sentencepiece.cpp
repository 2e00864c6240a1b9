// SentencePiece models behind the tokenizer interface: ids, pieces and decoded text against Python's
// sentencepiece 0.1.97 (tests/fixtures/sentencepiece/make_fixtures.py), the special tokens, the JSON
// document, encoding on several threads, training in C++ against the Python-trained models, and
// every bad input of the "SentencePiece" section of tests/BAD_INPUT.md.
#include <catch2/catch.hpp>

#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "peak_memory.hpp"
#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"

using namespace xgrad;
using namespace xgrad::text;
using Catch::Contains;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

const std::string kDir = std::string(XGRAD_FIXTURE_DIR) + "/sentencepiece/";

const nlohmann::json& expected() {
  static const nlohmann::json doc = nlohmann::json::parse(read_bytes(kDir + "expected.json"));
  return doc;
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

TokenIds ids_of(const nlohmann::json& j) { return j.get<TokenIds>(); }

const char* const kModels[] = {"bpe", "unigram"};

SentencePieceTrainerOptions options_of(const nlohmann::json& o) {
  SentencePieceTrainerOptions t(o["vocab_size"].get<std::size_t>());
  t.model_type(o["model_type"].get<std::string>())
      .byte_fallback(o["byte_fallback"].get<bool>())
      .character_coverage(o["character_coverage"].get<double>())
      .normalization_rule_name(o["normalization_rule_name"].get<std::string>())
      .unk_id(o["unk_id"].get<int>())
      .bos_id(o["bos_id"].get<int>())
      .eos_id(o["eos_id"].get<int>())
      .pad_id(o["pad_id"].get<int>());
  if (o.contains("remove_extra_whitespaces")) t.remove_extra_whitespaces(o["remove_extra_whitespaces"].get<bool>());
  if (o.contains("add_dummy_prefix")) t.add_dummy_prefix(o["add_dummy_prefix"].get<bool>());
  if (o.contains("split_digits")) t.split_digits(o["split_digits"].get<bool>());
  if (o.contains("user_defined_symbols"))
    t.user_defined_symbols(o["user_defined_symbols"].get<std::vector<std::string>>());
  if (o.contains("control_symbols")) t.control_symbols(o["control_symbols"].get<std::vector<std::string>>());
  return t;
}

// The pieces of `ids` as the model spells them.
std::vector<std::string> pieces_of(const SentencePieceTokenizer& t, const TokenIds& ids) {
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(t.piece(id));
  return out;
}

}  // namespace

TEST_CASE("SentencePiece: ids, pieces and decoded text are Python sentencepiece's, for a BPE and a unigram model") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    CHECK(t->kind() == "sentencepiece");
    REQUIRE(t->vocab_size() == m["vocab_size"].get<std::size_t>());
    for (std::size_t id = 0; id < t->vocab_size(); ++id) CHECK(t->piece(id) == m["pieces"][id].get<std::string>());
    std::size_t n = 0;
    for (const auto& c : m["cases"]) {
      const std::string text = unhex(c["text_hex"]);
      INFO("case " << n++ << ": " << readable_bytes(text));
      const TokenIds ids = t->encode(text);
      CHECK(ids == ids_of(c["ids"]));
      // Python gives an unknown piece's surface text, not "<unk>": those are left out.
      const auto python_pieces = c["pieces"].get<std::vector<std::string>>();
      const auto ours = pieces_of(*t, ids);
      REQUIRE(ours.size() == python_pieces.size());
      for (std::size_t i = 0; i < ours.size(); ++i)
        if (ids[i] != m["unk_id"].get<std::int64_t>()) CHECK(ours[i] == python_pieces[i]);
      CHECK(t->decode(ids) == unhex(c["decoded_hex"]));
    }
    for (const auto& c : m["training_lines"]) CHECK(t->encode(unhex(c["text_hex"])) == ids_of(c["ids"]));
  }
}

// A text of the training text and the test cases (every script, whitespace runs, newlines,
// invalid UTF-8), short enough for encode to give it to SentencePiece whole.
std::string mixed_text() {
  std::string text = read_bytes(kDir + "train.txt");
  for (const char* name : kModels)
    for (const auto& c : expected()["models"][name]["cases"]) text += unhex(c["text_hex"]) + " and " + "\n";
  return text;
}

// encode gives a long text to SentencePiece in parts, each cut before a space between two letters
// or digits, the next part encoded with the dummy-prefix ▁ standing for that space. With parts of 1
// byte every such space is a cut; runs of 4096 bytes without one would be refused (these models'
// pieces could not be cut) or cut inside, so equal ids mean the cuts at spaces keep them.
TEST_CASE("SentencePiece: a text encoded in parts cut at spaces gives the ids of the whole text") {
  const std::string text = mixed_text();
  REQUIRE(text.size() > 30000);
  REQUIRE(text.size() <= SentencePieceTokenizer::PartSizes().part);  // encode gives it whole
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto t = load_sentencepiece(kDir + expected()["models"][name]["file"].get<std::string>());
    const TokenIds whole = t->encode(text), whole_match = t->encode(text, SpecialText::match);
    for (const std::size_t part : {1, 2, 7, 100, 4096}) {
      INFO("parts of " << part << " bytes");
      const SentencePieceTokenizer::PartSizes sizes{part, 4096};
      CHECK(t->encode_in_parts(text, SpecialText::ordinary, sizes) == whole);
      CHECK(t->encode_in_parts(text, SpecialText::match, sizes) == whole_match);
    }
    CHECK(t->encode_in_parts(" a b ", SpecialText::ordinary, {1, 5}) == t->encode(" a b "));
    CHECK_THROWS_WITH(t->encode_in_parts(text, SpecialText::ordinary, {0, 10}),
                      Contains("encode_in_parts: parts of 0 bytes and runs of 10"));
  }
}

// What SentencePiece holds while it encodes (its normalized copy, offsets, symbols, heaps, the
// pieces' protobuf: 115 to 200 bytes a byte) is bounded by the part, not the text. Measured in
// this process from a reset peak (tests/peak_memory.hpp), after malloc_trim has given back what
// the run before freed.
TEST_CASE("SentencePiece: encoding 8 MB, or 4 MB of one word, holds its ids and parts, not the whole text") {
  std::string text;
  while (text.size() < (std::size_t{8} << 20)) text += mixed_text();
  std::string word;
  while (word.size() < (std::size_t{4} << 20)) word += "abcdefghijklmnopqrstuvwxyz";
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto t = load_sentencepiece(kDir + expected()["models"][name]["file"].get<std::string>());
    const TokenIds head = t->encode(text.substr(0, text.find(" ", 40000)));
    for (const std::string* input : {&text, &word}) {
      INFO(input->size() << " bytes");
      ::malloc_trim(0);
      if (!testing::kAddressSanitizer) REQUIRE(testing::reset_peak_rss());  // its peak means nothing there
      const long baseline = testing::status_kib("VmRSS");
      const TokenIds ids = t->encode(*input);
      const long rise = testing::peak_rise_kib(baseline);
      // The ids (8 bytes each, twice while the vector grows) and a part's worth of SentencePiece.
      const long bound = static_cast<long>(2 * ids.capacity() * sizeof(std::int64_t) / 1024) + 48 * 1024;
      INFO("peak rise " << rise << " KiB for " << ids.size() << " ids, bound " << bound << " KiB");
      if (!testing::kAddressSanitizer) CHECK(rise < bound);
      if (input == &text) CHECK(std::equal(head.begin(), head.end(), ids.begin()));
    }
  }
  // A run cut inside gets no dummy-prefix ▁ at the cut: with identity normalization the text comes
  // back whole.
  const auto bpe = load_sentencepiece(kDir + "bpe.model");
  const std::string run = word.substr(0, 100000);
  CHECK(bpe->decode(bpe->encode_in_parts(run, SpecialText::ordinary, {1000, 4000})) == run);
}

// Pieces that hold ▁ after another character (split_by_whitespace false) span the spaces a cut
// would use: such a model encodes a text whole up to a run's size and refuses a longer one.
TEST_CASE("bad input: a text too long to encode whole, with a model whose pieces join words across spaces") {
  TempDir dir("xgrad_spm_uncut");
  train_sentencepiece({kDir + "train.txt"},
                      SentencePieceTrainerOptions(1000).model_type("bpe").split_by_whitespace(false),
                      dir.file("joined.model"));
  const auto t = load_sentencepiece(dir.file("joined.model"));
  bool joins = false;
  for (std::size_t id = 0; id < t->vocab_size(); ++id)
    joins = joins || t->piece(id).find("\xE2\x96\x81", 1) != std::string::npos;
  REQUIRE(joins);
  const std::string text = read_bytes(kDir + "train.txt");
  CHECK(t->encode_in_parts(text, SpecialText::ordinary, {100, text.size()}) == t->encode(text));
  CHECK_THROWS_WITH(t->encode_in_parts(text, SpecialText::ordinary, {100, 4096}),
                    Contains("SentencePieceTokenizer::encode: a text of " + std::to_string(text.size()) +
                             " bytes is more than this model encodes at once (4096;") &&
                        Contains("joins a character to the space after it; split the text into smaller documents"));
}

TEST_CASE("SentencePiece: the special tokens are the model's bos, eos, pad and unk ids") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    const SpecialTokens s = t->special_tokens();
    const auto id = [](const nlohmann::json& v) {
      const auto i = v.get<std::int64_t>();
      return i >= 0 ? std::optional<std::int64_t>(i) : std::nullopt;
    };
    CHECK(s.bos == id(m["bos_id"]));
    CHECK(s.eos == id(m["eos_id"]));
    CHECK(s.pad == id(m["pad_id"]));
    CHECK(s.unk == id(m["unk_id"]));
  }
  // The fixtures differ where it matters: bos 1 / 0, a pad in one model only.
  const auto bpe = load_sentencepiece(kDir + "bpe.model");
  const auto uni = load_sentencepiece(kDir + "unigram.model");
  CHECK(bpe->special_tokens().bos == 1);
  CHECK(bpe->special_tokens().pad == 3);
  CHECK(uni->special_tokens().bos == 0);
  CHECK(uni->special_tokens().unk == 2);
  CHECK_FALSE(uni->special_tokens().pad.has_value());
}

TEST_CASE("SentencePiece: special tokens' text is ordinary text unless SpecialText::match is asked for") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    const auto& types = m["types"];
    for (const auto& c : m["cases"]) {
      const std::string text = unhex(c["text_hex"]);
      INFO(readable_bytes(text));
      for (auto id : t->encode(text)) CHECK(types[id].get<std::string>() != "control");
      CHECK(t->encode(text, SpecialText::match) == ids_of(c["ids_matching_specials"]));
    }
  }
  const auto bpe = load_sentencepiece(kDir + "bpe.model");
  const TokenIds matched = bpe->encode("begin<s>middle</s>end<pad>", SpecialText::match);
  REQUIRE(matched.size() > 4);
  CHECK(std::count(matched.begin(), matched.end(), 1) == 1);  // <s>
  CHECK(std::count(matched.begin(), matched.end(), 2) == 1);  // </s>
  CHECK(matched.back() == 3);                                 // <pad>
  CHECK(bpe->encode("<s>", SpecialText::match) == TokenIds{1});
  CHECK(bpe->encode("<unk>", SpecialText::match) == TokenIds{0});
  // A user-defined symbol is matched in both modes, as SentencePiece always does.
  const std::int64_t sep = 4;
  REQUIRE(bpe->piece(sep) == "<sep>");
  CHECK(bpe->encode("<sep>") == TokenIds{bpe->encode(" ")[0], sep});
}

TEST_CASE("SentencePiece: token_bytes and token_strings show ▁ as a space and byte pieces as their byte") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    for (std::size_t id = 0; id < t->vocab_size(); ++id) {
      const std::string piece = m["pieces"][id].get<std::string>(), type = m["types"][id].get<std::string>();
      INFO("id " << id << " piece " << piece << " (" << type << ")");
      std::string want = piece;
      for (std::size_t at; (at = want.find("\xE2\x96\x81")) != std::string::npos;) want.replace(at, 3, " ");
      if (type == "control") want = "";
      if (type == "unknown") want = m["unknown_decoded"].get<std::string>();
      if (type == "byte") want = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      CHECK(t->token_bytes(id) == want);
      const auto shown = t->token_strings({static_cast<std::int64_t>(id)});
      CHECK(shown[0] == (type == "control" || type == "unknown" ? piece : readable_bytes(want)));
    }
  }
  const auto bpe = load_sentencepiece(kDir + "bpe.model");
  const TokenIds ids = bpe->encode("The Work\n");
  const auto shown = bpe->token_strings(ids);
  CHECK(shown.front() == " The");  // "▁The"
  CHECK(shown.back() == "\n");     // <0x0A>
  CHECK(bpe->token_strings({1, 2, 0})[0] == "<s>");
  CHECK(bpe->token_strings({1, 2, 0})[2] == "<unk>");
  CHECK(bpe->token_bytes(6 + 0xE4) == "\xE4");  // a byte piece alone: the byte, though Decode gives U+FFFD
  CHECK(bpe->decode({6 + 0xE4}) == "\xEF\xBF\xBD");
  CHECK(bpe->token_strings({6 + 0xE4})[0] == "\\xE4");
}

TEST_CASE("SentencePiece: from_json(to_json()) is the same tokenizer") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    const std::string doc = t->to_json();
    const auto j = nlohmann::json::parse(doc);
    CHECK(j["kind"] == "sentencepiece");
    CHECK(j.size() == 2);
    const auto back = SentencePieceTokenizer::from_json(doc, "test");
    CHECK(back->to_json() == doc);
    CHECK(back->identity() == t->identity());
    CHECK(back->identity().vocab_size == t->vocab_size());
    CHECK(back->serialized_model() == read_bytes(kDir + m["file"].get<std::string>()));
    for (const auto& c : m["cases"]) CHECK(back->encode(unhex(c["text_hex"])) == ids_of(c["ids"]));
  }
  const auto bpe = load_sentencepiece(kDir + "bpe.model");
  const auto uni = load_sentencepiece(kDir + "unigram.model");
  CHECK(bpe->identity() != uni->identity());
}

TEST_CASE("SentencePiece: one tokenizer encodes on four threads at once, each getting Python's ids") {
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const auto t = load_sentencepiece(kDir + m["file"].get<std::string>());
    std::vector<std::pair<std::string, TokenIds>> cases;
    for (const auto& c : m["cases"]) cases.emplace_back(unhex(c["text_hex"]), ids_of(c["ids"]));
    for (const auto& c : m["training_lines"]) cases.emplace_back(unhex(c["text_hex"]), ids_of(c["ids"]));
    std::atomic<int> wrong{0}, done{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&, k] {
        for (int round = 0; round < 30; ++round)
          for (std::size_t i = 0; i < cases.size(); ++i) {
            const auto& c = cases[(i + static_cast<std::size_t>(k) * 7) % cases.size()];
            if (t->encode(c.first) != c.second) ++wrong;
            if (t->decode(c.second).size() > 100000) ++wrong;
            ++done;
          }
      });
    for (auto& th : threads) th.join();
    CHECK(wrong == 0);
    CHECK(done == static_cast<int>(4 * 30 * cases.size()));
  }
}

TEST_CASE("SentencePiece: training in C++ with the Python script's options gives the same models") {
  TempDir dir("xgrad_spm_train");
  for (const char* name : kModels) {
    INFO("model " << name);
    const auto& m = expected()["models"][name];
    const std::string out = dir.file(std::string(name) + ".model");
    train_sentencepiece({kDir + "train.txt"}, options_of(m["options"]), out);
    const auto t = load_sentencepiece(out);
    const auto python = load_sentencepiece(kDir + m["file"].get<std::string>());
    REQUIRE(t->vocab_size() == python->vocab_size());
    for (std::size_t id = 0; id < t->vocab_size(); ++id) CHECK(t->piece(id) == python->piece(id));
    for (const auto& c : m["cases"]) CHECK(t->encode(unhex(c["text_hex"])) == ids_of(c["ids"]));
    for (const auto& c : m["training_lines"]) CHECK(t->encode(unhex(c["text_hex"])) == ids_of(c["ids"]));
    CHECK(t->special_tokens().bos == python->special_tokens().bos);
    CHECK(t->special_tokens().pad == python->special_tokens().pad);
  }
  // Nothing but the two models: SentencePiece wrote no .model/.vocab of its own, no temporary is left.
  CHECK(dir.entries() == std::set<std::string>{"bpe.model", "unigram.model"});
}

TEST_CASE("SentencePiece: training reads every line of several files, the last one without its newline") {
  TempDir dir("xgrad_spm_lines");
  const std::string text = read_bytes(kDir + "train.txt");
  const std::size_t cut = text.find('\n', text.size() / 2);
  write_bytes(dir.file("a.txt"), text.substr(0, cut));  // ends without '\n'
  write_bytes(dir.file("b.txt"), text.substr(cut + 1));
  const auto& m = expected()["models"]["unigram"];
  train_sentencepiece({dir.file("a.txt"), dir.file("b.txt")}, options_of(m["options"]), dir.file("u.model"));
  const auto t = load_sentencepiece(dir.file("u.model"));
  for (const auto& c : m["cases"]) CHECK(t->encode(unhex(c["text_hex"])) == ids_of(c["ids"]));
  // A file of one line without a newline is that line.
  write_bytes(dir.file("one.txt"), "hello world");
  train_sentencepiece({dir.file("one.txt")}, SentencePieceTrainerOptions(20).hard_vocab_limit(false),
                      dir.file("one.model"));
  const auto one = load_sentencepiece(dir.file("one.model"));
  const TokenIds ids = one->encode("hello world");
  CHECK(one->decode(ids) == "hello world");
  for (auto id : ids) CHECK(id != one->special_tokens().unk);
}

TEST_CASE("bad input: SentencePiece model files that are missing, folders, empty, cut short or not models") {
  TempDir dir("xgrad_spm_bad");
  CHECK_THROWS_WITH(load_sentencepiece(dir.file("missing.model")),
                    Catch::StartsWith("load_sentencepiece") && Catch::Contains("missing.model"));
  CHECK_THROWS_WITH(load_sentencepiece(dir.path),
                    Catch::StartsWith("load_sentencepiece") && Catch::Contains(dir.path) && Catch::Contains("folder"));
  write_bytes(dir.file("empty.model"), "");
  CHECK_THROWS_WITH(load_sentencepiece(dir.file("empty.model")),
                    Catch::StartsWith("load_sentencepiece: '" + dir.file("empty.model") +
                                      "' is not a SentencePiece model: it holds no bytes"));
  write_bytes(dir.file("text.model"), "This is a text file, not a model.\n");
  CHECK_THROWS_WITH(
      load_sentencepiece(dir.file("text.model")),
      Catch::StartsWith("load_sentencepiece: '" + dir.file("text.model") + "' is not a SentencePiece model"));
  write_bytes(dir.file("json.model"), read_bytes(kDir + "expected.json"));
  CHECK_THROWS_WITH(load_sentencepiece(dir.file("json.model")), Catch::Contains("is not a SentencePiece model"));

  // Every cut of the BPE model (it ends with its normalizer_spec, so no prefix is whole).
  const std::string model = read_bytes(kDir + "bpe.model");
  const std::string cut = dir.file("cut.model");
  std::size_t refused = 0;
  for (std::size_t n = 1; n < model.size(); ++n) {
    try {
      SentencePieceTokenizer t(model.substr(0, n), "load_sentencepiece", "'" + cut + "'");
    } catch (const Error& e) {
      if (std::string(e.what()).find("load_sentencepiece: '" + cut + "' is not a SentencePiece model") == 0) ++refused;
    }
  }
  CHECK(refused == model.size() - 1);
  write_bytes(cut, model.substr(0, model.size() / 2));
  CHECK_THROWS_WITH(load_sentencepiece(cut),
                    Catch::StartsWith("load_sentencepiece: '" + cut + "'") && Catch::Contains("cut short"));
  const auto cut_message = [&](std::size_t n) {
    write_bytes(cut, model.substr(0, n));
    try {
      load_sentencepiece(cut);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string refusal = "load_sentencepiece: '" + cut + "' is not a SentencePiece model: ";
  CHECK(cut_message(7000) ==
        refusal + "field 1 at byte offset 6982 needs 20 bytes, but only 16 follow (the file is cut short)");
  CHECK(cut_message(7005) == refusal + "the length of field 1 at byte offset 7004 runs past the end (cut short?)");
  CHECK(cut_message(7004) == refusal + "it lacks the trainer_spec (field 2): cut short after the pieces?");
  // Well-formed protobuf that SentencePiece refuses: an empty piece, no unknown piece.
  CHECK_THROWS_WITH(
      SentencePieceTokenizer(std::string("\x0a\x00\x12\x00\x1a\x00", 6), "load_sentencepiece", "'m'"),
      Catch::StartsWith("load_sentencepiece: 'm' is not a valid SentencePiece model; SentencePiece says: ") &&
          Catch::Contains("piece must not be empty"));
  CHECK_THROWS_WITH(
      SentencePieceTokenizer(std::string("\x0a\x03\x0a\x01\x61\x12\x00\x1a\x00", 9)),
      Catch::StartsWith("SentencePieceTokenizer: the serialized model is not a valid SentencePiece model") &&
          Catch::Contains("unk is not defined"));
  // Cut between two pieces: a proto that parses, without its trainer and normalizer specs.
  const std::string unigram = read_bytes(kDir + "unigram.model");
  for (std::size_t n = 1; n < unigram.size(); n += 997)
    CHECK_THROWS_WITH(SentencePieceTokenizer(unigram.substr(0, n), "load_sentencepiece", "'u'"),
                      Catch::StartsWith("load_sentencepiece: 'u' is not a SentencePiece model"));
}

TEST_CASE("bad input: SentencePiece ids outside the vocabulary are refused with the id and its position") {
  const auto t = load_sentencepiece(kDir + "bpe.model");
  CHECK_THROWS_WITH(t->decode({5, 6, 1000}),
                    Catch::StartsWith("SentencePieceTokenizer::decode: id 1000 at position 2"));
  CHECK_THROWS_WITH(t->decode({-1}), Catch::Contains("id -1 at position 0"));
  CHECK_THROWS_WITH(t->decode({std::int64_t(1) << 40}), Catch::Contains("id 1099511627776"));
  CHECK_THROWS_WITH(t->token_bytes(1000), Catch::StartsWith("SentencePieceTokenizer::token_bytes: id 1000"));
  CHECK_THROWS_WITH(t->token_strings({0, 4000}), Catch::Contains("id 4000 at position 1"));
  CHECK_THROWS_WITH(t->piece(-5), Catch::Contains("id -5"));
  CHECK(t->decode({}).empty());
  CHECK(t->encode("").empty());
}

TEST_CASE("bad input: SentencePiece JSON documents that are not one") {
  const auto t = load_sentencepiece(kDir + "bpe.model");
  const auto from = [](const std::string& doc) { SentencePieceTokenizer::from_json(doc, "reader"); };
  CHECK_THROWS_WITH(from("{\"kind\":"), Catch::StartsWith("reader: the tokenizer document is not JSON"));
  CHECK_THROWS_WITH(from("[]"), Catch::StartsWith("reader: the tokenizer document is not a JSON object"));
  CHECK_THROWS_WITH(from(R"({"kind":"bytes"})"),
                    Catch::StartsWith("reader: field \"kind\"") && Catch::Contains("\"bytes\""));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece"})"), Catch::StartsWith("reader: the tokenizer document has no "
                                                                           "string field \"model\""));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":7})"), Catch::Contains("no string field \"model\""));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":"abc"})"),
                    Catch::StartsWith("reader: field \"model\" of the tokenizer document is not base64: its length 3"));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":"ab*d"})"),
                    Catch::Contains("character * at offset 2 is not base64"));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":"a=bc"})"), Catch::Contains("is not base64"));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":""})"),
                    Catch::StartsWith("reader: field \"model\" of the tokenizer document is not a SentencePiece "
                                      "model: it holds no bytes"));
  CHECK_THROWS_WITH(from(R"({"kind":"sentencepiece","model":"aGVsbG8gd29ybGQ="})"),
                    Catch::Contains("is not a SentencePiece model"));
  // A document cut inside its model.
  std::string doc = t->to_json();
  const std::size_t quote = doc.rfind('"');
  doc = doc.substr(0, quote - 400) + doc.substr(quote);
  CHECK_THROWS_WITH(from(doc), Catch::Contains("is not a SentencePiece model"));
}

TEST_CASE("bad input: train_sentencepiece options out of range, inputs that are not files, too small a text") {
  TempDir dir("xgrad_spm_badtrain");
  const std::string text = kDir + "train.txt", out = dir.file("m.model");
  const auto refuses = [&](const SentencePieceTrainerOptions& o, const std::string& what) {
    CHECK_THROWS_WITH(train_sentencepiece({text}, o, out), Catch::StartsWith("train_sentencepiece: option " + what));
  };
  using O = SentencePieceTrainerOptions;
  refuses(O(0), "vocab_size 0 must be in [1,");
  refuses(O(std::size_t(1) << 40), "vocab_size 1099511627776");
  refuses(O(500).model_type("wordpiece"), "model_type \"wordpiece\" must be \"bpe\" or \"unigram\"");
  refuses(O(500).character_coverage(0.5), "character_coverage 0.5 must be in [0.98, 1]");
  refuses(O(500).character_coverage(std::nan("")), "character_coverage nan");
  refuses(O(500).num_threads(0), "num_threads 0 must be in [1, 128]");
  refuses(O(500).num_threads(1000), "num_threads 1000");
  refuses(O(500).input_sentence_size(50), "input_sentence_size 50 must be 0 (all lines) or more than 100");
  refuses(O(500).max_sentence_length(5), "max_sentence_length 5");
  refuses(O(500).max_sentencepiece_length(0), "max_sentencepiece_length 0");
  refuses(O(500).normalization_rule_name("nfc"), "normalization_rule_name \"nfc\"");
  refuses(O(500).unk_id(-1), "unk_id -1 must be in [0, vocab_size 500)");
  refuses(O(500).bos_id(500), "bos_id 500 must be below vocab_size 500");
  refuses(O(500).eos_id(1), "eos_id 1 is also bos_id");
  refuses(O(500).pad_id(0), "pad_id 0 is also unk_id");
  refuses(O(500).bos_piece(""), "bos_piece \"\" must be non-empty");
  refuses(O(500).eos_piece("<s>"), "eos_piece \"<s>\" is also bos_piece");
  refuses(O(500).user_defined_symbols({"<a>", ""}), "user_defined_symbols[1] \"\" must be non-empty");
  CHECK_THROWS_WITH(
      train_sentencepiece({text}, O(500).user_defined_symbols({std::string("a\0b", 3)}), out),
      Catch::Contains("option user_defined_symbols[0] \"a\\x00b\" must be non-empty and hold no NUL byte"));
  refuses(O(500).user_defined_symbols({"<a>", "<a>"}),
          "user_defined_symbols[1] \"<a>\" is also user_defined_symbols[0]");
  refuses(O(500).control_symbols({"<s>"}), "control_symbols[0] \"<s>\" is also bos_piece");
  CHECK_NOTHROW(O(500).bos_id(-7).pad_id(-1));  // any negative id: none

  CHECK_THROWS_WITH(train_sentencepiece({}, O(500), out), Catch::StartsWith("train_sentencepiece: no input files"));
  CHECK_THROWS_WITH(train_sentencepiece({text, dir.file("missing.txt")}, O(500), out),
                    Catch::StartsWith("train_sentencepiece") && Catch::Contains("missing.txt"));
  CHECK_THROWS_WITH(train_sentencepiece({dir.path}, O(500), out),
                    Catch::StartsWith("train_sentencepiece") && Catch::Contains("folder"));
  CHECK_THROWS_WITH(train_sentencepiece({text}, O(500), dir.file("no/such/folder/m.model")),
                    Catch::StartsWith("train_sentencepiece") && Catch::Contains("no/such/folder"));

  // SentencePiece's own refusals, passed on with the files named; an earlier model is left alone.
  write_bytes(out, "earlier");
  write_bytes(dir.file("tiny.txt"), "a tiny text\nof two lines\n");
  CHECK_THROWS_WITH(
      train_sentencepiece({dir.file("tiny.txt")}, O(5000), out),
      Catch::StartsWith("train_sentencepiece: SentencePiece could not train on '" + dir.file("tiny.txt") + "'") &&
          Catch::Contains("5000"));
  CHECK_THROWS_WITH(train_sentencepiece({dir.file("tiny.txt")}, O(5000).model_type("bpe"), out),
                    Catch::StartsWith("train_sentencepiece: SentencePiece could not train on"));
  write_bytes(dir.file("empty.txt"), "");
  CHECK_THROWS_WITH(
      train_sentencepiece({dir.file("empty.txt")}, O(100), out),
      Catch::StartsWith("train_sentencepiece: '" + dir.file("empty.txt") + "' hold no line of text to train on"));
  write_bytes(dir.file("blank.txt"), "\n\n\n");
  CHECK_THROWS_WITH(train_sentencepiece({dir.file("empty.txt"), dir.file("blank.txt")}, O(100), out),
                    Catch::Contains("hold no line of text to train on"));
  CHECK(read_bytes(out) == "earlier");
  CHECK(dir.entries() == std::set<std::string>{"m.model", "tiny.txt", "empty.txt", "blank.txt"});
}

// Not run by default: `build/tests/test_text_sentencepiece "[speed]"` prints encode and training speed.
TEST_CASE("SentencePiece: encode and training speed", "[.][speed]") {
  const std::string text = read_bytes(kDir + "train.txt");
  std::vector<std::string> lines;
  for (std::size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(text.substr(at, nl - at));
  const auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (const char* name : kModels) {
    const auto t = load_sentencepiece(kDir + name + ".model");
    for (int threads : {1, 2}) {
      std::atomic<std::size_t> tokens{0};
      const int rounds = 20;
      const double s = seconds([&] {
        std::vector<std::thread> pool;
        for (int k = 0; k < threads; ++k)
          pool.emplace_back([&] {
            for (int r = 0; r < rounds; ++r)
              for (const auto& line : lines) tokens += t->encode(line).size();
          });
        for (auto& th : pool) th.join();
      });
      const double bytes = static_cast<double>(text.size()) * rounds * threads;
      std::printf("%-8s encode, %d thread%s: %6.2f MB/s, %8.0f tokens/s (%zu bytes x %d rounds per thread)\n", name,
                  threads, threads == 1 ? " " : "s", bytes / s / 1e6, static_cast<double>(tokens) / s, text.size(),
                  rounds);
    }
  }
  TempDir dir("xgrad_spm_speed");
  for (const char* name : kModels) {
    const auto& m = expected()["models"][name];
    const double s =
        seconds([&] { train_sentencepiece({kDir + "train.txt"}, options_of(m["options"]), dir.file("m")); });
    std::printf("%-8s training on train.txt (%zu bytes, 1 thread): %.2f s\n", name, text.size(), s);
  }
}
