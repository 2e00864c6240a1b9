// The example programs' command lines and the files of their runs, run as a user runs them (in
// child processes under a time and memory limit): one parsing rule for every number, usage errors
// that exit 2 naming the program, no output that overwrites an input or another output, one
// writer per checkpoint, mode flags that refuse a meaningless value, sizes refused before they
// are allocated, and a log and a checkpoint that tell the truth after a stop.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cli.hpp"
#include "common/files.hpp"
#include "fixture.hpp"
#include "run_log.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"

using xgrad::testing::Limits;
using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

const std::vector<std::string> kPrograms = {"train_lm",        "chinese_attention", "head_specialization",
                                            "gradient_flow",   "article_claims",    "spirals",
                                            "seed_walkthrough"};

std::string exe(const std::string& program) { return std::string(XGRAD_EXAMPLES_DIR) + "/" + program; }

Outcome run(const TempDir& dir, const std::string& program, const std::vector<std::string>& args,
            const Limits& limits = {}) {
  return xgrad::testing::run_program(dir, exe(program), args, limits);
}

// Exited by itself with `code`, stderr's first line starting with "<program>: error: ", and
// every part somewhere in stderr.
void require_fails(const Outcome& o, const std::string& program, int code, const std::vector<std::string>& parts) {
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.exited);
  REQUIRE(o.code == code);
  REQUIRE_THAT(o.err, Catch::StartsWith(program + ": error: "));
  for (const std::string& p : parts) REQUIRE_THAT(o.err, Catch::Contains(p));
}

// A tiny train_lm model: each run takes well under a second.
std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> a = {
      "--layers",     "1",     "--d-model",      "16", "--heads", "2",        "--seq-len", "16", "--batch", "4",
      "--text-bytes", "20000", "--eval-batches", "2",  "--quiet", "--warmup", "1"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// The steps of log.csv's rows, after checking its header is there once, first.
std::vector<std::size_t> logged_steps(const std::string& path) {
  const std::string log = read_bytes(path);
  REQUIRE_THAT(log, Catch::StartsWith(lm::RunLog::kHeader + "\n"));
  REQUIRE(log.back() == '\n');
  std::istringstream in(log);
  std::string line;
  std::getline(in, line);
  std::vector<std::size_t> steps;
  while (std::getline(in, line)) {
    REQUIRE(line != lm::RunLog::kHeader);
    steps.push_back(std::stoul(line));
  }
  return steps;
}

std::vector<std::size_t> one_to(std::size_t n) {
  std::vector<std::size_t> v;
  for (std::size_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

std::size_t checkpoint_step(const std::string& path) {
  return std::stoul(xgrad::load_safetensors(path).metadata.at("step"));
}

// A program started in `dir` without waiting; output goes to dir/<name>.out and .err.
pid_t start(const TempDir& dir, const std::string& program, const std::vector<std::string>& args,
            const std::string& name) {
  const std::string out = dir.file(name + ".out"), err = dir.file(name + ".err");
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(dir.path.c_str()) != 0) ::_exit(120);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
              e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(121);
    const std::string path = exe(program);
    std::vector<char*> argv{const_cast<char*>(path.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(path.c_str(), argv.data());
    ::_exit(122);
  }
  REQUIRE(pid > 0);
  return pid;
}

// Waits up to 60 s for `ready`; false on time out.
template <class F>
bool wait_for(F ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

TEST_CASE("every program: a usage error exits 2 with a first line naming the program", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_usage");
  for (const std::string& program : kPrograms) {
    INFO(program);
    require_fails(run(dir, program, {"--no-such-flag"}), program, 2, {"--no-such-flag"});
    const std::vector<std::string> sub =
        program == "article_claims" ? std::vector<std::string>{"configs"} : std::vector<std::string>{};
    std::vector<std::string> bad = sub;
    bad.insert(bad.end(), {"--threads", "two"});
    require_fails(run(dir, program, bad), program, 2, {"--threads", "'two'"});
  }
  require_fails(run(dir, "article_claims", {"heads", "--no-such-flag"}), "article_claims", 2, {"--no-such-flag"});
#ifdef XGRAD_BENCH_DIR
  for (const std::string bench : {"bench_train_step", "bench_gemm", "bench_attention_weights", "bench_generate"}) {
    INFO(bench);
    const std::string path = std::string(XGRAD_BENCH_DIR) + "/" + bench;
    const Outcome o = xgrad::testing::run_program(dir, path, {"--no-such-flag"});
    INFO(o);
    REQUIRE(o.exited);
    REQUIRE(o.code == 2);
    REQUIRE_THAT(o.err, Catch::StartsWith(bench + ": error: ") && Catch::Contains("--no-such-flag"));
  }
#endif
}

#ifdef XGRAD_BENCH_DIR
TEST_CASE("bench_train_step --precision bf16 says so in its JSON, and fp16 is refused naming the flag",
          "[examples][bad_input][bf16][gemm]") {
  TempDir dir("xgrad_runs_bench_precision");
  const std::string path = std::string(XGRAD_BENCH_DIR) + "/bench_train_step";
  const Outcome bad = xgrad::testing::run_program(dir, path, {"--precision", "fp16"});
  INFO(bad);
  REQUIRE(bad.exited);
  REQUIRE(bad.code == 2);
  REQUIRE_THAT(bad.err, Catch::StartsWith("bench_train_step: error: ") && Catch::Contains("--precision"));
  for (const std::string precision : {"fp32", "bf16"}) {
    const Outcome o =
        xgrad::testing::run_program(dir, path, {"--precision", precision, "--steps", "1", "--warmup", "0"});
    INFO(o);
    REQUIRE(o.exited);
    REQUIRE(o.code == 0);
    const nlohmann::json j = nlohmann::json::parse(o.out);
    CHECK(j.at("precision") == precision);
    CHECK(std::isfinite(j.at("last_loss").get<double>()));
  }
}

TEST_CASE("bench_train_step --loss fused and unfused start from the same loss, and another value is refused",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_bench_loss");
  const std::string path = std::string(XGRAD_BENCH_DIR) + "/bench_train_step";
  const Outcome bad = xgrad::testing::run_program(dir, path, {"--loss", "chunked"});
  INFO(bad);
  REQUIRE(bad.exited);
  REQUIRE(bad.code == 2);
  REQUIRE_THAT(bad.err, Catch::StartsWith("bench_train_step: error: ") && Catch::Contains("--loss"));
  double first[2];
  for (int i = 0; i < 2; ++i) {
    const std::string loss = i ? "fused" : "unfused";
    const Outcome o = xgrad::testing::run_program(dir, path, {"--loss", loss, "--steps", "2", "--warmup", "0"});
    INFO(o);
    REQUIRE(o.code == 0);
    const nlohmann::json j = nlohmann::json::parse(o.out);
    CHECK(j.at("loss") == loss);
    first[i] = j.at("first_loss").get<double>();
  }
  CHECK(first[1] == Approx(first[0]).epsilon(1e-6));
}
#endif

TEST_CASE("every real flag: decimal notation only, and a value a float keeps", "[examples][bad_input][gemm][long]") {
  TempDir dir("xgrad_runs_reals");
  struct Case {
    std::string program;
    std::vector<std::string> before;  // a subcommand or a mode flag
    std::string flag;
  };
  const std::vector<Case> cases = {{"train_lm", {}, "--lr"},
                                   {"train_lm", {}, "--valid-fraction"},
                                   {"chinese_attention", {}, "--lr"},
                                   {"head_specialization", {}, "--dropout"},
                                   {"gradient_flow", {"--train"}, "--lr"},
                                   {"article_claims", {"configs"}, "--dropout"},
                                   {"article_claims", {"heads"}, "--weight-decay"},
                                   {"spirals", {}, "--momentum"}};
  for (const Case& c : cases) {
    for (const std::string value : {"nan", "-inf", "Infinity"}) {
      std::vector<std::string> args = c.before;
      args.insert(args.end(), {c.flag, value});
      require_fails(run(dir, c.program, args), c.program, 2, {c.flag, "'" + value + "' is not a finite number"});
    }
    for (const std::string value : {"0x1p-1", " 0.5", "0.5 ", "+0.5", "1e", ".", "0.5f", "1,5"}) {
      INFO(c.program << " " << c.flag << " '" << value << "'");
      std::vector<std::string> args = c.before;
      args.insert(args.end(), {c.flag, value});
      require_fails(run(dir, c.program, args), c.program, 2, {c.flag, "'" + value + "' is not a number"});
    }
    std::vector<std::string> args = c.before;
    args.insert(args.end(), {c.flag, "1e-300"});
    require_fails(run(dir, c.program, args), c.program, 2, {c.flag, "1e-300 is too small for a 32-bit float"});
    args.back() = "1e-40";  // a float32 subnormal
    require_fails(run(dir, c.program, args), c.program, 2, {c.flag, "1e-40 is too small for a 32-bit float"});
  }
  // Exponent notation and a leading dot are read as written.
  require_ok(
      run(dir, "spirals", {"--lr", "5E-1", "--momentum", ".5", "--steps", "2", "--points", "5", "--hidden", "4"}));
}

TEST_CASE("an output that is an input or another output is refused before the work, naming both",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_same");
  const std::string text(30000, 'a');
  write_bytes(dir.file("same.txt"), text);
  auto unchanged = [&] { REQUIRE(read_bytes(dir.file("same.txt")) == text); };

  require_fails(run(dir, "train_lm", tiny({"same.txt", "--checkpoint", "same.txt"})), "train_lm", 2,
                {"--checkpoint 'same.txt' is the same file as the training text 'same.txt'"});
  unchanged();
  require_fails(run(dir, "train_lm", tiny({dir.file("same.txt"), "--checkpoint", "./same.txt"})), "train_lm", 2,
                {"--checkpoint './same.txt' is the same file as the training text"});
  std::filesystem::create_symlink("same.txt", dir.file("link.txt"));
  std::filesystem::create_hard_link(dir.file("same.txt"), dir.file("hard.txt"));
  require_fails(run(dir, "train_lm", tiny({"link.txt", "--checkpoint", "same.txt"})), "train_lm", 2, {"'link.txt'"});
  require_fails(run(dir, "train_lm", tiny({"same.txt", "--checkpoint", "hard.txt"})), "train_lm", 2, {"'hard.txt'"});
  // The log of --out, as the text or as the checkpoint (a file not there yet, in a folder not there yet).
  std::filesystem::create_directory(dir.file("o"));
  write_bytes(dir.file("o/log.csv"), text);
  require_fails(run(dir, "train_lm", tiny({"o/log.csv", "--out", "o"})), "train_lm", 2,
                {"--out's log.csv 'o/log.csv' is the same file as the training text 'o/log.csv'"});
  REQUIRE(read_bytes(dir.file("o/log.csv")) == text);
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", "new/./loss.svg", "--out", "new"})), "train_lm", 2,
                {"--out's loss.svg 'new/loss.svg' is the same file as --checkpoint 'new/./loss.svg'"});
  // The --out folder itself; a checkpoint inside an --out not there yet is fine.
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", "run1", "--out", "./run1"})), "train_lm", 2,
                {"--out (a folder) './run1' is the same file as --checkpoint 'run1'"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("run1")));
  require_ok(run(dir, "train_lm", tiny({"--steps", "2", "--checkpoint", "run2/ck", "--out", "run2"})));
  REQUIRE(checkpoint_step(dir.file("run2/ck")) == 2);
  // The checkpoint's lock file beside it.
  write_bytes(dir.file("ck.lock"), text);
  require_fails(run(dir, "train_lm", tiny({"ck.lock", "--checkpoint", "ck"})), "train_lm", 2,
                {"--checkpoint's lock file 'ck.lock' is the same file as the training text 'ck.lock'"});
  unchanged();

  // Reports against the images of --out.
  require_fails(run(dir, "head_specialization", {"--report", "hs/heads.svg", "--out", "hs"}), "head_specialization", 2,
                {"--report 'hs/heads.svg' is the same file as --out's heads.svg"});
  require_fails(run(dir, "head_specialization", {"--report", "hs/head_l0_h3.svg", "--out", "./hs/"}),
                "head_specialization", 2, {"--out's head_l0_h3.svg"});
  require_fails(run(dir, "gradient_flow", {"--report", "./gf/../gf/training.svg", "--out", "gf"}), "gradient_flow", 2,
                {"--report './gf/../gf/training.svg' is the same file as --out's training.svg"});
  // The report named as the folder itself: refused before the folder is made.
  require_fails(run(dir, "head_specialization", {"--report", "hs", "--out", "hs"}), "head_specialization", 2,
                {"--report 'hs' is the same file as --out (a folder) 'hs': one would overwrite the other"});
  require_fails(run(dir, "gradient_flow", {"--report", "gf", "--out", "./gf"}), "gradient_flow", 2,
                {"--report 'gf' is the same file as --out (a folder) './gf'"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("hs")));
  REQUIRE_FALSE(std::filesystem::exists(dir.file("gf")));

  // An output path taken by a folder is refused before the work, not when the file is written.
  std::filesystem::create_directories(dir.file("busy/loss.svg"));
  std::filesystem::create_directories(dir.file("busy/head_l1_h0.svg"));
  std::filesystem::create_directories(dir.file("busy/training.svg"));
  std::filesystem::create_directories(dir.file("busy/attention.html"));
  std::filesystem::create_directories(dir.file("busy/head0.svg"));
  require_fails(run(dir, "train_lm", tiny({"--out", "busy"})), "train_lm", 2,
                {"--out's loss.svg 'busy/loss.svg' is a folder: the run could not write it at its end"});
  require_fails(run(dir, "head_specialization", {"--out", "busy", "--layers", "2"}), "head_specialization", 2,
                {"--out's head_l1_h0.svg 'busy/head_l1_h0.svg' is a folder"});
  require_fails(run(dir, "gradient_flow", {"--out", "busy"}), "gradient_flow", 2,
                {"--out's training.svg 'busy/training.svg' is a folder"});
  require_fails(run(dir, "chinese_attention", {"--out", "busy"}), "chinese_attention", 2,
                {"--out's attention.html 'busy/attention.html' is a folder"});
  require_fails(run(dir, "seed_walkthrough", {"--out", "busy"}), "seed_walkthrough", 2,
                {"--out's head0.svg 'busy/head0.svg' is a folder"});
}

TEST_CASE("train_lm: a second writer of a checkpoint is refused naming the file and the holder's pid",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_lock");
  const std::string ck = dir.file("ck.safetensors");
  const pid_t first = start(dir, "train_lm", tiny({"--steps", "10000000", "--checkpoint", ck}), "first");
  const std::string log = dir.file("train_lm_out/log.csv");
  const bool locked = wait_for([&] {
    const std::string rows = read_bytes(log);
    return read_bytes(ck + ".lock") == std::to_string(first) + "\n" && std::count(rows.begin(), rows.end(), '\n') > 3;
  });
  if (!locked) ::kill(first, SIGKILL);
  REQUIRE(locked);
  const Outcome second = run(dir, "train_lm", tiny({"--steps", "5", "--checkpoint", ck}));
  const Outcome late = run(dir, "train_lm", tiny({"missing.txt", "--steps", "5", "--checkpoint", ck}));
  ::kill(first, SIGKILL);  // a killed holder leaves its lock file behind
  int status = 0;
  ::waitpid(first, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  // The log of the steps it trained is on disk.
  const std::vector<std::size_t> trained = logged_steps(log);
  REQUIRE(trained.size() >= 3);
  REQUIRE(trained == one_to(trained.size()));
  require_fails(second, "train_lm", 1,
                {"--checkpoint '" + ck + "' is being written by another run (pid " + std::to_string(first) +
                 ", holding '" + ck + ".lock')"});
  REQUIRE_FALSE(std::filesystem::exists(ck));  // the second run wrote nothing
  // It is refused before it reads its text: a text that is not there is not even opened.
  require_fails(late, "train_lm", 1, {"is being written by another run (pid " + std::to_string(first) + ","});

  // The stale lock file does not block; a run that ends removes its lock.
  REQUIRE(std::filesystem::exists(ck + ".lock"));
  require_ok(run(dir, "train_lm", tiny({"--steps", "5", "--checkpoint", ck})));
  REQUIRE(checkpoint_step(ck) == 5);
  REQUIRE_FALSE(std::filesystem::exists(ck + ".lock"));
  // --resume writes too; --sample only reads, and takes no lock.
  require_ok(run(dir, "train_lm", tiny({"--steps", "8", "--checkpoint", ck, "--resume"})));
  REQUIRE(checkpoint_step(ck) == 8);
}

TEST_CASE("train_lm: SIGINT or SIGTERM ends the run at a step's end with its checkpoint, log and plot",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_sigterm");
  const std::string ck = dir.file("ck.safetensors"), log = dir.file("train_lm_out/log.csv");
  for (const int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    const std::string before = read_bytes(log);
    const auto rows_before = std::count(before.begin(), before.end(), '\n');
    const std::vector<std::string> args =
        tiny({"--steps", "10000000", "--checkpoint", ck, "--checkpoint-interval", "1000000"});
    std::vector<std::string> resume_args = args;
    resume_args.push_back("--resume");
    const pid_t pid = start(dir, "train_lm", sig == SIGTERM ? args : resume_args, "stopped");
    const bool started = wait_for([&] {
      const std::string rows = read_bytes(log);
      return std::count(rows.begin(), rows.end(), '\n') > rows_before + 3;
    });
    ::kill(pid, sig);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(started);
    // It ends as the signal would, after writing everything.
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == sig);
    const std::vector<std::size_t> steps = logged_steps(log);
    REQUIRE_FALSE(steps.empty());
    const std::size_t at = checkpoint_step(ck);
    REQUIRE(steps.back() == at);
    REQUIRE_THAT(read_bytes(dir.file("stopped.err")),
                 Catch::Contains(std::string("train_lm: stopped by ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                 " after step " + std::to_string(at) + " of 10000000; log: train_lm_out/log.csv; '" +
                                 ck + "' holds step " + std::to_string(at) + ": --resume continues"));
    REQUIRE(std::filesystem::exists(dir.file("train_lm_out/loss.svg")));
    REQUIRE_FALSE(std::filesystem::exists(ck + ".lock"));
    if (sig == SIGINT) {
      // The second stop was a resume of the first: one log, steps 1 .. at once each.
      REQUIRE(steps == one_to(at));
    }
  }
}

TEST_CASE("train_lm: a stop signal in the middle of the matrix products leaves the heap whole",
          "[examples][bad_input][gemm][long]") {
  // The default model's products are large enough for oneDNN's kernels (when xgrad has them):
  // a handler frame on the thread's stack corrupted the heap under them in 4 stops of 6.
  TempDir dir("xgrad_runs_stop_heap");
  const std::string log = dir.file("train_lm_out/log.csv");
  for (int round = 0; round < 6; ++round) {
    INFO("round " << round);
    std::filesystem::remove(log);
    const pid_t pid = start(dir, "train_lm", {"--steps", "10000000", "--quiet"}, "stopped");
    const bool started = wait_for([&] {
      const std::string rows = read_bytes(log);
      return std::count(rows.begin(), rows.end(), '\n') > 2 + round;
    });
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(started);
    INFO(read_bytes(dir.file("stopped.err")));
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGTERM);
    const std::vector<std::size_t> steps = logged_steps(log);
    REQUIRE_THAT(read_bytes(dir.file("stopped.err")),
                 Catch::Equals("train_lm: stopped by SIGTERM after step " + std::to_string(steps.back()) +
                               " of 10000000; log: train_lm_out/log.csv\n"));
  }
}

TEST_CASE("a mode flag refuses a value or a mix that means nothing, instead of another mode",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_modes");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(run(dir, "train_lm", tiny({"--steps", "3", "--checkpoint", ck})));
  const std::string saved = read_bytes(ck);
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", ck, "--sample", "0"})), "train_lm", 2,
                {"--sample", "0 is outside [1, "});
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", ck, "--sample", "5", "--resume"})), "train_lm", 2,
                {"--sample", "--resume"});
  require_fails(run(dir, "train_lm", tiny({"--checkpoint", ck, "--sample", "5", "--checkpoint-interval", "2"})),
                "train_lm", 2, {"--checkpoint-interval is for training"});
  require_fails(run(dir, "train_lm", tiny({"--checkpoint-interval", "2"})), "train_lm", 2,
                {"--checkpoint-interval needs --checkpoint"});
  require_fails(run(dir, "train_lm", tiny({"--sample", "5"})), "train_lm", 2, {"--sample needs --checkpoint"});
  write_bytes(dir.file("t.txt"), std::string(30000, 'a'));
  require_fails(run(dir, "train_lm", {"t.txt", "--checkpoint", ck, "--sample", "5"}), "train_lm", 2,
                {"--sample reads no training text: 't.txt' would be unused"});
  REQUIRE(read_bytes(ck) == saved);

  for (const std::string flag : {"--steps", "--warmup", "--lr"}) {
    require_fails(run(dir, "gradient_flow", {flag, "1"}), "gradient_flow", 2, {flag + " is a setting of --train"});
  }
  require_fails(run(dir, "head_specialization", {"--sweep-heads", "1,2", "--no-single-head"}), "head_specialization", 2,
                {"--no-single-head", "--sweep-heads"});
  require_fails(run(dir, "head_specialization", {"--sweep-heads", "1,2", "--heads", "4"}), "head_specialization", 2,
                {"--heads is for one run; --sweep-heads gives the head counts"});
  require_fails(run(dir, "article_claims", {"configs", "--no-time", "--steps", "3"}), "article_claims", 2,
                {"--steps", "--no-time"});
}

TEST_CASE("an empty value of a file name, layout or prompt flag is refused instead of meaning its default",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_empty_values");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(run(dir, "train_lm", tiny({"--steps", "2", "--checkpoint", ck, "--out", "first"})));
  const std::string saved = read_bytes(ck);
  const std::string empty = ": the value is empty: give one, or leave the flag out";
  struct Case {
    std::string program;
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {"train_lm", tiny({"", "--steps", "2"}), "text"},                          // was: trained on the built-in text
      {"train_lm", tiny({"--checkpoint", "", "--steps", "2"}), "--checkpoint"},  // was: trained, saved nothing
      {"train_lm", tiny({"--prompt", "", "--steps", "2"}), "--prompt"},  // was: trained, then exit 1 at the last line
      {"train_lm",
       {"--sample", "5", "--checkpoint", ck, "--import", ""},
       "--import"},  // was: read as train_lm's own file
      {"head_specialization", {"--report", "", "--steps", "1", "--quiet"}, "--report"},  // was: no report, exit 0
      {"gradient_flow", {"--report", "", "--quiet", "--layers", "1", "--batches", "1"}, "--report"},
      {"article_claims", {"configs", "--report", "", "--no-time"}, "--report"},
      {"article_claims", {"heads", "--report", "", "--steps", "1", "--heads", "1", "--quiet"}, "--report"},
  };
  for (const Case& c : cases) {
    INFO(c.program << " " << c.flag);
    require_fails(run(dir, c.program, c.args, {20}), c.program, 2, {c.flag + empty});
  }
  for (const char* folder : {"train_lm_out", "head_specialization_out", "gradient_flow_out"}) {
    REQUIRE_FALSE(std::filesystem::exists(dir.file(folder)));
  }
  REQUIRE(read_bytes(ck) == saved);
}

TEST_CASE("every size flag is refused before it is allocated when it cannot fit", "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_memory");
  Limits quick;
  quick.seconds = 20;
  const Outcome zh = run(dir, "chinese_attention", {"--batch", "65536"}, quick);
  require_fails(zh, "chinese_attention", 2, {"--batch 65536", "needs about", "of memory, more than the"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("chinese_attention_out")));
  require_fails(run(dir, "head_specialization", {"--eval-batches", "65536", "--batch", "4096"}, quick),
                "head_specialization", 2, {"--eval-batches 65536", "memory"});
  // At the default batch the held-out ids alone fit, but the measurements' attention patterns do
  // not: this run ended in std::bad_alloc after 100 s.
  const Outcome held = run(dir, "head_specialization", {"--eval-batches", "65536", "--steps", "1"}, quick);
  require_fails(held, "head_specialization", 2, {"--eval-batches 65536 held-out batches", "needs about 34.5 GiB"});
  require_fails(run(dir, "gradient_flow", {"--batches", "65536", "--batch", "65536"}, quick), "gradient_flow", 2,
                {"--batches 65536 batches needs about", "memory"});
  // What each step keeps, over --steps: these fit the machine and are refused only under the
  // 3 GiB address-space limit, which AddressSanitizer's builds run without (see run_program.hpp).
  if (xgrad::testing::kAddressSanitizer) return;
  require_fails(run(dir, "train_lm", {"--steps", "100000000"}, quick), "train_lm", 2,
                {"a training step of this model with the log of --steps 100000000 needs about", "memory"});
  require_fails(run(dir, "gradient_flow", {"--train", "--steps", "100000000"}, quick), "gradient_flow", 2,
                {"the curves of --steps 100000000 needs about"});
  require_fails(run(dir, "head_specialization", {"--steps", "100000000"}, quick), "head_specialization", 2,
                {"the losses of --steps 100000000 needs about"});
}

TEST_CASE("train_lm: a text file whose name is not UTF-8 trains and saves, the name escaped",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_utf8");
  const std::string name = "t\xff\xfe.txt";
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  write_bytes(dir.file(name), text);
  const std::string ck = dir.file("ck.safetensors");
  require_ok(run(dir, "train_lm", tiny({name, "--steps", "3", "--checkpoint", ck})));
  const auto data = nlohmann::json::parse(xgrad::load_safetensors(ck).metadata.at("data"));
  REQUIRE(data.at("name") == "t\\xFF\\xFE.txt");
  REQUIRE(checkpoint_step(ck) == 3);
  require_ok(run(dir, "train_lm", tiny({name, "--steps", "5", "--checkpoint", ck, "--resume"})));
  REQUIRE(checkpoint_step(ck) == 5);
}

TEST_CASE("train_lm: log.csv is written as the steps go, and --resume appends after the checkpoint's step",
          "[examples][bad_input][gemm][long]") {
  TempDir dir("xgrad_runs_log");
  const std::string ck = dir.file("ck.safetensors"), log = dir.file("train_lm_out/log.csv");

  // A run killed in the middle keeps the log of the steps it trained, in whole rows.
  Limits kill_soon;
  kill_soon.seconds = 3;
  const Outcome killed =
      run(dir, "train_lm", tiny({"--steps", "10000000", "--checkpoint", ck, "--checkpoint-interval", "10"}), kill_soon);
  REQUIRE(killed.timed_out);
  const std::vector<std::size_t> before = logged_steps(log);
  REQUIRE(before.size() >= 10);
  REQUIRE(before == one_to(before.size()));
  const std::size_t at = checkpoint_step(ck);
  REQUIRE(at % 10 == 0);
  REQUIRE(at >= 10);
  REQUIRE(at <= before.size());

  // A checkpoint older than the log: the rows past its step are dropped, then the run appends.
  require_ok(run(dir, "train_lm", tiny({"--steps", "20", "--checkpoint", ck})));
  REQUIRE(logged_steps(log) == one_to(20));
  const std::string at_20 = read_bytes(ck);
  require_ok(run(dir, "train_lm", tiny({"--steps", "30", "--checkpoint", ck, "--resume"})));
  REQUIRE(logged_steps(log) == one_to(30));
  write_bytes(ck, at_20);
  require_ok(run(dir, "train_lm", tiny({"--steps", "40", "--checkpoint", ck, "--resume"})));
  REQUIRE(logged_steps(log) == one_to(40));

  // A log.csv that is not train_lm's is refused on resume, and left as it was.
  write_bytes(log, "my,own,data\n1,2,3\n");
  require_fails(run(dir, "train_lm", tiny({"--steps", "45", "--checkpoint", ck, "--resume"})), "train_lm", 1,
                {"log.csv' is not a train_lm log"});
  REQUIRE(read_bytes(log) == "my,own,data\n1,2,3\n");
}

TEST_CASE("train_lm: after a NaN stop the message says which step the checkpoint holds, and it is so",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_nan");
  const std::string ck = dir.file("ck.safetensors");
  const std::vector<std::string> exploding = tiny({"--lr", "100", "--clip", "0", "--steps", "60", "--checkpoint", ck,
                                                   "--checkpoint-interval", "1", "--dropout", "0"});
  const Outcome o = run(dir, "train_lm", exploding);
  require_fails(o, "train_lm", 1, {"training stopped before this step's update", "holds step "});
  const std::size_t failed = std::stoul(o.err.substr(o.err.find("step ") + 5));
  const std::size_t held = std::stoul(o.err.substr(o.err.find("holds step ") + 11));
  INFO(o);
  REQUIRE(held >= 1);
  REQUIRE(held < failed);
  REQUIRE(checkpoint_step(ck) == held);
  // The state held has finite weights and gave a finite loss at its next forward pass. Weights
  // that far along a divergence may still overflow on the sampling prompt: then --sample says so
  // in one line, as the message warns.
  for (const auto& [name, a] : xgrad::load_safetensors(ck).tensors) {
    INFO(name);
    REQUIRE(std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); }));
  }
  const Outcome sampled = run(dir, "train_lm", {"--checkpoint", ck, "--sample", "20"});
  if (sampled.code != 0) require_fails(sampled, "train_lm", 1, {"LanguageModel::generate: the logit of token "});
  // Resuming with the same settings takes the same steps again and stops the same way.
  std::vector<std::string> again = exploding;
  again.push_back("--resume");
  const Outcome resumed = run(dir, "train_lm", again);
  require_fails(resumed, "train_lm", 1, {"step " + std::to_string(failed) + ":", "holds step " + std::to_string(held)});
  REQUIRE(checkpoint_step(ck) == held);

  // Without an interval the run writes its checkpoint at the end only: the message says none is there.
  const std::string none = dir.file("none.safetensors");
  const Outcome never = run(
      dir, "train_lm", tiny({"--lr", "100", "--clip", "0", "--steps", "60", "--checkpoint", none, "--dropout", "0"}));
  require_fails(never, "train_lm", 1,
                {"step " + std::to_string(failed) + ": the loss is", "('" + none + "' was not written by this run)"});
  REQUIRE_FALSE(std::filesystem::exists(none));
}

// In process: the pieces behind the runs above.

TEST_CASE("RunLog: a resume keeps whole rows up to its step, drops a cut last line and refuses a log that is not one",
          "[examples][bad_input]") {
  TempDir dir("xgrad_runs_runlog");
  auto entry = [](std::size_t step, double seconds) {
    lm::LogEntry e;
    e.step = step;
    e.train_loss = 2.5f;
    e.lr = 1e-3f;
    e.seconds = seconds;
    if (step % 2 == 0) e.valid_loss = 2.25f;
    return e;
  };
  {
    lm::RunLog log(dir.path, std::nullopt);
    for (std::size_t s = 1; s <= 5; ++s) log.append(entry(s, static_cast<double>(s)));
    // Every row is on disk before the next one is made.
    REQUIRE(read_bytes(dir.file("log.csv")) == lm::RunLog::kHeader + "\n" + lm::log_row(entry(1, 1)) +
                                                   lm::log_row(entry(2, 2)) + lm::log_row(entry(3, 3)) +
                                                   lm::log_row(entry(4, 4)) + lm::log_row(entry(5, 5)));
  }
  write_bytes(dir.file("log.csv"), read_bytes(dir.file("log.csv")) + "6,2.4,,0.0");  // killed mid-row
  {
    lm::RunLog log(dir.path, 3);
    REQUIRE(log.entries().size() == 3);
    REQUIRE(log.entries().back().step == 3);
    REQUIRE(log.entries()[1].valid_loss == std::optional<float>(2.25f));
    log.append(entry(4, 0.5));  // the resumed run's clock starts at 0
    REQUIRE(log.entries().back().seconds == 3.5);
  }
  REQUIRE(logged_steps(dir.file("log.csv")) == one_to(4));
  // A resume with no log starts one; a new run replaces any log.
  {
    lm::RunLog log(dir.path, std::nullopt);
    REQUIRE(log.entries().empty());
  }
  REQUIRE(read_bytes(dir.file("log.csv")) == lm::RunLog::kHeader + "\n");

  for (const std::string& bad : {std::string("step,loss\n1,2\n"), lm::RunLog::kHeader + "\n1,2,,3,4\n1,2,,3,4\n",
                                 lm::RunLog::kHeader + "\n1,2,,3\n", lm::RunLog::kHeader + "\n1,0x2,,3,4\n"}) {
    INFO(bad);
    write_bytes(dir.file("log.csv"), bad);
    REQUIRE_THROWS_WITH(lm::RunLog(dir.path, 5), Catch::Contains("log.csv'") && Catch::Contains("is not"));
    REQUIRE(read_bytes(dir.file("log.csv")) == bad);
  }
}

TEST_CASE("log_row: the validation loss keeps 6 significant digits like the training loss", "[examples][bad_input]") {
  lm::LogEntry e;
  e.step = 7;
  e.train_loss = 2.5f;
  e.lr = 0.001f;
  e.seconds = 1.25;
  REQUIRE(lm::log_row(e) == "7,2.5,,0.001,1.25\n");
  e.valid_loss = 1.5e-7f;
  REQUIRE(lm::log_row(e) == "7,2.5,1.5e-07,0.001,1.25\n");  // was 0.000000
  e.valid_loss = 9.52565e12f;
  REQUIRE(lm::log_row(e) == "7,2.5,9.52565e+12,0.001,1.25\n");  // was 9525649735680.000000
  e.valid_loss = 2.25f;
  REQUIRE(lm::log_row(e) == "7,2.5,2.25,0.001,1.25\n");
}

TEST_CASE("FileLock: one holder at a time even in one process, the pid in the file, the file gone at the end",
          "[examples][bad_input]") {
  TempDir dir("xgrad_runs_filelock");
  const std::string ck = dir.file("ck");
  {
    cli::FileLock lock(ck, "test: --checkpoint");
    REQUIRE(lock.lock_path() == ck + ".lock");
    REQUIRE(read_bytes(ck + ".lock") == std::to_string(::getpid()) + "\n");
    REQUIRE_THROWS_WITH(cli::FileLock(ck, "test: --checkpoint"),
                        "test: --checkpoint '" + ck + "' is being written by another run (pid " +
                            std::to_string(::getpid()) + ", holding '" + ck +
                            ".lock'); wait for it to end or choose another path");
  }
  REQUIRE_FALSE(std::filesystem::exists(ck + ".lock"));
  write_bytes(ck + ".lock", "999999999\n");  // left by a killed run: no flock on it
  { cli::FileLock lock(ck, "test"); }
  // Through a symlink: the lock is beside the file it names.
  std::filesystem::create_symlink("ck", dir.file("link"));
  {
    cli::FileLock lock(dir.file("link"), "test");
    REQUIRE(lock.lock_path() == dir.file("ck.lock"));
    REQUIRE_THROWS_WITH(cli::FileLock(ck, "test"), Catch::Contains("is being written by another run"));
  }
  REQUIRE_THROWS_WITH(cli::FileLock(dir.file("missing/ck"), "test"),
                      Catch::Contains("cannot create the lock file") && Catch::Contains("No such file or directory"));
}

TEST_CASE("file identities: links, dots and files not there yet", "[examples][bad_input]") {
  TempDir dir("xgrad_runs_identity");
  write_bytes(dir.file("a"), "x");
  std::filesystem::create_symlink("a", dir.file("sym"));
  std::filesystem::create_symlink("b", dir.file("dangling"));  // a write through it creates b
  std::filesystem::create_directory(dir.file("d"));
  REQUIRE(xgrad::same_file(dir.file("a"), dir.file("sym")));
  REQUIRE(xgrad::same_file(dir.file("a"), dir.file("d/../a")));
  REQUIRE(!xgrad::same_file(dir.file("a"), dir.file("d")));
  REQUIRE(xgrad::same_file(dir.file("dangling"), dir.file("b")));
  REQUIRE(xgrad::same_file(dir.file("new/x/../y"), dir.file("./new/y")));
  REQUIRE(!xgrad::same_file(dir.file("new/y"), dir.file("new/z")));
  REQUIRE_NOTHROW(cli::check_distinct_files("prog", {{"in", dir.file("a")}},
                                            {{"out", dir.file("b.txt")}, {"other", dir.file("c.txt")}}));
  REQUIRE_THROWS_AS(cli::check_distinct_files("prog", {}, {{"first", dir.file("dangling")}, {"second", dir.file("b")}}),
                    cli::UsageError);
  REQUIRE_THROWS_WITH(cli::check_distinct_files("prog", {{"the text", dir.file("sym")}}, {{"--out", dir.file("a")}}),
                      "prog: --out '" + dir.file("a") + "' is the same file as the text '" + dir.file("sym") +
                          "': writing it would destroy what the run reads; choose another path");
}

TEST_CASE("train_lm: no output replaces a file of the tokenizer folder or the tokenizer it saves, however spelled",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_tokenizer_files");
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  write_bytes(dir.file("a.txt"), text);
  std::filesystem::create_directory(dir.file("g"));
  for (const char* f : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(xgrad::testing::fixture_path(std::string("gpt2_tokenizer/") + f),
                               dir.file(std::string("g/") + f));
  std::filesystem::create_symlink("g", dir.file("g_link"));
  const std::string vocab = read_bytes(dir.file("g/vocab.json"));
  auto gpt2 = [&](const std::string& g, std::vector<std::string> more) {
    more.insert(more.begin(), {"a.txt", "--steps", "2", "--tokenizer", "gpt2", g});
    return tiny(more);
  };
  require_fails(run(dir, "train_lm", gpt2("g", {"--checkpoint", "g/vocab.json"})), "train_lm", 2,
                {"--checkpoint 'g/vocab.json' is the same file as 'vocab.json' in --tokenizer 'g': writing it would "
                 "destroy what the run reads"});
  require_fails(run(dir, "train_lm", gpt2("./g", {"--checkpoint", "g_link/merges.txt"})), "train_lm", 2,
                {"--checkpoint 'g_link/merges.txt' is the same file as 'merges.txt' in --tokenizer './g'"});
  require_fails(run(dir, "train_lm", gpt2("g_link/", {"--out", "g"})), "train_lm", 2,
                {"--out (a folder) 'g' is the same file as --tokenizer 'g_link/'"});
  require_fails(run(dir, "train_lm", gpt2("g", {"--checkpoint", "./g/model.safetensors"})), "train_lm", 2,
                {"--checkpoint './g/model.safetensors' would be written in --tokenizer 'g', a folder the run reads"});
  REQUIRE(read_bytes(dir.file("g/vocab.json")) == vocab);
  REQUIRE(dir.entries().count("train_lm_out") == 0);  // refused before --out was made

  // The tokenizer --save-tokenizer writes, against the checkpoint and --out's files.
  auto trained = [&](std::vector<std::string> more) {
    more.insert(more.begin(), {"a.txt", "--steps", "2", "--train-tokenizer", "300", "--save-tokenizer", "st"});
    return tiny(more);
  };
  require_fails(run(dir, "train_lm", trained({"--checkpoint", "st/vocab.json"})), "train_lm", 2,
                {"--save-tokenizer's vocab.json 'st/vocab.json' is the same file as --checkpoint 'st/vocab.json': one "
                 "would overwrite the other"});
  require_fails(run(dir, "train_lm", trained({"--checkpoint", "./st/merges.txt"})), "train_lm", 2,
                {"--save-tokenizer's merges.txt 'st/merges.txt' is the same file as --checkpoint './st/merges.txt'"});
  require_fails(run(dir, "train_lm", trained({"--out", "st/vocab.json"})), "train_lm", 2, {"st/vocab.json"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("st")));
  require_ok(run(dir, "train_lm", trained({"--checkpoint", "st/ck.safetensors", "--out", "st"})));
  REQUIRE(read_bytes(dir.file("st/vocab.json")).size() > 1000);
  REQUIRE(checkpoint_step(dir.file("st/ck.safetensors")) == 2);
}

TEST_CASE("train_lm: a second run on one --out folder is refused naming the folder and the lock",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_out_lock");
  const pid_t first = start(dir, "train_lm", tiny({"--steps", "10000000"}), "first");
  const std::string log = dir.file("train_lm_out/log.csv");
  const bool running = wait_for([&] {
    const std::string rows = read_bytes(log);
    return read_bytes(dir.file("train_lm_out/.lock")) == std::to_string(first) + "\n" &&
           std::count(rows.begin(), rows.end(), '\n') > 2;
  });
  if (!running) ::kill(first, SIGKILL);
  REQUIRE(running);
  std::filesystem::create_symlink("train_lm_out", dir.file("same_out"));
  const Outcome second = run(dir, "train_lm", tiny({"--steps", "3"}));
  const Outcome linked = run(dir, "train_lm", tiny({"--steps", "3", "--out", "./same_out/"}));
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  require_fails(second, "train_lm", 1,
                {"--out 'train_lm_out/' is being written by another run (pid " + std::to_string(first) +
                 ", holding 'train_lm_out/.lock'); wait for it to end or choose another path"});
  require_fails(linked, "train_lm", 1, {"--out './same_out/' is being written by another run"});
  // The first run's log is its own: rows 1, 2, 3, ... from one run.
  const std::vector<std::size_t> steps = logged_steps(log);
  REQUIRE(steps == one_to(steps.size()));
  // A killed holder's lock does not block; a run that ends removes it.
  require_ok(run(dir, "train_lm", tiny({"--steps", "3"})));
  REQUIRE(logged_steps(log) == one_to(3));
  REQUIRE_FALSE(std::filesystem::exists(dir.file("train_lm_out/.lock")));
}

TEST_CASE("train_lm: a token file with an id past the vocabulary is refused before the first step, named",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_bad_ids");
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("good.bin"), bytes.encode(text), bytes.identity());
  std::string bad = read_bytes(dir.file("good.bin"));
  bad[128 + 2 * 20000 + 1] = 1;  // the id at position 20000 becomes 256 + its byte
  const int id = 256 + static_cast<unsigned char>(bad[128 + 2 * 20000]);
  write_bytes(dir.file("bad.bin"), bad);
  require_fails(run(dir, "train_lm", tiny({"--tokens", "bad.bin", "--steps", "300"})), "train_lm", 2,
                {"--tokens 'bad.bin': the token at position 20000 (byte 40128) is " + std::to_string(id) +
                 ", outside the vocabulary [0, 256) of its tokenizer"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("train_lm_out/log.csv")));  // no step was taken
  require_fails(run(dir, "train_lm", tiny({"--tokens", "good.bin", "--valid-tokens", "bad.bin", "--steps", "300"})),
                "train_lm", 2, {"'bad.bin': the token at position 20000 (byte 40128) is " + std::to_string(id)});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("train_lm_out/log.csv")));
}

TEST_CASE("train_lm: --valid-tokens that is --tokens, and a --prompt of no tokens, are refused before training",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_same_tokens");
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  write_bytes(dir.file("a.txt"), text);
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("t.bin"), bytes.encode(text), bytes.identity());
  std::filesystem::create_symlink("t.bin", dir.file("t_link.bin"));
  require_fails(run(dir, "train_lm", tiny({"--tokens", "t.bin", "--valid-tokens", "t.bin"})), "train_lm", 2,
                {"--valid-tokens 't.bin' is the same file as --tokens 't.bin': the run would validate on its training "
                 "data"});
  require_fails(run(dir, "train_lm", tiny({"--tokens", "./t.bin", "--valid-tokens", "t_link.bin"})), "train_lm", 2,
                {"--valid-tokens 't_link.bin' is the same file as --tokens './t.bin'"});
  // SentencePiece normalizes white space away: a prompt of spaces is no tokens.
  const std::string spm = xgrad::testing::fixture_path("sentencepiece/unigram.model");
  require_fails(run(dir, "train_lm", tiny({"a.txt", "--steps", "300", "--tokenizer", "spm", spm, "--prompt", "   "})),
                "train_lm", 2, {"--prompt '   ' encodes to no tokens"});
  REQUIRE_FALSE(std::filesystem::exists(dir.file("train_lm_out/log.csv")));
}

TEST_CASE("train_lm --resume of a checkpoint whose data_rng was edited names the file and the field",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_data_rng");
  const std::string ck = dir.file("ck.safetensors");
  require_ok(run(dir, "train_lm", tiny({"--steps", "2", "--checkpoint", ck})));
  xgrad::SafetensorsContents file = xgrad::load_safetensors(ck);
  file.metadata["data_rng"] = "1 2 3 4";
  xgrad::save_safetensors(ck, file.tensors, file.metadata);
  require_fails(run(dir, "train_lm", tiny({"--steps", "4", "--checkpoint", ck, "--resume"})), "train_lm", 2,
                {"checkpoint '" + ck +
                 "': the metadata field \"data_rng\" (the batch order's random state) cannot be "
                 "read: Generator::set_state: not a generator state (7 characters)"});
  REQUIRE(checkpoint_step(ck) == 2);
}

TEST_CASE("train_lm under `ulimit -f`: a save past the limit is an error naming it, with no temporary left",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_ulimit");
  // The shell sets the limit and leaves SIGXFSZ as it is: by default the signal kills the writer.
  const std::string command = "ulimit -f 40 && exec " + exe("train_lm") +
                              " --layers 1 --d-model 16 --heads 2 --seq-len 16 --batch 4 --text-bytes 20000"
                              " --eval-batches 2 --quiet --warmup 1 --steps 2 --checkpoint ck.safetensors";
  const Outcome o = xgrad::testing::run_program(dir, "/bin/bash", {"-c", command});
  require_fails(o, "train_lm", 1,
                {"cannot write 'ck.safetensors'", "File too large; the file size limit (ulimit -f) is 40960 bytes"});
  for (const std::string& f : dir.entries()) REQUIRE(f.find(".tmp.") == std::string::npos);
  REQUIRE_FALSE(std::filesystem::exists(dir.file("ck.safetensors")));
}

// Every example program ignores SIGXFSZ from its first line (cli::parse), not only train_lm.
TEST_CASE("gradient_flow under `ulimit -f`: a plot past the limit is an error naming it, not a kill",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_ulimit_gf");
  const std::string command = "ulimit -f 1 && exec " + exe("gradient_flow") +
                              " --layers 2 --d-model 8 --heads 2 --vocab 16 --seq-len 8 --batches 1 --batch 2 --out gf";
  const Outcome o = xgrad::testing::run_program(dir, "/bin/bash", {"-c", command});
  require_fails(o, "gradient_flow", 1, {"File too large; the file size limit (ulimit -f) is 1024 bytes"});
  for (const auto& e : std::filesystem::directory_iterator(dir.file("gf")))
    REQUIRE(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("train_lm: a run with --train-tokenizer continues with the same command and --resume",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_runs_resume_bpe");
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  write_bytes(dir.file("a.txt"), text);
  auto command = [&](const std::string& file, const std::string& steps, bool save, bool resume) {
    std::vector<std::string> a = {file, "--train-tokenizer", "300", "--checkpoint", "ck", "--steps", steps};
    if (save) a.insert(a.end(), {"--save-tokenizer", "st"});
    if (resume) a.push_back("--resume");
    return tiny(a);
  };
  require_ok(run(dir, "train_lm", command("a.txt", "2", true, false)));
  const std::string vocab = read_bytes(dir.file("st/vocab.json"));
  require_ok(run(dir, "train_lm", command("a.txt", "4", true, true)));
  REQUIRE(checkpoint_step(dir.file("ck")) == 4);
  REQUIRE(read_bytes(dir.file("st/vocab.json")) == vocab);
  // On other text the tokenizer trained again is another one: the saved one is not replaced, and
  // without --save-tokenizer the checkpoint refuses the other data.
  std::string other;
  for (int i = 0; other.size() < 30000; ++i) other += "a dog ran to the park at hour " + std::to_string(i % 89) + ". ";
  write_bytes(dir.file("b.txt"), other);
  require_fails(run(dir, "train_lm", command("b.txt", "6", true, true)), "train_lm", 2,
                {"--save-tokenizer: 'st' holds the tokenizer byte_bpe, 300 ids", "not the one trained now"});
  REQUIRE(read_bytes(dir.file("st/vocab.json")) == vocab);
  require_fails(run(dir, "train_lm", command("b.txt", "6", false, true)), "train_lm", 2, {"other data"});
  REQUIRE(checkpoint_step(dir.file("ck")) == 4);
}

TEST_CASE("train_lm --help shows --tokenizer's two values", "[examples][gemm]") {
  TempDir dir("xgrad_runs_help");
  const Outcome o = run(dir, "train_lm", {"--help"});
  require_ok(o);
  REQUIRE_THAT(o.out, Catch::Contains("--tokenizer KIND [PATH]"));
  REQUIRE_THAT(o.out, !Catch::Contains("--tokenizer TEXT"));
}

TEST_CASE("train_lm under mpirun: a text file whose name is not UTF-8 trains, the name escaped",
          "[examples][bad_input][gemm][distributed]") {
  std::string mpiexec;
  for (const char* p : {"/usr/bin/mpiexec", "/usr/local/bin/mpiexec"})
    if (mpiexec.empty() && std::filesystem::exists(p)) mpiexec = p;
  if (mpiexec.empty()) {
    WARN("no mpiexec: the case under mpirun is not run");
    return;
  }
  TempDir dir("xgrad_runs_mpi_utf8");
  const std::string name = "t\xff\xfe.txt";
  std::string text;
  for (int i = 0; text.size() < 30000; ++i) text += "the cat sat on mat number " + std::to_string(i % 97) + ". ";
  write_bytes(dir.file(name), text);
  const std::string ck = dir.file("c\xff.safetensors");
  Limits limits;
  limits.memory = RLIM_INFINITY;  // Open MPI maps large shared-memory segments
  limits.seconds = 120;
  std::vector<std::string> args = {
      "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", exe("train_lm"), name};
  for (const std::string& a : tiny({"--steps", "2", "--checkpoint", ck})) args.push_back(a);
  const Outcome o = xgrad::testing::run_program(dir, mpiexec, args, limits);
  require_ok(o);
  REQUIRE_THAT(o.out, Catch::Contains("data-parallel on 2 processes"));
  REQUIRE(checkpoint_step(ck) == 2);
}
