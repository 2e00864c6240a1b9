// The example programs as a hostile user runs them: every command here must end with one clear
// message and the documented exit code (2 for a bad command line, 1 for a failure at run time),
// never a signal, a hang or a memory blow-up, and never lose an earlier checkpoint. Each command
// runs in a child process under a time limit and (outside AddressSanitizer, which reserves
// terabytes of address space) a memory limit, so a regression fails this test, not the machine.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"
#include "xgrad/weights/torch_import.hpp"

using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

using xgrad::testing::Limits;
using xgrad::testing::Outcome;

// Runs an example program from `dir`.
Outcome run(const TempDir& dir, const std::string& program, const std::vector<std::string>& args,
            const Limits& limits = {}) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/" + program, args, limits);
}

// Exited by itself with `code`, a one-line message on stderr containing every part.
void require_fails(const Outcome& o, int code, const std::vector<std::string>& parts) {
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.exited);
  REQUIRE(o.code == code);
  for (const std::string& p : parts) REQUIRE_THAT(o.err, Catch::Contains(p));
}

// A tiny train_lm model, so each run takes well under a second.
std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> a = {"--layers", "1", "--d-model",    "16",    "--heads",        "2", "--seq-len", "16",
                                "--batch",  "4", "--text-bytes", "20000", "--eval-batches", "2", "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// A child that has exited and been reaped: its pid names no process.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// Trains the tiny model for `steps` steps (after `text`, when given) into dir/ck.safetensors.
std::string trained_checkpoint(const TempDir& dir, const std::string& steps,
                               const std::vector<std::string>& text = {}) {
  const std::string ck = dir.file("ck.safetensors");
  std::vector<std::string> args = text;
  for (const std::string& a : tiny({"--steps", steps, "--warmup", "1", "--checkpoint", ck})) args.push_back(a);
  const Outcome made = run(dir, "train_lm", args);
  INFO(made);
  REQUIRE(made.code == 0);
  return ck;
}

xgrad::SafetensorsContents checkpoint_with(const std::string& path, const std::string& key, const std::string& value) {
  xgrad::SafetensorsContents c = xgrad::load_safetensors(path);
  if (value.empty()) {
    c.metadata.erase(key);
  } else {
    c.metadata[key] = value;
  }
  return c;
}

}  // namespace

TEST_CASE("counts that wrap around are refused, naming the flag", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_counts");
  require_fails(run(dir, "train_lm", {"--steps", "-5"}), 2, {"--steps", "'-5'"});
  require_fails(run(dir, "train_lm", {"--layers", "-1"}), 2, {"--layers", "'-1'"});
  require_fails(run(dir, "head_specialization", {"--steps", "-1"}), 2, {"--steps", "'-1'"});
  require_fails(run(dir, "gradient_flow", {"--depths", "-1"}), 2, {"--depths", "'-1'"});
  require_fails(run(dir, "gradient_flow", {"--depths", "6,-1"}), 2, {"--depths", "'-1'"});
  require_fails(run(dir, "train_lm", {"--seed", "-1"}), 2, {"--seed", "'-1'"});
  require_fails(run(dir, "seed_walkthrough", {"--seed", "-1"}), 2, {"--seed"});
  require_fails(run(dir, "spirals", {"--points", "-3"}), 2, {"--points"});
  require_fails(run(dir, "train_lm", {"--steps", "0x10"}), 2, {"--steps", "'0x10'"});
  require_fails(run(dir, "train_lm", {"--batch", "1e3"}), 2, {"--batch"});
  require_fails(run(dir, "train_lm", {"--steps", "1000000000"}), 2, {"--steps", "outside"});
  require_fails(run(dir, "head_specialization", {"--offsets", "1,-2"}), 2, {"--offsets"});
  require_fails(run(dir, "head_specialization", {"--sweep-heads", "2,-4"}), 2, {"--sweep-heads"});
}

// Every program takes --threads (default 1) through one option (examples/common/cli.hpp).
TEST_CASE("every example takes --threads and refuses 0 and -1", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_threads");
  for (const char* program : {"train_lm", "head_specialization", "gradient_flow", "seed_walkthrough", "spirals"}) {
    INFO(program);
    require_fails(run(dir, program, {"--threads", "0"}), 2, {"--threads", "0 is outside [1, 256]"});
    require_fails(run(dir, program, {"--threads", "-1"}), 2, {"--threads", "'-1'"});
  }
}

// Every training program takes --precision fp32|bf16 through one option (examples/common/cli.hpp).
TEST_CASE("every training example refuses an unknown --precision, naming the flag",
          "[examples][bad_input][bf16][gemm]") {
  TempDir dir("xgrad_fail_precision");
  for (const char* program : {"train_lm", "head_specialization"}) {
    INFO(program);
    require_fails(run(dir, program, {"--precision", "fp16"}), 2, {"--precision", "fp16"});
    require_fails(run(dir, program, {"--precision", ""}), 2, {"--precision"});
  }
}

TEST_CASE("a leading zero is decimal, not octal", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_octal");
  // With CLI11 alone "010" is 8: the refusal names 10 steps.
  require_fails(run(dir, "train_lm", {"--steps", "010", "--warmup", "20"}), 2,
                {"--warmup 20 must be fewer than the 10 steps"});
}

TEST_CASE("reals that are not finite are refused", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_reals");
  require_fails(run(dir, "spirals", {"--lr", "nan"}), 2, {"--lr", "'nan'"});
  require_fails(run(dir, "train_lm", {"--lr", "inf"}), 2, {"--lr", "finite"});
  require_fails(run(dir, "train_lm", {"--dropout", "1"}), 2, {"--dropout"});
  require_fails(run(dir, "head_specialization", {"--lr", "-1"}), 2, {"--lr"});
  require_fails(run(dir, "gradient_flow", {"--lr", "0", "--train"}), 2, {"--lr"});
}

TEST_CASE("sizes that cannot fit in memory are refused before allocating", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_memory");
  Limits quick;
  quick.seconds = 10;
  require_fails(run(dir, "train_lm", {"--layers", "1000", "--d-model", "65536", "--heads", "1"}, quick), 2, {"memory"});
  require_fails(run(dir, "train_lm", {"--batch", "1048576", "--seq-len", "65536"}, quick), 2, {"memory"});
  require_fails(run(dir, "head_specialization", {"--seq-len", "60000", "--batch", "100000"}, quick), 2, {"memory"});
  require_fails(run(dir, "gradient_flow", {"--depths", "1024", "--d-model", "65536"}, quick), 2, {"memory"});
  require_fails(run(dir, "spirals", {"--points", "1000000", "--hidden", "65536"}, quick), 2, {"memory"});
  require_fails(run(dir, "train_lm", {"--text-bytes", "2147483648"}, quick), 2, {"--text-bytes", "outside"});
}

TEST_CASE("one warm-up rule in every example", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_warmup");
  require_fails(run(dir, "train_lm", {"--steps", "50", "--warmup", "50"}), 2,
                {"--warmup 50 must be fewer than the 50 steps"});
  require_fails(run(dir, "head_specialization", {"--steps", "50", "--warmup", "60"}), 2,
                {"--warmup 60 must be fewer than the 50 steps"});
  require_fails(run(dir, "gradient_flow", {"--train", "--steps", "50", "--warmup", "50"}), 2,
                {"--warmup 50 must be fewer than the 50 steps"});
}

TEST_CASE("train_lm --eval-interval 0 validates at the end only", "[examples][bug][gemm]") {
  TempDir dir("xgrad_fail_eval0");
  const Outcome o = run(dir, "train_lm", tiny({"--steps", "10", "--warmup", "1", "--eval-interval", "0"}));
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 0);
  const std::string log = read_bytes(dir.file("train_lm_out/log.csv"));
  REQUIRE_THAT(log, Catch::StartsWith("step,train_loss,valid_loss"));
  // Ten steps, and only the last has a validation loss.
  std::size_t lines = 0, validated = 0;
  std::istringstream in(log);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    ++lines;
    const auto a = line.find(','), b = line.find(',', a + 1), c = line.find(',', b + 1);  // step,train,valid,
    if (c > b + 1) {
      ++validated;
      REQUIRE_THAT(line, Catch::StartsWith("10,"));
    }
  }
  REQUIRE(lines == 10);
  REQUIRE(validated == 1);
}

TEST_CASE("outputs that cannot be written are refused before the work starts", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_outputs");
  write_bytes(dir.file("plain"), "a file, not a folder");
  const std::string under_file = dir.file("plain/sub");  // fails for root too: ENOTDIR
  require_fails(run(dir, "seed_walkthrough", {"--out", under_file}), 2, {"--out", "plain/sub", "Not a directory"});
  require_fails(run(dir, "head_specialization", {"--out", under_file}), 2, {"--out", "Not a directory"});
  require_fails(run(dir, "gradient_flow", {"--out", under_file}), 2, {"--out", "Not a directory"});
  require_fails(run(dir, "train_lm", tiny({"--out", under_file})), 2, {"--out", "Not a directory"});
  require_fails(run(dir, "head_specialization", {"--report", dir.file("plain/r.json")}), 2,
                {"--report", "Not a directory"});
  require_fails(run(dir, "gradient_flow", {"--report", dir.path}), 2, {"--report", "Is a directory"});

  // A checkpoint path that cannot be written fails at once, not after the run: 100000 steps could
  // not end within the limit, and no step is logged.
  Limits quick;
  quick.seconds = 10;
  const Outcome o =
      run(dir, "train_lm", tiny({"--steps", "100000", "--checkpoint", dir.file("missing/ck.safetensors")}), quick);
  require_fails(o, 2, {"--checkpoint", "missing/ck.safetensors", "No such file or directory"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("train_lm_out/log.csv")));
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", dir.path})), 2, {"--checkpoint", "Is a directory"});
}

TEST_CASE("a full disk under --out is reported with the OS error", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_disk");
  Limits full;
  full.file_size = 300;  // bytes: the log of 40 steps is longer
  const Outcome o = run(dir, "train_lm", tiny({"--steps", "40", "--warmup", "1", "--eval-interval", "0"}), full);
  require_fails(o, 1, {"log.csv", "File too large; the file size limit (ulimit -f) is 300 bytes"});
  // The log is written as the run goes: it keeps the steps trained, in whole rows only.
  const std::string log = read_bytes(dir.file("train_lm_out/log.csv"));
  REQUIRE_THAT(log, Catch::StartsWith("step,train_loss,valid_loss,lr,seconds\n1,"));
  REQUIRE(log.size() <= 300);
  REQUIRE(log.back() == '\n');
}

TEST_CASE("a text path that is not a regular file is named as such", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_text");
  require_fails(run(dir, "train_lm", tiny({dir.path})), 2, {"is a folder"});
  require_fails(run(dir, "train_lm", tiny({"/dev/zero"})), 2, {"/dev/zero", "not a regular file"});
  require_fails(run(dir, "train_lm", tiny({dir.file("none.txt")})), 2, {"none.txt", "No such file or directory"});
  write_bytes(dir.file("short.txt"), "too short");
  require_fails(run(dir, "train_lm", tiny({dir.file("short.txt")})), 2, {"too short"});
}

TEST_CASE("a NaN loss stops training naming the step, and the last checkpoint stays good",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_nan");
  const std::string ck = dir.file("ck.safetensors");
  const Outcome o = run(dir, "train_lm",
                        tiny({"--lr", "10000", "--clip", "0", "--steps", "60", "--warmup", "1", "--checkpoint", ck,
                              "--checkpoint-interval", "1"}));
  require_fails(o, 1, {"step ", "training stopped", "--detect-anomaly"});
  const std::size_t at = o.err.find("step ");
  const std::size_t failed = std::stoul(o.err.substr(at + 5));
  REQUIRE(failed >= 3);
  // Step failed - 1's weights gave the NaN: the file holds the step before, whose weights did not.
  const xgrad::SafetensorsContents saved = xgrad::load_safetensors(ck);
  REQUIRE(std::stoul(saved.metadata.at("step")) == failed - 2);
  REQUIRE_THAT(o.err, Catch::Contains("holds step " + std::to_string(failed - 2) +
                                      ", the last state whose next forward pass gave a finite loss"));
  for (const auto& [name, a] : saved.tensors) {
    for (float v : a) REQUIRE(std::isfinite(v));
  }
  // The steps before the failure are logged.
  REQUIRE_THAT(read_bytes(dir.file("train_lm_out/log.csv")), Catch::Contains("\n" + std::to_string(failed - 1) + ","));

  // With anomaly mode the op is named.
  const Outcome a = run(dir, "train_lm",
                        tiny({"--lr", "10000", "--clip", "0", "--steps", "60", "--warmup", "1", "--detect-anomaly"}));
  require_fails(a, 1, {"train_lm: error: step ", ": anomaly: ", "produced"});
}

TEST_CASE("checkpoints that are not what they claim are refused with clear messages", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_checkpoint");
  const std::string ck = trained_checkpoint(dir, "6");
  const std::string good = read_bytes(ck);

  require_fails(run(dir, "train_lm", {"--checkpoint", dir.path, "--sample", "5"}), 1, {"folder"});
  Limits quick;
  quick.seconds = 10;
  require_fails(run(dir, "train_lm", {"--checkpoint", "/dev/zero", "--sample", "5"}, quick), 1,
                {"/dev/zero", "regular file"});

  // A stored configuration past sane limits is refused before a model is built.
  auto config = nlohmann::json::parse(xgrad::load_safetensors(ck).metadata.at("config"));
  config["layers"] = 100000;
  const std::string absurd = dir.file("absurd.safetensors");
  xgrad::SafetensorsContents c = checkpoint_with(ck, "config", config.dump());
  xgrad::save_safetensors(absurd, c.tensors, c.metadata);
  require_fails(run(dir, "train_lm", {"--checkpoint", absurd, "--sample", "5"}, quick), 1,
                {"absurd.safetensors", "--layers 100000"});

  // Weights that are not finite.
  c = xgrad::load_safetensors(ck);
  c.tensors[0].second.data()[3] = std::nanf("");
  const std::string nan_path = dir.file("nan.safetensors");
  xgrad::save_safetensors(nan_path, c.tensors, c.metadata);
  require_fails(run(dir, "train_lm", {"--checkpoint", nan_path, "--sample", "5"}), 1,
                {c.tensors[0].first, "nan", "non-finite"});

  // The step in the metadata: missing, not a number, negative, past any run, past this run.
  const std::vector<std::pair<std::string, std::string>> steps = {{"", "no \"step\""},
                                                                  {"abc", "not a whole number"},
                                                                  {"-3", "not a whole number"},
                                                                  {"18446744073709551615", "not a whole number"},
                                                                  {"6", "pass a larger --steps"}};
  for (const auto& [value, message] : steps) {
    INFO("step metadata '" << value << "'");
    c = checkpoint_with(ck, "step", value);
    const std::string p = dir.file("step.safetensors");
    xgrad::save_safetensors(p, c.tensors, c.metadata);
    require_fails(run(dir, "train_lm", tiny({"--steps", "6", "--warmup", "1", "--checkpoint", p, "--resume"})), 2,
                  {message});
  }
  REQUIRE(read_bytes(ck) == good);
}

TEST_CASE("train_lm --resume names what differs, refuses other data, and may extend --steps",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_resume");
  write_bytes(dir.file("a.txt"), std::string(30000, 'a') + std::string(30000, 'b'));
  write_bytes(dir.file("b.txt"), std::string(30000, 'b') + std::string(30000, 'a'));
  const std::string ck = trained_checkpoint(dir, "6", {dir.file("a.txt")});
  const std::string good = read_bytes(ck);

  const Outcome other_text =
      run(dir, "train_lm", tiny({dir.file("b.txt"), "--steps", "12", "--warmup", "1", "--checkpoint", ck, "--resume"}));
  require_fails(other_text, 2, {"other data", "a.txt", "b.txt"});

  const Outcome other_sizes = run(dir, "train_lm",
                                  {dir.file("a.txt"),
                                   "--layers",
                                   "2",
                                   "--d-model",
                                   "16",
                                   "--heads",
                                   "4",
                                   "--seq-len",
                                   "16",
                                   "--batch",
                                   "4",
                                   "--eval-batches",
                                   "2",
                                   "--steps",
                                   "12",
                                   "--warmup",
                                   "1",
                                   "--checkpoint",
                                   ck,
                                   "--resume"});
  require_fails(other_sizes, 2, {"--layers 1 in the checkpoint, 2 now", "--heads 2 in the checkpoint, 4 now"});
  REQUIRE(other_sizes.err.find('{') == std::string::npos);  // names keys, not two JSON dumps
  REQUIRE(read_bytes(ck) == good);

  const Outcome extended =
      run(dir, "train_lm", tiny({dir.file("a.txt"), "--steps", "12", "--warmup", "1", "--checkpoint", ck, "--resume"}));
  INFO(extended);
  REQUIRE(extended.code == 0);
  REQUIRE_THAT(extended.out, Catch::Contains("resuming at step 6"));
  REQUIRE(xgrad::load_safetensors(ck).metadata.at("step") == "12");
  REQUIRE(xgrad::load_safetensors(ck).metadata.at("schedule_steps") == "6");
}

TEST_CASE("stale temporaries of a killed save are removed on the next load", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_stale");
  const std::string ck = trained_checkpoint(dir, "3");
  const std::string stale = ck + ".tmp." + std::to_string(dead_pid());
  write_bytes(stale, "half a checkpoint");
  const Outcome sampled = run(dir, "train_lm", {"--checkpoint", ck, "--sample", "5"});
  INFO(sampled);
  REQUIRE(sampled.code == 0);
  REQUIRE_FALSE(std::filesystem::exists(stale));
}

TEST_CASE(
    "train_lm --sample --import gpt2 samples from a GPT-2-layout checkpoint as the library does, at each precision",
    "[examples][gemm]") {
  TempDir dir("xgrad_import_sample");
  const std::string prompt = "Hi";
  for (const std::string file : {"import_gpt2.safetensors", "import_gpt2_f16.safetensors"})
    for (const xgrad::Precision precision : {xgrad::Precision::fp32, xgrad::Precision::bf16}) {
      INFO(file << " at " << xgrad::precision_name(precision));
      const std::string path = xgrad::testing::fixture_path(file);
      const Outcome o =
          run(dir, "train_lm",
              {"--sample", "40", "--checkpoint", path, "--import", "gpt2", "--heads", "2", "--temperature", "0",
               "--prompt", prompt, "--precision", xgrad::precision_name(precision)});
      INFO(o);
      REQUIRE(o.code == 0);
      const xgrad::weights::ImportedLanguageModel imported =
          xgrad::weights::from_gpt2(xgrad::load_safetensors(path).tensors, 2);
      xgrad::nn::LanguageModel model(imported.options);
      xgrad::weights::load_state_dict(model, imported.state);
      xgrad::Generator gen(0);
      const xgrad::AutocastGuard guard(precision);
      const auto ids = model.generate({'H', 'i'}, 40, {0.f, 0}, gen);
      std::string want;
      for (const std::int64_t id : ids) want += static_cast<char>(id);
      REQUIRE(want.size() == prompt.size() + 40);
      REQUIRE(o.out == want + "\n");
    }
}

TEST_CASE("train_lm --import: bad usage and unusable files are refused in one line", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_import_fail");
  const std::string gpt2 = xgrad::testing::fixture_path("import_gpt2.safetensors");
  auto sample = [&](const std::string& path, std::vector<std::string> more) {
    std::vector<std::string> a = {"--sample", "5", "--checkpoint", path};
    a.insert(a.end(), more.begin(), more.end());
    return run(dir, "train_lm", a);
  };
  auto one_line = [](const Outcome& o, int code, const std::vector<std::string>& parts) {
    require_fails(o, code, parts);
    REQUIRE(std::count(o.err.begin(), o.err.end(), '\n') == 1);
  };
  one_line(sample(gpt2, {"--import", "gpt2"}), 2, {"--import gpt2 needs --heads"});
  one_line(sample(gpt2, {"--import", "llama", "--heads", "2"}), 2, {"--import: unknown layout 'llama'"});
  one_line(sample(gpt2, {"--import", "gpt2", "--heads", "3"}), 2, {"--heads 3 does not divide", "d_model 8"});
  one_line(run(dir, "train_lm", {"--import", "gpt2", "--heads", "2"}), 2, {"--import is for --sample"});

  // A vocabulary other than bytes; a file missing a tensor.
  xgrad::NamedArrays tensors = xgrad::load_safetensors(gpt2).tensors;
  for (auto& [name, a] : tensors) {
    if (name != "wte.weight") continue;
    xgrad::Array fewer = xgrad::Array::from_shape({200, a.shape()[1]});
    std::copy(a.data(), a.data() + fewer.size(), fewer.data());
    a = fewer;
  }
  xgrad::save_safetensors(dir.file("v200.safetensors"), tensors);
  one_line(sample(dir.file("v200.safetensors"), {"--import", "gpt2", "--heads", "2"}), 2,
           {"vocabulary of 200", "the bytes tokenizer 256"});
  tensors = xgrad::load_safetensors(gpt2).tensors;
  tensors.erase(
      std::find_if(tensors.begin(), tensors.end(), [](const auto& e) { return e.first == "h.1.mlp.c_fc.bias"; }));
  xgrad::save_safetensors(dir.file("short.safetensors"), tensors);
  one_line(sample(dir.file("short.safetensors"), {"--import", "gpt2", "--heads", "2"}), 1,
           {"gpt2_options: missing tensor 'h.1.mlp.c_fc.bias'"});
}

TEST_CASE("train_lm stores the model options in every checkpoint and refuses flags that contradict them",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_fail_options");
  const std::string ck = trained_checkpoint(dir, "3");
  const std::string good = read_bytes(ck);
  const xgrad::Metadata meta = xgrad::load_safetensors(ck).metadata;
  REQUIRE(meta.at("xgrad.checkpoint") == "2");
  const xgrad::nn::LanguageModelOptions o =
      xgrad::weights::language_model_options_from_json(meta.at("xgrad.model_options"), "test");
  CHECK(o.vocab_size() == 256);
  CHECK(o.num_layers() == 1);
  CHECK(o.d_model() == 16);
  CHECK(o.num_heads() == 2);
  CHECK(o.d_ff() == 64);
  CHECK(o.max_len() == 16);

  // --sample: a wrong --heads is refused naming the field; several wrong flags are all named.
  require_fails(run(dir, "train_lm", {"--checkpoint", ck, "--sample", "5", "--heads", "4"}), 2,
                {"train_lm: error: --sample: '" + ck +
                 "': the stored model options contradict the ones asked for: num_heads 2 in the file, 4 asked"});
  const Outcome several =
      run(dir, "train_lm", {"--checkpoint", ck, "--sample", "5", "--layers", "3", "--norm", "post", "--d-ff", "32"});
  require_fails(
      several, 2,
      {"num_layers 1 in the file, 3 asked; d_ff 64 in the file, 32 asked; norm \"pre\" in the file, \"post\" asked"});
  // Flags that agree, and no flags, sample the same bytes.
  const Outcome agree = run(
      dir, "train_lm", {"--checkpoint", ck, "--sample", "20", "--heads", "2", "--d-model", "16", "--temperature", "0"});
  const Outcome plain = run(dir, "train_lm", {"--checkpoint", ck, "--sample", "20", "--temperature", "0"});
  INFO(agree);
  REQUIRE(agree.code == 0);
  REQUIRE(plain.code == 0);
  CHECK(agree.out == plain.out);
  CHECK(agree.out.size() == std::string("The ").size() + 20 + 1);

  // --resume with a wrong --heads: refused before anything is loaded.
  std::vector<std::string> resume = tiny({"--steps", "6", "--warmup", "1", "--checkpoint", ck, "--resume"});
  *(std::find(resume.begin(), resume.end(), std::string("--heads")) + 1) = "4";
  require_fails(run(dir, "train_lm", resume), 2, {"--heads 2 in the checkpoint, 4 now"});

  // Stored options that contradict the file's own config (an edited file): exit 1 naming the field.
  xgrad::SafetensorsContents c = xgrad::load_safetensors(ck);
  nlohmann::json j = nlohmann::json::parse(c.metadata.at("xgrad.model_options"));
  j["num_heads"] = 4;
  c.metadata["xgrad.model_options"] = j.dump();
  const std::string edited = dir.file("edited.safetensors");
  xgrad::save_safetensors(edited, c.tensors, c.metadata);
  require_fails(run(dir, "train_lm", {"--checkpoint", edited, "--sample", "5"}), 1,
                {"load_language_model: '" + edited + "'", "num_heads 4 in the file, 2 asked"});
  REQUIRE(read_bytes(ck) == good);
}
