// The installed xgrad::distributed component: one data-parallel step of a Linear layer. Under
// mpirun every rank must end with the same gradient; in one process it runs without MPI.
#include <cstdio>

#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/xgrad.hpp>

int main() {
  using namespace xgrad;
  auto& group = distributed::ProcessGroup::world();
  Generator gen(static_cast<std::uint64_t>(group.rank()));  // different weights: rank 0's win
  nn::Linear layer(3, 2, true, gen);
  distributed::DataParallel ddp(layer, group);
  const float r = static_cast<float>(group.rank());
  sum(layer.forward(Tensor(Array{{1.f + r, 2.f, 3.f}}))).backward();
  // d sum(W x + b) / dW00 = x0, averaged over ranks: 1 + (size - 1) / 2.
  const float want = 1.f + static_cast<float>(group.size() - 1) / 2.f;
  const float got = layer.named_parameters()[0].second.grad()(0, 0);
  if (got != want) {
    std::printf("rank %d: gradient %g, expected %g\n", group.rank(), static_cast<double>(got),
                static_cast<double>(want));
    return 1;
  }
  if (group.rank() == 0) std::printf("data-parallel gradient agrees on %d process(es)\n", group.size());
  return 0;
}
