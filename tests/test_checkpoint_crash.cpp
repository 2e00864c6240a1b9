// A save killed in the middle (SIGKILL, as a crash or an OOM kill would) leaves the checkpoint
// at its path loadable and equal to the previous checkpoint or to the new one, never a mix or a
// cut file. POSIX only: fork, kill, waitpid, a pipe.
//
// What a killed save leaves behind: save_safetensors writes "<path>.tmp.<pid>", syncs it and
// renames it over <path>. Killed before the rename, the temporary file stays next to the
// checkpoint, complete or partial. Nothing reads it, and the next save or load of the same path
// removes it once its writer's pid is gone (remove_stale_temporaries); this test checks what is
// left before loading, and deletes the leftovers after each round.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "small_models.hpp"
#include "test_files.hpp"

using namespace xgrad;
using testing::read_bytes;
using testing::small_lm;
using testing::TempDir;
using testing::write_bytes;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Deterministic values, different for each `salt`; no two arrays of A and B agree anywhere.
Array pattern(const Shape& shape, float salt) {
  Array a = Array::from_shape(shape);
  float* p = a.data();
  for (std::size_t i = 0; i < a.size(); ++i) p[i] = salt + static_cast<float>(i % 4093) * 0.5f;
  return a;
}

bool bit_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool named_equal(const NamedArrays& x, const NamedArrays& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].first != y[i].first || !bit_equal(x[i].second, y[i].second)) return false;
  }
  return true;
}

// One checkpoint: a small model's parameters plus a large stand-in optimizer state (16 MiB), so a
// save (write + fsync) takes tens of milliseconds and can be interrupted.
struct Snapshot {
  NamedArrays params;
  NamedArrays optimizer_state;
  Metadata metadata;
};

// What weights::save_checkpoint writes for a snapshot's model (checked against save_checkpoint's
// own file below).
SafetensorsContents checkpoint_contents(const nn::Module& model, const Snapshot& s) {
  return weights::checkpoint_contents(model, s.optimizer_state, s.metadata);
}

// The child: saves checkpoint B to `path` again and again, writing 'S' to the pipe just before
// each save and 'D' after it. It calls save_safetensors on contents built in advance rather than
// weights::save_checkpoint, which first copies every array: that way the temporary file is opened
// microseconds after 'S', so the parent's delays fall inside the write. Bounded (50 saves or
// 8 s) in case nobody kills it; never returns.
[[noreturn]] void child_saves(int fd, const std::string& path, const NamedArrays& contents, const Metadata& metadata) {
  int code = 0;
  try {
    const auto t0 = Clock::now();
    for (int k = 0; k < 50 && Clock::now() - t0 < std::chrono::seconds(8); ++k) {
      if (::write(fd, "S", 1) != 1) code = 4;
      save_safetensors(path, contents, metadata);
      if (::write(fd, "D", 1) != 1) code = 4;
    }
  } catch (...) {
    code = 3;
  }
  ::_exit(code);  // no atexit handlers, no Catch teardown in the child
}

// Kills and reaps the child however the round ends, so no process outlives the test.
struct ChildGuard {
  pid_t pid = -1;
  int status = 0;
  void kill_and_reap() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }
  ~ChildGuard() { kill_and_reap(); }
};

struct Fd {
  int fd = -1;
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~Fd() { close(); }
};

// Waits up to `timeout_ms` for the byte `want` on `fd`; counts the 'D's seen on the way.
bool wait_for(int fd, char want, int timeout_ms, int& done) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int left =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    const int r = ::poll(&p, 1, left > 0 ? left : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) return false;  // EOF: the child is gone
    if (c == 'D') ++done;
    if (c == want) return true;
  }
  return false;
}

// Waits up to `timeout_ms` for `path` to appear.
bool wait_for_file(const std::string& path, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (fs::exists(path)) return true;
    ::usleep(100);
  }
  return false;
}

// Reads what is left in the pipe after the child died (EOF comes once it is reaped).
void drain(int fd, int& done) {
  char buf[256];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i) done += buf[i] == 'D';
  }
}

// Temporary files of interrupted saves next to `path`.
std::vector<std::string> leftovers(const std::string& dir, const std::string& base) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(base + ".tmp.", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

}  // namespace

TEST_CASE("a save killed mid-write leaves either the previous checkpoint or the new one and never a mix",
          "[checkpoint][crash][gemm]") {
  const auto test_start = Clock::now();
  TempDir dir("xgrad_crash");
  const std::string base = "ckpt.safetensors";
  const std::string path = dir.file(base);

  // Checkpoint A and checkpoint B: different models, different large state (names, shapes and
  // values), different metadata: 16 MiB of data per file. (Bigger files make the test slower, not
  // stronger.)
  Generator g_a(31), g_b(32), g_probe(33);
  nn::LanguageModel model_a(small_lm(), g_a), model_b(small_lm(), g_b), probe(small_lm(), g_probe);
  Snapshot a{weights::state_dict(model_a),
             {{"moments.m", pattern({2u << 20}, 1.f)}, {"moments.v", pattern({1024, 2048}, 2.f)}},
             {{"step", "100"}, {"which", "A"}}};
  Snapshot b{weights::state_dict(model_b),
             {{"moments.m", pattern({2048, 1024}, -3.f)},
              {"moments.v", pattern({2u << 20}, -4.f)},
              {"moments.extra", pattern({1024}, 5.f)}},
             {{"step", "200"}, {"which", "B"}}};

  // The reference bytes of each file, and how long one save takes here. The child's way of
  // saving B writes exactly what weights::save_checkpoint writes.
  const SafetensorsContents contents_b = checkpoint_contents(model_b, b);
  weights::save_checkpoint(dir.file("b_reference"), model_b, b.optimizer_state, b.metadata);
  const std::string bytes_b = read_bytes(dir.file("b_reference"));
  save_safetensors(dir.file("b_direct"), contents_b.tensors, contents_b.metadata);
  REQUIRE(read_bytes(dir.file("b_direct")) == bytes_b);
  fs::remove(dir.file("b_reference"));
  fs::remove(dir.file("b_direct"));
  const double setup_s = std::chrono::duration<double>(Clock::now() - test_start).count();
  const auto t0 = Clock::now();
  weights::save_checkpoint(path, model_a, a.optimizer_state, a.metadata);
  const double save_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::string bytes_a = read_bytes(path);
  REQUIRE(bytes_a.size() > (16u << 20));
  REQUIRE(bytes_b.size() > (16u << 20));
  REQUIRE(bytes_a != bytes_b);

  // When each round kills the child: a delay after it announced a save (fixed ones and half a
  // measured save, so a fast disk is still hit mid-write), a delay after its temporary file
  // appeared (inside the write, whatever the machine's speed), or during the save after one
  // finished save.
  enum class After { announce, temporary_file, finished_save };
  struct Round {
    After after;
    int delay_ms;
  };
  const std::vector<Round> rounds = {
      {After::announce, 5},       {After::announce, 20},
      {After::announce, 50},      {After::announce, std::max(1, static_cast<int>(save_ms / 2))},
      {After::temporary_file, 2}, {After::finished_save, 0}};
  int interrupted = 0, interrupted_with_a = 0, ended_a = 0, ended_b = 0;
  std::ostringstream log;

  for (std::size_t round = 0; round < rounds.size(); ++round) {
    const Round& r = rounds[round];
    const std::string when =
        r.after == After::finished_save
            ? "after one finished save"
            : std::to_string(r.delay_ms) + " ms after " +
                  (r.after == After::announce ? "the child announced a save" : "its temporary file appeared");
    const auto round_start = Clock::now();
    INFO("round " << round << ": kill " << when);
    // Every round starts from A, saved while the previous round's leftover is still there.
    if (round > 0) weights::save_checkpoint(path, model_a, a.optimizer_state, a.metadata);
    for (const std::string& f : leftovers(dir.path, base)) fs::remove(f);
    REQUIRE(fs::file_size(path) == bytes_a.size());  // its bytes are compared after the kill

    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    Fd rd{fds[0]}, wr{fds[1]};
    ChildGuard child;
    child.pid = ::fork();
    REQUIRE(child.pid >= 0);
    if (child.pid == 0) {
      rd.close();
      child_saves(wr.fd, path, contents_b.tensors, contents_b.metadata);
    }
    wr.close();  // so the parent sees EOF once the child is gone
    const pid_t pid = child.pid;

    const std::string tmp = path + ".tmp." + std::to_string(pid);  // what save_safetensors writes first
    int done = 0;
    bool started = false;
    switch (r.after) {
      case After::announce:
        started = wait_for(rd.fd, 'S', 10000, done);
        break;
      case After::temporary_file:
        started = wait_for_file(tmp, 10000);
        break;
      case After::finished_save:
        started = wait_for(rd.fd, 'D', 20000, done) && wait_for(rd.fd, 'S', 10000, done);
        break;
    }
    if (started) ::usleep(static_cast<useconds_t>(r.delay_ms) * 1000);
    child.kill_and_reap();
    drain(rd.fd, done);
    REQUIRE(started);
    REQUIRE(WIFSIGNALED(child.status));  // killed, not exited (an exit would mean a failed save)
    REQUIRE(WTERMSIG(child.status) == SIGKILL);

    // What the killed save left: its temporary file exists iff it died between open and rename.
    const bool tmp_left = fs::exists(tmp);
    const std::uintmax_t tmp_size = tmp_left ? fs::file_size(tmp) : 0;
    const std::vector<std::string> extra = leftovers(dir.path, base);
    CHECK(extra.size() == (tmp_left ? 1u : 0u));  // nothing else, e.g. no leftover of the parent's saves

    // The checkpoint is exactly A or exactly B, byte for byte, with the leftover still present.
    const std::string got = read_bytes(path);
    const bool is_a = got == bytes_a, is_b = got == bytes_b;
    INFO("file of " << got.size() << " bytes, " << done << " saves finished, temporary file left: " << tmp_left);
    REQUIRE((is_a || is_b));
    if (done > 0) REQUIRE(is_b);               // a finished save was renamed into place
    if (done == 0 && tmp_left) REQUIRE(is_a);  // the first save was cut: the previous file stands

    // And it loads, through the checkpoint API, as the same snapshot.
    const Snapshot& expect = is_a ? a : b;
    weights::Checkpoint ck;
    REQUIRE_NOTHROW(ck = weights::load_checkpoint(path, probe));
    CHECK(named_equal(weights::state_dict(probe), expect.params));
    CHECK(named_equal(ck.optimizer_state, expect.optimizer_state));
    CHECK(ck.metadata == expect.metadata);

    interrupted += tmp_left;
    interrupted_with_a += tmp_left && is_a;
    ended_a += is_a;
    ended_b += is_b;
    log << "  round " << round << ": kill " << when << ", " << done << " saves finished, file = " << (is_a ? "A" : "B")
        << ", temporary file left: "
        << (tmp_left ? std::to_string(tmp_size) + " of " + std::to_string(bytes_b.size()) + " bytes" : "none") << " ("
        << std::chrono::duration<double>(Clock::now() - round_start).count() << " s)\n";
  }
  for (const std::string& f : leftovers(dir.path, base)) fs::remove(f);

  const double seconds = std::chrono::duration<double>(Clock::now() - test_start).count();
  std::cout << "checkpoint crash: one save of " << bytes_a.size() << " bytes took " << save_ms << " ms; "
            << rounds.size() << " rounds in " << seconds << " s (setup " << setup_s << " s); " << interrupted
            << " killed mid-write (" << interrupted_with_a << " with the previous checkpoint intact), file A after "
            << ended_a << ", B after " << ended_b << "\n"
            << log.str();
  // The interruption really happened: at least one save was killed between creating its
  // temporary file and renaming it, and the previous checkpoint survived it.
  CHECK(interrupted >= 1);
  CHECK(interrupted_with_a >= 1);
  CHECK(ended_b >= 1);  // the last round always ends with B
}
