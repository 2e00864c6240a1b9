// train_lm --init-from: fine-tuning a Hugging Face folder of any family (made here by
// weights::save_hf_model), its checkpoint resumed and sampled with no architecture flags, the model
// written back with --save-hf; and what the flags refuse, before any work.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/hf_import.hpp"

using namespace xgrad;
using testing::Outcome;
using testing::TempDir;

namespace {

// A tiny run: these settings, but for those `args` gives.
Outcome train_lm(const TempDir& dir, std::vector<std::string> args) {
  const std::vector<std::pair<std::string, std::string>> run = {
      {"--seq-len", "16"}, {"--batch", "4"},        {"--text-bytes", "20000"}, {"--dropout", "0"},
      {"--warmup", "1"},   {"--eval-batches", "2"}, {"--eval-interval", "10"}};
  for (const auto& [flag, value] : run) {
    if (std::find(args.begin(), args.end(), flag) == args.end()) args.insert(args.end(), {flag, value});
  }
  args.push_back("--quiet");
  return testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", args);
}

// The "validation loss X" a run prints at its end.
double final_loss(const Outcome& o) {
  const std::size_t at = o.out.find("validation loss ");
  REQUIRE(at != std::string::npos);
  return std::stod(o.out.substr(at + 16));
}

using xgrad::testing::require_ok;
using xgrad::testing::require_usage_error;

// The validation losses of a train_lm log.csv (its third column, where given).
std::vector<double> valid_losses(const std::string& path) {
  std::vector<double> out;
  std::istringstream in(testing::read_bytes(path));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string step, train, valid;
    std::getline(fields, step, ',');
    std::getline(fields, train, ',');
    std::getline(fields, valid, ',');
    if (!valid.empty()) out.push_back(std::stod(valid));
  }
  return out;
}

nn::LanguageModelOptions gemma_like(std::size_t vocab) {
  return nn::LanguageModelOptions::llama_style(vocab, 32, 4, 2, 2)
      .max_len(64)
      .norm(nn::Norm::sandwich)
      .norm_unit_offset(true)
      .activation(nn::Activation::geglu_tanh)
      .qk_norm(true)
      .tie_embeddings(true)
      .embed_scale(std::sqrt(32.f))
      .sliding_window(8)
      .full_attention_layers({1})
      .rope_local_theta(1000.f);
}

}  // namespace

TEST_CASE(
    "train_lm --init-from fine-tunes a Hugging Face folder of any family, resumes and samples its checkpoint, "
    "and --save-hf writes it back",
    "[examples][gemm]") {
  struct Case {
    const char* family;
    nn::LanguageModelOptions options;
  };
  const Case cases[] = {{"llama", nn::LanguageModelOptions::llama_style(256, 32, 4, 2, 2).max_len(64)},
                        {"gemma3_text", gemma_like(256)}};
  for (const Case& c : cases) {
    SECTION(c.family) {
      TempDir dir("xgrad_train_lm_init_from");
      Generator gen(3);
      nn::LanguageModel model(c.options, gen);
      const std::string init = dir.file("init");
      weights::save_hf_model(model, init);

      // At a learning rate of 1e-30 the run writes back the folder's weights (a fresh draw would not).
      const Outcome unchanged =
          train_lm(dir, {"--init-from", init, "--tokenizer", "bytes", "--steps", "2", "--lr", "1e-30", "--min-lr", "0",
                         "--save-hf", dir.file("same"), "--out", dir.file("o1")});
      require_ok(unchanged);
      const auto back = weights::load_hf_model(dir.file("same"));
      CHECK(testing::read_bytes(dir.file("same/config.json")).find(c.family) != std::string::npos);
      const auto want = model.named_parameters(), got = back->named_parameters();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        INFO(want[i].first);
        CHECK(xt::amax(xt::abs(got[i].second.value() - want[i].second.value()))() < 1e-20f);
      }

      // A fine-tune: the validation loss falls; --resume and --sample need no flags.
      const std::string ck = dir.file("ck.safetensors");
      const Outcome trained = train_lm(dir, {"--init-from", init, "--tokenizer", "bytes", "--steps", "30", "--lr",
                                             "3e-3", "--checkpoint", ck, "--out", dir.file("o2")});
      require_ok(trained);
      CHECK_THAT(trained.out, Catch::Contains("model: --arch imported, 2 layers, d_model 32, 4 heads"));
      // from the imported model's loss (about ln 256) to well below it
      CHECK(final_loss(trained) < final_loss(unchanged) - 1.0);
      CHECK(valid_losses(dir.file("o2/log.csv")).size() == 3);
      const Outcome resumed =
          train_lm(dir, {"--steps", "40", "--lr", "3e-3", "--checkpoint", ck, "--resume", "--out", dir.file("o3")});
      require_ok(resumed);
      CHECK_THAT(resumed.out, Catch::Contains("resuming at step 30"));
      const Outcome sampled = testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm",
                                                   {"--checkpoint", ck, "--sample", "10", "--temperature", "0"});
      require_ok(sampled);
      CHECK(sampled.out.rfind("The ", 0) == 0);
      require_usage_error(testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm",
                                               {"--checkpoint", ck, "--sample", "5", "--layers", "3"}),
                          {"--layers does not apply: --sample: '" + ck + "' fine-tunes --init-from"});
    }
  }
}

TEST_CASE(
    "train_lm --init-from refuses architecture flags, a missing tokenizer, a larger vocabulary, --resume and an "
    "output in its folder, before any work",
    "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_train_lm_init_from_bad");
  Generator gen(4);
  const std::string init = dir.file("init"), small = dir.file("small");
  weights::save_hf_model(nn::LanguageModel(nn::LanguageModelOptions::llama_style(256, 32, 4, 2, 2).max_len(64), gen),
                         init);
  weights::save_hf_model(nn::LanguageModel(nn::LanguageModelOptions::llama_style(100, 32, 4, 2, 2).max_len(64), gen),
                         small);
  require_usage_error(train_lm(dir, {"--init-from", init, "--tokenizer", "bytes", "--layers", "3"}),
                      {"--layers does not apply to --init-from: '" + init + "/config.json' fixes the architecture"});
  require_usage_error(train_lm(dir, {"--init-from", init}),
                      {"--init-from '" + init + "' holds no tokenizer.json: name the tokenizer with --tokenizer"});
  require_usage_error(train_lm(dir, {"--init-from", small, "--tokenizer", "bytes"}),
                      {"the tokenizer's 256 tokens are more than the 100 rows of --init-from"});
  require_usage_error(train_lm(dir, {"--init-from", init, "--tokenizer", "bytes", "--seq-len", "65"}),
                      {"--seq-len 65 is more than the 64 positions of --init-from"});
  require_usage_error(train_lm(dir, {"--init-from", init, "--resume", "--checkpoint", dir.file("ck")}),
                      {"--init-from starts a run from a folder; --resume continues --checkpoint's"});
  require_usage_error(train_lm(dir, {"--init-from", init, "--tokenizer", "bytes", "--save-hf", init}),
                      {"--init-from", "--save-hf"});
  // A model no Hugging Face family describes cannot be written back: said before training.
  const Outcome classic = train_lm(dir, {"--steps", "2", "--save-hf", dir.file("classic")});
  INFO(classic);
  CHECK(classic.code != 0);
  CHECK_THAT(classic.err, Catch::Contains("no Hugging Face family describes this model"));
  CHECK_FALSE(std::filesystem::exists(dir.file("train_lm_out/log.csv")));
}
