// The tokenizer interface, the bytes tokenizer and GPT-2's pre-tokenization.
#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/pretokenizer.hpp"

using namespace xgrad;
using namespace xgrad::text;

namespace {

std::string joined(const std::vector<std::string_view>& pieces) {
  std::string out;
  for (auto p : pieces) out += p;
  return out;
}

std::vector<std::string> strings(const std::vector<std::string_view>& pieces) { return {pieces.begin(), pieces.end()}; }

}  // namespace

TEST_CASE("the bytes tokenizer round-trips every byte and refuses ids outside 0..255") {
  BytesTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const TokenIds ids = t.encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[b] == b);
  CHECK(t.decode(ids) == all);
  CHECK(t.vocab_size() == 256);
  CHECK_FALSE(t.special_tokens().eos.has_value());
  CHECK_THROWS_WITH(t.decode({65, 256}),
                    Catch::Contains("Tokenizer::decode") && Catch::Contains("id 256") && Catch::Contains("position 1"));
  CHECK_THROWS_WITH(t.decode({-1}), Catch::Contains("id -1"));
  CHECK_THROWS_WITH(t.token_bytes(300), Catch::Contains("id 300"));
}

TEST_CASE("token_strings writes bytes that are not UTF-8 on their own as \\xNN") {
  BytesTokenizer t;
  const auto s = t.token_strings(t.encode("a\xE4\xB8\xAD\\"));  // "中" cut into its three bytes
  REQUIRE(s.size() == 5);
  CHECK(s[0] == "a");
  CHECK(s[1] == "\\xE4");
  CHECK(s[2] == "\\xB8");
  CHECK(s[3] == "\\xAD");
  CHECK(s[4] == "\\\\");
  CHECK(readable_bytes("\xE4\xB8\xAD") == "\xE4\xB8\xAD");     // whole, it is kept
  CHECK(readable_bytes("\xED\xA0\x80") == "\\xED\\xA0\\x80");  // a surrogate is not UTF-8
  CHECK(readable_bytes("\xC0\xAF") == "\\xC0\\xAF");           // nor an overlong form
}

TEST_CASE("the identity of a tokenizer names its kind, its size and a digest of its document") {
  BytesTokenizer t;
  const TokenizerIdentity id = t.identity();
  CHECK(id.kind == "bytes");
  CHECK(id.vocab_size == 256);
  CHECK(id.digest.size() == 16);
  CHECK(id == BytesTokenizer().identity());
  TokenizerIdentity other = id;
  other.digest[0] = other.digest[0] == '0' ? '1' : '0';
  CHECK(id != other);
  CHECK(describe(id).find("bytes, 256 ids, digest ") == 0);
}

TEST_CASE("tokenizer_from_json rebuilds the bytes tokenizer and names what it cannot read") {
  CHECK(tokenizer_from_json(BytesTokenizer().to_json())->identity() == BytesTokenizer().identity());
  CHECK_THROWS_WITH(tokenizer_from_json("{", "load"), Catch::Contains("load") && Catch::Contains("not JSON"));
  CHECK_THROWS_WITH(tokenizer_from_json("{}"), Catch::Contains("\"kind\""));
  CHECK_THROWS_WITH(tokenizer_from_json(R"({"kind":"wordpiece"})"), Catch::Contains("unknown tokenizer kind"));
}

TEST_CASE("GPT-2's pre-tokenization splits as its pattern says") {
  Gpt2Pretokenizer pre;
  CHECK(strings(pre.split("Hello world")) == std::vector<std::string>{"Hello", " world"});
  CHECK(strings(pre.split("I'll don't  x")) == std::vector<std::string>{"I", "'ll", " don", "'t", " ", " x"});
  CHECK(strings(pre.split("I'LL")) == std::vector<std::string>{"I", "'", "LL"});  // contractions are lower case
  CHECK(strings(pre.split("abc123 !?")) == std::vector<std::string>{"abc", "123", " !?"});
  CHECK(strings(pre.split("a   \n")) == std::vector<std::string>{"a", "   \n"});
  CHECK(strings(pre.split("x   y")) == std::vector<std::string>{"x", "  ", " y"});  // \s+(?!\S) leaves one space
  CHECK(strings(pre.split(" Привет мир")) == std::vector<std::string>{" Привет", " мир"});
  CHECK(strings(pre.split("北京123")) == std::vector<std::string>{"北京", "123"});
  CHECK(pre.split("").empty());
}

TEST_CASE("GPT-2's pre-tokenization covers text that is not UTF-8, piece by piece") {
  Gpt2Pretokenizer pre;
  const std::string bad = "ab\xFF\xFE cd\xC3";
  const auto pieces = pre.split(bad);
  CHECK(joined(pieces) == bad);
  Generator gen(7);
  for (int round = 0; round < 200; ++round) {
    std::string s(gen.below(64), '\0');
    for (auto& c : s) c = static_cast<char>(gen.below(256));
    const auto p = pre.split(s);
    REQUIRE(joined(p) == s);
    for (auto piece : p) REQUIRE_FALSE(piece.empty());
  }
}

TEST_CASE("GPT-2's pre-tokenization gives the same pieces on several threads at once") {
  Gpt2Pretokenizer pre;
  const std::string text = "It's 2024: the quick brown fox — 速い茶色の狐 — jumps\tover 13 lazy dogs!\r\n";
  const auto expected = strings(pre.split(text));
  std::vector<bool> same(4, false);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 200; ++i) ok = ok && strings(pre.split(text)) == expected;
      same[t] = ok;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(same[t]);
}
