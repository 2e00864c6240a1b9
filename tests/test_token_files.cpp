// Token files: the bytes of the documented format (built here by hand from the table in
// text/token_file.hpp, not by the writer), the atomic and streaming writers, the reader and every
// bad file it refuses (and a file truncated while open), and that a large file costs no memory.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"

using Catch::Contains;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;
using namespace xgrad::text;
using xgrad::check_run_paths;
using xgrad::RunPath;

namespace {

void put(std::string& s, std::size_t at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

// A header as the table in token_file.hpp lays it out.
std::string header_bytes(std::uint32_t dtype, std::uint64_t tokens, std::uint64_t documents, std::uint64_t vocab,
                         std::int64_t eos, const std::string& digest, const std::string& kind,
                         std::uint32_t version = 1) {
  std::string h(128, '\0');
  std::memcpy(h.data(), "XGTOKENS", 8);
  put(h, 8, version, 4);
  put(h, 12, dtype, 4);
  put(h, 16, tokens, 8);
  put(h, 24, documents, 8);
  put(h, 32, vocab, 8);
  put(h, 40, static_cast<std::uint64_t>(eos), 8);
  std::memcpy(h.data() + 48, digest.data(), 16);
  std::memcpy(h.data() + 64, kind.data(), kind.size());
  return h;
}

std::string ids_bytes(const std::vector<std::uint32_t>& ids, int dtype) {
  std::string s(ids.size() * dtype, '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) put(s, i * dtype, ids[i], dtype);
  return s;
}

const TokenizerIdentity kBytes = BytesTokenizer().identity();
const TokenizerIdentity kBig{"byte_bpe", 70000, "0123456789abcdef"};

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("token files: write_token_file gives the documented bytes, and TokenFile reads them back", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  SECTION("uint16 for the bytes tokenizer, no eos") {
    const TokenIds ids{104, 105, 0, 255, 10};
    write_token_file(dir.file("a.bin"), ids, kBytes, 2);
    const std::string want =
        header_bytes(2, 5, 2, 256, -1, kBytes.digest, "bytes") + ids_bytes({104, 105, 0, 255, 10}, 2);
    CHECK(read_bytes(dir.file("a.bin")) == want);
    const TokenFile f(dir.file("a.bin"));
    CHECK(f.size() == 5);
    CHECK(f.header().version == 1);
    CHECK(f.header().dtype == 2);
    CHECK(f.header().documents == 2);
    CHECK(f.header().tokenizer == kBytes);
    CHECK(!f.header().eos);
    CHECK(f.read_ids(0, 5) == ids);
    CHECK(f.read_ids(3, 2) == TokenIds{255, 10});
    CHECK(f.read_ids(5, 0).empty());
  }
  SECTION("uint32 past 65536 ids, with an eos") {
    const TokenIds ids{69999, 0, 65536, 123456 % 70000, 50256};
    write_token_file(dir.file("b.bin"), ids, kBig, 3, 50256);
    std::vector<std::uint32_t> raw(ids.begin(), ids.end());
    CHECK(read_bytes(dir.file("b.bin")) ==
          header_bytes(4, 5, 3, 70000, 50256, kBig.digest, "byte_bpe") + ids_bytes(raw, 4));
    const TokenFile f(dir.file("b.bin"));
    CHECK(f.header().dtype == 4);
    CHECK(f.header().eos == std::optional<std::int64_t>(50256));
    CHECK(f.read_ids(0, 5) == ids);
  }
  SECTION("the dtype is uint16 up to 65536 ids") {
    CHECK(token_file_dtype(65536) == 2);
    CHECK(token_file_dtype(65537) == 4);
    write_token_file(dir.file("c.bin"), {65535}, TokenizerIdentity{"byte_bpe", 65536, kBig.digest});
    CHECK(TokenFile(dir.file("c.bin")).read_ids(0, 1) == TokenIds{65535});
  }
  SECTION("an empty token array is a valid file") {
    write_token_file(dir.file("e.bin"), {}, kBytes);
    CHECK(TokenFile(dir.file("e.bin")).size() == 0);
  }
}

TEST_CASE("token files: the streaming writer writes what write_token_file writes", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  SECTION("documents joined by the eos") {
    {
      TokenFileWriter w(dir.file("s.bin"), kBig, 7);
      w.append_document({1, 2, 3});
      w.append_document({});
      w.append_document({69999});
      CHECK(w.tokens() == 6);
      CHECK(w.documents() == 3);
      w.finish();
    }
    write_token_file(dir.file("a.bin"), {1, 2, 3, 7, 7, 69999}, kBig, 3, 7);
    CHECK(read_bytes(dir.file("s.bin")) == read_bytes(dir.file("a.bin")));
    CHECK(dir.entries() == std::set<std::string>{"a.bin", "s.bin"});
  }
  SECTION("many appends past the writer's buffer") {
    TokenIds all;
    {
      TokenFileWriter w(dir.file("s.bin"), kBytes);
      for (int k = 0; k < 40; ++k) {
        TokenIds part(30000 + k);
        for (std::size_t i = 0; i < part.size(); ++i) part[i] = static_cast<std::int64_t>((i * 7 + k) % 256);
        w.append(part);
        all.insert(all.end(), part.begin(), part.end());
      }
      w.finish(12);
    }
    write_token_file(dir.file("a.bin"), all, kBytes, 12);
    CHECK(read_bytes(dir.file("s.bin")) == read_bytes(dir.file("a.bin")));
  }
  SECTION("a writer dropped before finish leaves the earlier file and no temporary") {
    write_bytes(dir.file("s.bin"), "earlier");
    {
      TokenFileWriter w(dir.file("s.bin"), kBytes);
      w.append({1, 2, 3});
    }
    CHECK(read_bytes(dir.file("s.bin")) == "earlier");
    CHECK(dir.entries() == std::set<std::string>{"s.bin"});
  }
  SECTION("bad input: an id outside the vocabulary appends nothing; appending after finish is refused") {
    TokenFileWriter w(dir.file("s.bin"), kBytes);
    w.append({1, 2});
    REQUIRE_THROWS_WITH(w.append({3, 256, 4}), Contains("id 256 at position 3") && Contains("[0, 256)"));
    REQUIRE_THROWS_WITH(w.append({-1}), Contains("id -1 at position 2"));
    CHECK(w.tokens() == 2);
    w.finish();
    CHECK(TokenFile(dir.file("s.bin")).read_ids(0, 2) == TokenIds{1, 2});
    REQUIRE_THROWS_WITH(w.append({1}), Contains("already finished"));
    REQUIRE_THROWS_WITH(w.finish(), Contains("already finished"));
  }
  SECTION("bad input: a folder, a missing folder, an eos outside the vocabulary") {
    REQUIRE_THROWS_WITH(TokenFileWriter(dir.path, kBytes), Contains("TokenFileWriter") && Contains(dir.path));
    REQUIRE_THROWS_WITH(TokenFileWriter(dir.file("no/such.bin"), kBytes), Contains("no/such.bin"));
    REQUIRE_THROWS_WITH(TokenFileWriter(dir.file("x.bin"), kBytes, 256), Contains("eos id 256"));
    CHECK(dir.entries().empty());
  }
}

// Each writer has a temporary of its own (writers on one path used to share `path.tmp.PID`: the
// second truncated the first's file and the first finish() moved it away under the second). On one
// path the last finish() wins, and every finished file is whole, as for two atomic writes.
TEST_CASE("token files: two writers on one path in one process each finish a whole file, the last finish wins",
          "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  const std::string path = dir.file("s.bin");
  const auto finish_both = [&](bool first_finishes_first) {
    TokenFileWriter a(path, kBytes), b(path, kBytes);
    a.append_document({1, 2, 3});
    b.append_document({4, 5});
    a.append_document({6});
    TokenFileWriter& early = first_finishes_first ? a : b;
    TokenFileWriter& late = first_finishes_first ? b : a;
    early.finish();
    const TokenIds early_ids = TokenFile(path).read_ids(0, early.tokens());
    CHECK(early_ids == (first_finishes_first ? TokenIds{1, 2, 3, 6} : TokenIds{4, 5}));
    late.finish();
  };
  finish_both(true);
  CHECK(TokenFile(path).read_ids(0, 2) == TokenIds{4, 5});
  CHECK(TokenFile(path).header().documents == 1);
  finish_both(false);
  CHECK(TokenFile(path).read_ids(0, 4) == TokenIds{1, 2, 3, 6});
  CHECK(TokenFile(path).header().documents == 2);
  CHECK(dir.entries() == std::set<std::string>{"s.bin"});  // no temporary left

  // write_token_file while a writer of the path is open: neither touches the other's temporary.
  {
    TokenFileWriter w(path, kBytes);
    w.append({7, 8, 9});
    write_token_file(path, {10}, kBytes);
    CHECK(TokenFile(path).read_ids(0, 1) == TokenIds{10});
    w.finish();
  }
  CHECK(TokenFile(path).read_ids(0, 3) == TokenIds{7, 8, 9});
  CHECK(dir.entries() == std::set<std::string>{"s.bin"});
}

TEST_CASE("bad input: write_token_file names the first bad id and its position, and writes nothing", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  write_bytes(dir.file("a.bin"), "earlier");
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {1, 2, 300, 400}, kBytes),
                      Contains("write_token_file") && Contains("id 300 at position 2") && Contains("[0, 256)"));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {-5}, kBytes), Contains("id -5 at position 0"));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {1}, TokenizerIdentity{"bytes", 0, kBytes.digest}),
                      Contains("vocab_size 0"));
  REQUIRE_THROWS_WITH(
      write_token_file(dir.file("a.bin"), {1}, TokenizerIdentity{"bytes", (1ull << 32) + 1, kBytes.digest}),
      Contains("vocab_size 4294967297"));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {1}, TokenizerIdentity{"", 256, kBytes.digest}),
                      Contains("kind"));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {1}, TokenizerIdentity{"bytes", 256, "xyz"}),
                      Contains("digest \"xyz\""));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("a.bin"), {1}, kBytes, 0, -2), Contains("eos id -2"));
  CHECK(read_bytes(dir.file("a.bin")) == "earlier");
  REQUIRE_THROWS_WITH(write_token_file(dir.path, {1}, kBytes), Contains("write_token_file") && Contains(dir.path));
  REQUIRE_THROWS_WITH(write_token_file(dir.file("no/a.bin"), {1}, kBytes), Contains("no/a.bin"));
  CHECK(dir.entries() == std::set<std::string>{"a.bin"});
}

// The one output-path rule (xgrad::check_run_paths) on a token file's inputs.
TEST_CASE("bad input: an output that is an input is refused, by any spelling or a hard link", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  write_bytes(dir.file("in.txt"), "text");
  REQUIRE(::link(dir.file("in.txt").c_str(), dir.file("link.txt").c_str()) == 0);
  const std::vector<RunPath> inputs{{"the text", dir.file("other.txt")}, {"the text", dir.file("in.txt")}};
  const auto check = [&](const std::string& out) { check_run_paths(inputs, {{"--out", out}}, "tool"); };
  REQUIRE_THROWS_WITH(check(dir.file("in.txt")), Contains("tool: --out") && Contains("is the same file as the text"));
  REQUIRE_THROWS_WITH(check(dir.path + "/./sub/../in.txt"), Contains("is the same file as"));
  REQUIRE_THROWS_WITH(check(dir.file("link.txt")), Contains("is the same file as"));
  REQUIRE_THROWS_WITH(check(dir.file("other.txt")), Contains("is the same file as"));
  CHECK_NOTHROW(check(dir.file("out.bin")));
}

TEST_CASE("bad input: TokenFile refuses every malformed file, naming the file and the field", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  const std::string path = dir.file("t.bin");
  const std::string good = header_bytes(2, 3, 1, 256, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2);
  auto refuses = [&](const std::string& bytes, const std::string& what) {
    write_bytes(path, bytes);
    INFO(what);
    REQUIRE_THROWS_WITH(TokenFile(path), Contains("TokenFile") && Contains(path) && Contains(what));
  };
  write_bytes(path, good);
  REQUIRE_NOTHROW(TokenFile(path));
  REQUIRE_THROWS_WITH(TokenFile(dir.file("missing.bin")), Contains("missing.bin") && Contains("No such file"));
  REQUIRE_THROWS_WITH(TokenFile(dir.path), Contains("a folder"));
  refuses("", "is empty");
  refuses(good.substr(0, 100), "truncated: it holds 100 bytes, fewer than the 128-byte header");
  refuses("hello", "truncated: it holds 5 bytes");
  refuses("hello\nworld", "bytes 0..8 are \"hello\\x0Awo\", not the magic");
  refuses("not a token file, but long enough to hold a header" + std::string(100, ' '),
          "not an xgrad token file: bytes 0..8 are \"not a to\"");
  std::string s = good;
  refuses(s.replace(0, 8, "XGTOKENZ"), "the magic");
  refuses(header_bytes(2, 3, 1, 256, -1, kBytes.digest, "bytes", 2) + ids_bytes({1, 2, 3}, 2), "version 2 (byte 8)");
  refuses(header_bytes(3, 3, 1, 256, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2), "dtype 3 (byte 12)");
  refuses(header_bytes(2, 3, 1, 70000, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2),
          "dtype 2 (uint16, byte 12) cannot hold");
  refuses(header_bytes(2, 3, 1, 0, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2), "vocab_size 0 (byte 32)");
  refuses(header_bytes(2, 3, 1, 256, 256, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2), "eos 256 (byte 40)");
  refuses(header_bytes(2, 3, 1, 256, -7, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2), "eos -7 (byte 40)");
  refuses(header_bytes(2, 3, 1, 256, -1, "0123456789ABCDEF", "bytes") + ids_bytes({1, 2, 3}, 2), "(bytes 48..64)");
  refuses(header_bytes(2, 3, 1, 256, -1, kBytes.digest, "") + ids_bytes({1, 2, 3}, 2), "(bytes 64..96)");
  s = good;
  s[100] = 1;
  refuses(s, "byte 100 is 1");
  s = good;
  s[80] = 'x';  // after the kind's terminating zero
  refuses(s, "byte 80 is 120");
  refuses(good.substr(0, good.size() - 1),
          "truncated: its header counts 3 tokens of 2 bytes (134 bytes in all), but the file holds 133 bytes");
  refuses(good + "xy", "2 bytes follow the 3 tokens its header counts (at byte 134)");
  refuses(header_bytes(4, 3, 1, 256, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3}, 2), "truncated");
  refuses(header_bytes(2, ~0ull, 1, 256, -1, kBytes.digest, "bytes"), "passes any file size");
}

TEST_CASE("bad input: an id past vocab_size in the data is named by read(), with its position and byte offset",
          "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  const std::string path = dir.file("t.bin");
  write_bytes(path, header_bytes(2, 6, 1, 256, -1, kBytes.digest, "bytes") + ids_bytes({1, 2, 3, 4, 999, 5}, 2));
  const TokenFile f(path);  // not scanned when opened
  CHECK(f.read_ids(0, 4) == TokenIds{1, 2, 3, 4});
  CHECK(f.read_ids(5, 1) == TokenIds{5});
  REQUIRE_THROWS_WITH(f.read_ids(2, 4), Contains("TokenFile::read") && Contains(path) &&
                                            Contains("position 4 (byte 136) is 999") && Contains("[0, 256)"));
  REQUIRE_THROWS_WITH(f.check_ids(), Contains("position 4 (byte 136) is 999"));
  REQUIRE_THROWS_WITH(f.read_ids(4, 3), Contains("tokens [4, 4 + 3) pass the end of the source's 6 tokens"));
  std::int64_t out[2];
  REQUIRE_THROWS_WITH(f.read(~std::size_t{0}, 2, out), Contains("pass the end"));
}

TEST_CASE("token files: check_tokenizer names both identities when they differ", "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  write_token_file(dir.file("t.bin"), {1}, kBytes);
  const TokenFile f(dir.file("t.bin"));
  CHECK_NOTHROW(f.check_tokenizer(BytesTokenizer().identity()));
  REQUIRE_THROWS_WITH(f.check_tokenizer(kBig), Contains(dir.file("t.bin")) && Contains(describe(kBytes)) &&
                                                   Contains("byte_bpe, 70000 ids, digest 0123456789abcdef"));
  REQUIRE_THROWS_WITH(f.check_tokenizer(TokenizerIdentity{"bytes", 256, "0000000000000000"}),
                      Contains("digest 0000000000000000"));
}

TEST_CASE("token files: a 2 GB file is mapped, never read whole: opening and reading cost almost no memory",
          "[text][tokens]") {
  TempDir dir("xgrad_tokfile");
  const std::string path = dir.file("big.bin");
  const std::uint64_t tokens = std::uint64_t{1} << 30;  // 2 GiB of uint16, a sparse file of zeros
  write_bytes(path, header_bytes(2, tokens, 1, 256, -1, kBytes.digest, "bytes"));
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(128 + 2 * tokens)) == 0);
  const std::size_t before = resident_bytes();
  const TokenFile f(path);
  const std::size_t opened = resident_bytes();
  CHECK(f.size() == tokens);
  std::vector<std::int64_t> window(1025);
  for (std::uint64_t k = 0; k < 8; ++k) {
    f.read(static_cast<std::size_t>(k * (tokens / 8) + 12345), window.size(), window.data());
    CHECK(window[0] == 0);
  }
  const std::size_t read = resident_bytes();
  INFO("resident before " << before << ", opened " << opened << ", after 8 windows " << read);
  CHECK(opened < before + (std::size_t{1} << 20));
  CHECK(read < opened + (std::size_t{16} << 20));
}

TEST_CASE("token sources: TokenVector reads by range and refuses a range past its end", "[text][tokens]") {
  const TokenVector v({5, 6, 7});
  CHECK(v.size() == 3);
  CHECK(v.read_ids(1, 2) == TokenIds{6, 7});
  CHECK(v.ids() == TokenIds{5, 6, 7});
  std::int64_t out[4] = {-1, -1, -1, -1};
  REQUIRE_THROWS_WITH(v.read(2, 2, out),
                      Contains("TokenVector::read: tokens [2, 2 + 2) pass the end of the source's 3 tokens"));
  CHECK(out[0] == -1);
  REQUIRE_THROWS_WITH(v.read(4, 0, out), Contains("[4, 4 + 0)"));
}

TEST_CASE("bad input: a token file truncated or replaced while open: read() names the file, never SIGBUS",
          "[text][tokens][bad_input][gemm]") {
  TempDir dir("xgrad_tokfile_shrink");
  const std::string path = dir.file("t.bin");
  std::vector<std::int64_t> ids(100000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i % 251);
  write_token_file(path, ids, kBytes);
  // In a child process, so that a SIGBUS (what reading a mapping past a new end gives) fails the
  // test instead of ending the suite.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 10;
    try {
      const TokenFile f(path);
      std::vector<std::int64_t> window(1000);
      f.read(90000, window.size(), window.data());
      code = window[0] == 90000 % 251 ? 11 : 12;
      if (::truncate(path.c_str(), 128 + 2 * 4096) != 0) ::_exit(13);
      f.read(4000, 50, window.data());  // still inside the file
      if (window[0] != 4000 % 251) ::_exit(14);
      f.read(90000, window.size(), window.data());
      code = 15;  // read past the new end without an Error
    } catch (const xgrad::Error& e) {
      const std::string m = e.what();
      code = m.find("TokenFile::read: '" + path + "' ends at byte 8320, before byte 182128") != std::string::npos &&
                     m.find("truncated while open (200128 bytes when opened)") != std::string::npos
                 ? 0
                 : 16;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child " << (WIFSIGNALED(status) ? "killed by signal " : "exited with ")
                << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));

  // A file replaced by an atomic write while open: the reader keeps reading the old one.
  write_token_file(path, ids, kBytes);
  const TokenFile f(path);
  write_token_file(path, std::vector<std::int64_t>(10, 7), kBytes);
  CHECK(f.read_ids(99990, 10) == std::vector<std::int64_t>(ids.end() - 10, ids.end()));
  CHECK(TokenFile(path).size() == 10);
}
