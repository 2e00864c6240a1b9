// Catch2's main, compiled once for the whole suite, with the check that keeps the [gemm] tag honest
// (tests/engine_label.hpp): a test case without the tag that read the GEMM engine choice or started
// a child process is reported, and the program fails.
#define CATCH_CONFIG_RUNNER
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <pthread.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine_label.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"

namespace {

std::vector<std::string> unlabelled;

class EngineLabelCheck : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    labelled_ = std::find(info.tags.begin(), info.tags.end(), "gemm") != info.tags.end();
    reads_ = xgrad::blas::detail::engine_choice_reads();
    children_ = xgrad::testing::child_processes().load();
  }

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (labelled_) return;
    const std::size_t reads = xgrad::blas::detail::engine_choice_reads() - reads_;
    const std::size_t children = xgrad::testing::child_processes().load() - children_;
    if (reads > 0 || children > 0) {
      unlabelled.push_back("\"" + stats.testInfo.name + "\" read the GEMM engine choice " + std::to_string(reads) +
                           " times and started " + std::to_string(children) + " child processes");
    }
  }

 private:
  bool labelled_ = false;
  std::size_t reads_ = 0, children_ = 0;
};

}  // namespace

CATCH_REGISTER_LISTENER(EngineLabelCheck)

int main(int argc, char* argv[]) {
  ::pthread_atfork(
      nullptr, [] { xgrad::testing::note_child_process(); }, nullptr);
  const int failed = Catch::Session().run(argc, argv);
  for (const std::string& u : unlabelled) {
    std::fprintf(stderr,
                 "error: the test case %s, but has no [gemm] tag: its result can depend on the engine, and "
                 "the engine-forced passes run only tagged cases (tests/engine_label.hpp)\n",
                 u.c_str());
  }
  return failed != 0 ? failed : (unlabelled.empty() ? 0 : 1);
}
