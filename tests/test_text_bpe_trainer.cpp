// Training a byte-level BPE vocabulary: the incremental trainer against a naive one written here
// (all pairs counted again at every step), the stop rules on counts worked out by hand, and the
// refusals of bad options and files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/bpe_trainer.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/detail/pretokenize_in_chunks.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/pretokenizer.hpp"

using namespace xgrad;
using namespace xgrad::text;

namespace {

// The naive trainer: the same rules as train_byte_level_bpe's documentation, nothing kept
// between steps. Tokens are byte strings; a std::map of (left, right) strings orders pairs by
// their left bytes, then their right bytes, as unsigned bytes (the tie rule).
struct ReferenceVocabulary {
  std::vector<std::string> tokens;                          // 256 bytes, then the merged tokens
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
};

// The text outside the special tokens: at each position the longest special starting there.
std::vector<std::string> ordinary_parts(const std::string& text, const std::vector<std::string>& specials) {
  std::vector<std::string> parts(1);
  for (std::size_t i = 0; i < text.size();) {
    std::size_t longest = 0;
    for (const auto& s : specials)
      if (s.size() > longest && text.compare(i, s.size(), s) == 0) longest = s.size();
    if (longest > 0) {
      parts.emplace_back();
      i += longest;
    } else {
      parts.back() += text[i++];
    }
  }
  return parts;
}

ReferenceVocabulary reference_train(const std::vector<std::string>& texts, std::size_t vocab_size,
                                    std::uint64_t min_frequency, const std::vector<std::string>& specials = {}) {
  Gpt2Pretokenizer pretokenizer;
  std::map<std::string, std::uint64_t> word_counts;
  for (const auto& text : texts)
    for (const auto& part : ordinary_parts(text, specials))
      for (auto piece : pretokenizer.split(part))
        if (!first_invalid_utf8(piece)) ++word_counts[std::string(piece)];  // invalid bytes never merge
  std::vector<std::pair<std::vector<std::string>, std::uint64_t>> words;
  for (const auto& [word, count] : word_counts) {
    std::vector<std::string> symbols;
    for (char c : word) symbols.emplace_back(1, c);
    words.emplace_back(symbols, count);
  }
  ReferenceVocabulary out;
  for (int b = 0; b < 256; ++b) out.tokens.emplace_back(1, static_cast<char>(b));
  std::set<std::string> known(out.tokens.begin(), out.tokens.end());
  std::set<std::pair<std::string, std::string>> merged;
  while (out.tokens.size() + specials.size() < vocab_size) {
    std::map<std::pair<std::string, std::string>, std::uint64_t> counts;
    for (const auto& [symbols, count] : words)
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) counts[{symbols[i], symbols[i + 1]}] += count;
    std::pair<std::string, std::string> best;
    std::uint64_t best_count = 0;
    for (const auto& [pair, count] : counts)
      if (count > best_count) {
        best = pair;
        best_count = count;
      }
    if (best_count == 0 || best_count < min_frequency) break;
    const std::string joined = best.first + best.second;
    if (known.insert(joined).second) out.tokens.push_back(joined);
    if (merged.insert(best).second) out.merges.push_back(best);
    for (auto& [symbols, count] : words) {
      std::vector<std::string> next;
      for (std::size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == best.first && symbols[i + 1] == best.second) {
          next.push_back(joined);
          i += 2;
        } else {
          next.push_back(symbols[i++]);
        }
      }
      symbols = std::move(next);
    }
  }
  return out;
}

// The merges of a trained vocabulary as pairs of byte strings.
std::vector<std::pair<std::string, std::string>> merge_bytes(const BpeVocabulary& v) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [left, right] : v.merges) out.emplace_back(v.tokens.at(left), v.tokens.at(right));
  return out;
}

// Checks train_byte_level_bpe against the reference: the same ids, merges and special tokens.
void check_against_reference(const std::vector<std::string>& texts, std::size_t vocab_size, std::uint64_t min_frequency,
                             const std::vector<std::string>& specials = {}) {
  const BpeVocabulary v =
      train_byte_level_bpe(texts, BpeTrainerOptions(vocab_size).min_frequency(min_frequency).special_tokens(specials));
  const ReferenceVocabulary r = reference_train(texts, vocab_size, min_frequency, specials);
  REQUIRE(v.tokens.size() == r.tokens.size() + specials.size());
  for (std::size_t id = 0; id < r.tokens.size(); ++id) REQUIRE(v.tokens[id] == r.tokens[id]);
  for (std::size_t i = 0; i < specials.size(); ++i) {
    REQUIRE(v.tokens[r.tokens.size() + i] == specials[i]);
    REQUIRE(v.special_tokens.at(i) == static_cast<std::int64_t>(r.tokens.size() + i));
  }
  REQUIRE(v.special_tokens.size() == specials.size());
  REQUIRE(merge_bytes(v) == r.merges);
  CHECK_NOTHROW(ByteLevelBpe(v));  // a vocabulary the tokenizer takes (check_bpe_vocabulary)
  // On these texts, as on every text tried, merge r made the new token 256 + r.
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank)
    REQUIRE(v.tokens.at(256 + rank) == v.tokens[v.merges[rank].first] + v.tokens[v.merges[rank].second]);
}

std::string random_text(Generator& gen, const std::string& alphabet, std::size_t length) {
  std::string s;
  for (std::size_t i = 0; i < length; ++i) s += alphabet[gen.below(alphabet.size())];
  return s;
}

std::string all_bytes() {
  std::string s;
  for (int b = 0; b < 256; ++b) s += static_cast<char>(b);
  return s;
}

const std::vector<std::string> kEnglish = {
    "The quick brown fox jumps over the lazy dog. The dog didn't mind; it's been there before.",
    "Byte pair encoding merges the most frequent pair of adjacent tokens, again and again, until "
    "the vocabulary is full. We'll see that the pairs it finds are the common pieces of words: "
    "the, ing, tion, and their neighbours.",
    "  Numbers 12345 and 2024, punctuation!!! -- and   spaces\tand tabs\n\nnew lines.\r\n",
};

const std::vector<std::string> kUnicode = {
    "Héllo wörld, naïve café, crème brûlée: déjà vu.",
    "中文字符和汉字，中文分词很有意思。中文中文中文。",
    "Привет, мир! Привет, друзья. Мир, мир, мир.",
    "😀🎉😀🎉 emoji 🎉🎉 and ZWJ 👩‍👩‍👧 families 👩‍👩‍👧",
    "ελληνικά και αγγλικά, ελληνικά ξανά; 日本語のテキスト、日本語。",
};

}  // namespace

TEST_CASE("the trainer makes Wikipedia's byte pair encoding example: aa, ab, then aaab") {
  // "Byte pair encoding" on Wikipedia: aaabdaaabac gives Z = aa, Y = ab, X = ZY, then no pair
  // occurs twice. (Za and ab tie at 2 after the first merge; "a" < "aa" picks ab, as Wikipedia does.)
  const BpeVocabulary v = train_byte_level_bpe({"aaabdaaabac"}, BpeTrainerOptions(1000));
  REQUIRE(v.tokens.size() == 259);
  CHECK(v.tokens[256] == "aa");
  CHECK(v.tokens[257] == "ab");
  CHECK(v.tokens[258] == "aaab");
  using M = std::pair<std::int64_t, std::int64_t>;
  CHECK(v.merges == std::vector<M>{{'a', 'a'}, {'a', 'b'}, {256, 257}});
  CHECK(v.special_tokens.empty());
  for (int b = 0; b < 256; ++b) CHECK(v.tokens[b] == std::string(1, static_cast<char>(b)));
}

TEST_CASE("the trainer stops at min_frequency and at vocab_size, with counts worked out by hand") {
  // Pieces: "ab" once, " ab" twice, " cd" twice. Pairs: ab 3, " a" 2, " c" 2, cd 2.
  const std::vector<std::string> text = {"ab ab ab cd cd"};
  using P = std::vector<std::pair<std::string, std::string>>;
  // After ab: " ab" 2, " c" 2, cd 2: the tie goes to the left bytes " " < "c", then "ab" < "c".
  const P all = {{"a", "b"}, {" ", "ab"}, {" ", "c"}, {" c", "d"}};
  CHECK(merge_bytes(train_byte_level_bpe(text, BpeTrainerOptions(1000))) == all);
  CHECK(merge_bytes(train_byte_level_bpe(text, BpeTrainerOptions(1000).min_frequency(1))) == all);
  CHECK(merge_bytes(train_byte_level_bpe(text, BpeTrainerOptions(1000).min_frequency(3))) == P{{"a", "b"}});
  CHECK(train_byte_level_bpe(text, BpeTrainerOptions(1000).min_frequency(4)).merges.empty());
  CHECK(train_byte_level_bpe(text, BpeTrainerOptions(1000)).tokens.size() == 260);  // runs out of pairs
  // vocab_size counts the bytes, the merged tokens and the special tokens.
  CHECK(merge_bytes(train_byte_level_bpe(text, BpeTrainerOptions(258))) == P(all.begin(), all.begin() + 2));
  CHECK(train_byte_level_bpe(text, BpeTrainerOptions(256)).merges.empty());
  const BpeVocabulary v = train_byte_level_bpe(text, BpeTrainerOptions(260).special_tokens({"<|endoftext|>"}));
  CHECK(merge_bytes(v) == P(all.begin(), all.begin() + 3));
  REQUIRE(v.tokens.size() == 260);
  CHECK(v.tokens[259] == "<|endoftext|>");
  CHECK(v.special_tokens == std::vector<std::int64_t>{259});
  CHECK(train_byte_level_bpe(text, BpeTrainerOptions(257).special_tokens({"<|endoftext|>"})).merges.empty());
}

TEST_CASE("the incremental trainer gives the naive trainer's merges on English, Unicode and random bytes") {
  SECTION("English") {
    for (std::uint64_t f : {1, 2, 3}) check_against_reference(kEnglish, 600, f);
    check_against_reference(kEnglish, 300, 1);
  }
  SECTION("Unicode") {
    for (std::uint64_t f : {1, 2}) check_against_reference(kUnicode, 600, f);
    std::vector<std::string> both = kEnglish;
    both.insert(both.end(), kUnicode.begin(), kUnicode.end());
    check_against_reference(both, 400, 2);
  }
  SECTION("random bytes, every byte value") {
    Generator gen(1);
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<std::string> texts;
      for (int i = 0; i < 5; ++i) texts.push_back(random_text(gen, all_bytes(), 50 + gen.below(200)));
      check_against_reference(texts, 256 + 200, 1 + trial % 2);
    }
  }
  SECTION("random bytes from small alphabets, with long runs of merges") {
    Generator gen(2);
    const std::vector<std::string> alphabets = {"ab", "aab ", "ab  \n", "xy\xC3\xA9 ", "a\xE4\xB8\xAD\xFF ", "0a1 .,"};
    for (int trial = 0; trial < 60; ++trial) {
      const std::string& alphabet = alphabets[trial % alphabets.size()];
      std::vector<std::string> texts;
      for (int i = 0; i < 4; ++i) texts.push_back(random_text(gen, alphabet, 20 + gen.below(300)));
      check_against_reference(texts, 256 + 1000, 1 + trial % 3);
    }
  }
  SECTION("one long piece (letters without a space), merged in many places at every step") {
    Generator gen(4);
    check_against_reference({random_text(gen, "abcd", 6000)}, 256 + 300, 2);
    check_against_reference({std::string(3000, 'a') + random_text(gen, "ab", 3000)}, 256 + 100, 1);
  }
}

TEST_CASE("pre-tokenizing a long text in chunks gives the pieces of the whole text") {
  // Fragments where GPT-2's pattern looks ahead: whitespace runs before a word, contractions,
  // characters of 2 to 4 bytes, a character cut short, bytes that are not UTF-8, long runs.
  const std::vector<std::string> fragments = {" ",
                                              "  ",
                                              "\n",
                                              "\t",
                                              "\r\n",
                                              "\xC2\xA0",
                                              "'s",
                                              "'re",
                                              "'ll",
                                              "'",
                                              "a",
                                              "bc",
                                              "Word",
                                              "\xE4\xB8\xAD",
                                              "\xF0\x9F\x98\x80",
                                              "\xFF",
                                              "\xE4\xB8",
                                              "\x80",
                                              "1",
                                              "23",
                                              "!",
                                              "?!",
                                              "...",
                                              std::string(300, 'x'),
                                              std::string(200, ' '),
                                              std::string(150, '\n')};
  Gpt2Pretokenizer pretokenizer;
  Generator gen(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const std::size_t parts = 1 + gen.below(400);
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t f = gen.below(fragments.size());
      if (fragments[f].size() > 100 && gen.below(8) != 0) continue;  // long runs now and then
      text += fragments[f];
    }
    const std::vector<std::string_view> whole = pretokenizer.split(text);
    std::vector<std::string_view> chunked;
    const std::size_t chunk_bytes = 1 + gen.below(400);
    detail::pretokenize_in_chunks(pretokenizer, text, chunk_bytes, [&](const std::vector<std::string_view>& pieces) {
      chunked.insert(chunked.end(), pieces.begin(), pieces.end());
    });
    INFO("trial " << trial << ", chunk_bytes " << chunk_bytes << ", " << text.size() << " bytes");
    REQUIRE(chunked.size() == whole.size());
    for (std::size_t i = 0; i < whole.size(); ++i) {
      REQUIRE(chunked[i].data() == whole[i].data());
      REQUIRE(chunked[i].size() == whole[i].size());
    }
  }
}

TEST_CASE("the trainer cuts out special tokens, the longest at a position, and merges nothing across them") {
  // Without the cut, "abXYZcd" is one piece and bX, Zc would merge; "XY" matching before "XYZ"
  // would leave "Zcd".
  const std::vector<std::string> texts = {"abXYZcdabXYZcd abXYZcd", "XYZXYZ ab XY cd XYZ"};
  const std::vector<std::string> specials = {"XY", "XYZ"};
  check_against_reference(texts, 400, 1, specials);
  const BpeVocabulary v = train_byte_level_bpe(texts, BpeTrainerOptions(400).min_frequency(1).special_tokens(specials));
  for (std::size_t id = 256; id < v.tokens.size() - specials.size(); ++id) {
    CHECK(v.tokens[id].find('X') == std::string::npos);
    CHECK(v.tokens[id].find('Z') == std::string::npos);
  }
  CHECK(v.tokens[v.tokens.size() - 2] == "XY");
  CHECK(v.tokens.back() == "XYZ");
  check_against_reference({"hello<|endoftext|>hello<|endoftext|><|endoftext|>world hello"}, 300, 1, {"<|endoftext|>"});
}

TEST_CASE("the runs of bytes that are not UTF-8 are not learnt from: the tokenizer never merges them") {
  CHECK(train_byte_level_bpe({std::string(100, '\xFF'), "\xE4\xB8\xE4\xB8\xE4\xB8"}, BpeTrainerOptions(400))
            .merges.empty());
  const BpeVocabulary v = train_byte_level_bpe({"ab\xFF\xFF"
                                                "ab\xFF\xFF"
                                                " ab"},
                                               BpeTrainerOptions(400));
  using P = std::vector<std::pair<std::string, std::string>>;
  CHECK(merge_bytes(v) == P{{"a", "b"}});  // "ab" twice, " ab" once; "\xFF\xFF" twice but not UTF-8
}

TEST_CASE("training is deterministic and does not depend on the order of the texts") {
  std::vector<std::string> texts = kEnglish;
  texts.insert(texts.end(), kUnicode.begin(), kUnicode.end());
  const auto options = BpeTrainerOptions(500).special_tokens({"<|endoftext|>", "<pad>"});
  const BpeVocabulary a = train_byte_level_bpe(texts, options);
  const BpeVocabulary b = train_byte_level_bpe(texts, options);
  std::reverse(texts.begin(), texts.end());
  const BpeVocabulary c = train_byte_level_bpe(texts, options);
  for (const BpeVocabulary* other : {&b, &c}) {
    CHECK(a.tokens == other->tokens);
    CHECK(a.merges == other->merges);
    CHECK(a.special_tokens == other->special_tokens);
  }
  CHECK(a.special_tokens == std::vector<std::int64_t>{static_cast<std::int64_t>(a.tokens.size()) - 2,
                                                      static_cast<std::int64_t>(a.tokens.size()) - 1});
}

TEST_CASE("train_byte_level_bpe_files trains on each file as one text") {
  testing::TempDir dir("xgrad_bpe_trainer");
  testing::write_bytes(dir.file("a.txt"), kEnglish[0] + kEnglish[1]);
  testing::write_bytes(dir.file("b.txt"), kUnicode[1]);
  const auto options = BpeTrainerOptions(400).special_tokens({"<|endoftext|>"});
  const BpeVocabulary from_files = train_byte_level_bpe_files({dir.file("a.txt"), dir.file("b.txt")}, options);
  const BpeVocabulary from_texts = train_byte_level_bpe({kEnglish[0] + kEnglish[1], kUnicode[1]}, options);
  CHECK(from_files.tokens == from_texts.tokens);
  CHECK(from_files.merges == from_texts.merges);
  CHECK(from_files.special_tokens == from_texts.special_tokens);
  CHECK(train_byte_level_bpe_files({}, options).tokens.size() == 257);
}

TEST_CASE("bad input: the trainer refuses bad options naming the function, the option and the value") {
  const std::vector<std::string> texts = {"some text"};
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(255)),
                    Catch::Contains("train_byte_level_bpe: vocab_size 255 is below the 256 byte tokens plus the 0 "
                                    "special tokens (256)"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(257).special_tokens({"<a>", "<b>"})),
                    Catch::Contains("vocab_size 257 is below the 256 byte tokens plus the 2 special tokens (258)"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(std::size_t{1} << 31)),
                    Catch::Contains("train_byte_level_bpe: vocab_size 2147483648 is more than the 2147483647 ids"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(300).min_frequency(0)),
                    Catch::Contains("train_byte_level_bpe: min_frequency 0"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(300).special_tokens({"<a>", ""})),
                    Catch::Contains("train_byte_level_bpe: special token 1 is empty"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(300).special_tokens({"<a>", "<b>", "<a>"})),
                    Catch::Contains("train_byte_level_bpe: special tokens 0 and 2 are both \"<a>\""));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(300).special_tokens({"<\xFF>"})),
                    Catch::Contains("train_byte_level_bpe: special token 0 \"<\\xFF>\" is not valid UTF-8 (byte 0xFF "
                                    "at offset 1)"));
  CHECK_THROWS_WITH(train_byte_level_bpe(texts, BpeTrainerOptions(300).special_tokens({"<a>", "!"})),
                    Catch::Contains("train_byte_level_bpe: special token 1 \"!\" is one byte, which is the byte "
                                    "token 33 already"));
  // The files' function names itself, and checks the options before reading any file.
  CHECK_THROWS_WITH(train_byte_level_bpe_files({"/no/such/file.txt"}, BpeTrainerOptions(255)),
                    Catch::Contains("train_byte_level_bpe_files: vocab_size 255"));
}

TEST_CASE("bad input: train_byte_level_bpe_files names a missing file and a folder") {
  testing::TempDir dir("xgrad_bpe_trainer");
  testing::write_bytes(dir.file("a.txt"), "text");
  const auto options = BpeTrainerOptions(300);
  CHECK_THROWS_WITH(train_byte_level_bpe_files({dir.file("a.txt"), dir.file("missing.txt")}, options),
                    Catch::Contains("train_byte_level_bpe_files: cannot open '" + dir.file("missing.txt") + "'"));
  CHECK_THROWS_WITH(train_byte_level_bpe_files({dir.path}, options),
                    Catch::Contains("train_byte_level_bpe_files: cannot read '" + dir.path + "'") &&
                        Catch::Contains("it is a folder, not a regular file"));
}

namespace {

// Random UTF-8 text: ASCII words and spaces, Latin-1, Cyrillic, CJK, emoji and combining marks.
std::string random_utf8(Generator& gen, std::size_t characters) {
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges = {
      {0x20, 0x7E},   {0x20, 0x20},     {0x61, 0x7A},       {0xA0, 0xFF},     {0x400, 0x4FF},
      {0x300, 0x36F}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}, {0x3040, 0x30FF}, {0x0A, 0x0A}};
  std::string s;
  for (std::size_t i = 0; i < characters; ++i) {
    const auto& [lo, hi] = ranges[gen.below(ranges.size())];
    const std::uint32_t c = lo + static_cast<std::uint32_t>(gen.below(hi - lo + 1));
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += static_cast<char>(0xE0 | (c >> 12));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (c >> 18));
      s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return s;
}

// A vocabulary trained on English, Unicode and random bytes, with two special tokens.
BpeVocabulary trained_vocabulary() {
  std::vector<std::string> texts = kEnglish;
  texts.insert(texts.end(), kUnicode.begin(), kUnicode.end());
  Generator gen(5);
  for (int i = 0; i < 4; ++i) texts.push_back(random_text(gen, all_bytes(), 300));
  for (int i = 0; i < 4; ++i) texts.push_back(random_utf8(gen, 300));
  texts.push_back("one<|endoftext|>two<|endoftext|><pad>");
  return train_byte_level_bpe(texts,
                              BpeTrainerOptions(900).min_frequency(2).special_tokens({"<|endoftext|>", "<pad>"}));
}

}  // namespace

TEST_CASE("a trained vocabulary's tokenizer gives back every byte sequence and UTF-8 text it encodes") {
  const BpeVocabulary v = trained_vocabulary();
  REQUIRE(v.merges.size() > 200);
  const ByteLevelBpe tokenizer(v);
  CHECK(tokenizer.vocab_size() == v.tokens.size());
  const std::set<std::int64_t> specials(v.special_tokens.begin(), v.special_tokens.end());
  Generator gen(6);
  const std::vector<std::string> alphabets = {all_bytes(), "ab \n", "the quick, brown",
                                              "\xC3\xA9\xE4\xB8\xAD\xFF\x80 a"};
  auto check_round_trip = [&](const std::string& x) {
    const TokenIds ids = tokenizer.encode(x);
    for (const std::int64_t id : ids) {
      REQUIRE(id >= 0);
      REQUIRE(id < static_cast<std::int64_t>(v.tokens.size()));
      REQUIRE(specials.count(id) == 0);  // ordinary text never gives a special id
    }
    REQUIRE(tokenizer.decode(ids) == x);
  };
  for (int trial = 0; trial < 3000; ++trial) {
    INFO("trial " << trial);
    check_round_trip(random_text(gen, alphabets[trial % alphabets.size()], gen.below(200)));
    check_round_trip(random_utf8(gen, gen.below(100)));
  }
  check_round_trip(all_bytes());
  check_round_trip("");
  check_round_trip("a<|endoftext|>b<pad>");  // special texts as ordinary text
  for (const std::string& text : kEnglish) {
    check_round_trip(text);
    CHECK(tokenizer.encode(text).size() < text.size());  // trained on it: some merges apply
  }
}

TEST_CASE("a trained vocabulary's special tokens are single ids when matched, and only then") {
  const BpeVocabulary v = trained_vocabulary();
  const ByteLevelBpe tokenizer(v);
  REQUIRE(v.special_tokens.size() == 2);
  const std::int64_t eot = v.special_tokens[0], pad = v.special_tokens[1];
  CHECK(v.tokens[eot] == "<|endoftext|>");
  CHECK(v.tokens[pad] == "<pad>");
  CHECK(tokenizer.encode("<|endoftext|>", SpecialText::match) == TokenIds{eot});
  CHECK(tokenizer.encode("<pad>", SpecialText::match) == TokenIds{pad});
  const std::string a = "Hello world", b = " and more";
  TokenIds expected = tokenizer.encode(a);
  expected.push_back(eot);
  const TokenIds tail = tokenizer.encode(b);
  expected.insert(expected.end(), tail.begin(), tail.end());
  expected.push_back(pad);
  const std::string text = a + "<|endoftext|>" + b + "<pad>";
  CHECK(tokenizer.encode(text, SpecialText::match) == expected);
  CHECK(tokenizer.decode(expected) == text);
  const TokenIds ordinary = tokenizer.encode(text);
  CHECK(std::find(ordinary.begin(), ordinary.end(), eot) == ordinary.end());
  CHECK(std::find(ordinary.begin(), ordinary.end(), pad) == ordinary.end());
  CHECK(tokenizer.decode(ordinary) == text);
  CHECK(tokenizer.special_tokens().eos == eot);  // ByteLevelBpe gives <|endoftext|> its role
}

TEST_CASE("a trained vocabulary saved as vocab.json + merges.txt loads back to the same tokenizer") {
  const BpeVocabulary v = trained_vocabulary();
  testing::TempDir dir("xgrad_bpe_trainer");
  const std::string folder = dir.file("trained");
  save_gpt2_vocabulary(v, folder);
  const BpeVocabulary loaded = load_gpt2_vocabulary(folder + "/vocab.json", folder + "/merges.txt");
  CHECK(loaded.tokens == v.tokens);
  CHECK(loaded.merges == v.merges);
  CHECK(loaded.special_tokens == v.special_tokens);
  const ByteLevelBpe original(v), reloaded(loaded);
  CHECK(original.identity() == reloaded.identity());
  Generator gen(7);
  std::string text = kEnglish[1] + "<|endoftext|>" + kUnicode[3] + random_text(gen, all_bytes(), 200) + "<pad>";
  for (const SpecialText mode : {SpecialText::ordinary, SpecialText::match}) {
    const TokenIds ids = original.encode(text, mode);
    CHECK(reloaded.encode(text, mode) == ids);
    CHECK(reloaded.decode(ids) == text);
  }
}
