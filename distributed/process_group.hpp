// A group of processes that train together, on MPI (Open MPI, the C API): rank, size, and the
// collectives data-parallel training needs (allreduce, broadcast, barrier) on float32 buffers.
// Launched with mpirun or srun; a program started without either is a group of one and never
// touches MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"

/// Training on several processes: the process group of the job (on MPI) and data-parallel
/// training on it.
namespace xgrad::distributed {

/// What a rank is doing when it enters a collective (the ProcessGroup call of that name unless
/// noted); ranks that disagree are named with these.
enum class Call : std::uint32_t {
  allreduce_sum,         ///< allreduce_sum or allreduce_mean of floats
  allreduce_sum_double,  ///< allreduce_sum of a double
  allreduce_max,
  allreduce_min,
  iallreduce_sum,
  broadcast,         ///< broadcast of floats
  broadcast_string,  ///< broadcast of a string
  barrier,
  data_parallel,  ///< constructing a DataParallel
  exit,           ///< leaving the program
};
/// The function that makes `call`: "allreduce_sum", "DataParallel", "exit".
const char* call_name(Call call);

/// A collective started and not yet finished; wait() completes it. Destroying a pending request
/// waits for it (MPI owns its buffers until then).
class Request {
 public:
  /// A request that is not pending.
  Request();
  /// Takes over the moved-from request, which is then not pending.
  Request(Request&&) noexcept;
  /// Waits for this request if it is pending, then takes over the moved-from one.
  Request& operator=(Request&&) noexcept;
  ~Request();
  /// True until the collective is known to have finished (by test() or wait()).
  bool pending() const { return state_ != nullptr; }
  /// True once finished (and drives MPI's progress meanwhile).
  bool test();
  /// Completes the collective; ends the job when it does not finish within its timeout (the one
  /// iallreduce_sum was given, else the group's).
  void wait();

 private:
  friend class ProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

/// The processes of one job and the collectives between them; world() is the one group.
///
/// No call waits forever. Every collective first agrees on what it is (one allreduce of four
/// integers: the call and its length), so ranks in different calls fail at once, naming both; and
/// every wait polls with a deadline, sleeping between polls (a waiting rank uses next to no CPU).
/// A collective that has not completed within the timeout (a rank is stopped, hung, gone or that
/// slow) prints one line naming the rank, the call and the wait, and ends the whole job
/// (MPI_Abort), as NCCL's watchdog does. The timeout is 300 s unless XGRAD_DIST_TIMEOUT (seconds)
/// or set_timeout says otherwise. A program that leaves main with a non-zero status ends the whole
/// job too (glibc hands the status over), rather than waiting in MPI_Finalize for ranks that wait
/// for it; one that leaves with 0 first checks that every rank is leaving (within the timeout).
class ProcessGroup {
 public:
  /// Every process of the job (a duplicate of MPI_COMM_WORLD, so xgrad's collectives never meet
  /// the program's own). MPI is initialized on the first call when the program runs under mpirun
  /// or srun. An XGRAD_DIST_TIMEOUT that is not a number of seconds > 0 is an Error naming it.
  static ProcessGroup& world();

  /// This process's rank, from 0 to size() - 1.
  int rank() const { return rank_; }
  /// The number of processes in the job (1 for a program started without mpirun or srun).
  int size() const { return size_; }
  /// True when the job has more than one process.
  bool distributed() const { return size_ > 1; }

  /// Seconds a collective may wait for the other ranks before the job is ended (> 0).
  double timeout() const { return timeout_; }
  /// Sets timeout(); throws for a value that is not a number of seconds > 0.
  void set_timeout(double seconds);

  /// Every rank passes a buffer of the same length; each gets the elementwise sum. A length that
  /// differs between ranks is an Error on every rank, naming the call and the lengths; so is a
  /// rank that is in another call, naming both calls and ranks.
  void allreduce_sum(float* data, std::size_t n);
  /// The elementwise mean: allreduce_sum divided by size(), checked as allreduce_sum is.
  void allreduce_mean(float* data, std::size_t n);
  /// allreduce_sum of the array's elements.
  void allreduce_sum(Array& a) { allreduce_sum(a.data(), a.size()); }
  /// allreduce_mean of the array's elements.
  void allreduce_mean(Array& a) { allreduce_mean(a.data(), a.size()); }
  /// The sum of `v` over the ranks, checked as allreduce_sum is.
  double allreduce_sum(double v);
  /// The largest `v` of the ranks, checked as allreduce_sum is.
  std::uint64_t allreduce_max(std::uint64_t v);
  /// The smallest `v` of the ranks, checked as allreduce_sum is.
  std::uint64_t allreduce_min(std::uint64_t v);
  /// The sum, started now and finished by the returned request. The agreement on the call and the
  /// length runs alongside; a difference ends the job when the request is tested or waited for
  /// (this rank has a reduction in flight that no other rank will join). `what` names the
  /// reduction in that message and in the timeout's ("bucket 2 of 5").
  /// A timeout of 0 is the group's. Throws for a timeout that is not a number >= 0, and in a
  /// group of more than one for more than 2^30 elements.
  Request iallreduce_sum(float* data, std::size_t n, std::string what = "iallreduce_sum", double timeout = 0);

  /// Root's buffer is copied to every rank; lengths are checked as for allreduce. Throws for a
  /// root that is not a rank of the group.
  void broadcast(float* data, std::size_t n, int root = 0);
  /// broadcast of the array's elements.
  void broadcast(Array& a, int root = 0) { broadcast(a.data(), a.size(), root); }
  /// Root's string is copied to every rank (any length).
  void broadcast(std::string& s, int root = 0);
  /// Returns once every rank has entered it (or ends the job at the timeout).
  void barrier();
  /// The agreement alone: every rank is at `call` with the same n, or it is an Error on every
  /// rank naming the ranks and calls that differ (a cheap check before a run of collectives).
  void agree(Call call, std::uint64_t n = 0);

  /// Ends every process of the job at once with `code` (MPI_Abort): the way out when one rank
  /// fails and the others may be waiting in a collective. Without MPI it exits.
  [[noreturn]] void abort(int code);

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  friend class Request;
  ProcessGroup();
  static void leave(int status, void* group);  // at exit: MPI_Abort on a non-zero status, else agree and finalize
  void agree_and_check(Call call, std::uint64_t n, bool check_lengths);
  int rank_ = 0, size_ = 1;
  double timeout_ = 300;
  std::uintptr_t comm_ = 0;  // an MPI_Comm, kept opaque so this header needs no mpi.h
};

/// True when this process was started by mpirun or srun (as one rank of a job).
bool launched_by_mpi();

}  // namespace xgrad::distributed
