// File reading and writing (core/file_io): folders, devices, fifos and over-large files refused
// before reading, atomic writes that fail with the OS error and leave earlier files intact, output
// path checks, stale temporaries of killed saves, and the checkpoint loaders built on them
// (including the refusal of NaN and infinite weights). POSIX only: fork, mkfifo, setrlimit.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "test_files.hpp"

using namespace xgrad;
using Catch::Contains;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;
namespace fs = std::filesystem;

namespace {

// A fifo or a device must be refused, not waited on or read forever: if that regresses, SIGALRM
// ends the test program instead of hanging the suite.
struct HangGuard {
  HangGuard() { ::alarm(60); }
  ~HangGuard() { ::alarm(0); }
};

// The message of the xgrad::Error `f` throws; fails the test if it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no xgrad::Error was thrown");
  return {};
}

// The pid of a process that has exited and been reaped, so that pid names no process.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(::kill(pid, 0) == -1);
  REQUIRE(errno == ESRCH);
  return pid;
}

std::string with_pid(const std::string& path, long pid) { return path + ".tmp." + std::to_string(pid); }

bool bit_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// read_file

TEST_CASE("read_file reads a regular file whole and up to the byte limit", "[file_io]") {
  TempDir dir("xgrad_io");
  std::string bytes(100000, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  write_bytes(dir.file("f"), bytes);
  CHECK(read_file(dir.file("f"), "test") == bytes);
  CHECK(read_file(dir.file("f"), "test", bytes.size()) == bytes);  // the limit itself is allowed
  write_bytes(dir.file("empty"), "");
  CHECK(read_file(dir.file("empty"), "test", 0).empty());
}

TEST_CASE("read_file refuses a folder, a device, a fifo, a missing and a too-large file before reading", "[file_io]") {
  HangGuard guard;
  TempDir dir("xgrad_io");

  CHECK(error_of([&] { read_file(dir.path, "reader"); }) ==
        "reader: cannot read '" + dir.path + "': it is a folder, not a regular file");

  CHECK(error_of([&] { read_file("/dev/zero", "reader"); }) ==
        "reader: cannot read '/dev/zero': it is a character device, not a regular file");

  // Opening a fifo for reading blocks until a writer comes, unless the reader asks not to.
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(error_of([&] { read_file(fifo, "reader"); }) ==
        "reader: cannot read '" + fifo + "': it is a fifo, not a regular file");

  const std::string missing = dir.file("missing.bin");
  CHECK(error_of([&] { read_file(missing, "reader"); }) ==
        "reader: cannot open '" + missing + "': " + std::strerror(ENOENT));
  CHECK_THAT(error_of([&] { read_file(dir.file("pipe/x"), "reader"); }),
             Contains("cannot open") && Contains("Not a directory"));

  write_bytes(dir.file("big"), std::string(1000, 'x'));
  CHECK(error_of([&] { read_file(dir.file("big"), "reader", 999); }) ==
        "reader: cannot read '" + dir.file("big") + "': it holds 1000 bytes, more than the limit of 999");
  CHECK(read_file(dir.file("big"), "reader", 1000).size() == 1000);
}

// ----------------------------------------------------------------------------------------------
// write_file_atomically

TEST_CASE("write_file_atomically writes the chunks in order and replaces an earlier file", "[file_io]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("out.bin");
  write_bytes(path, "an earlier, longer file that must be replaced entirely");
  const std::string big(1 << 20, 'z');
  const std::vector<std::string_view> chunks = {"head", "", big, std::string_view("\0tail", 5)};
  write_file_atomically(path, chunks, "writer");
  CHECK(read_bytes(path) == "head" + big + std::string("\0tail", 5));
  CHECK(dir.entries() == std::set<std::string>{"out.bin"});  // no temporary left

  write_file_atomically(path, std::string("second"), "writer");
  CHECK(read_bytes(path) == "second");
  write_file_atomically(path, std::string(), "writer");
  CHECK(fs::exists(path));
  CHECK(fs::file_size(path) == 0);
  CHECK(dir.entries() == std::set<std::string>{"out.bin"});
}

TEST_CASE("write_file_atomically fails with the OS error and leaves what was there", "[file_io]") {
  HangGuard guard;
  TempDir dir("xgrad_io");
  const std::string suffix = " (anything already at that path is unchanged)";

  SECTION("into a missing folder") {
    const std::string path = dir.file("no_such_dir/out.bin");
    CHECK(error_of([&] { write_file_atomically(path, std::string("x"), "writer"); }) ==
          "writer: cannot write '" + path + "': creating the temporary file '" + temporary_path(path) +
              "' failed: " + std::strerror(ENOENT) + suffix);
    CHECK(dir.entries().empty());
  }

  SECTION("onto a folder") {
    const std::string path = dir.file("folder");
    fs::create_directory(path);
    write_bytes(path + "/inside", "kept");
    CHECK(error_of([&] { write_file_atomically(path, std::string("x"), "writer"); }) ==
          "writer: cannot write '" + path + "': " + std::strerror(EISDIR) + suffix);
    CHECK(fs::is_directory(path));
    CHECK(read_bytes(path + "/inside") == "kept");
    CHECK(dir.entries() == std::set<std::string>{"folder"});
    CHECK(error_of([&] { write_file_atomically("", std::string("x"), "writer"); }) ==
          "writer: cannot write a file: the path is empty");
  }

  SECTION("onto a fifo (a rename would replace it)") {
    const std::string path = dir.file("pipe");
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    CHECK(error_of([&] { write_file_atomically(path, std::string("x"), "writer"); }) ==
          "writer: cannot write '" + path + "': it is a fifo, not a regular file" + suffix);
    CHECK(fs::is_fifo(path));
    CHECK(dir.entries() == std::set<std::string>{"pipe"});
  }

  // Permission bits do not stop root (CI runs as root): a folder that is a regular file, or a
  // kernel file system, refuses everyone.
  SECTION("into a folder that cannot hold files") {
    const std::string file = dir.file("plain");
    write_bytes(file, "earlier bytes");
    const std::string path = file + "/out.bin";
    CHECK(error_of([&] { write_file_atomically(path, std::string("x"), "writer"); }) ==
          "writer: cannot write '" + path + "': creating the temporary file '" + temporary_path(path) +
              "' failed: " + std::strerror(ENOTDIR) + suffix);
    CHECK(read_bytes(file) == "earlier bytes");
    CHECK(dir.entries() == std::set<std::string>{"plain"});

    const std::string sys = "/sys/xgrad_file_io_test.bin";
    CHECK_THAT(error_of([&] { write_file_atomically(sys, std::string("x"), "writer"); }),
               Contains("writer: cannot write '" + sys + "': creating the temporary file") && Contains(suffix));
    CHECK(!fs::exists(sys));
  }
}

// The temporary name may be taken: by another writer of this process (its file open), or by a
// folder. The write takes the next free name and leaves what holds the first one alone (writers
// used to share `path.tmp.PID`: the second truncated and then renamed the first's file).
TEST_CASE("write_file_atomically leaves a taken temporary name alone and takes the next one", "[file_io]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("ckpt");
  const std::string first = temporary_path(path);
  write_bytes(path, "earlier checkpoint");
  write_bytes(first, "another writer's half-written file");
  write_file_atomically(path, std::string("new"), "writer");
  CHECK(read_bytes(path) == "new");
  CHECK(read_bytes(first) == "another writer's half-written file");
  CHECK(dir.entries() == std::set<std::string>{"ckpt", "ckpt.tmp." + std::to_string(::getpid())});

  fs::remove(first);
  fs::create_directory(first);
  write_bytes(first + "/inside", "kept");
  write_bytes(first + ".1", "a second writer's file");
  write_file_atomically(path, std::string("newer"), "writer");
  CHECK(read_bytes(path) == "newer");
  CHECK(read_bytes(first + "/inside") == "kept");
  CHECK(read_bytes(first + ".1") == "a second writer's file");
  std::string name;
  const int fd = create_temporary_file(path, name);
  REQUIRE(fd >= 0);
  ::close(fd);
  CHECK(name == first + ".2");
}

// Threads writing one path at once: every write succeeds and the file is always one of them, whole.
TEST_CASE("write_file_atomically from several threads on one path: the last rename wins, each file whole",
          "[file_io]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("shared.bin");
  constexpr int kThreads = 4, kWrites = 25;
  std::vector<std::string> contents;
  for (int t = 0; t < kThreads; ++t) contents.push_back(std::string(std::size_t{1} << 16, static_cast<char>('a' + t)));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int k = 0; k < kWrites; ++k) write_file_atomically(path, contents[t], "writer");
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) CHECK(e.empty());
  const std::string got = read_bytes(path);
  CHECK(std::find(contents.begin(), contents.end(), got) != contents.end());
  CHECK(dir.entries() == std::set<std::string>{"shared.bin"});
}

// A full disk, made real with a file size limit: past it write() fails with EFBIG (SIGXFSZ ignored).
// In a child process, so the limit and the ignored signal end with it.
TEST_CASE("write_file_atomically on a full disk names the error, removes its temporary and keeps the earlier file",
          "[file_io][gemm]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("ckpt.bin");
  std::string earlier(10000, '\0');
  for (std::size_t i = 0; i < earlier.size(); ++i) earlier[i] = static_cast<char>(i % 251);
  write_bytes(path, earlier);
  const std::string big(65536, 'n');

  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    int code = 2;
    if (::setrlimit(RLIMIT_FSIZE, &limit) == 0) {
      code = 3;
      try {
        write_file_atomically(path, std::vector<std::string_view>{"head", big}, "writer");
      } catch (const Error& e) {
        const std::string msg = e.what();
        code = ::write(fds[1], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()) ? 0 : 4;
      }
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    REQUIRE(r > 0);
    msg.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  INFO("child exit code (2: setrlimit failed, 3: no error thrown): " << WEXITSTATUS(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  const std::string tmp = with_pid(path, child);
  CHECK(msg == "writer: cannot write '" + path + "': writing the temporary file '" + tmp + "' failed after 4096 of " +
                   std::to_string(4 + big.size()) + " bytes: " + std::strerror(EFBIG) +
                   "; the file size limit (ulimit -f) is 4096 bytes (anything already at that path is unchanged)");
  CHECK(read_bytes(path) == earlier);
  CHECK(dir.entries() == std::set<std::string>{"ckpt.bin"});
}

// ----------------------------------------------------------------------------------------------
// check_writable_file and prepare_output_dir

TEST_CASE("check_writable_file accepts a writable path and leaves no probe behind", "[file_io]") {
  TempDir dir("xgrad_io");
  REQUIRE_NOTHROW(check_writable_file(dir.file("new.bin"), "run"));
  CHECK(!fs::exists(dir.file("new.bin")));
  CHECK(dir.entries().empty());
  write_bytes(dir.file("old.bin"), "kept");
  REQUIRE_NOTHROW(check_writable_file(dir.file("old.bin"), "run"));
  CHECK(read_bytes(dir.file("old.bin")) == "kept");
  CHECK(dir.entries() == std::set<std::string>{"old.bin"});
}

TEST_CASE("check_writable_file refuses a missing folder, a folder, a file as folder and a read-only folder",
          "[file_io]") {
  TempDir dir("xgrad_io");
  const std::string missing = dir.file("no_such_dir");
  CHECK(error_of([&] { check_writable_file(missing + "/out.bin", "run"); }) ==
        "run: cannot write '" + missing + "/out.bin': folder '" + missing + "': " + std::strerror(ENOENT));

  fs::create_directory(dir.file("sub"));
  CHECK(error_of([&] { check_writable_file(dir.file("sub"), "run"); }) ==
        "run: cannot write '" + dir.file("sub") + "': " + std::strerror(EISDIR));
  CHECK(error_of([&] { check_writable_file("", "run"); }) == "run: cannot write a file: the path is empty");
  CHECK(error_of([&] { check_writable_file(dir.file("sub") + "/", "run"); }) ==
        "run: cannot write '" + dir.file("sub") + "/': the path names a folder, not a file");

  write_bytes(dir.file("plain"), "x");
  CHECK(error_of([&] { check_writable_file(dir.file("plain") + "/out.bin", "run"); }) ==
        "run: cannot write '" + dir.file("plain") + "/out.bin': folder '" + dir.file("plain") +
            "': " + std::strerror(ENOTDIR));

  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(error_of([&] { check_writable_file(fifo, "run"); }) ==
        "run: cannot write '" + fifo + "': it is a fifo, not a regular file");

  // /sys refuses new files even to root.
  CHECK_THAT(error_of([&] { check_writable_file("/sys/xgrad_file_io_test.bin", "run"); }),
             Contains("run: cannot write '/sys/xgrad_file_io_test.bin': creating a file in '/sys' failed: "));
  CHECK(dir.entries() == std::set<std::string>{"sub", "plain", "pipe"});
}

TEST_CASE("prepare_output_dir creates missing folders and refuses what cannot hold files", "[file_io]") {
  TempDir dir("xgrad_io");
  const std::string nested = dir.file("a/b/c");
  REQUIRE_NOTHROW(prepare_output_dir(nested, "run"));
  CHECK(fs::is_directory(nested));
  CHECK(fs::is_empty(nested));                         // the probe is gone
  REQUIRE_NOTHROW(prepare_output_dir(nested, "run"));  // already there
  REQUIRE_NOTHROW(prepare_output_dir(dir.file("d") + "/", "run"));
  CHECK(fs::is_directory(dir.file("d")));

  write_bytes(dir.file("plain"), "kept");
  CHECK(error_of([&] { prepare_output_dir(dir.file("plain"), "run"); }) == "run: cannot use '" + dir.file("plain") +
                                                                               "' as a folder: it is a regular file (" +
                                                                               std::strerror(ENOTDIR) + ")");
  CHECK(error_of([&] { prepare_output_dir(dir.file("plain") + "/out", "run"); }) ==
        "run: cannot create the folder '" + dir.file("plain") + "/out': " + std::strerror(ENOTDIR));
  CHECK(read_bytes(dir.file("plain")) == "kept");
  CHECK(error_of([&] { prepare_output_dir("", "run"); }) == "run: the output folder name is empty");
  CHECK_THAT(error_of([&] { prepare_output_dir("/proc/xgrad_file_io_test/out", "run"); }),
             Contains("run: cannot create the folder '/proc/xgrad_file_io_test/out': "));
  // An existing folder that refuses new files even to root.
  CHECK(error_of([&] {
          prepare_output_dir("/proc", "run");
        }).rfind("run: cannot create files in the folder '/proc': ", 0) == 0);
}

// ----------------------------------------------------------------------------------------------
// Stale temporaries

TEST_CASE("remove_stale_temporaries removes a dead writer's file and nothing else", "[file_io][gemm]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("ckpt.safetensors");
  const pid_t dead = dead_pid();
  write_bytes(path, "the checkpoint");
  write_bytes(with_pid(path, dead), "partial");
  const std::set<std::string> kept = {
      "ckpt.safetensors",
      "ckpt.safetensors.tmp." + std::to_string(::getpid()),   // this process: a live writer
      "ckpt.safetensors.tmp." + std::to_string(::getppid()),  // the parent: alive too
      "ckpt.safetensors.tmp.1",                               // init
      "ckpt.safetensors.tmp.0",                               // kill(0) would mean the process group
      "ckpt.safetensors.tmp." + std::to_string(dead) + "x",   // not a pid
      "ckpt.safetensors.tmp.0" + std::to_string(dead),        // not as a writer names it
      "ckpt.safetensors.tmp.99999999999",                     // past any pid
      "ckpt.safetensors.tmp.",
      "ckpt.safetensors.tmp.-1",
      "other.safetensors.tmp." + std::to_string(dead),  // another checkpoint's
      "xckpt.safetensors.tmp." + std::to_string(dead),
      "ckpt.safetensors.tmp." + std::to_string(::getpid()) + ".2",  // this process's second name
      "ckpt.safetensors.tmp." + std::to_string(dead) + ".",         // not as a writer names it
      "ckpt.safetensors.tmp." + std::to_string(dead) + ".01",
      "ckpt.safetensors.tmp." + std::to_string(dead) + ".1x",
  };
  for (const std::string& f : kept) {
    if (f != "ckpt.safetensors") write_bytes(dir.file(f), "keep");
  }
  // A folder with a dead writer's name is not a temporary file either.
  const pid_t dead2 = dead_pid();
  fs::create_directory(with_pid(path, dead2));

  write_bytes(with_pid(path, dead) + ".3", "partial");  // a dead writer's later name
  CHECK(remove_stale_temporaries(path) == 2);
  std::set<std::string> expect = kept;
  expect.insert("ckpt.safetensors.tmp." + std::to_string(dead2));
  CHECK(dir.entries() == expect);
  CHECK(read_bytes(path) == "the checkpoint");
  CHECK(remove_stale_temporaries(path) == 0);
  CHECK(remove_stale_temporaries(dir.file("no_such_dir/ckpt")) == 0);
  CHECK(remove_stale_temporaries(dir.path + "/") == 0);
}

TEST_CASE("save_safetensors and load_safetensors remove the stale temporaries of their path", "[file_io][gemm]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("ckpt.safetensors");
  const std::string live = with_pid(path, ::getppid());
  const pid_t dead = dead_pid();
  write_bytes(with_pid(path, dead), std::string(5000, 'p'));
  write_bytes(live, "live");

  save_safetensors(path, {{"w", Array{1.f, 2.f}}});
  CHECK(dir.entries() == std::set<std::string>{"ckpt.safetensors", fs::path(live).filename().string()});

  write_bytes(with_pid(path, dead), std::string(5000, 'p'));
  const SafetensorsContents back = load_safetensors(path);
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].second == Array{1.f, 2.f});
  CHECK(dir.entries() == std::set<std::string>{"ckpt.safetensors", fs::path(live).filename().string()});
  CHECK(read_bytes(live) == "live");
}

// ----------------------------------------------------------------------------------------------
// load_safetensors on what is not a checkpoint file

TEST_CASE("load_safetensors refuses a folder, /dev/zero and a fifo at once, and a file shorter than its header says",
          "[file_io]") {
  HangGuard guard;
  TempDir dir("xgrad_io");
  CHECK(error_of([&] { load_safetensors(dir.path); }) ==
        "load_safetensors: cannot read '" + dir.path + "': it is a folder, not a regular file");
  CHECK(error_of([&] { load_safetensors("/dev/zero"); }) ==
        "load_safetensors: cannot read '/dev/zero': it is a character device, not a regular file");
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(error_of([&] { load_safetensors(fifo); }) ==
        "load_safetensors: cannot read '" + fifo + "': it is a fifo, not a regular file");

  // The 8-byte length promises more than the file holds.
  const std::string path = dir.file("short.safetensors");
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(200);
  write_bytes(path, bytes + "{}");
  CHECK(error_of([&] { load_safetensors(path); }) ==
        "load_safetensors: '" + path + "': truncated: header length 200 but only 2 bytes follow");
  // The header promises more data than follows it (refused before any data is read).
  const std::string header = R"({"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  write_bytes(path, len + header + std::string(16, '\0'));
  CHECK(error_of([&] { load_safetensors(path); }) ==
        "load_safetensors: '" + path + "': tensor 'w' has a shape larger than the file");
}

// ----------------------------------------------------------------------------------------------
// Non-finite weights

TEST_CASE("load_checkpoint refuses NaN and infinite weights, naming the file, parameter and position, unless allowed",
          "[file_io][checkpoint]") {
  TempDir dir("xgrad_io");
  const std::string path = dir.file("lin.safetensors");
  Generator g_target(3), g_source(4);
  nn::Linear target(2, 3, true, g_target);
  nn::Linear source(2, 3, true, g_source);
  const NamedArrays before = weights::state_dict(target);
  REQUIRE(before[0].first == "weight");
  REQUIRE(before[1].first == "bias");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto unchanged = [&] {
    const NamedArrays now = weights::state_dict(target);
    return bit_equal(now[0].second, before[0].second) && bit_equal(now[1].second, before[1].second);
  };

  NamedArrays bad = weights::state_dict(source);
  bad[0].second.data()[4] = nan;
  weights::save_checkpoint(path, source);  // a good file first: the bad one replaces it below
  save_safetensors(path, {{"weight", bad[0].second}, {"bias", bad[1].second}, {"optimizer.w.step", Array(1.f)}});
  CHECK(error_of([&] { weights::load_checkpoint(path, target); }) ==
        "load_checkpoint: '" + path +
            "': load_state_dict: parameter 'weight' holds nan at flat position 4 of 6; "
            "refusing non-finite weights (LoadOptions().allow_non_finite(true) loads them)");
  CHECK(unchanged());

  NamedArrays bad_bias = weights::state_dict(source);
  bad_bias[1].second.data()[1] = -inf;
  weights::save_checkpoint(path, source);
  save_safetensors(path, bad_bias);
  CHECK_THAT(error_of([&] { weights::load_checkpoint(path, target); }),
             Contains(path) && Contains("parameter 'bias' holds -inf at flat position 1 of 3"));
  CHECK(unchanged());
  CHECK_THAT(error_of([&] { weights::load_state_dict(target, bad_bias); }),
             Contains("load_state_dict: parameter 'bias' holds -inf at flat position 1 of 3"));
  bad_bias[1].second.data()[1] = inf;
  CHECK_THAT(error_of([&] { weights::load_state_dict(target, bad_bias); }),
             Contains("parameter 'bias' holds inf at flat position 1"));
  CHECK(unchanged());

  // Allowed explicitly, the values arrive bit for bit.
  save_safetensors(path, {{"weight", bad[0].second}, {"bias", bad[1].second}});
  REQUIRE_NOTHROW(weights::load_checkpoint(path, target, weights::LoadOptions().allow_non_finite(true)));
  CHECK(std::isnan(target.weight.value().data()[4]));
  CHECK(bit_equal(target.weight.value(), bad[0].second));
  REQUIRE_NOTHROW(weights::load_state_dict(target, bad_bias, weights::LoadOptions().allow_non_finite(true)));
  CHECK(target.bias.value().data()[1] == inf);

  // Finite values load as before, through both calls' old signatures.
  REQUIRE_NOTHROW(weights::load_state_dict(target, before));
  CHECK(unchanged());
  weights::save_checkpoint(path, source);
  REQUIRE_NOTHROW(weights::load_checkpoint(path, target));
  CHECK(bit_equal(target.weight.value(), weights::state_dict(source)[0].second));
}

// ----------------------------------------------------------------------------------------------
// check_run_paths: the one output-path rule

TEST_CASE("check_run_paths refuses an output that is an input, a file of an input folder or another output",
          "[file_io][bad_input]") {
  TempDir dir("xgrad_io_paths");
  fs::create_directory(dir.file("g"));
  write_bytes(dir.file("g/vocab.json"), "{}");
  write_bytes(dir.file("g/merges.txt"), "#version: 0.2\n");
  write_bytes(dir.file("tok.model"), "model");
  write_bytes(dir.file("a.txt"), "text");
  fs::create_symlink("g", dir.file("link_to_g"));
  fs::create_symlink("tok.model", dir.file("tok_link"));
  const std::vector<RunPath> folder_in = {{"--tokenizer", dir.file("g"), true}, {"the text", dir.file("a.txt")}};
  auto refused = [&](const std::vector<RunPath>& in, const std::vector<RunPath>& out) {
    return error_of([&] { check_run_paths(in, out, "tool"); });
  };

  // A file of an input folder, however spelled: the folder's own files, through a link to the
  // folder, with "./" and "..".
  CHECK(refused(folder_in, {{"--checkpoint", dir.file("g/vocab.json")}}) ==
        "tool: --checkpoint '" + dir.file("g/vocab.json") + "' is the same file as 'vocab.json' in --tokenizer '" +
            dir.file("g") + "': writing it would destroy what the run reads; choose another path");
  CHECK_THAT(refused(folder_in, {{"--val", dir.file("link_to_g/merges.txt")}}),
             Contains("--val '" + dir.file("link_to_g/merges.txt") + "' is the same file as 'merges.txt' in"));
  CHECK_THAT(refused(folder_in, {{"--val", dir.path + "/./g/../g/merges.txt"}}), Contains("'merges.txt' in"));
  // A new file in an input folder would change what it holds.
  CHECK(refused(folder_in, {{"--out", dir.file("link_to_g/new.bin")}}) ==
        "tool: --out '" + dir.file("link_to_g/new.bin") + "' would be written in --tokenizer '" + dir.file("g") +
            "', a folder the run reads; choose a path outside it");
  // The folder itself.
  CHECK_THAT(refused(folder_in, {{"--out (a folder)", dir.file("./g/")}}),
             Contains("--out (a folder) '" + dir.file("./g/") + "' is the same file as --tokenizer"));
  // An input file, through a symlink or "./"; and two outputs that are one file not there yet.
  CHECK_THAT(
      refused({{"--tokenizer", dir.file("tok.model"), true}}, {{"--out", dir.file("tok_link")}}),
      Contains("--out '" + dir.file("tok_link") + "' is the same file as --tokenizer '" + dir.file("tok.model")));
  CHECK_THAT(refused({{"the text", dir.file("a.txt")}}, {{"--out", dir.path + "/./a.txt"}}),
             Contains("is the same file as the text"));
  CHECK(refused({}, {{"--save-tokenizer's vocab.json", dir.file("st/vocab.json")},
                     {"--checkpoint", dir.file("st/./vocab.json")}}) ==
        "tool: --checkpoint '" + dir.file("st/./vocab.json") + "' is the same file as --save-tokenizer's vocab.json '" +
            dir.file("st/vocab.json") + "': one would overwrite the other; choose another path");

  // Fine: beside the folder, in a subfolder of it, a folder input read as a file, a text in an
  // output folder.
  CHECK_NOTHROW(check_run_paths(folder_in, {{"--out", dir.file("t.bin")}, {"--val", dir.file("v.bin")}}, "tool"));
  fs::create_directory(dir.file("g/sub"));
  CHECK_NOTHROW(check_run_paths(folder_in, {{"--out", dir.file("g/sub/t.bin")}}, "tool"));
  CHECK_NOTHROW(check_run_paths({{"the text", dir.file("g")}}, {{"--out", dir.file("g/t.bin")}}, "tool"));
  CHECK_NOTHROW(check_run_paths({{"the text", dir.file("a.txt")}},
                                {{"--out (a folder)", dir.path}, {"--out's log.csv", dir.file("log.csv")}}, "tool"));
  // Two folders written into may be one; a file output may not be a folder output.
  CHECK_NOTHROW(check_run_paths({}, {{"--out", dir.file("o"), true}, {"--save", dir.file("./o"), true}}, "tool"));
  CHECK_THAT(refused({}, {{"--out", dir.file("o"), true}, {"--checkpoint", dir.file("./o")}}),
             Contains("one would overwrite the other"));
  CHECK(same_file(dir.file("a.txt"), dir.path + "/./a.txt"));
  CHECK(same_file(dir.file("tok_link"), dir.file("tok.model")));
  CHECK_FALSE(same_file(dir.file("a.txt"), dir.file("tok.model")));
}

// The same full disk as above, and the same error, but the limit in it: a program that ignores
// SIGXFSZ under `ulimit -f` sees the reason.
TEST_CASE("write_error_text names the file size limit behind EFBIG", "[file_io][bad_input][gemm]") {
  CHECK(write_error_text(ENOSPC) == std::strerror(ENOSPC));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const rlimit limit{4096, 4096};
    const bool ok = ::setrlimit(RLIMIT_FSIZE, &limit) == 0 &&
                    write_error_text(EFBIG) ==
                        std::string(std::strerror(EFBIG)) + "; the file size limit (ulimit -f) is 4096 bytes";
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &now) == 0);
  if (now.rlim_cur == RLIM_INFINITY) CHECK(write_error_text(EFBIG) == std::strerror(EFBIG));
}
