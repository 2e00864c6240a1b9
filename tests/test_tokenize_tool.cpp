// xgrad-tokenize run as a user runs it: encode (whole files, lines, separators, a validation
// split chosen by seed), ids, decode and info, and every bad command ending with exit 1, one
// line "xgrad-tokenize: ..." on stderr and nothing written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/load_tokenizer.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"
#include "xgrad/text/token_batches.hpp"
#include "xgrad/text/token_file.hpp"

using Catch::Contains;
using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;
using namespace xgrad::text;

namespace {

Outcome tool(const TempDir& dir, const std::vector<std::string>& args) {
  return xgrad::testing::run_program(dir, XGRAD_TOKENIZE_EXE, args);
}

// A token file of the bytes tokenizer as the text it holds.
std::string text_of(const std::string& path) {
  const TokenFile f(path);
  f.check_tokenizer(BytesTokenizer().identity());
  std::string s;
  for (std::int64_t id : f.read_ids(0, f.size())) s += static_cast<char>(id);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  for (std::size_t at; (at = s.find(sep, begin)) != std::string::npos; begin = at + 1)
    out.push_back(s.substr(begin, at - begin));
  out.push_back(s.substr(begin));
  return out;
}

// Exit 1 with one line starting "xgrad-tokenize: " holding `part`, no stdout, and the folder as it was.
void check_refused(const TempDir& dir, const std::vector<std::string>& args, const std::string& part) {
  const std::set<std::string> before = dir.entries();
  const Outcome o = tool(dir, args);
  INFO(o);
  CHECK(o.exited);
  CHECK(o.code == 1);
  CHECK(o.err.rfind("xgrad-tokenize: ", 0) == 0);
  CHECK(std::count(o.err.begin(), o.err.end(), '\n') == 1);
  CHECK_THAT(o.err, Contains(part));
  CHECK(o.out.empty());
  std::set<std::string> after = dir.entries();
  after.erase(".stdout");
  after.erase(".stderr");
  std::set<std::string> was = before;
  was.erase(".stdout");
  was.erase(".stderr");
  CHECK(after == was);
}

}  // namespace

TEST_CASE("xgrad-tokenize encode: each file a document, the token file holding their bytes", "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  write_bytes(dir.file("a.txt"), "first file\n");
  write_bytes(dir.file("b.txt"), std::string("second \xff\x00 file", 15));
  const Outcome o = tool(dir, {"encode", "--tokenizer", "bytes", "--out", "train.bin", "a.txt", "b.txt"});
  INFO(o);
  REQUIRE(o.code == 0);
  CHECK_THAT(o.out, Contains("train.bin: 26 tokens, 2 documents (uint16)"));
  CHECK(text_of(dir.file("train.bin")) == read_bytes(dir.file("a.txt")) + read_bytes(dir.file("b.txt")));
  CHECK(TokenFile(dir.file("train.bin")).header().documents == 2);
  const Outcome i = tool(dir, {"info", "train.bin", "--check"});
  INFO(i);
  CHECK(i.code == 0);
  CHECK(i.out ==
        "file: train.bin\nformat: XGTOKENS version 1\ndtype: uint16\ntokens: 26\ndocuments: 2\n"
        "tokenizer: bytes\nvocab_size: 256\ndigest: " +
            BytesTokenizer().identity().digest + "\neos: none\nids: all below vocab_size\n");
}

TEST_CASE("xgrad-tokenize encode --split-lines --val: a split by whole documents, the same for the same seed",
          "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  std::string text;
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) lines.push_back("line number " + std::to_string(i));
  for (const std::string& l : lines) text += l + "\n";
  write_bytes(dir.file("lines.txt"), text);
  auto encode = [&](const std::string& seed, const std::string& out, const std::string& val) {
    const Outcome o = tool(dir, {"encode", "--tokenizer", "bytes", "--split-lines", "--val", val, "--val-fraction",
                                 "0.25", "--seed", seed, "--out", out, "lines.txt"});
    INFO(o);
    REQUIRE(o.code == 0);
    CHECK_THAT(o.out,
               Contains(out + ": ") && Contains("30 documents") && Contains(val + ": ") && Contains("10 documents"));
  };
  encode("5", "t1.bin", "v1.bin");
  encode("5", "t2.bin", "v2.bin");
  encode("6", "t3.bin", "v3.bin");
  CHECK(read_bytes(dir.file("t1.bin")) == read_bytes(dir.file("t2.bin")));
  CHECK(read_bytes(dir.file("v1.bin")) == read_bytes(dir.file("v2.bin")));
  CHECK(read_bytes(dir.file("v1.bin")) != read_bytes(dir.file("v3.bin")));
  // Without an eos the documents are joined by the newline that separated them; the validation
  // documents are the first 10 of the seeded partial Fisher-Yates shuffle of the 40.
  std::vector<std::size_t> index(40);
  for (std::size_t k = 0; k < 40; ++k) index[k] = k;
  xgrad::Generator gen(5);
  for (std::size_t k = 0; k < 10; ++k) std::swap(index[k], index[k + gen.below(40 - k)]);
  std::vector<std::size_t> val_docs(index.begin(), index.begin() + 10);
  std::sort(val_docs.begin(), val_docs.end());
  std::vector<std::string> want_val, want_train;
  for (std::size_t k = 0; k < 40; ++k)
    (std::binary_search(val_docs.begin(), val_docs.end(), k) ? want_val : want_train).push_back(lines[k]);
  CHECK(split(text_of(dir.file("v1.bin")), '\n') == want_val);
  CHECK(split(text_of(dir.file("t1.bin")), '\n') == want_train);
  CHECK(TokenFile(dir.file("v1.bin")).header().documents == 10);
}

TEST_CASE("xgrad-tokenize encode --separator splits files into documents at the separator", "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  write_bytes(dir.file("s.txt"), "one<|sep|>two<|sep|>three<|sep|>");
  const Outcome o = tool(dir, {"encode", "--tokenizer", "bytes", "--separator", "<|sep|>", "--out", "t.bin", "s.txt"});
  INFO(o);
  REQUIRE(o.code == 0);
  CHECK(TokenFile(dir.file("t.bin")).header().documents == 3);  // the final separator starts no document
  CHECK(text_of(dir.file("t.bin")) == "one<|sep|>two<|sep|>three");
}

TEST_CASE("bad input: xgrad-tokenize encode on a full disk exits 1, leaving the earlier file and no temporary",
          "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  write_bytes(dir.file("big.txt"), std::string(3 << 20, 'a'));
  write_bytes(dir.file("t.bin"), "earlier");
  xgrad::testing::Limits limits;
  limits.file_size = 1 << 20;  // writes past 1 MiB fail with EFBIG, as on a full disk
  const Outcome o = xgrad::testing::run_program(
      dir, XGRAD_TOKENIZE_EXE, {"encode", "--tokenizer", "bytes", "--out", "t.bin", "big.txt"}, limits);
  INFO(o);
  CHECK(o.exited);
  CHECK(o.code == 1);
  CHECK_THAT(o.err,
             Contains("xgrad-tokenize") && Contains("t.bin") && Contains("File too large") && Contains("unchanged"));
  CHECK(read_bytes(dir.file("t.bin")) == "earlier");
  CHECK(dir.entries() == std::set<std::string>{"big.txt", "t.bin", ".stdout", ".stderr"});
}

TEST_CASE("xgrad-tokenize with GPT-2's tokenizer: documents joined by its end-of-text id, ids as the library gives",
          "[text][tool][gemm][long]") {
  TempDir dir("xgrad_tokenize_gpt2");
  const std::string gpt2 = std::string(XGRAD_FIXTURE_DIR) + "/gpt2_tokenizer";
  const auto tokenizer = load_tokenizer("gpt2", gpt2);
  const std::string a = "Hello world, 北京!\n", b = "It's <|endoftext|> as text.";
  write_bytes(dir.file("a.txt"), a);
  write_bytes(dir.file("b.txt"), b);
  const Outcome o = tool(dir, {"encode", "--tokenizer", "gpt2", gpt2, "--out", "train.bin", "a.txt", "b.txt"});
  INFO(o);
  REQUIRE(o.code == 0);
  const TokenFile file(dir.file("train.bin"));
  file.check_tokenizer(tokenizer->identity());
  CHECK(file.header().eos == 50256);
  CHECK(file.header().documents == 2);
  TokenIds want = tokenizer->encode(a);
  want.push_back(50256);
  for (std::int64_t id : tokenizer->encode(b)) want.push_back(id);  // its <|endoftext|> is text, not 50256
  CHECK(file.read_ids(0, file.size()) == want);
  CHECK(std::count(want.begin(), want.end(), 50256) == 1);

  Outcome ids = tool(dir, {"ids", "--tokenizer", "gpt2", gpt2, "Hello world"});
  CHECK(ids.out == "[15496,995]\n");
  ids = tool(dir, {"ids", "--tokenizer", "gpt2", gpt2, "--special", "match", "a<|endoftext|>b"});
  CHECK(ids.out == "[64,50256,65]\n");
  const Outcome text = tool(dir, {"decode", "--tokenizer", "gpt2", gpt2, "[15496,995]"});
  CHECK(text.out == "Hello world");
}

TEST_CASE("xgrad-tokenize with a Hugging Face tokenizer folder: Mistral's ids in a token file, and back",
          "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize_hf");
  const std::string mistral = std::string(XGRAD_HF_TOKENIZERS_DIR) + "/mistral";
  write_bytes(dir.file("a.txt"), "The quick brown fox jumps over the lazy dog.");
  const Outcome o = tool(dir, {"encode", "--tokenizer", "hf", mistral, "--out", "train.bin", "a.txt"});
  INFO(o);
  REQUIRE(o.code == 0);
  const TokenFile file(dir.file("train.bin"));
  file.check_tokenizer(load_tokenizer("hf", mistral)->identity());
  // Hugging Face's ids for this text (its JavaScript implementation, as the fixtures were made),
  // without the template's <s>.
  CHECK(file.read_ids(0, file.size()) ==
        TokenIds{415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 28723});
  CHECK(file.header().eos == 2);  // tokenizer_config.json's eos_token, </s>
  const Outcome ids = tool(dir, {"ids", "--tokenizer", "hf", mistral, "--special", "match", "<s>Hi"});
  CHECK(ids.out == "[1,15359]\n");
  const Outcome text = tool(dir, {"decode", "--tokenizer", "hf", mistral, "[1,15359]"});
  CHECK(text.out == "<s> Hi");  // Hugging Face's Metaspace decoder strips only the first token's space
}

TEST_CASE("xgrad-tokenize ids and decode: text to a JSON array of ids and back to the raw bytes",
          "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  Outcome o = tool(dir, {"ids", "--tokenizer", "bytes", "h\xc3\xa9!"});
  INFO(o);
  CHECK(o.code == 0);
  CHECK(o.out == "[104,195,169,33]\n");
  write_bytes(dir.file("t.txt"), "ab\n");
  o = tool(dir, {"ids", "--tokenizer=bytes", "--special", "match", "--file", "t.txt"});
  CHECK(o.out == "[97,98,10]\n");
  o = tool(dir, {"decode", "--tokenizer", "bytes", "[104, 195,169, 255, 0]"});
  CHECK(o.code == 0);
  CHECK(o.out == std::string("h\xc3\xa9\xff\0", 5));
  write_bytes(dir.file("ids.json"), "[97, 98]\n");
  o = tool(dir, {"decode", "--tokenizer", "bytes", "--file", "ids.json"});
  CHECK(o.out == "ab");
  o = tool(dir, {"decode", "--tokenizer", "bytes", "[]"});
  CHECK(o.code == 0);
  CHECK(o.out.empty());
  o = tool(dir, {"--help"});
  CHECK(o.code == 0);
  CHECK_THAT(o.out, Contains("encode") && Contains("decode") && Contains("info"));
}

// A SentencePiece model whose pieces join words across spaces cannot encode a long document in
// parts without changing ids; the refusal names the document's file.
TEST_CASE("bad input: xgrad-tokenize names the file of a document its tokenizer refuses", "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize_spm");
  const std::string train = read_bytes(std::string(XGRAD_FIXTURE_DIR) + "/sentencepiece/train.txt");
  write_bytes(dir.file("train.txt"), train);
  train_sentencepiece({dir.file("train.txt")},
                      SentencePieceTrainerOptions(1000).model_type("bpe").split_by_whitespace(false),
                      dir.file("joined.model"));
  std::string big;
  while (big.size() < (std::size_t{1} << 19)) big += train;
  write_bytes(dir.file("big.txt"), big);
  check_refused(dir, {"encode", "--tokenizer", "spm", "joined.model", "--out", "t.bin", "train.txt", "big.txt"},
                "xgrad-tokenize: encoding 'big.txt' (document 1 of 1): SentencePieceTokenizer::encode: a text of " +
                    std::to_string(big.size()) + " bytes is more than this model encodes at once");
}

TEST_CASE("bad input: xgrad-tokenize exits 1 with one line and writes nothing", "[text][tool][gemm]") {
  TempDir dir("xgrad_tokenize");
  write_bytes(dir.file("a.txt"), "some text\nmore\n");
  write_bytes(dir.file("empty.txt"), "");
  write_bytes(dir.file("old.bin"), "earlier");
  const std::vector<std::string> enc{"encode", "--tokenizer", "bytes"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = enc;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  check_refused(dir, with({"--out", "t.bin", "missing.txt"}), "'missing.txt': No such file");
  check_refused(dir, with({"--out", "t.bin", "."}), "it is a folder");
  check_refused(dir, with({"--out", "a.txt", "a.txt"}), "--out 'a.txt' is the same file as the text file 'a.txt'");
  check_refused(dir, with({"--out", "./a.txt", "a.txt"}), "is the same file as the text file 'a.txt'");
  check_refused(dir, with({"--out", "t.bin", "--val", "a.txt", "a.txt"}), "--val 'a.txt' is the same file as");
  check_refused(dir, with({"--out", "t.bin", "--val", "t.bin", "a.txt"}),
                "--val 't.bin' is the same file as --out 't.bin': one would overwrite the other");
  check_refused(dir, with({"--out", "no/t.bin", "a.txt"}), "no/t.bin");
  check_refused(dir, with({"--out", ".", "a.txt"}), "cannot write '.'");
  check_refused(dir, with({"--out", "t.bin", "empty.txt"}),
                "encode --out 't.bin' would hold no tokens: its 1 document, from 'empty.txt', is empty (the input "
                "has no text)");
  check_refused(dir, with({"--out", "old.bin", "--split-lines", "empty.txt"}),
                "encode --out 'old.bin' would hold no tokens: no document goes to it (the input has no text)");
  {  // a seed that puts the empty file in the validation file
    std::uint64_t seed = 0;
    while (true) {
      xgrad::Generator gen(seed);
      if (draw_below(gen, 2) == 1) break;
      ++seed;
    }
    check_refused(dir,
                  with({"--out", "t.bin", "--val", "v.bin", "--val-fraction", "0.5", "--seed", std::to_string(seed),
                        "a.txt", "empty.txt"}),
                  "encode --val 'v.bin' would hold no tokens: its 1 document, from 'empty.txt', is empty (another "
                  "--seed or --val-fraction chooses others)");
  }
  check_refused(dir, with({"--out", "t.bin", "--val", "v.bin", "a.txt"}),
                "gives 0 validation documents");  // one document
  check_refused(dir, with({"--out", "t.bin", "--val", "v.bin", "--val-fraction", "0.9", "--split-lines", "a.txt"}),
                "gives 2 validation documents");
  check_refused(dir, with({"--out", "t.bin", "--val", "v.bin", "--val-fraction", "1.5", "a.txt"}),
                "--val-fraction '1.5' is not a number in (0, 1)");
  check_refused(dir, with({"--out", "t.bin", "--val", "v.bin", "--val-fraction", "nan", "a.txt"}), "--val-fraction");
  check_refused(dir, with({"--out", "t.bin", "--val", "v.bin", "--seed", "-1", "a.txt"}), "--seed '-1'");
  check_refused(dir, with({"--out", "t.bin", "--seed", "3", "a.txt"}), "they need --val");
  check_refused(dir, with({"--out", "t.bin", "--split-lines", "--separator", "x", "a.txt"}), "excludes");
  check_refused(dir, with({"--out", "t.bin", "--separator", "", "a.txt"}), "--separator is empty");
  check_refused(dir, with({"--out", "t.bin", "--special", "maybe", "a.txt"}), "--special maybe");
  check_refused(dir, with({"--out", "t.bin"}), "files is required");
  check_refused(dir, {"encode", "--out", "t.bin", "a.txt"}, "--tokenizer is required");
  check_refused(dir, {"encode", "--tokenizer", "words", "x", "--out", "t.bin", "a.txt"}, "unknown tokenizer \"words\"");
  check_refused(dir, {"encode", "--tokenizer", "gpt2", "missing_dir", "--out", "t.bin", "a.txt"}, "gpt2");
  check_refused(dir, {"encode", "--out", "t.bin", "a.txt", "--tokenizer", "spm"}, "the spm tokenizer needs a path");
  check_refused(dir, {"ids", "--tokenizer", "bytes"}, "give the text or --file F");
  check_refused(dir, {"ids", "--tokenizer", "bytes", "--file", "a.txt", "text"}, "give the text or --file F");
  check_refused(dir, {"ids", "--tokenizer", "bytes", "--file", "nope.txt"}, "nope.txt");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[1, 2"}, "the list of ids is not JSON");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "{\"a\": 1}"}, "a JSON array of integers, not a object");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[1, 2.5]"}, "the element at position 1 is 2.5");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[1, \"a\"]"}, "position 1 is \"a\"");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[18446744073709551615]"}, "past 2^63 - 1");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[1, 256]"}, "id 256 at position 1 is outside the vocabulary");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "[-1]"}, "id -1 at position 0");
  check_refused(dir, {"info", "a.txt"}, "is not an xgrad token file");
  check_refused(dir, {"info", "old.bin"}, "truncated");
  check_refused(dir, {"info", "missing.bin"}, "No such file");
  check_refused(dir, {"info"}, "file is required");
  check_refused(dir, {}, "A subcommand is required");
  check_refused(dir, {"frobnicate"}, "unknown command 'frobnicate'");
  CHECK(read_bytes(dir.file("old.bin")) == "earlier");
  // An id past vocab_size inside a token file: info opens it, --check names the position.
  std::string bad = read_bytes(dir.file("old.bin"));
  write_token_file(dir.file("bad.bin"), {1, 2, 3}, BytesTokenizer().identity());
  bad = read_bytes(dir.file("bad.bin"));
  bad[128 + 2 * 2 + 1] = 1;  // id 2 becomes 259
  write_bytes(dir.file("bad.bin"), bad);
  CHECK(tool(dir, {"info", "bad.bin"}).code == 0);
  check_refused(dir, {"info", "--check", "bad.bin"}, "the token at position 2 (byte 132) is 259");
}

TEST_CASE("bad input: xgrad-tokenize decode of ids nested a million deep exits 1, not with a stack overflow",
          "[text][tool][bad_input][gemm]") {
  TempDir dir("xgrad_tokenize_deep");
  write_bytes(dir.file("deep.json"), "[1, " + std::string(1000000, '[') + std::string(1000000, ']') + "]");
  check_refused(dir, {"decode", "--tokenizer", "bytes", "--file", "deep.json"},
                "the list of ids nests arrays and objects deeper than 64 levels (byte 67)");
}

TEST_CASE("bad input: xgrad-tokenize encode writes over no file of its tokenizer, however spelled",
          "[text][tool][bad_input][gemm]") {
  TempDir dir("xgrad_tokenize_tokenizer_files");
  write_bytes(dir.file("a.txt"), "some text\nmore\n");
  std::filesystem::copy_file(xgrad::testing::fixture_path("sentencepiece/unigram.model"), dir.file("tok.model"));
  std::filesystem::create_symlink("tok.model", dir.file("tok_link.model"));
  std::filesystem::create_directory(dir.file("g"));
  for (const char* f : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(xgrad::testing::fixture_path(std::string("gpt2_tokenizer/") + f),
                               dir.file(std::string("g/") + f));
  std::filesystem::create_symlink("g", dir.file("g_link"));
  const std::string model = read_bytes(dir.file("tok.model")), merges = read_bytes(dir.file("g/merges.txt"));

  check_refused(dir, {"encode", "--tokenizer", "spm", "tok.model", "--out", "tok.model", "a.txt"},
                "--out 'tok.model' is the same file as --tokenizer 'tok.model': writing it would destroy what the run "
                "reads");
  check_refused(dir, {"encode", "--tokenizer", "spm", "tok_link.model", "--out", "./tok.model", "a.txt"},
                "--out './tok.model' is the same file as --tokenizer 'tok_link.model'");
  check_refused(dir, {"encode", "--tokenizer", "gpt2", "g", "--out", "t.bin", "--val", "g/merges.txt", "a.txt"},
                "--val 'g/merges.txt' is the same file as 'merges.txt' in --tokenizer 'g'");
  check_refused(dir, {"encode", "--tokenizer", "gpt2", "./g/", "--out", "g_link/vocab.json", "a.txt"},
                "--out 'g_link/vocab.json' is the same file as 'vocab.json' in --tokenizer './g/'");
  check_refused(dir, {"encode", "--tokenizer", "gpt2", "g", "--out", "g_link/t.bin", "a.txt"},
                "--out 'g_link/t.bin' would be written in --tokenizer 'g', a folder the run reads");
  CHECK(read_bytes(dir.file("tok.model")) == model);
  CHECK(read_bytes(dir.file("g/merges.txt")) == merges);
  // Beside them it writes.
  const Outcome o = tool(dir, {"encode", "--tokenizer", "gpt2", "g", "--out", "t.bin", "a.txt"});
  INFO(o);
  CHECK(o.code == 0);
}

TEST_CASE("bad input: xgrad-tokenize under `ulimit -f` exits 1 naming the error and leaves no temporary",
          "[text][tool][bad_input][gemm]") {
  TempDir dir("xgrad_tokenize_ulimit");
  std::string text;
  while (text.size() < 40000) text += "some words to tokenize, ";
  write_bytes(dir.file("a.txt"), text);
  // The shell sets the limit and leaves SIGXFSZ as it is: by default the signal kills the writer.
  const Outcome o = xgrad::testing::run_program(dir, "/bin/bash",
                                                {"-c", "ulimit -f 20 && exec " + std::string(XGRAD_TOKENIZE_EXE) +
                                                           " encode --tokenizer bytes --out t.bin a.txt"});
  INFO(o);
  CHECK(o.exited);
  CHECK(o.code == 1);
  CHECK_THAT(o.err, Contains("xgrad-tokenize") && Contains("t.bin") && Contains("File too large"));
  for (const std::string& f : dir.entries()) CHECK(f.find(".tmp.") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("t.bin")));
}
