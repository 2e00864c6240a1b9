// Running a program as a child process under limits, for the tests that run the example
// programs as a user would: a time limit, an address-space limit (not under AddressSanitizer,
// which reserves terabytes of it), no core dumps, and optionally a file-size limit that makes
// writes fail as on a full disk. stdout and stderr are captured in files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "peak_memory.hpp"  // kAddressSanitizer
#include "test_files.hpp"

namespace xgrad::testing {

struct Limits {
  int seconds = 60;
  rlim_t memory = rlim_t{3} << 30;   // address space, bytes
  rlim_t file_size = RLIM_INFINITY;  // bytes; a write past it fails with EFBIG, like a full disk
};

struct Outcome {
  bool exited = false;  // false: killed by a signal (or by the time limit)
  int code = -1;        // exit code, or the signal
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
};

inline std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << (o.timed_out ? "timed out"
                : o.exited  ? "exit " + std::to_string(o.code)
                            : "signal " + std::to_string(o.code))
            << " after " << o.seconds << " s\n--- stdout\n"
            << o.out.substr(0, 2000) << "\n--- stderr\n"
            << o.err.substr(0, 2000);
}

// Runs `exe` in `dir` with the given arguments, stdout and stderr in files there.
inline Outcome run_program(const TempDir& dir, const std::string& exe, const std::vector<std::string>& args,
                           const Limits& limits = {}) {
  const std::string out_path = dir.file(".stdout"), err_path = dir.file(".stderr");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(dir.path.c_str()) != 0) ::_exit(120);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(121);
    if (!kAddressSanitizer) {
      const rlimit as{limits.memory, limits.memory};
      ::setrlimit(RLIMIT_AS, &as);
    }
    const rlimit core{0, 0};
    ::setrlimit(RLIMIT_CORE, &core);
    if (limits.file_size != RLIM_INFINITY) {
      ::signal(SIGXFSZ, SIG_IGN);  // stays ignored across exec: writes fail with EFBIG instead
      const rlimit fs{limits.file_size, limits.file_size};
      ::setrlimit(RLIMIT_FSIZE, &fs);
    }
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(122);
  }
  REQUIRE(pid > 0);
  Outcome o;
  int status = 0;
  const auto deadline = start + std::chrono::seconds(limits.seconds * (kAddressSanitizer ? 4 : 1));
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      o.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.exited = WIFEXITED(status);
  o.code = o.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  o.out = read_bytes(out_path);
  o.err = read_bytes(err_path);
  return o;
}

// The program exited 0, within its time limit.
inline void require_ok(const Outcome& o) {
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.exited);
  REQUIRE(o.code == 0);
}

// Exit 2 (a usage error) with every part on stderr.
inline void require_usage_error(const Outcome& o, const std::vector<std::string>& parts) {
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 2);
  for (const std::string& p : parts) REQUIRE_THAT(o.err, Catch::Contains(p));
}

// Sets an environment variable for a scope (children inherit it), then restores it.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace xgrad::testing
