// A small data-parallel job that goes wrong on purpose, one way per mode, which
// test_distributed_hangs runs under `mpirun -np 2`: test_distributed_job MODE [FOLDER].
//   ok             both ranks train 3 steps; rank 1 starts 1.5 s late, and rank 0 prints the
//                  wall and CPU seconds of its first step (spent waiting for rank 1)
//   return-error   rank 1 returns 1 from main while rank 0 is in a gradient reduction
//   throw          rank 1 throws out of main while rank 0 is in a gradient reduction
//   stop           both ranks write their pids to FOLDER/rank<r>.pid and train until stopped
//   uneven-passes  rank 0 runs two backward passes per step, rank 1 one; a loss mean per step
//   uneven-exit    rank 0 trains 4 steps, rank 1 3, and returns 0
//   ddp-one-rank   only rank 0 builds a DataParallel; a loss mean per step
//   late           a loss mean per step; rank 1 sleeps 4 s before the one of step 1
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/distributed/data_parallel.hpp"
#include "xgrad/nn/layers.hpp"

using namespace xgrad;
using distributed::DataParallel;
using distributed::DataParallelOptions;
using distributed::ProcessGroup;

namespace {

struct Chain : nn::Module {
  explicit Chain(Generator& g)
      : a(std::make_shared<nn::Linear>(3, 4, true, g)), b(std::make_shared<nn::Linear>(4, 2, true, g)) {
    register_module("a", a);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x) { return b->forward(tanh(a->forward(x))); }
  std::shared_ptr<nn::Linear> a, b;
};

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok", folder = argc > 2 ? argv[2] : ".";
  int rank = 0;
  try {
    ProcessGroup& group = ProcessGroup::world();  // an Error for a bad XGRAD_DIST_TIMEOUT
    rank = group.rank();
    Generator g(1);
    Chain model(g);
    std::unique_ptr<DataParallel> ddp;
    if (mode != "ddp-one-rank" || rank == 0)
      ddp = std::make_unique<DataParallel>(model, group, DataParallelOptions().bucket_bytes(16));
    if (mode == "stop") std::ofstream(folder + "/rank" + std::to_string(rank) + ".pid") << ::getpid() << '\n';
    const bool loss_mean = mode == "uneven-passes" || mode == "ddp-one-rank" || mode == "late";
    const int passes = mode == "uneven-passes" && rank == 0 ? 2 : 1;
    const long steps = mode == "stop" ? 100000000 : mode == "uneven-exit" && rank == 0 ? 4 : 3;
    const Tensor x(Array{{1.f, -2.f, 3.f}});
    for (long step = 0; step < steps; ++step) {
      if (mode == "return-error" && rank == 1 && step == 1) {
        std::fprintf(stderr, "test_distributed_job: rank 1 gives up at step 1\n");
        return 1;
      }
      if (mode == "throw" && rank == 1 && step == 1) throw std::runtime_error("rank 1 throws out of main at step 1");
      if (mode == "ok" && rank == 1 && step == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      const auto wall = std::chrono::steady_clock::now();
      const double cpu = cpu_seconds();
      double loss = 0;
      for (int p = 0; p < passes; ++p) {
        Tensor l = sum(model.forward(x));
        loss += static_cast<double>(l.item());
        l.backward();
      }
      if (mode == "late" && rank == 1 && step == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
      if (loss_mean) loss = group.allreduce_sum(loss) / group.size();
      if (mode == "ok" && rank == 0 && step == 0) {
        std::printf("rank 0: first step: %.3f s wall, %.3f s CPU\n",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(),
                    cpu_seconds() - cpu);
      }
      model.zero_grad();
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "test_distributed_job (rank %d): error: %s\n", rank, e.what());
    return 1;
  }
  if (rank == 0) std::printf("test_distributed_job %s: done\n", mode.c_str());
  return 0;
}
