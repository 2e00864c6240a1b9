// Jobs that used to never end: each runs test_distributed_job under `mpirun -np 2` as a child
// process under a time limit, and must end non-zero, soon, with a line naming the rank and what
// it waited for (a bucket, a call, the other rank's call). XGRAD_DIST_TIMEOUT is 2 s where the
// timeout is what ends the job, and 60 s where a check must end it first.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_program.hpp"
#include "test_files.hpp"

using xgrad::testing::Limits;
using xgrad::testing::Outcome;
using xgrad::testing::read_bytes;
using xgrad::testing::run_program;
using xgrad::testing::TempDir;

namespace {

Outcome job(const TempDir& dir, const std::string& mode, const std::string& timeout, int limit_seconds = 40) {
  Limits limits;
  limits.seconds = limit_seconds;
  limits.memory = RLIM_INFINITY;  // Open MPI maps large shared-memory segments
  return run_program(dir, XGRAD_MPIEXEC,
                     {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-x",
                      "XGRAD_DIST_TIMEOUT=" + timeout, "-np", "2", XGRAD_DISTRIBUTED_JOB, mode, dir.path},
                     limits);
}

// Ended by the job itself, non-zero: not by the time limit of job(), which a hang would reach.
void require_failed(const Outcome& o) {
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.exited);
  REQUIRE(o.code != 0);
}

// User plus system CPU seconds of a process so far, from /proc/PID/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after "pid (name) "
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i >= 14) ticks += std::stod(f);  // fields 14 and 15: utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

}  // namespace

TEST_CASE("a job whose ranks agree ends 0, and a rank waiting for a late one sleeps", "[distributed][gemm]") {
  TempDir dir("xgrad_job_ok");
  const Outcome o = job(dir, "ok", "60");
  INFO(o);
  REQUIRE(o.code == 0);
  REQUIRE_THAT(o.out, Catch::Contains("test_distributed_job ok: done"));
  double wall = 0, cpu = 0;
  REQUIRE(std::sscanf(o.out.c_str(), "rank 0: first step: %lf s wall, %lf s CPU", &wall, &cpu) == 2);
  std::printf("rank 0 waited %.2f s for rank 1 in a gradient reduction, using %.3f s of CPU\n", wall, cpu);
  REQUIRE(wall > 1.0);
  REQUIRE(cpu < 0.1 * wall);
}

TEST_CASE("a rank that returns non-zero from main while another is in a reduction ends the job at once",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_return");
  const Outcome o = job(dir, "return-error", "60");
  require_failed(o);
  REQUIRE_THAT(o.err, Catch::Contains("rank 1 gives up at step 1"));
  REQUIRE_THAT(o.err, Catch::Contains("ProcessGroup: rank 1 is leaving the program with status 1: ending the job"));
}

TEST_CASE("a rank that throws out of main while another is in a reduction ends the job at once",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_throw");
  const Outcome o = job(dir, "throw", "60");
  require_failed(o);
  REQUIRE_THAT(o.err, Catch::Contains("rank 1 throws out of main at step 1"));
}

TEST_CASE(
    "a stopped rank ends the job by the timeout, naming the rank, the bucket and the wait, and the other sleeps "
    "meanwhile",
    "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_stop");
  Outcome o;
  std::thread launcher([&] { o = job(dir, "stop", "2"); });
  pid_t pids[2] = {-1, -1};
  for (int i = 0; i < 2000 && (pids[0] <= 0 || pids[1] <= 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int r = 0; r < 2; ++r) pids[r] = read_pid(dir.file("rank" + std::to_string(r) + ".pid"));
  }
  const bool started = pids[0] > 0 && pids[1] > 0;
  double cpu = -1;
  if (started) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few steps
    ::kill(pids[1], SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is waiting now
    const double before = cpu_seconds(pids[0]);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    cpu = cpu_seconds(pids[0]) - before;
  }
  launcher.join();
  if (started && ::kill(pids[1], 0) == 0) ::kill(pids[1], SIGKILL);  // never left stopped
  REQUIRE(started);
  require_failed(o);
  std::printf("CPU seconds of rank 0 in 1 s of waiting for the stopped rank 1: %.3f\n", cpu);
  REQUIRE(cpu < 0.1);
  REQUIRE_THAT(o.err, Catch::Contains("DataParallel: the reduction of bucket ") && Catch::Contains(" of 4 (") &&
                          Catch::Contains(" floats): rank 0 waited 2.") &&
                          Catch::Contains(" s (the timeout is 2 s; XGRAD_DIST_TIMEOUT sets it) for the other ranks"));
}

TEST_CASE("a rank late past the timeout for a blocking collective ends the job naming the call and the wait",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_late");
  const Outcome o = job(dir, "late", "2");
  require_failed(o);
  REQUIRE(o.seconds > 2);
  REQUIRE_THAT(
      o.err,
      Catch::Contains("allreduce_sum of a double: rank 0 waited 2.") &&
          Catch::Contains(
              " s (the timeout is 2 s; XGRAD_DIST_TIMEOUT sets it) for the other ranks: one is stopped, hung, gone"));
}

TEST_CASE("ranks that run different numbers of backward passes per step end the job naming both calls",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_passes");
  const Outcome o = job(dir, "uneven-passes", "60");
  require_failed(o);
  // Rank 0's second pass meets rank 1's loss mean; whichever rank reports first names both.
  REQUIRE_THAT(o.err, Catch::Contains("rank 0 is in iallreduce_sum while rank 1 is in allreduce_sum (double)") ||
                          Catch::Contains("rank 1 is in allreduce_sum (double) while rank 0 is in iallreduce_sum"));
}

TEST_CASE("a rank that leaves main while another still reduces ends the job naming both",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_exit");
  const Outcome o = job(dir, "uneven-exit", "60");
  require_failed(o);
  REQUIRE_THAT(o.err, Catch::Contains("rank 0 is in iallreduce_sum while rank 1 is leaving the program") ||
                          Catch::Contains("rank 1 is leaving the program while rank 0 is in iallreduce_sum"));
}

TEST_CASE("a DataParallel built on one rank only ends the job naming what each rank does",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_ddp");
  const Outcome o = job(dir, "ddp-one-rank", "60");
  require_failed(o);
  REQUIRE_THAT(
      o.err,
      Catch::Contains("DataParallel: rank 0 is constructing a DataParallel while rank 1 is in allreduce_sum (double)"));
  REQUIRE_THAT(o.err,
               Catch::Contains(
                   "allreduce_sum: rank 1 is in allreduce_sum (double) while rank 0 is constructing a DataParallel") ||
                   Catch::Contains("ProcessGroup: rank 0 is leaving the program with status 1"));
}

TEST_CASE("an XGRAD_DIST_TIMEOUT that is not a number of seconds > 0 is refused naming it",
          "[distributed][bad_input][gemm]") {
  TempDir dir("xgrad_job_env");
  const Outcome o = job(dir, "ok", "abc");
  INFO(o);
  require_failed(o);
  REQUIRE_THAT(o.err, Catch::Contains("ProcessGroup: XGRAD_DIST_TIMEOUT 'abc' is not a number of seconds > 0"));
  // The same check without mpirun (the variable is read before MPI is looked for).
  Limits limits;
  limits.seconds = 20;
  for (const std::string bad : {"0", "-5", "2s", "nan", ""}) {
    ::setenv("XGRAD_DIST_TIMEOUT", bad.c_str(), 1);
    const Outcome one = run_program(dir, XGRAD_DISTRIBUTED_JOB, {"ok"}, limits);
    ::unsetenv("XGRAD_DIST_TIMEOUT");
    INFO(one);
    REQUIRE(one.exited);
    REQUIRE(one.code == 1);
    REQUIRE_THAT(one.err,
                 Catch::Contains("ProcessGroup: XGRAD_DIST_TIMEOUT '" + bad + "' is not a number of seconds > 0"));
  }
  ::setenv("XGRAD_DIST_TIMEOUT", "7.5", 1);
  const Outcome fine = run_program(dir, XGRAD_DISTRIBUTED_JOB, {"ok"}, limits);
  ::unsetenv("XGRAD_DIST_TIMEOUT");
  INFO(fine);
  REQUIRE(fine.code == 0);
  REQUIRE_THAT(fine.out, Catch::Contains("test_distributed_job ok: done"));
}
