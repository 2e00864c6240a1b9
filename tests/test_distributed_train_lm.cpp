// train_lm data-parallel under mpirun, end to end: two ranks follow the trajectory of one process
// on the same global batch (over shared memory and over TCP), resume exactly, refuse ranks that
// disagree, and end the whole job with a message naming the rank when one rank dies or throws,
// leaving the last checkpoint loadable.
#include <dirent.h>
#include <signal.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"

using xgrad::testing::Limits;
using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::run_program;
using xgrad::testing::TempDir;

namespace {

const std::string kTrainLm = std::string(XGRAD_EXAMPLES_DIR) + "/train_lm";

std::vector<std::string> mpirun_args(int ranks, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.insert(a.end(), {"-np", std::to_string(ranks), kTrainLm});
  return a;
}

// A small model's command line; `more` adds flags or, for a flag already there, replaces its value.
std::vector<std::string> small(const std::vector<std::string>& more) {
  std::vector<std::string> a = {"--layers",       "1",  "--d-model", "32", "--heads",      "2",
                                "--seq-len",      "16", "--batch",   "8",  "--text-bytes", "30000",
                                "--eval-batches", "2",  "--dropout", "0",  "--quiet"};
  for (std::size_t i = 0; i < more.size(); ++i) {
    const bool has_value = i + 1 < more.size() && more[i + 1].compare(0, 2, "--") != 0;
    const auto at = std::find(a.begin(), a.end(), more[i]);
    if (at != a.end() && has_value) {
      *(at + 1) = more[++i];
    } else {
      a.push_back(more[i]);
      if (has_value) a.push_back(more[++i]);
    }
  }
  return a;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Limits mpi_limits(int seconds = 120) {
  Limits l;
  l.seconds = seconds;
  l.memory = RLIM_INFINITY;  // Open MPI maps large shared-memory segments
  return l;
}

Outcome mpirun(const TempDir& dir, int ranks, const std::vector<std::string>& args,
               const std::vector<std::string>& mca = {}, const Limits& limits = mpi_limits()) {
  return run_program(dir, XGRAD_MPIEXEC, concat(mpirun_args(ranks, mca), args), limits);
}

struct Row {
  double train = 0, valid = NAN;
};
std::vector<Row> read_log(const std::string& path) {
  std::vector<Row> rows;
  std::istringstream in(read_bytes(path));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    Row r;
    r.train = std::stod(f.at(1));
    if (!f.at(2).empty()) r.valid = std::stod(f.at(2));
    rows.push_back(r);
  }
  return rows;
}

// The largest relative difference between two logs' train and validation losses.
double max_relative_difference(const std::vector<Row>& a, const std::vector<Row>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i].train - b[i].train) / std::abs(b[i].train));
    REQUIRE(std::isnan(a[i].valid) == std::isnan(b[i].valid));
    if (!std::isnan(a[i].valid)) worst = std::max(worst, std::abs(a[i].valid - b[i].valid) / std::abs(b[i].valid));
  }
  return worst;
}

// A /proc file, which reports its size as 0: read to the end.
std::string read_proc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The Open MPI rank of a process, from its environment; -1 when it has none.
int rank_of(pid_t pid) {
  const std::string env = read_proc("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
  std::size_t at = 0;
  while (at < env.size()) {
    const std::size_t end = env.find('\0', at);
    const std::string var = env.substr(at, end - at);
    if (var.compare(0, key.size(), key) == 0) return std::atoi(var.c_str() + key.size());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return -1;
}

// The pid of the process of Open MPI rank `rank` whose command line contains `marker`, or -1.
pid_t find_rank(int rank, const std::string& marker) {
  pid_t found = -1;
  DIR* d = ::opendir("/proc");
  if (!d) return found;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || pid == ::getpid()) continue;
    const std::string cmdline = read_proc("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.find(marker) != std::string::npos && cmdline.find("train_lm") != std::string::npos &&
        rank_of(pid) == rank)
      found = pid;
  }
  ::closedir(d);
  return found;
}

}  // namespace

TEST_CASE("two ranks follow one process's trajectory on the same global batch", "[distributed][gemm][long]") {
  TempDir dir("xgrad_ddp_equal");
  const std::vector<std::string> args = small({"--steps", "100", "--warmup", "10", "--eval-interval", "20"});
  require_ok(run_program(dir, kTrainLm, concat(args, {"--out", "one"}), mpi_limits()));
  const auto one = read_log(dir.file("one/log.csv"));
  REQUIRE(one.size() == 100);

  const Outcome two = mpirun(dir, 2, concat(args, {"--out", "two"}));
  require_ok(two);
  REQUIRE_THAT(two.out, Catch::Contains("data-parallel on 2 processes, 4 sequences each"));
  const double shm = max_relative_difference(read_log(dir.file("two/log.csv")), one);
  std::printf("max relative difference of the losses after 100 steps, 2 ranks (shared memory) vs 1 process: %.3g\n",
              shm);
  REQUIRE(shm <= 1e-4);

  const Outcome tcp = mpirun(dir, 2, concat(args, {"--out", "tcp"}), {"--mca", "btl", "tcp,self"});
  require_ok(tcp);
  const double over_tcp = max_relative_difference(read_log(dir.file("tcp/log.csv")), one);
  std::printf("max relative difference of the losses after 100 steps, 2 ranks (TCP) vs 1 process: %.3g\n", over_tcp);
  REQUIRE(over_tcp <= 1e-4);
}

TEST_CASE("two ranks follow one process through a trained BPE and through a token file", "[distributed][gemm][long]") {
  TempDir dir("xgrad_ddp_text");
  // Every rank trains the same BPE on the same text (the ranks' settings include its identity).
  const std::vector<std::string> bpe = small({"--steps", "30", "--warmup", "3", "--train-tokenizer", "300"});
  require_ok(run_program(dir, kTrainLm, concat(bpe, {"--out", "one"}), mpi_limits()));
  const Outcome two = mpirun(dir, 2, concat(bpe, {"--out", "two"}));
  require_ok(two);
  REQUIRE(max_relative_difference(read_log(dir.file("two/log.csv")), read_log(dir.file("one/log.csv"))) <= 1e-4);

  // A token file, memory-mapped by every rank.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " of the token file.\n";
  const xgrad::text::BytesTokenizer bytes;
  xgrad::text::write_token_file(dir.file("t.bin"), bytes.encode(text), bytes.identity());
  const std::vector<std::string> tokens = small({"--steps", "30", "--warmup", "3", "--tokens", dir.file("t.bin")});
  require_ok(run_program(dir, kTrainLm, concat(tokens, {"--out", "t1"}), mpi_limits()));
  require_ok(mpirun(dir, 2, concat(tokens, {"--out", "t2"})));
  REQUIRE(max_relative_difference(read_log(dir.file("t2/log.csv")), read_log(dir.file("t1/log.csv"))) <= 1e-4);
}

TEST_CASE("a checkpoint written by one process resumes on two, and one of two on one", "[distributed][gemm]") {
  TempDir dir("xgrad_ddp_resume");
  const std::string single = dir.file("single.safetensors");
  require_ok(run_program(dir, kTrainLm, concat(small({"--steps", "10", "--warmup", "5"}), {"--checkpoint", single}),
                         mpi_limits()));
  const Outcome up =
      mpirun(dir, 2, concat(small({"--steps", "20", "--warmup", "5"}), {"--checkpoint", single, "--resume"}));
  require_ok(up);
  REQUIRE_THAT(up.out, Catch::Contains("resuming at step 10"));
  const Outcome down = run_program(
      dir, kTrainLm, concat(small({"--steps", "25", "--warmup", "5"}), {"--checkpoint", single, "--resume"}),
      mpi_limits());
  require_ok(down);
  REQUIRE_THAT(down.out, Catch::Contains("resuming at step 20"));
}

TEST_CASE("ranks that disagree fail at start-up with one clear message", "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_ddp_disagree");
  // Open MPI's MPMD form: rank 0 and rank 1 get different command lines.
  std::vector<std::string> a = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", kTrainLm};
  a = concat(a, small({"--steps", "5", "--warmup", "1"}));
  a = concat(a, {":", "-np", "1", kTrainLm});
  a = concat(a, small({"--steps", "5", "--warmup", "1", "--d-model", "64"}));
  const Outcome o = run_program(dir, XGRAD_MPIEXEC, a, mpi_limits(60));
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.code != 0);
  REQUIRE_THAT(o.err,
               Catch::Contains("rank 1 was started with other settings than rank 0: --d-model 32 on rank 0, 64 here"));

  const Outcome odd = mpirun(dir, 2, small({"--steps", "5", "--warmup", "1", "--batch", "5"}));
  INFO(odd);
  REQUIRE_FALSE(odd.timed_out);
  REQUIRE(odd.code != 0);
  REQUIRE_THAT(odd.err, Catch::Contains("--batch 5 does not divide among 2 processes"));
}

TEST_CASE("an option that picks another path on one rank only is refused on every rank, naming it",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_ddp_paths");
  const std::vector<std::string> base = small({"--steps", "5", "--warmup", "1"});
  // Open MPI's MPMD form: rank 0 and rank 1 get different command lines.
  const auto two_lines = [&](const std::vector<std::string>& rank0, const std::vector<std::string>& rank1) {
    std::vector<std::string> a = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", kTrainLm};
    a = concat(concat(a, rank0), {":", "-np", "1", kTrainLm});
    return run_program(dir, XGRAD_MPIEXEC, concat(a, rank1), mpi_limits(60));
  };
  const std::string ck = dir.file("ck.safetensors");
  // Rank 0 would sample and leave; rank 1 would train and wait for it in every step.
  const Outcome sample =
      two_lines(concat(base, {"--checkpoint", ck, "--sample", "50"}), concat(base, {"--checkpoint", ck}));
  INFO(sample);
  REQUIRE_FALSE(sample.timed_out);
  REQUIRE(sample.code != 0);
  REQUIRE_THAT(sample.err, Catch::Contains("train_lm (rank 1): error: rank 1 was started with other settings than rank "
                                           "0: --sample 50 on rank 0, not given here"));

  // Per-process options may differ; --help on one rank ends the job instead of leaving it waiting.
  const Outcome help = two_lines(concat(base, {"--threads", "2"}), concat(base, {"--help"}));
  INFO(help);
  REQUIRE_FALSE(help.timed_out);
  REQUIRE(help.code != 0);
  // Either rank may see the mismatch first; each names both sides.
  REQUIRE_THAT(help.err, Catch::Contains("rank 1 is leaving the program while rank 0 is in broadcast (string)") ||
                             Catch::Contains("rank 0 is in broadcast (string) while rank 1 is leaving the program"));
  const Outcome usage = two_lines(base, concat(base, {"--layers", "-1"}));
  INFO(usage);
  REQUIRE_FALSE(usage.timed_out);
  REQUIRE(usage.code != 0);
  REQUIRE_THAT(usage.err, Catch::Contains("--layers: '-1' is not a whole number"));

  const Outcome timeout = mpirun(dir, 2, base, {"-x", "XGRAD_DIST_TIMEOUT=soon"});
  INFO(timeout);
  REQUIRE_FALSE(timeout.timed_out);
  REQUIRE(timeout.exited);
  REQUIRE(timeout.code == 1);
  REQUIRE_THAT(
      timeout.err,
      Catch::Contains("train_lm: error: ProcessGroup: XGRAD_DIST_TIMEOUT 'soon' is not a number of seconds > 0"));
}

TEST_CASE("a rank that dies or throws ends the job naming it, and the checkpoint loads and resumes bit-exactly",
          "[distributed][bad_input][gemm][long]") {
  TempDir dir("xgrad_ddp_fault");
  const std::string ck = dir.file("ck.safetensors"), straight = dir.file("straight.safetensors");
  // Enough steps that the kill, within 10 ms of the first checkpoint (step 20), comes before the
  // end; under AddressSanitizer each step takes several times as long, so fewer do.
  const std::size_t steps = xgrad::testing::kAddressSanitizer ? 200 : 1000;
  const std::vector<std::string> args =
      small({"--steps", std::to_string(steps), "--warmup", "5", "--dropout", "0.1", "--eval-interval", "0"});
  require_ok(mpirun(dir, 2, concat(args, {"--checkpoint", straight})));

  // Killed: start the same run with checkpoints every 20 steps, kill rank 1 after the first.
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    const Outcome o =
        mpirun(dir, 2, concat(args, {"--checkpoint", ck, "--checkpoint-interval", "20"}), {}, mpi_limits(90));
    std::ofstream(dir.file("outcome")) << (o.timed_out ? "timeout"
                                           : o.exited  ? "exit"
                                                       : "signal")
                                       << ' ' << o.code << ' ' << o.seconds << '\n'
                                       << o.err;
    ::_exit(0);
  }
  pid_t victim = -1;
  for (int i = 0; i < 3000 && victim < 0; ++i) {
    if (std::filesystem::exists(ck)) victim = find_rank(1, ck);
    if (victim < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  const std::string outcome = read_bytes(dir.file("outcome"));  // "timeout ..." when the job hung
  INFO(outcome);
  REQUIRE_THAT(outcome, Catch::StartsWith("exit "));
  REQUIRE_THAT(outcome, !Catch::StartsWith("exit 0 "));
  REQUIRE_THAT(outcome, Catch::Contains("rank 1"));
  const auto saved = xgrad::load_safetensors(ck);  // intact
  const std::size_t at = std::stoul(saved.metadata.at("step"));
  REQUIRE(at > 0);
  REQUIRE(at < steps);

  // Resumed on the same world size, it ends where the uninterrupted run ended, to the bit.
  const Outcome resumed = mpirun(dir, 2, concat(args, {"--checkpoint", ck, "--resume"}));
  require_ok(resumed);
  REQUIRE_THAT(resumed.out, Catch::Contains("resuming at step " + std::to_string(at)));
  const auto a = xgrad::load_safetensors(straight), b = xgrad::load_safetensors(ck);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    INFO(a.tensors[i].first);
    REQUIRE(a.tensors[i].first == b.tensors[i].first);
    REQUIRE(a.tensors[i].second == b.tensors[i].second);  // every bit
  }

  // Throws: rank 1 alone runs with anomaly mode, so a NaN stops it in forward while rank 0 waits
  // in a collective.
  std::vector<std::string> cmd = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", kTrainLm};
  const std::vector<std::string> diverging = small({"--steps", "60", "--warmup", "1", "--lr", "10000", "--clip", "0"});
  cmd = concat(cmd, diverging);
  cmd = concat(cmd, {":", "-np", "1", kTrainLm});
  cmd = concat(cmd, concat(diverging, {"--detect-anomaly"}));
  const Outcome o = run_program(dir, XGRAD_MPIEXEC, cmd, mpi_limits(60));
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.code != 0);
  REQUIRE_THAT(o.err, Catch::Contains("train_lm (rank 1): error: step ") && Catch::Contains("anomaly"));
}
