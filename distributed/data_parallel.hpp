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

/// How DataParallel splits and waits for its reductions.
struct DataParallelOptions {
  /// Gradient bytes per reduction (per bucket); at least one float. Default 4 MiB.
  XGRAD_ARG(std::size_t, bucket_bytes, std::size_t{4} << 20);
  /// Seconds a bucket's reduction may wait for the other ranks before the job is ended, naming
  /// the rank, the bucket and the wait (0: the group's timeout, ProcessGroup::timeout()).
  XGRAD_ARG(double, timeout, 0.0);
};

/// What the last backward pass communicated.
struct ReductionStats {
  std::size_t buckets = 0;    ///< the number of buckets, one reduction each
  std::size_t bytes = 0;      ///< gradient bytes each rank sent into the reductions
  double reduce_seconds = 0;  ///< from the first bucket's start to the end of backward
  double wait_seconds = 0;    ///< time backward spent waiting for reductions after its sweep
  /// The share of reduce_seconds not spent waiting, 1 - wait / reduce (0 when nothing was reduced).
  double overlap() const;
};

/// Averages a module's gradients over the ranks of a ProcessGroup during backward, as PyTorch's
/// DDP does.
///
/// Wrap the model once, then train as usual. It listens to the backward passes that reach the
/// module's parameters (a GradientReadyListener): each gradient goes into its bucket as soon as it
/// is final, and a bucket's reduction starts once all its gradients are in (buckets start in order,
/// the same on every rank); when the pass ends it waits for the reductions and adds the mean over
/// ranks to each parameter's gradient. A pass that fails midway leaves its reductions in flight,
/// and the next pass waits for them first.
///
/// One backward pass at a time per rank: a pass that reaches the parameters on another thread
/// while one is under way fails with an Error, and the one under way goes on unharmed. A tensor
/// registered under two names (tied weights) is averaged once, as the sum of its uses. Hooks on
/// the parameters run before the gradient goes into its bucket: they see, and may change, this
/// rank's gradient; what they leave is what is averaged.
class DataParallel {
 public:
  /// Wraps `module` for training on every rank of `group`.
  ///
  /// Checks that every rank is constructing a DataParallel (a rank in another collective, or
  /// leaving the program, is an Error naming both ranks and what each is doing) and holds the same
  /// parameter names and shapes (a mismatch is an Error on every rank, naming the first differing
  /// parameter), then copies rank 0's values to every rank and starts watching the parameters'
  /// gradients (watch_gradients). One DataParallel per module at a time. Every rank must run the
  /// same number of backward passes: a rank whose next collective is another one ends the job,
  /// naming both. An Error for a bucket_bytes below one float or a timeout that is not >= 0.
  DataParallel(nn::Module& module, ProcessGroup& group, const DataParallelOptions& options = {});
  /// Stops watching the parameters and waits for the reductions still in flight.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// The wrapped module.
  nn::Module& module() { return module_; }
  /// The ranks the gradients are averaged over.
  ProcessGroup& group() { return group_; }
  /// What the last backward pass that reached the parameters communicated.
  const ReductionStats& last_stats() const { return stats_; }
  /// The number of buckets the parameters' gradients are split into.
  std::size_t num_buckets() const;

 private:
  struct State;
  /// At the end of backward: waits for the reductions and adds the means to the gradients.
  void finish_pass();
  nn::Module& module_;
  ProcessGroup& group_;
  ReductionStats stats_;
  std::unique_ptr<State> state_;
};

}  // namespace xgrad::distributed
