// The language-model example in small: validation loss falls well below the text's unigram
// entropy, and a run resumed from a checkpoint continues with exactly the same losses; the
// program's --arch presets and architecture flags, run as a user runs them.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "trainer.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace lm;
using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;

namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.layers = 1;
  c.d_model = 64;
  c.heads = 4;
  c.seq_len = 32;
  c.batch = 8;
  c.steps = 500;
  c.warmup = 40;
  c.lr = 5e-3f;
  c.min_lr = 5e-4f;
  c.eval_interval = 100;
  c.eval_batches = 4;
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("xgrad_test_train_lm_" + name)).string();
}

Outcome train_lm(const TempDir& dir, const std::vector<std::string>& args) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", args);
}

// The training settings of a tiny run (no architecture flag among them); each run is well under a second.
std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> a = {"--seq-len", "16", "--batch", "4",    "--text-bytes", "20000", "--eval-batches", "2",
                                "--dropout", "0",  "--lr",    "1e-2", "--warmup",     "2",     "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// The tiny model's sizes.
std::vector<std::string> sizes(std::vector<std::string> more) {
  std::vector<std::string> a = {"--layers", "1", "--d-model", "16", "--heads", "2"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// (step, train loss, validation loss or NaN) of every row of a train_lm log.csv.
std::vector<std::array<double, 3>> log_rows(const std::string& path) {
  std::vector<std::array<double, 3>> rows;
  std::istringstream in(read_bytes(path));
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string step, train, valid;
    std::getline(fields, step, ',');
    std::getline(fields, train, ',');
    std::getline(fields, valid, ',');
    rows.push_back({std::stod(step), std::stod(train), valid.empty() ? std::nan("") : std::stod(valid)});
  }
  return rows;
}

using xgrad::testing::require_ok;
using xgrad::testing::require_usage_error;

}  // namespace

TEST_CASE("the byte-level model learns the built-in text well below its unigram entropy", "[gemm][long]") {
  const std::string text = grammar_text(60000, 7);
  const double unigram = unigram_entropy(text);
  REQUIRE(unigram > 2.5);  // the bar is meaningful: about 20 distinct letters in use
  Trainer trainer(small_config(), split(text, 0.1, 32));
  const float before = trainer.validation_loss();
  CHECK(before > 0.9 * std::log(256.0));  // an untrained model is near uniform over bytes
  trainer.run(trainer.config().steps);
  const float after = trainer.validation_loss();
  INFO("validation loss " << after << ", unigram entropy " << unigram);
  REQUIRE(after < 0.5 * unigram);
}

// train_lm's documented default run (TrainConfig's defaults on its 200 kB built-in text, as
// `train_lm` with no flags trains): the same seed in fp32 and with bf16 products, the engine chosen
// per product as a user runs it. With an engine forced (XGRAD_GEMM, the engine passes of
// scripts/run_tests.sh) and under AddressSanitizer, the learning test's smaller settings above:
// the same comparison on each engine at a smaller size.
TEST_CASE("train_lm's default run in bf16 ends within 1% of the fp32 run's validation loss on the same seed",
          "[bf16][gemm][long]") {
  const bool reduced = xgrad::testing::kAddressSanitizer || std::getenv("XGRAD_GEMM") != nullptr;
  const TrainConfig config = reduced ? small_config() : TrainConfig{};
  const std::string text = reduced ? grammar_text(60000, 7) : grammar_text(200000, 12345);
  float valid[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    Trainer trainer(config, split(text, config.valid_fraction, config.seq_len));
    trainer.set_precision(i == 0 ? xgrad::Precision::fp32 : xgrad::Precision::bf16);
    trainer.run(trainer.config().steps);
    valid[i] = trainer.validation_loss();
    REQUIRE(xgrad::autocast_precision() == xgrad::Precision::fp32);  // no guard left open
  }
  INFO("validation loss fp32 " << valid[0] << ", bf16 " << valid[1]);
  CHECK(valid[0] != valid[1]);  // the products really were bf16
  REQUIRE(std::abs(valid[1] - valid[0]) <= 0.01 * valid[0]);
}

TEST_CASE("a resumed run continues with exactly the losses of an uninterrupted one", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 40;
  c.warmup = 10;
  c.eval_interval = 10;
  c.dropout = 0.1f;  // the dropout generator's state must be restored too
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("resume.safetensors");

  Trainer straight(c, split(text, 0.1, c.seq_len));
  straight.run(c.steps);

  Trainer first(c, split(text, 0.1, c.seq_len));
  first.run(20);
  first.save(path);
  Trainer second(c, split(text, 0.1, c.seq_len));
  second.resume(path);
  REQUIRE(second.step() == 20);
  second.run(c.steps);
  std::filesystem::remove(path);

  const auto& a = straight.log();
  const auto& b = second.log();
  REQUIRE(a.size() == 40);
  REQUIRE(b.size() == 20);
  for (std::size_t i = 0; i < b.size(); ++i) {
    INFO("step " << b[i].step);
    REQUIRE(b[i].step == a[20 + i].step);
    REQUIRE(b[i].train_loss == a[20 + i].train_loss);  // bitwise
    REQUIRE(b[i].valid_loss == a[20 + i].valid_loss);
  }
  const auto pa = straight.model().named_parameters(), pb = second.model().named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i].second.value() == pb[i].second.value());
}

TEST_CASE("resume refuses a checkpoint with other settings and a file that is not one", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 5;
  c.warmup = 1;
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("settings.safetensors");
  Trainer a(c, split(text, 0.1, c.seq_len));
  a.run(2);
  a.save(path);
  TrainConfig other = c;
  other.d_model = 32;
  Trainer b(other, split(text, 0.1, c.seq_len));
  REQUIRE_THROWS_WITH(b.resume(path), Catch::Contains("different settings"));
  REQUIRE(b.step() == 0);
  xgrad::save_safetensors(path, {{"w", xgrad::Array({1.f})}});
  REQUIRE_THROWS_WITH(a.resume(path), Catch::Contains("not a train_lm checkpoint"));
  std::filesystem::remove(path);
}

TEST_CASE("a resumed run may extend --steps: the schedule it started with goes on at min_lr", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 12;
  c.warmup = 2;
  c.eval_interval = 0;
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("extend.safetensors");
  Trainer first(c, split(text, 0.1, c.seq_len), identify("grammar", text));
  first.run(c.steps);
  first.save(path);

  TrainConfig longer = c;
  longer.steps = 20;
  Trainer second(longer, split(text, 0.1, c.seq_len), identify("grammar", text));
  second.resume(path);
  REQUIRE(second.step() == 12);
  second.run(longer.steps);
  REQUIRE(second.log().size() == 8);
  for (const LogEntry& e : second.log()) REQUIRE(e.lr == c.min_lr);
  REQUIRE(second.log().back().valid_loss.has_value());  // the last step validates

  // Other data is refused, naming both.
  const std::string other = grammar_text(30000, 4);
  Trainer third(longer, split(other, 0.1, c.seq_len), identify("other", other));
  REQUIRE_THROWS_WITH(third.resume(path),
                      Catch::Contains("other data") && Catch::Contains("'grammar'") && Catch::Contains("'other'"));
  REQUIRE(third.step() == 0);
  std::filesystem::remove(path);
}

TEST_CASE("a NaN loss stops the run before the update, naming the step", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 60;
  c.warmup = 1;
  c.lr = 1e4f;
  c.clip = 0;
  c.eval_interval = 0;
  Trainer trainer(c, split(grammar_text(30000, 3), 0.1, c.seq_len));
  REQUIRE_THROWS_WITH(trainer.run(c.steps), Catch::Contains("train_lm: step ") && Catch::Contains("training stopped"));
  REQUIRE(trainer.step() < c.steps);
  // The weights are those after the last good step: finite.
  for (const auto& [name, p] : trainer.model().named_parameters()) {
    for (float v : p.value()) REQUIRE(std::isfinite(v));
  }
}

TEST_CASE("train_lm --arch llama trains a Llama-style model whose loss falls, with the usual weight-decay groups",
          "[examples][gemm]") {
  TempDir dir("xgrad_train_lm_llama");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(
      train_lm(dir, tiny(sizes({"--arch", "llama", "--steps", "40", "--eval-interval", "20", "--checkpoint", ck}))));
  const auto rows = log_rows(dir.file("train_lm_out/log.csv"));
  REQUIRE(rows.size() == 40);
  INFO("step 1 train " << rows.front()[1] << ", step 40 validation " << rows.back()[2]);
  CHECK(rows.front()[1] > 0.95 * std::log(256.0));  // GPT-2's init: near uniform over bytes
  REQUIRE(rows.back()[2] < rows.front()[1] - 1.5);

  // The checkpoint holds the Llama architecture: 16 / 3 * 8 = 42.7 -> 48; half of 2 heads.
  const xgrad::SafetensorsContents file = xgrad::load_safetensors(ck);
  const auto options = nlohmann::json::parse(file.metadata.at("xgrad.model_options"));
  CHECK(options.at("positional") == "rotary");
  CHECK(options.at("norm_kind") == "rms_norm");
  CHECK(options.at("activation") == "swiglu");
  CHECK(options.at("d_ff") == 48);
  CHECK(options.at("num_kv_heads") == 1);
  CHECK(options.at("qkv_bias") == false);
  CHECK(options.at("head_bias") == false);
  CHECK(options.at("tie_embeddings") == false);
  CHECK(options.at("init") == "gpt2");
  CHECK(nlohmann::json::parse(file.metadata.at("config")).at("arch") == "llama");
  // Two optimizer groups: the matrices decay by --weight-decay, the norms and the embedding not.
  auto scalar = [&](const std::string& name) {
    for (const auto& [n, a] : file.tensors) {
      if (n == name) return static_cast<double>(a.data()[0]);
    }
    FAIL("no tensor " << name);
    return 0.0;
  };
  CHECK(scalar("optimizer:AdamW:groups") == 2);
  CHECK(scalar("optimizer:AdamW:group0:weight_decay") == Approx(0.1));
  CHECK(scalar("optimizer:AdamW:group1:weight_decay") == 0);
  CHECK(scalar("optimizer:AdamW:group_of:blocks.0.attn.w_q.weight") == 0);
  CHECK(scalar("optimizer:AdamW:group_of:blocks.0.ffn.gate.weight") == 0);
  CHECK(scalar("optimizer:AdamW:group_of:head.weight") == 0);
  CHECK(scalar("optimizer:AdamW:group_of:tok_emb.weight") == 1);
  CHECK(scalar("optimizer:AdamW:group_of:blocks.0.attn.norm.weight") == 1);
  CHECK(scalar("optimizer:AdamW:group_of:final_norm.weight") == 1);
}

TEST_CASE("train_lm --resume and --sample of a llama checkpoint need no architecture flags and name contradicting ones",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_train_lm_llama_resume");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(train_lm(dir, tiny(sizes({"--arch", "llama", "--steps", "10", "--checkpoint", ck}))));
  const std::string at_10 = read_bytes(ck);

  // No --arch and no size: the checkpoint's architecture, 10 more steps.
  const Outcome resumed = train_lm(dir, tiny({"--steps", "20", "--checkpoint", ck, "--resume"}));
  require_ok(resumed);
  REQUIRE_THAT(resumed.out, Catch::Contains("model: --arch llama, 1 layers, d_model 16, 2 heads") &&
                                Catch::Contains("resuming at step 10"));
  REQUIRE(xgrad::load_safetensors(ck).metadata.at("step") == "20");
  REQUIRE(log_rows(dir.file("train_lm_out/log.csv")).size() == 20);

  // Flags that contradict the checkpoint are named with both values, and the file stays as it was.
  xgrad::testing::write_bytes(ck, at_10);
  require_usage_error(
      train_lm(dir, tiny({"--steps", "20", "--checkpoint", ck, "--resume", "--arch", "gpt2", "--num-kv-heads", "2",
                          "--norm-kind", "layer_norm", "--d-model", "32"})),
      {"--resume with different settings than the checkpoint's", "--arch \"llama\" in the checkpoint, \"gpt2\" now",
       "--num-kv-heads 1 in the checkpoint, 2 now", "--norm-kind \"rms_norm\" in the checkpoint, \"layer_norm\" now",
       "--d-model 16 in the checkpoint, 32 now"});
  require_usage_error(train_lm(dir, tiny({"--steps", "20", "--checkpoint", ck, "--resume", "--qk-norm"})),
                      {"--qk-norm false in the checkpoint, true now"});
  REQUIRE(read_bytes(ck) == at_10);

  // --sample: no flags, and flags that agree, give the same bytes; one that contradicts is named.
  const Outcome plain = train_lm(dir, {"--checkpoint", ck, "--sample", "20", "--temperature", "0"});
  const Outcome agree = train_lm(dir, {"--checkpoint", ck, "--sample", "20", "--temperature", "0", "--arch", "llama",
                                       "--positional", "rotary", "--activation", "swiglu", "--num-kv-heads", "1"});
  require_ok(plain);
  require_ok(agree);
  CHECK(plain.out == agree.out);
  CHECK(plain.out.size() == std::string("The ").size() + 20 + 1);
  require_usage_error(train_lm(dir, {"--checkpoint", ck, "--sample", "5", "--positional", "learned"}),
                      {"positional \"rotary\" in the file, \"learned\" asked"});
  require_usage_error(train_lm(dir, {"--checkpoint", ck, "--sample", "5", "--arch", "gpt2"}),
                      {"holds an --arch llama model, not gpt2"});
}

TEST_CASE("train_lm refuses a bad architecture flag value naming the flag, before any work",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_train_lm_bad_arch");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--arch", "bert"}, "--arch: bert not in {classic,gpt2,llama}"},
      {{"--norm-kind", "rms"}, "--norm-kind: rms not in {layer_norm,rms_norm}"},
      {{"--norm-eps", "0"}, "--norm-eps: 0 is outside (0, 1]"},
      {{"--norm-eps", "nan"}, "--norm-eps: 'nan' is not a finite number"},
      {{"--positional", "alibi"}, "--positional: alibi not in {learned,sinusoidal,none,rotary}"},
      {{"--arch", "llama", "--rope-theta", "0"}, "--rope-theta: 0 is outside (0, 1e+30]"},
      {{"--arch", "llama", "--rotary-dim", "3"}, "--rotary-dim 3 must be even and at most the head size 8"},
      {{"--arch", "llama", "--rotary-dim", "10"}, "--rotary-dim 10 must be even and at most the head size 8"},
      {{"--rotary-dim", "4"}, "--rotary-dim is for --positional rotary; this model's positions are learned"},
      {{"--arch", "gpt2", "--rope-theta", "500"}, "--rope-theta is for --positional rotary"},
      {{"--num-kv-heads", "3"}, "--num-kv-heads 3 does not divide --heads 2"},
      {{"--activation", "swish"}, "--activation: swish not in {gelu,gelu_tanh,relu,swiglu,geglu,geglu_tanh}"},
      {{"--init", "xavier"}, "--init: xavier not in {pytorch,gpt2}"},
      {{"--qk-norm=maybe"}, "Could not convert: --qk-norm = maybe"},
  };
  for (const auto& [flags, message] : cases) {
    INFO(flags.front() << " " << (flags.size() > 1 ? flags[1] : ""));
    require_usage_error(train_lm(dir, tiny(sizes({"--steps", "5", "--checkpoint", dir.file("ck")})) + flags),
                        {"train_lm: error: " + message});
    REQUIRE(dir.entries().count("train_lm_out") == 0);  // no folder made, no text read
    REQUIRE(dir.entries().count("ck") == 0);
  }
  // A GPT-2-layout file fixes its architecture: the option flags do not apply to it.
  const std::string gpt2 = xgrad::testing::fixture_path("import_gpt2.safetensors");
  const std::vector<std::pair<std::vector<std::string>, std::string>> import_cases = {
      {{"--norm-kind", "rms_norm"}, "--norm-kind"}, {{"--arch", "llama"}, "--arch"}, {{"--no-bias"}, "--bias"}};
  for (const auto& [flag, name] : import_cases) {
    require_usage_error(train_lm(dir, std::vector<std::string>{"--sample", "5", "--checkpoint", gpt2, "--import",
                                                               "gpt2", "--heads", "2"} +
                                          flag),
                        {name + " does not apply to --import gpt2: the GPT-2 layout fixes the architecture"});
  }
}

TEST_CASE("the default train_lm run keeps its classic model and its weight decay on every parameter",
          "[examples][gemm]") {
  // What the documented default run trains: LanguageModelOptions' defaults at these sizes.
  const TrainConfig c;
  CHECK(c.arch == "classic");
  const auto classic = xgrad::nn::LanguageModelOptions(256, 128, 4, 2).d_ff(512).max_len(64).dropout(0.1f);
  const auto differences = xgrad::weights::architecture_differences(classic, model_options(c));
  for (const auto& d : differences) INFO(d.field << ": " << d.stored << " vs " << d.given);
  REQUIRE(differences.empty());
  TrainConfig preset = c;
  apply_arch(preset, "classic");
  REQUIRE(preset.to_json() == c.to_json());

  TrainConfig small = c;
  small.steps = 2;
  small.warmup = 1;
  Trainer trainer(small, split(grammar_text(30000, 3), 0.1, small.seq_len));
  REQUIRE(trainer.model().num_parameters() == 470784);  // the count the documented default run prints
  // One group, no group entries in its state: every parameter decays by --weight-decay.
  const xgrad::optim::AdamW& opt = trainer.optimizer();
  REQUIRE(opt.num_groups() == 1);
  REQUIRE(opt.group_params(0).size() == trainer.model().named_parameters().size());
  bool has_groups = false;
  float decay = -1;
  for (const auto& [name, a] : opt.state_dict()) {
    has_groups = has_groups || name.find(":group") != std::string::npos;
    if (name == "AdamW:weight_decay") decay = a.data()[0];
  }
  CHECK_FALSE(has_groups);
  CHECK(decay == 0.1f);

  // The program with no architecture flag: the classic config and model options in its checkpoint.
  TempDir dir("xgrad_train_lm_default");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(train_lm(dir, tiny({"--steps", "3", "--checkpoint", ck})));
  const xgrad::Metadata meta = xgrad::load_safetensors(ck).metadata;
  TrainConfig ran = TrainConfig::from_json(nlohmann::json::parse(meta.at("config")));
  REQUIRE(ran.arch == "classic");
  REQUIRE(xgrad::weights::architecture_differences(
              xgrad::weights::language_model_options_from_json(meta.at("xgrad.model_options"), "test"),
              xgrad::nn::LanguageModelOptions(256, 128, 4, 2).d_ff(512).max_len(16).dropout(0.f))
              .empty());
}

TEST_CASE("train_lm --precision bf16 trains and keeps the precision out of its checkpoint, and fp16 is refused",
          "[examples][bf16][bad_input][gemm]") {
  TempDir dir("xgrad_train_lm_precision");
  const std::string ck = dir.file("ck.safetensors");
  const Outcome bf16 = train_lm(dir, sizes(tiny({"--steps", "3", "--precision", "bf16", "--checkpoint", ck})));
  require_ok(bf16);
  CHECK_THAT(bf16.out, Catch::Contains("precision: bf16 products"));
  const xgrad::Metadata meta = xgrad::load_safetensors(ck).metadata;
  for (const auto& [key, value] : meta) {
    INFO(key);
    CHECK(value.find("bf16") == std::string::npos);
    CHECK(value.find("precision") == std::string::npos);
  }
  // the checkpoint resumes at either precision
  require_ok(train_lm(dir, sizes(tiny({"--steps", "4", "--checkpoint", ck, "--resume", "--precision", "fp32"}))));
  require_usage_error(train_lm(dir, sizes(tiny({"--steps", "3", "--precision", "fp16"}))), {"--precision", "fp16"});
}

TEST_CASE("a checkpoint config written before the architecture fields reads as the classic model") {
  nlohmann::json j = TrainConfig().to_json();
  for (const char* key : {"arch", "norm_kind", "norm_eps", "positional", "rope_theta", "rotary_dim", "num_kv_heads",
                          "qk_norm", "activation", "tie_embeddings", "bias", "init"}) {
    REQUIRE(j.erase(key) == 1);
  }
  REQUIRE(TrainConfig::from_json(j).to_json() == TrainConfig().to_json());
  j["activation"] = "swish";
  REQUIRE_THROWS_WITH(TrainConfig::from_json(j),
                      Catch::Contains("activation \"swish\", which this train_lm does not know"));
}
