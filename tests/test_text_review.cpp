// The text layer's hostile review: GPT-2's pre-tokenization at U+180E and U+FEFF against GPT-2's
// own encoder, pretokenizers on one thread and tokenizers on many, merges.txt with a byte order
// mark, and JSON nested past any stack in every file and document the loaders read.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"
#include "peak_memory.hpp"
#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/pretokenizer.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"
#include "xgrad/text/tokenizer.hpp"

using namespace xgrad;
using namespace xgrad::text;
using Catch::Contains;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

const ByteLevelBpe& gpt2() {
  static const std::unique_ptr<ByteLevelBpe> t = load_byte_level_bpe(testing::fixture_path("gpt2_tokenizer"));
  return *t;
}

std::vector<std::string> pieces(const Gpt2Pretokenizer& p, const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view piece : p.split(text)) out.emplace_back(piece);
  return out;
}

// A million nested arrays: dump() of it recurses a million frames deep.
std::string deeply_nested(std::size_t depth = 1000000) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

TEST_CASE("review: U+180E is punctuation to GPT-2's pattern, not whitespace as PCRE2's \\s has it", "[text]") {
  const Gpt2Pretokenizer p;
  // GPT-2's encoder.py (Python's regex module, \s = Unicode White_Space): U+180E, a format
  // character since Unicode 6.3, goes with the punctuation.
  CHECK(pieces(p, " \u180Ex") == std::vector<std::string>{" \u180E", "x"});
  CHECK(pieces(p, "!\u180E!") == std::vector<std::string>{"!\u180E!"});
  CHECK(pieces(p, "a\u180E\u180Eb") == std::vector<std::string>{"a", "\u180E\u180E", "b"});
  CHECK(pieces(p, "\u180E\n\n") == std::vector<std::string>{"\u180E", "\n\n"});
  CHECK(pieces(p, "  \u180E  y") == std::vector<std::string>{" ", " \u180E", " ", " y"});
  // The ids of GPT-2's encoder.py and of js-tiktoken (cases.json "review: U+180E ..." has more).
  CHECK(gpt2().encode(" \u180Ex") == TokenIds{28053, 254, 236, 87});
  CHECK(gpt2().encode("\u180E's") == TokenIds{157, 254, 236, 6, 82});
  // The other spaces are as they were (Python regex's pieces): U+00A0, U+3000, U+2028 and U+0085
  // are whitespace, and the optional space before a word is U+0020 only.
  CHECK(pieces(p, "a\u00A0\u00A0b") == std::vector<std::string>{"a", "\u00A0", "\u00A0", "b"});
  CHECK(pieces(p, "a\u3000\u2028\u0085 b") == std::vector<std::string>{"a", "\u3000\u2028\u0085", " b"});
}

TEST_CASE("review: runs of 200000 characters of one class split and encode, within PCRE2's JIT stack", "[text]") {
  // A pattern whose class is an alternation repeated per character ((?:[...]|\x{180E})+) takes a
  // JIT stack frame per character: PCRE2 gave "JIT stack limit reached" from 100000 '!' on.
  const Gpt2Pretokenizer p;
  std::string marks, separators;
  for (int i = 0; i < 200000; ++i) marks += "\u0301", separators += "\u180E";
  for (const std::string& run : {std::string(200000, '!'), " " + std::string(200000, '?'), marks, separators,
                                 std::string(200000, ' ') + "x", std::string(200000, 'a'), std::string(200000, '7')}) {
    INFO(readable_bytes(run.substr(0, 8)) << " x " << run.size());
    std::vector<std::string_view> pieces;
    REQUIRE_NOTHROW(pieces = p.split(run));
    CHECK(pieces.size() <= 2);
    const TokenIds ids = gpt2().encode(run);
    CHECK(gpt2().decode(ids) == run);
  }
}

TEST_CASE("review: U+FEFF is punctuation as in GPT-2's encoder.py (js-tiktoken's JavaScript \\s differs)", "[text]") {
  // JavaScript's \s holds U+FEFF, Python's regex and Rust's (tiktoken) do not; these ids are GPT-2's
  // encoder.py's, which js-tiktoken does not give (it gives 220 171 119 123 87 for the first).
  CHECK(gpt2().encode(" \uFEFFx") == TokenIds{27332, 119, 123, 87});
  CHECK(gpt2().encode("\uFEFF's") == TokenIds{171, 119, 123, 6, 82});
  CHECK(gpt2().encode("a\uFEFF\uFEFFb") == TokenIds{64, 171, 119, 123, 171, 119, 123, 65});
}

TEST_CASE("review: two pretokenizers used in turn on one thread, and many threads on one tokenizer", "[text]") {
  const std::string text = "It's 2024: naïve café, 北京 \r\n\r\n  x\u180E! " + std::string(300, 'a') + " 12345";
  const Gpt2Pretokenizer first;
  const std::vector<std::string> expected = pieces(first, text);
  {
    const Gpt2Pretokenizer second;
    for (int round = 0; round < 3; ++round) {
      CHECK(pieces(first, text) == expected);
      CHECK(pieces(second, text) == expected);
    }
  }
  CHECK(pieces(first, text) == expected);  // after the second is destroyed on this thread
  const TokenIds ids = gpt2().encode(text);
  std::vector<int> agree(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const Gpt2Pretokenizer own;  // a pretokenizer per thread as well as the shared tokenizer's
      for (int i = 0; i < 50; ++i) agree[t] += gpt2().encode(text) == ids && pieces(own, text) == expected;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) CHECK(agree[t] == 50);
}

TEST_CASE("review: a merges.txt with a UTF-8 byte order mark (saved on Windows) loads as without one", "[text]") {
  TempDir dir("xgrad_review_bom");
  const std::string merges = testing::read_bytes(testing::fixture_path("gpt2_tokenizer/merges.txt"));
  write_bytes(dir.file("merges.txt"), "\xEF\xBB\xBF" + merges);
  write_bytes(dir.file("crlf.txt"), [&] {
    std::string s = "\xEF\xBB\xBF";
    for (char c : merges) s += c == '\n' ? std::string("\r\n") : std::string(1, c);
    return s;
  }());
  const std::string vocab = testing::fixture_path("gpt2_tokenizer/vocab.json");
  const ByteLevelBpe with_bom(load_gpt2_vocabulary(vocab, dir.file("merges.txt")));
  const ByteLevelBpe crlf(load_gpt2_vocabulary(vocab, dir.file("crlf.txt")));
  CHECK(with_bom.identity() == gpt2().identity());
  CHECK(crlf.identity() == gpt2().identity());
  CHECK(with_bom.encode("hello world") == TokenIds{31373, 995});
  // Without the #version line the mark is before the first merge, which loads as well.
  write_bytes(dir.file("noversion.txt"), "\xEF\xBB\xBF" + merges.substr(merges.find('\n') + 1));
  CHECK(ByteLevelBpe(load_gpt2_vocabulary(vocab, dir.file("noversion.txt"))).identity() == gpt2().identity());
}

TEST_CASE("bad input: JSON nested a million deep is refused with a message, never a stack overflow",
          "[text][bad_input][long]") {
  TempDir dir("xgrad_review_deep");
  const std::string merges = testing::fixture_path("gpt2_tokenizer/merges.txt");
  // A million deep: refused by the JSON reader before any value is built.
  const std::string too_deep = "nests arrays and objects deeper than 64 levels";
  write_bytes(dir.file("vocab.json"), "{\"a\": " + deeply_nested() + "}");
  CHECK_THROWS_WITH(load_gpt2_vocabulary(dir.file("vocab.json"), merges), Contains(too_deep));
  CHECK_THROWS_WITH(ByteLevelBpe::from_json("{\"kind\":" + deeply_nested() + "}", "reader"),
                    Contains("reader: the byte_bpe tokenizer document " + too_deep));
  CHECK_THROWS_WITH(SentencePieceTokenizer::from_json("{\"kind\":" + deeply_nested() + "}", "reader"),
                    Contains("reader: the tokenizer document " + too_deep));
  // 40 deep, within the reader's limit: each message quotes the value by its kind.
  const std::string deep = deeply_nested(40);
  // vocab.json: an entry whose value is the nest.
  write_bytes(dir.file("vocab.json"), "{\"a\": " + deep + "}");
  CHECK_THROWS_WITH(load_gpt2_vocabulary(dir.file("vocab.json"), merges),
                    Contains("the entry \"a\" has the value an array of 1 elements, not an integer id"));
  // tokenizer.json: the nest as the normalizer, the pre-tokenizer, model.type, a merge, an added token.
  const std::string tj = testing::read_bytes(testing::fixture_path("gpt2_tokenizer/tokenizer.json"));
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string s = tj;
    const std::size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    write_bytes(dir.file("tokenizer.json"), s);
    return dir.file("tokenizer.json");
  };
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"normalizer\":null", "\"normalizer\":" + deep)),
                    Contains("normalizer is an array of 1 elements, not null"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"pre_tokenizer\":{", "\"pre_tokenizer\":" + deep + ",\"x\":{")),
                    Contains("pre_tokenizer is an array of 1 elements, not ByteLevel"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"type\":\"BPE\"", "\"type\":" + deep)),
                    Contains("model.type is an array of 1 elements, not \"BPE\""));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"merges\":[", "\"merges\":[" + deep + ",")),
                    Contains("model.merges[0]: an array of 1 elements is neither"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"added_tokens\":[", "\"added_tokens\":[" + deep + ",")),
                    Contains("added_tokens[0] is an array of 1 elements, not an object"));
  CHECK_THROWS_WITH(load_hf_tokenizer_json(with("\"dropout\":null", "\"dropout\":" + deep)),
                    Contains("model.dropout is an array of 1 elements"));
  // The tokenizer documents checkpoints store.
  CHECK_THROWS_WITH(ByteLevelBpe::from_json("{\"kind\":" + deep + "}", "reader"),
                    Contains("reader: the document's field \"kind\" is an array of 1 elements"));
  CHECK_THROWS_WITH(
      ByteLevelBpe::from_json("{\"kind\":\"byte_bpe\",\"tokens\":[" + deep + "],\"merges\":[],\"special_tokens\":[]}",
                              "reader"),
      Contains("reader: \"tokens\"[0] is an array of 1 elements, not a string"));
  CHECK_THROWS_WITH(
      ByteLevelBpe::from_json(
          "{\"kind\":\"byte_bpe\",\"tokens\":[],\"merges\":[[" + deep + ",1]],\"special_tokens\":[]}", "reader"),
      Contains("reader: \"merges\"[0][0] is an array of 1 elements, not an integer id"));
  CHECK_THROWS_WITH(SentencePieceTokenizer::from_json("{\"kind\":" + deep + "}", "reader"),
                    Contains("must be \"sentencepiece\", got an array of 1 elements"));
  CHECK_THROWS_WITH(tokenizer_from_json("{\"kind\":" + deep + "}", "reader"),
                    Contains("reader: the tokenizer document has no string field \"kind\""));
  // Short values are still quoted whole, long strings cut.
  CHECK_THROWS_WITH(ByteLevelBpe::from_json(R"({"kind":[1,[2]]})", "reader"), Contains("is [1,[2]], not"));
  CHECK_THROWS_WITH(ByteLevelBpe::from_json("{\"kind\":\"" + std::string(5000, 'k') + "\"}", "reader"),
                    Contains("kkk...,"));
}

namespace {

// Where the payload of normalizer_spec.precompiled_charsmap (ModelProto field 3, its field 2)
// starts in a serialized SentencePiece model, and its length: a protobuf walk of two levels.
std::pair<std::size_t, std::size_t> charsmap_at(const std::string& model) {
  const auto varint = [&](std::size_t& pos) {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto c = static_cast<unsigned char>(model.at(pos++));
      v |= static_cast<std::uint64_t>(c & 0x7F) << shift;
      if (!(c & 0x80)) return v;
    }
  };
  const auto find = [&](std::size_t begin, std::size_t end, std::uint64_t wanted) {
    for (std::size_t pos = begin; pos < end;) {
      const std::uint64_t key = varint(pos);
      const std::uint64_t wire = key & 7;
      std::size_t length = wire == 0 ? (varint(pos), 0) : wire == 1 ? 8 : wire == 5 ? 4 : varint(pos);
      if (key >> 3 == wanted && wire == 2) return std::make_pair(pos, length);
      pos += length;
    }
    FAIL("no field " << wanted);
    return std::make_pair(std::size_t{0}, std::size_t{0});
  };
  const auto [spec, spec_length] = find(0, model.size(), 3);
  return find(spec, spec + spec_length, 2);
}

void put_u32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) s[at + k] = static_cast<char>(v >> (8 * k));
}

}  // namespace

TEST_CASE("bad input: a SentencePiece model whose normalization trie points outside itself is refused on load",
          "[text][bad_input]") {
  const std::string model = testing::read_bytes(testing::fixture_path("sentencepiece/unigram.model"));
  const auto [at, length] = charsmap_at(model);
  REQUIRE(length == 237561);  // nmt_nfkc's rules: a 4-byte size, the trie, the strings
  CHECK_NOTHROW(SentencePieceTokenizer(model, "reader", "the model"));
  // The root's offset sends the first step 4 M units past a trie of 44288 (SentencePiece 0.1.97
  // reads there without a check: SIGSEGV, or garbage rules, in encode).
  std::string bad = model;
  put_u32(bad, at + 4, 0x3FFFFFu << 10);
  CHECK_THROWS_WITH(SentencePieceTokenizer(bad, "reader", "the model"),
                    Contains("reader: the model is not a SentencePiece model: normalizer_spec.precompiled_charsmap: "
                             "trie unit 0 leads to unit 4194303, past its 44288 units"));
  // A trie size past the blob.
  bad = model;
  put_u32(bad, at, 0xFFFFFFF0u);
  CHECK_THROWS_WITH(SentencePieceTokenizer(bad, "reader", "the model"),
                    Contains("its trie size 4294967280 does not fit in its 237561 bytes"));
  // The replacement strings not NUL-terminated: strlen would run past them.
  bad = model;
  bad[at + length - 1] = 'x';
  CHECK_THROWS_WITH(SentencePieceTokenizer(bad, "reader", "the model"),
                    Contains("its replacement strings do not end with a NUL byte"));
}

TEST_CASE("review: encoding 32 MB holds its ids, not every piece of the text at once", "[text]") {
  std::string text;
  while (text.size() < (std::size_t{32} << 20)) text += "hello world, the quick brown fox. ";
  const TokenIds reference = gpt2().encode(text.substr(0, 34 * 1000 - 1));
  REQUIRE(testing::reset_peak_rss());
  const long baseline = testing::status_kib("VmRSS");
  const TokenIds ids = gpt2().encode(text);
  const long rise = testing::peak_rise_kib(baseline);
  // The ids encode reserves (a third of the bytes, 8 bytes each: 89 MB) and a few MB more; all
  // pieces at once were 16 bytes for each of 7.9 M pieces more (126 MB).
  const long ids_kib = static_cast<long>((text.size() / 3 + 1) * sizeof(std::int64_t) / 1024);
  INFO("peak rise " << rise << " KiB, the ids' reserve " << ids_kib << " KiB");
  if (!testing::kAddressSanitizer) CHECK(rise < ids_kib + 24 * 1024);
  CHECK(std::equal(reference.begin(), reference.end(), ids.begin()));
  CHECK(gpt2().decode(ids) == text);
}
