// train_lm --sample's generation flags: --top-p, --min-p and --repetition-penalty give what the
// library's generate gives, --stop ends the sample at a text, the tokenizer's EOS ends it unless
// --ignore-eos, and values out of range are usage errors naming the flag.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/text/tokenizer.hpp"
#include "xgrad/weights/checkpoint.hpp"

using xgrad::testing::Outcome;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

Outcome run(const TempDir& dir, const std::vector<std::string>& args) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", args, {});
}

// A few kilobytes of text.
std::string some_text() {
  std::string t;
  for (int i = 0; i < 120; ++i)
    t +=
        "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog, " + std::to_string(i * i) + "!\n";
  return t;
}

// A checkpoint of a tiny model with a BPE tokenizer that has an EOS (<|endoftext|>), trained once.
std::string trained_checkpoint(const TempDir& dir) {
  write_bytes(dir.file("a.txt"), some_text());
  const std::string ck = dir.file("ck.safetensors");
  require_ok(run(dir, {dir.file("a.txt"),
                       "--train-tokenizer",
                       "300",
                       "--layers",
                       "1",
                       "--d-model",
                       "16",
                       "--heads",
                       "2",
                       "--seq-len",
                       "16",
                       "--batch",
                       "4",
                       "--steps",
                       "30",
                       "--warmup",
                       "1",
                       "--eval-interval",
                       "0",
                       "--eval-batches",
                       "2",
                       "--quiet",
                       "--checkpoint",
                       ck,
                       "--out",
                       dir.path}));
  return ck;
}

// What train_lm --seed 7 prints for `count` tokens of `options` after "The " (the library's
// generate, decoded; an EOS at the end is not printed).
std::string library_sample(const std::string& ck, std::size_t count, xgrad::nn::GenerateOptions options) {
  const auto loaded = xgrad::weights::load_language_model(ck);
  const auto tokenizer = xgrad::text::tokenizer_from_json(loaded.checkpoint.metadata.at("tokenizer"));
  options.seed = 7;  // --seed 7
  std::vector<std::int64_t> ids = loaded.model->generate(tokenizer->encode("The "), count, options);
  if (!options.stop_tokens.empty() && ids.back() == options.stop_tokens[0]) ids.pop_back();
  return tokenizer->decode(ids) + "\n";
}

}  // namespace

TEST_CASE("train_lm --sample's --top-p, --min-p and --repetition-penalty sample what generate does", "[gemm]") {
  TempDir dir("xgrad_lm_sample_flags");
  const std::string ck = trained_checkpoint(dir);
  const auto eos =
      xgrad::text::tokenizer_from_json(xgrad::weights::load_language_model(ck).checkpoint.metadata.at("tokenizer"))
          ->special_tokens()
          .eos;
  REQUIRE(eos);
  auto sample = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"--checkpoint", ck, "--sample", "30", "--seed", "7"};
    a.insert(a.end(), more.begin(), more.end());
    const Outcome o = run(dir, a);
    require_ok(o);
    return o.out;
  };
  xgrad::nn::GenerateOptions o;
  o.stop_tokens = {*eos};
  o.temperature = 0.9f;
  o.top_p = 0.7f;
  o.min_p = 0.1f;
  o.repetition_penalty = 1.3f;
  const std::string filtered =
      sample({"--temperature", "0.9", "--top-p", "0.7", "--min-p", "0.1", "--repetition-penalty", "1.3"});
  CHECK(filtered == library_sample(ck, 30, o));
  // a tiny top-p or a min-p of 1 keeps the most likely token alone: greedy
  const std::string greedy = sample({"--temperature", "0"});
  CHECK(greedy == library_sample(ck, 30, [&] {
          xgrad::nn::GenerateOptions g;
          g.temperature = 0.f;
          g.stop_tokens = {*eos};
          return g;
        }()));
  CHECK(sample({"--temperature", "1.5", "--top-p", "1e-6"}) == greedy);
  CHECK(sample({"--temperature", "1.5", "--min-p", "1"}) == greedy);
  // the penalty changes greedy's text
  const std::string penalized = sample({"--temperature", "0", "--repetition-penalty", "3"});
  CHECK(penalized != greedy);
  xgrad::nn::GenerateOptions p;
  p.temperature = 0.f;
  p.repetition_penalty = 3.f;
  p.stop_tokens = {*eos};
  CHECK(penalized == library_sample(ck, 30, p));

  // --stop: the sample ends with the token that completes the text, which is printed
  REQUIRE(greedy.size() > 20);
  const std::string stop = greedy.substr(8, 3);
  const std::string stopped = sample({"--temperature", "0", "--stop", "@@@@", "--stop", stop});
  INFO("stop '" << stop << "', greedy '" << greedy << "', stopped '" << stopped << "'");
  CHECK(stopped.size() < greedy.size());
  CHECK(greedy.compare(0, stopped.size() - 1, stopped, 0, stopped.size() - 1) == 0);  // less the newline
  const std::size_t match = stopped.find(stop, 4);                                    // after the prompt
  REQUIRE(match != std::string::npos);
  CHECK(match + stop.size() + 1 <= stopped.size());
  CHECK(stopped.back() == '\n');
  CHECK(sample({"--temperature", "0", "--stop", "@@@@"}) == greedy);
}

TEST_CASE("train_lm --sample ends at the tokenizer's EOS, unprinted, unless --ignore-eos", "[gemm]") {
  TempDir dir("xgrad_lm_sample_eos");
  const std::string trained = trained_checkpoint(dir);
  // The same model made to prefer the EOS above every token.
  auto loaded = xgrad::weights::load_language_model(trained);
  const auto tokenizer = xgrad::text::tokenizer_from_json(loaded.checkpoint.metadata.at("tokenizer"));
  const std::int64_t eos = *tokenizer->special_tokens().eos;
  REQUIRE(loaded.model->head->bias.defined());
  loaded.model->head->bias.mutable_value()(eos) = 1e3f;
  const std::string ck = dir.file("eos.safetensors");
  xgrad::weights::save_checkpoint(ck, *loaded.model, loaded.checkpoint.optimizer_state, loaded.checkpoint.metadata);

  const Outcome stops = run(dir, {"--checkpoint", ck, "--sample", "10", "--prompt", "The fox"});
  require_ok(stops);
  CHECK(stops.out == "The fox\n");
  const Outcome goes_on = run(dir, {"--checkpoint", ck, "--sample", "3", "--prompt", "The fox", "--ignore-eos"});
  require_ok(goes_on);
  const std::string marker = tokenizer->decode({eos});
  CHECK(goes_on.out == "The fox" + marker + marker + marker + "\n");
}

TEST_CASE("train_lm refuses sampling flags out of range, naming the flag", "[bad_input][gemm]") {
  TempDir dir("xgrad_lm_sample_bad");
  const std::string ck = dir.file("never.safetensors");  // refused before it is read
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--top-p", "0"}, "--top-p"},
      {{"--top-p", "1.5"}, "--top-p"},
      {{"--top-p", "nan"}, "--top-p"},
      {{"--min-p", "-0.1"}, "--min-p"},
      {{"--min-p", "1.01"}, "--min-p"},
      {{"--repetition-penalty", "0"}, "--repetition-penalty"},
      {{"--repetition-penalty", "-2"}, "--repetition-penalty"},
      {{"--repetition-penalty", "nan"}, "--repetition-penalty"},
      {{"--repetition-penalty", "inf"}, "--repetition-penalty"},
      {{"--stop", ""}, "--stop"},
  };
  for (const auto& [flags, name] : cases) {
    std::vector<std::string> a = {"--checkpoint", ck, "--sample", "5"};
    a.insert(a.end(), flags.begin(), flags.end());
    const Outcome o = run(dir, a);
    INFO(o);
    CHECK(o.code == 2);
    CHECK_THAT(o.err, Catch::StartsWith("train_lm: error: ") && Catch::Contains(name));
    CHECK(o.out.empty());
  }
}
