// tokenizer.json's Unigram model (text/hf_unigram_model.cpp): the ids of 36 texts with the
// hand-written tests/fixtures/hf_tokenizers/unigram_small.json (47 pieces) against Hugging Face's
// JavaScript tokenizers (unigram_small_expected.json, written by make_unigram_small_expected.mjs);
// Viterbi cases worked out by hand from Rust's rules (huggingface/tokenizers,
// tokenizers/src/models/unigram/model.rs: encode_optimized, tokenize), where the JS differs or has
// nothing (byte fallback); a long piece in bounded memory; and the vocabularies xgrad refuses.
#include <catch2/catch.hpp>

#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
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
using xgrad::text::TokenIds;

// The bytes this program holds through operator new, and their peak since it was last set. Not
// under AddressSanitizer, whose own operator new must pair with its delete: the count stays 0 there
// and the memory bound is not checked.
std::atomic<long long> held_bytes{0}, peak_held_bytes{0};
#if !defined(__SANITIZE_ADDRESS__)

void* operator new(std::size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (!p) throw std::bad_alloc();
  const long long now = held_bytes += static_cast<long long>(::malloc_usable_size(p));
  for (long long peak = peak_held_bytes.load(); now > peak && !peak_held_bytes.compare_exchange_weak(peak, now);) {
  }
  return p;
}
void* operator new[](std::size_t size) { return operator new(size); }
// GCC takes free() here for a mismatch with operator new, which it cannot see is the one above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  if (!p) return;
  held_bytes -= static_cast<long long>(::malloc_usable_size(p));
  std::free(p);
}
#pragma GCC diagnostic pop
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { operator delete(p); }
#endif

namespace {

const JsonPlace kPlace{"load_hf_tokenizer: 'dir/tokenizer.json'", "model"};
const std::string kDir = std::string(XGRAD_FIXTURE_DIR) + "/hf_tokenizers/";

const Json& small_file() {
  static const Json doc = Json::parse(read_bytes(kDir + "unigram_small.json"));
  return doc;
}

TokenIds ids_of(const HfModel& model, const std::string& text) {
  TokenIds ids;
  model.tokenize(text, ids);
  return ids;
}

// A Unigram model of `vocab` ([[piece, score], ...]) with unk_id 0.
std::unique_ptr<HfModel> model_of(const char* vocab, bool byte_fallback = false) {
  Json model = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", Json::parse(vocab)}, {"byte_fallback", byte_fallback}};
  return make_hf_unigram_model(model, kPlace);
}

}  // namespace

TEST_CASE("Unigram: the ids of the JavaScript reference on a small hand-written vocabulary", "[text]") {
  const auto model = make_hf_unigram_model(small_file().at("model"), kPlace);
  const Json expected = Json::parse(read_bytes(kDir + "unigram_small_expected.json"));
  REQUIRE(expected.at("cases").size() >= 20);
  for (const Json& c : expected.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    INFO("text \"" << text << "\", JS tokens " << c.at("tokens").dump());
    CHECK(ids_of(*model, text) == c.at("ids").get<TokenIds>());
  }
}

TEST_CASE("Unigram: vocabulary() and id_of() are the file's pieces in order", "[text]") {
  const Json& vocab = small_file().at("model").at("vocab");
  const auto model = make_hf_unigram_model(small_file().at("model"), kPlace);
  REQUIRE(model->vocabulary().size() == vocab.size());
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    CHECK(model->vocabulary()[id] == vocab[id][0].get<std::string>());
    CHECK(model->id_of(vocab[id][0].get<std::string>()) == static_cast<std::int64_t>(id));
  }
  CHECK(model->id_of("▁dog") == -1);
  CHECK(model->id_of("") == -1);
}

// Each expected value below is worked out by hand from model.rs's rules.
TEST_CASE("Unigram: Viterbi cases checked by hand against Rust's rules", "[text]") {
  SECTION("model.rs's own example: \"abcdacdxx\" is abcd, a, cd and the unk xx fused") {
    const auto m = model_of(R"([["<unk>", 0], ["a", 0], ["b", 0], ["c", 0], ["d", 0], ["cd", 1], ["ab", 2],
                                ["abc", 5], ["abcd", 10]])");
    CHECK(ids_of(*m, "abcdacdxx") == TokenIds{8, 1, 5, 0});
  }
  SECTION("a tie keeps the path whose last token is longest") {
    // ab + c = -6 - 4.5 = -10.5 = a + bc = -4 - 6.5; the path through bc reaches the end first (it is
    // offered from byte 1, c from byte 2) and a later path replaces it only when it scores more.
    const auto m = make_hf_unigram_model(small_file().at("model"), kPlace);
    CHECK(ids_of(*m, "abc") == TokenIds{11, 15});
    // 日本 + 語 = -8 - 7 = -15 = 日 + 本語 = -6 - 9: 日, 本語.
    CHECK(ids_of(*m, "日本語") == TokenIds{27, 31});
  }
  SECTION("unk scores the lowest score, its own included, minus 10") {
    // min 11, unk 1: a + unk = 12 beats ab = 11.5, but not ab = 12.5.
    CHECK(ids_of(*model_of(R"([["<unk>", 12], ["a", 11], ["ab", 11.5]])"), "ab") == TokenIds{1, 0});
    CHECK(ids_of(*model_of(R"([["<unk>", 12], ["a", 11], ["ab", 12.5]])"), "ab") == TokenIds{2});
    // <unk>'s own score 5 is the minimum: unk -5, a + unk = 6 < 11.5.
    CHECK(ids_of(*model_of(R"([["<unk>", 5], ["a", 11], ["ab", 11.5]])"), "ab") == TokenIds{2});
  }
  SECTION("the unk piece written in the text keeps its own score (the JS scores it as unk)") {
    // <unk> 0 beats < u n k > = -5 in Rust; the JS gives it unk's score -11 and ids 1..5.
    const auto m = model_of(R"([["<unk>", 0], ["<", -1], ["u", -1], ["n", -1], ["k", -1], [">", -1]])");
    CHECK(ids_of(*m, "<unk>") == TokenIds{0});
    // It is an unk too, fused with the unknown ☃ after it: "<unk>☃" is no piece, so unk.
    CHECK(ids_of(*m, "<unk>☃<") == TokenIds{0, 1});
  }
  SECTION("a run of unks fused into a string that is a piece gives that piece") {
    // Scores above 20: unk is 15, unk + unk = 30 beats cd = 25, and the fused "cd" is looked up.
    CHECK(ids_of(*model_of(R"([["<unk>", 30], ["cd", 25]])"), "cd") == TokenIds{1});
    CHECK(ids_of(*model_of(R"([["<unk>", 30], ["cd", 25]])"), "cdx") == TokenIds{0});
  }
  SECTION("byte_fallback: an unknown run becomes its bytes' <0xNN> pieces") {
    std::string vocab = R"([["<unk>", 0], ["a", -1], ["b", -1])";
    for (int b = 0; b < 256; ++b) {
      char piece[8];
      std::snprintf(piece, sizeof piece, "<0x%02X>", b);
      vocab += std::string(", [\"") + piece + "\", -20]";
    }
    vocab += "]";
    const auto m = model_of(vocab.c_str(), true);
    const std::int64_t e2 = 3 + 0xE2, x98 = 3 + 0x98, x83 = 3 + 0x83;
    CHECK(m->id_of("<0xE2>") == e2);
    CHECK(ids_of(*m, "a☃b") == TokenIds{1, e2, x98, x83, 2});
    CHECK(ids_of(*m, "☃☃") == TokenIds{e2, x98, x83, e2, x98, x83});
    CHECK(ids_of(*m, "☃a z") == TokenIds{e2, x98, x83, 1, 3 + 0x20, 3 + 0x7A});
    // The fused run "<unk>" is a piece: unk itself, no bytes.
    CHECK(ids_of(*m, "<unk>") == TokenIds{0});
  }
  SECTION("without unk_id, known characters still encode") {
    Json model = {{"type", "Unigram"}, {"vocab", Json::parse(R"([["a", -1], ["b", -2], ["ab", -2.5]])")}};
    const auto m = make_hf_unigram_model(model, kPlace);
    CHECK(ids_of(*m, "abba") == TokenIds{2, 1, 0});
  }
  SECTION("an empty piece is never matched, and id_of finds it") {
    const auto m = model_of(R"([["<unk>", 0], ["", 5], ["a", -1]])");
    CHECK(ids_of(*m, "aa") == TokenIds{2, 2});
    CHECK(m->id_of("") == 1);
  }
  SECTION("no text, no ids; bytes that are not UTF-8 are unknown characters") {
    const auto m = make_hf_unigram_model(small_file().at("model"), kPlace);
    CHECK(ids_of(*m, "").empty());
    CHECK(ids_of(*m,
                 "a\xFF"
                 "b") == TokenIds{11, 0, 12});
    CHECK(ids_of(*m, "a\xE2\x98") == TokenIds{11, 0});
    CHECK(ids_of(*m, "\xF0\x9F\x98\x80\xF0") == TokenIds{43, 0});
  }
}

// best_path holds 16 bytes a byte of the piece and the path 16 a token; the ids 8 a token, twice
// while the vector grows. A quadratic table would be terabytes. Measured as the peak of the bytes
// this program holds through operator new (replaced above), which is exact, where the resident size
// of the process lags a release (tests/peak_memory.hpp's reset failed one run in three here).
TEST_CASE("Unigram: a piece of 1 MB encodes in memory linear in its size", "[text]") {
  const auto m = make_hf_unigram_model(small_file().at("model"), kPlace);
  std::string ab, snowmen;
  while (ab.size() < (std::size_t{1} << 20)) ab += "ab";
  while (snowmen.size() < (std::size_t{1} << 20)) snowmen += "☃";
  for (const std::string* piece : {&ab, &snowmen}) {
    INFO(piece->size() << " bytes");
    const long long baseline = held_bytes.load();
    peak_held_bytes = baseline;
    const TokenIds ids = ids_of(*m, *piece);
    const long long rise = peak_held_bytes.load() - baseline;
    const long long bound = 64 * static_cast<long long>(piece->size());
    INFO("peak rise " << rise << " bytes, bound " << bound);
#if !defined(__SANITIZE_ADDRESS__)
    CHECK(rise > 16 * static_cast<long long>(piece->size()));  // the count sees best_path's table
    CHECK(rise < bound);
#endif
    if (piece == &ab) {
      CHECK(ids == TokenIds(ab.size() / 2, 14));
    } else {
      CHECK(ids == TokenIds{0});  // one unk for the whole fused run
    }
  }
}

TEST_CASE("bad input: Unigram vocabularies xgrad refuses", "[text][bad_input]") {
  const std::string file = "load_hf_tokenizer: 'dir/tokenizer.json' ";
  const auto error = [](const Json& model) { return error_of([&] { make_hf_unigram_model(model, kPlace); }); };
  const auto with_vocab = [](const Json& vocab) {
    return Json{{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}, {"byte_fallback", false}};
  };
  CHECK_THAT(error(with_vocab(Json::parse(R"([["<unk>", 0], ["a", -1], ["b", -2], ["a", -3]])"))),
             Contains(file + "model.vocab[3]: repeats the piece \"a\" of id 1"));
  CHECK_THAT(error(with_vocab(Json::array())),
             Contains(file + "model.vocab: is empty; a Unigram model needs at least one piece"));
  CHECK_THAT(error(with_vocab(Json::parse(R"({"a": -1})"))), Contains("model.vocab: is {\"a\":-1}, not an array"));
  CHECK_THAT(error(Json{{"type", "Unigram"}, {"unk_id", 0}}), Contains("model: has no field \"vocab\""));
  for (const char* entry :
       {R"(["a"])", R"(["a", -1, 0])", R"("a")", R"([1, -1])", R"(["a", "-1"])", R"(["a", null])"}) {
    INFO(entry);
    CHECK_THAT(error(with_vocab(Json::array({Json::parse(R"(["<unk>", 0])"), Json::parse(entry)}))),
               Contains("model.vocab[1]: is ") && Contains(", not [piece, score]"));
  }
  for (const double score : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()}) {
    INFO(score);
    CHECK_THAT(error(with_vocab(Json::array({Json::array({"<unk>", 0}), Json::array({"a", score})}))),
               Contains("model.vocab[1][1]: is ") && Contains(", not a finite score"));
  }

  Json model = with_vocab(Json::parse(R"([["<unk>", 0], ["a", -1]])"));
  for (const Json& unk : {Json(2), Json(-1), Json("0"), Json(0.5), Json(std::int64_t{1} << 40)}) {
    INFO(unk.dump());
    model["unk_id"] = unk;
    CHECK_THAT(error(model),
               Contains(file + "model.unk_id: is " + unk.dump() + ", not an id of the vocabulary's 2 pieces"));
  }
  model["unk_id"] = 0;
  model["byte_fallback"] = true;
  CHECK_THAT(error(model), Contains(file + "model.byte_fallback: is true but the vocabulary has no piece <0x00>"));
  model["byte_fallback"] = "yes";
  CHECK_THAT(error(model), Contains("model.byte_fallback: is \"yes\", not true or false"));
  model["byte_fallback"] = false;
  model["fuse_unk"] = true;
  CHECK_THAT(error(model), Contains(file + "model.fuse_unk: is a field xgrad does not implement for type Unigram"));
  model.erase("fuse_unk");
  model["type"] = "BPE";
  CHECK_THAT(error(model), Contains(file + "model.type: is \"BPE\", not \"Unigram\""));
  CHECK_THAT(error(Json::array()), Contains(file + "model: is [], not an object"));

  // Without unk_id, a character no piece covers is an Error when it is met, as in Rust
  // (UnigramError::MissingUnkId), naming the character and where it is.
  model = {{"type", "Unigram"}, {"vocab", Json::parse(R"([["a", -1], ["b", -2]])")}};
  const auto no_unk = make_hf_unigram_model(model, kPlace);
  CHECK_THAT(
      error_of([&] { ids_of(*no_unk, "ab☃"); }),
      Contains(file +
               "model: has no unk_id, and the text holds \"☃\" at byte 2, which no piece of one character covers"));
}
