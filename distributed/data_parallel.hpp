// Data-parallel training of any Module across the ranks of a ProcessGroup, used as PyTorch's
// DDP is: wrap the model once, then train as usual. Each rank runs forward and backward on its
// own share of the batch; during backward the gradients are summed across ranks in buckets,
// each bucket's reduction starting as soon as its gradients are final, so communication overlaps
// the rest of backward; when backward returns every gradient is the mean over ranks, so clipping,
// optimizers and anything else that reads gradients see the global values and need no change.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/distributed/process_group.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::distributed {

struct DataParallelOptions {
  XGRAD_ARG(std::size_t, bucket_bytes, std::size_t{4} << 20);  // gradient bytes per reduction
  // Seconds a bucket's reduction may wait for the other ranks before the job is ended, naming
  // the rank, the bucket and the wait (0: the group's timeout, ProcessGroup::timeout()).
  XGRAD_ARG(double, timeout, 0.0);
};

// What the last backward pass communicated.
struct ReductionStats {
  std::size_t buckets = 0;
  std::size_t bytes = 0;          // gradient bytes each rank sent into the reductions
  double reduce_seconds = 0;      // from the first bucket's start to the end of backward
  double wait_seconds = 0;        // time backward spent waiting for reductions after its sweep
  double overlap() const;         // share of reduce_seconds not spent waiting: 1 - wait / reduce
};

class DataParallel {
 public:
  // Checks that every rank is constructing a DataParallel (a rank in another collective, or
  // leaving the program, is an Error naming both ranks and what each is doing) and holds the same
  // parameter names and shapes (a mismatch is an Error on every rank, naming the first differing
  // parameter), then copies rank 0's values to every rank and hooks the parameters' gradients.
  // One DataParallel per module at a time. Every rank must run the same number of backward
  // passes: a rank whose next collective is another one ends the job, naming both.
  DataParallel(nn::Module& module, ProcessGroup& group, const DataParallelOptions& options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }
  const ReductionStats& last_stats() const { return stats_; }
  std::size_t num_buckets() const;

 private:
  struct State;
  void finish_pass();  // at the end of backward: wait for the reductions, store the means
  nn::Module& module_;
  ProcessGroup& group_;
  ReductionStats stats_;
  std::unique_ptr<State> state_;
};

}  // namespace xgrad::distributed
