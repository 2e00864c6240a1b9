// train_lm with tokenizers and token files: a token file of a text's bytes trains exactly as the
// text does, the checkpoint keeps its tokenizer for --sample and --resume, a BPE trained by
// --train-tokenizer is stored and saved, and --import gpt2 samples GPT-2 text through GPT-2's
// own vocabulary as the library's generate does; a run of other tokens than bytes
// says tokens, not bytes, and shows no byte entropy.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "trainer.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/load_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/torch_import.hpp"

using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

Outcome run(const TempDir& dir, const std::vector<std::string>& args) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", args, {});
}

void require_fails(const Outcome& o, int code, const std::vector<std::string>& parts) {
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == code);
  for (const std::string& p : parts) REQUIRE_THAT(o.err, Catch::Contains(p));
}

// A tiny model of `steps` steps, so each run takes well under a second.
std::vector<std::string> tiny(std::vector<std::string> more, const std::string& steps = "6") {
  std::vector<std::string> a = {"--layers",       "1", "--d-model", "16",  "--heads",  "2", "--seq-len",       "16",
                                "--batch",        "4", "--steps",   steps, "--warmup", "1", "--eval-interval", "3",
                                "--eval-batches", "2", "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::string gpt2_dir() { return xgrad::testing::fixture_path("gpt2_tokenizer"); }

// A few kilobytes of mixed English and Unicode text.
std::string some_text() {
  std::string t;
  for (int i = 0; i < 120; ++i)
    t += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog; naïve café, 北京 " +
         std::to_string(i * i) + "!\n";
  return t;
}

}  // namespace

TEST_CASE("train_lm on a token file of the text's bytes takes exactly the steps of the text run", "[gemm]") {
  TempDir dir("xgrad_lm_tokens");
  const std::string text = some_text();
  write_bytes(dir.file("a.txt"), text);
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("a.bin"), bytes.encode(text), bytes.identity());

  require_ok(run(dir, tiny({dir.file("a.txt"), "--out", dir.file("from_text")})));
  require_ok(run(dir, tiny({"--tokens", dir.file("a.bin"), "--out", dir.file("from_tokens")})));
  const std::string a = read_bytes(dir.file("from_text/log.csv")), b = read_bytes(dir.file("from_tokens/log.csv"));
  REQUIRE(a.size() > 50);
  // The seconds column differs; every loss must be the same.
  auto losses = [](const std::string& csv) {
    std::vector<std::string> rows;
    std::size_t at = 0;
    while (at < csv.size()) {
      const std::size_t end = csv.find('\n', at);
      const std::string line = csv.substr(at, end - at);
      rows.push_back(line.substr(0, line.rfind(',')));
      at = end == std::string::npos ? csv.size() : end + 1;
    }
    return rows;
  };
  CHECK(losses(a) == losses(b));
}

TEST_CASE("train_lm trains through GPT-2's tokenizer, stores it, and --sample decodes with it", "[gemm][long]") {
  TempDir dir("xgrad_lm_gpt2_tok");
  write_bytes(dir.file("a.txt"), some_text());
  const std::string ck = dir.file("ck.safetensors");
  const Outcome trained =
      run(dir, tiny({dir.file("a.txt"), "--tokenizer", "gpt2", gpt2_dir(), "--checkpoint", ck, "--out", dir.path}));
  require_ok(trained);
  CHECK_THAT(trained.out, Catch::Contains("bits/byte"));
  const auto stored = lm::checkpoint_tokenizer(ck);
  const auto gpt2 = xgrad::text::load_tokenizer("gpt2", gpt2_dir());
  REQUIRE(stored->identity() == gpt2->identity());
  CHECK(lm::checkpoint_config(ck).vocab_size == 50257);

  const Outcome sampled = run(dir, {"--checkpoint", ck, "--sample", "12", "--temperature", "0", "--prompt", "The fox"});
  require_ok(sampled);
  const auto loaded = xgrad::weights::load_language_model(ck);
  xgrad::Generator gen(0);
  const auto ids = loaded.model->generate(gpt2->encode("The fox"), 12, {0.f, 0}, gen);
  REQUIRE(ids.size() == gpt2->encode("The fox").size() + 12);
  CHECK(sampled.out == gpt2->decode(ids) + "\n");

  // --resume continues with the stored tokenizer, and refuses another one.
  require_ok(run(dir, tiny({dir.file("a.txt"), "--resume", "--checkpoint", ck, "--out", dir.path}, "8")));
  CHECK(lm::checkpoint_tokenizer(ck)->identity() == gpt2->identity());
  const Outcome other = run(
      dir, tiny({dir.file("a.txt"), "--resume", "--checkpoint", ck, "--out", dir.path, "--tokenizer", "bytes"}, "10"));
  INFO(other);
  CHECK(other.code == 2);
  CHECK_THAT(other.err, Catch::Contains("vocab") || Catch::Contains("tokenizer"));
}

TEST_CASE("train_lm trains through a Hugging Face tokenizer folder, stores it, and --sample decodes with it",
          "[gemm]") {
  TempDir dir("xgrad_lm_hf_tok");
  write_bytes(dir.file("a.txt"), some_text());
  const std::string ck = dir.file("ck.safetensors"), mistral = std::string(XGRAD_HF_TOKENIZERS_DIR) + "/mistral";
  require_ok(run(dir, tiny({dir.file("a.txt"), "--tokenizer", "hf", mistral, "--checkpoint", ck, "--out", dir.path})));
  const auto hf = xgrad::text::load_tokenizer("hf", mistral);
  REQUIRE(lm::checkpoint_tokenizer(ck)->identity() == hf->identity());
  CHECK(lm::checkpoint_config(ck).vocab_size == 32000);
  const Outcome sampled = run(dir, {"--checkpoint", ck, "--sample", "8", "--temperature", "0", "--prompt", "The fox"});
  require_ok(sampled);
  const auto loaded = xgrad::weights::load_language_model(ck);
  xgrad::Generator gen(0);
  const auto ids = loaded.model->generate(hf->encode("The fox"), 8, {0.f, 0}, gen);
  CHECK(sampled.out == hf->decode(ids) + "\n");
}

TEST_CASE("train_lm --train-tokenizer trains a BPE on the training text, stores it and saves it", "[gemm]") {
  TempDir dir("xgrad_lm_bpe");
  write_bytes(dir.file("a.txt"), some_text());
  const std::string ck = dir.file("ck.safetensors");
  const Outcome trained = run(dir, tiny({dir.file("a.txt"), "--train-tokenizer", "300", "--save-tokenizer",
                                         dir.file("bpe"), "--checkpoint", ck, "--out", dir.path}));
  require_ok(trained);
  CHECK_THAT(trained.out, Catch::Contains("a byte-level BPE of 300 tokens"));
  const auto stored = lm::checkpoint_tokenizer(ck);
  CHECK(stored->kind() == "byte_bpe");
  CHECK(stored->vocab_size() == 300);
  const auto saved = xgrad::text::load_tokenizer("bpe", dir.file("bpe"));
  CHECK(saved->encode(some_text()) == stored->encode(some_text()));
  CHECK(stored->encode(some_text()).size() < some_text().size() * 2 / 3);  // it merges
  const Outcome sampled = run(dir, {"--checkpoint", ck, "--sample", "5", "--temperature", "0"});
  require_ok(sampled);
  CHECK(sampled.out.rfind("The ", 0) == 0);
}

TEST_CASE("train_lm's validation loss in bits per byte is the loss in nats over ln 2 for bytes", "[gemm]") {
  TempDir dir("xgrad_lm_bpb");
  write_bytes(dir.file("a.txt"), some_text());
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("a.bin"), bytes.encode(some_text()), bytes.identity());
  const Outcome o = run(dir, tiny({"--tokens", dir.file("a.bin"), "--out", dir.path}));
  require_ok(o);
  double nats = 0, bits = 0;
  const auto at = o.out.find("validation loss ");
  REQUIRE(at != std::string::npos);
  REQUIRE(std::sscanf(o.out.c_str() + at, "validation loss %lf nats/token, %lf bits/byte", &nats, &bits) == 2);
  CHECK(bits == Approx(nats / std::log(2.0)).epsilon(2e-3));
}

TEST_CASE("train_lm --sample --import gpt2 with GPT-2's vocabulary samples what the library generates", "[gemm]") {
  TempDir dir("xgrad_lm_import_vocab");
  // A random GPT-2 of GPT-2's vocabulary: the small fixture's weights with a token table of 50257 rows.
  xgrad::NamedArrays tensors = xgrad::load_safetensors(xgrad::testing::fixture_path("import_gpt2.safetensors")).tensors;
  xgrad::Generator gen(5);
  for (auto& [name, a] : tensors) {
    if (name == "wte.weight") a = gen.normal({50257, a.shape()[1]}, 0.f, 0.5f);
  }
  const std::string path = dir.file("gpt2_vocab.safetensors");
  xgrad::save_safetensors(path, tensors);
  const std::string prompt = "Hello, world! 北京";
  const Outcome o = run(dir, {"--sample", "20", "--checkpoint", path, "--import", "gpt2", "--heads", "2", "--tokenizer",
                              "gpt2", gpt2_dir(), "--temperature", "0", "--prompt", prompt});
  require_ok(o);
  const auto tokenizer = xgrad::text::load_tokenizer("gpt2", gpt2_dir());
  const xgrad::weights::ImportedLanguageModel imported =
      xgrad::weights::from_gpt2(xgrad::load_safetensors(path).tensors, 2);
  xgrad::nn::LanguageModel model(imported.options);
  xgrad::weights::load_state_dict(model, imported.state);
  xgrad::Generator sampling(0);
  const auto ids = model.generate(tokenizer->encode(prompt), 20, {0.f, 0}, sampling);
  REQUIRE(ids.size() == tokenizer->encode(prompt).size() + 20);
  CHECK(o.out == tokenizer->decode(ids) + "\n");

  // Without GPT-2's files the vocabulary does not fit the bytes tokenizer.
  require_fails(run(dir, {"--sample", "5", "--checkpoint", path, "--import", "gpt2", "--heads", "2"}), 2,
                {"vocabulary of 50257", "--tokenizer gpt2 DIR"});
}

TEST_CASE("train_lm refuses tokenizer and token-file flags that cannot work together", "[bad_input][gemm]") {
  TempDir dir("xgrad_lm_text_bad");
  write_bytes(dir.file("a.txt"), some_text());
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("a.bin"), bytes.encode(some_text()), bytes.identity());
  require_fails(run(dir, tiny({dir.file("a.txt"), "--tokens", dir.file("a.bin")})), 2, {"--tokens", "unused"});
  require_fails(run(dir, tiny({"--valid-tokens", dir.file("a.bin")})), 2,
                {"--valid-tokens is for training from --tokens"});
  require_fails(run(dir, tiny({"--tokens", dir.file("a.bin"), "--train-tokenizer", "300"})), 2,
                {"--train-tokenizer", "already tokenized"});
  require_fails(run(dir, tiny({dir.file("a.txt"), "--tokenizer", "gpt2", gpt2_dir(), "--train-tokenizer", "300"})), 2,
                {"give one"});
  require_fails(run(dir, tiny({dir.file("a.txt"), "--save-tokenizer", dir.file("t")})), 2,
                {"--save-tokenizer saves the tokenizer --train-tokenizer trains"});
  require_fails(run(dir, tiny({dir.file("a.txt"), "--tokenizer", "wordpiece", "x"})), 2, {"unknown tokenizer"});
  require_fails(run(dir, tiny({dir.file("a.txt"), "--tokenizer", "gpt2"})), 2, {"needs a path"});
  require_fails(run(dir, tiny({dir.file("a.txt"), "--tokenizer", "gpt2", dir.file("missing")})), 2, {"missing"});
  require_fails(run(dir, {"--sample", "5", "--checkpoint", dir.file("ck.safetensors"), "--tokenizer", "bytes"}), 2,
                {"--sample uses the tokenizer the checkpoint stores"});
  // A token file made by another tokenizer than the one named.
  require_fails(run(dir, tiny({"--tokens", dir.file("a.bin"), "--tokenizer", "gpt2", gpt2_dir()})), 2,
                {"a.bin", "bytes"});
  // The token file is an input: --checkpoint may not overwrite it.
  const std::string before = read_bytes(dir.file("a.bin"));
  require_fails(run(dir, tiny({"--tokens", dir.file("a.bin"), "--checkpoint", dir.file("a.bin")})), 2, {"a.bin"});
  CHECK(read_bytes(dir.file("a.bin")) == before);
}

TEST_CASE("train_lm's summary speaks of tokens, and of no byte entropy, for a tokenizer other than bytes", "[gemm]") {
  TempDir dir("xgrad_lm_token_words");
  write_bytes(dir.file("a.txt"), some_text());
  const Outcome bpe = run(dir, tiny({dir.file("a.txt"), "--train-tokenizer", "300", "--out", dir.path}));
  require_ok(bpe);
  CHECK_THAT(bpe.out, Catch::Contains("6 steps of 4 x 16 tokens\n"));
  CHECK_THAT(bpe.out, !Catch::Contains("unigram entropy"));
  CHECK_THAT(bpe.out,
             Catch::Contains("text: " + dir.file("a.txt") + ", " + std::to_string(some_text().size()) + " bytes\n"));
  const Outcome bytes = run(dir, tiny({dir.file("a.txt"), "--out", dir.path}));
  require_ok(bytes);
  CHECK_THAT(bytes.out, Catch::Contains("6 steps of 4 x 16 bytes\n"));
  CHECK_THAT(bytes.out, Catch::Contains(" bytes, unigram entropy "));
}

TEST_CASE("train_lm --train-tokenizer on a text with fewer pairs than asked says so and trains the smaller vocabulary",
          "[bad_input][gemm]") {
  TempDir dir("xgrad_lm_text_few_pairs");
  // Every piece of GPT-2's pattern is one byte ("a", "!", "b", "?"): no pair to merge at all.
  std::string text;
  for (int i = 0; i < 300; ++i) text += "a!b?";
  write_bytes(dir.file("a.txt"), text);
  const Outcome o = run(dir, tiny({dir.file("a.txt"), "--train-tokenizer", "400", "--checkpoint", dir.file("c.st")}));
  require_ok(o);
  // 256 bytes and <|endoftext|>.
  CHECK_THAT(o.out, Catch::Contains("a byte-level BPE of 257 tokens (of 400 asked: no pair left occurs twice)"));
  CHECK(lm::checkpoint_tokenizer(dir.file("c.st"))->vocab_size() == 257);
}
