// Which test cases the engine-forced passes run again. A test case whose result can depend on the
// GEMM engine carries the tag [gemm], and ctest labels it gemm (tests/CMakeLists.txt); the passes
// with XGRAD_GEMM forced run that label alone. tests/main.cpp keeps the tag honest: a case without
// it fails when it read the engine choice (every product does) or started a child process (which
// inherits XGRAD_GEMM and may compute products).
#pragma once

#include <atomic>
#include <cstddef>

namespace xgrad::testing {

// Child processes started so far: every fork() is counted (a pthread_atfork handler of
// tests/main.cpp); a start that does not fork (std::system, posix_spawn) calls note_child_process.
inline std::atomic<std::size_t>& child_processes() {
  static std::atomic<std::size_t> started{0};
  return started;
}
inline void note_child_process() { child_processes().fetch_add(1); }

}  // namespace xgrad::testing
