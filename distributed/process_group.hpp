// A group of processes that train together, on MPI (Open MPI, the C API): rank, size, and the
// collectives data-parallel training needs (allreduce, broadcast, barrier) on float32 buffers.
// Launched with mpirun or srun; a program started without either is a group of one and never
// touches MPI.
//
// No call waits forever. Every collective first agrees on what it is (one allreduce of four
// integers: the call and its length), so ranks in different calls fail at once, naming both; and
// every wait polls with a deadline, sleeping between polls (a waiting rank uses next to no CPU).
// A collective that has not completed within the timeout (a rank is stopped, hung, gone or that
// slow) prints one line naming the rank, the call and the wait, and ends the whole job
// (MPI_Abort), as NCCL's watchdog does. The timeout is 300 s unless XGRAD_DIST_TIMEOUT (seconds)
// or set_timeout says otherwise. A program that leaves main with a non-zero status ends the whole
// job too (glibc hands the status over), rather than waiting in MPI_Finalize for ranks that wait
// for it; one that leaves with 0 first checks that every rank is leaving (within the timeout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "xgrad/core/autograd/tensor.hpp"

namespace xgrad::distributed {

// What a rank is doing when it enters a collective; ranks that disagree are named with these.
enum class Call : std::uint32_t {
  allreduce_sum,
  allreduce_sum_double,
  allreduce_max,
  allreduce_min,
  iallreduce_sum,
  broadcast,
  broadcast_string,
  barrier,
  data_parallel,  // constructing a DataParallel
  exit,           // leaving the program
};
const char* call_name(Call call);  // the function that makes it: "allreduce_sum", "DataParallel", "exit"

// A collective started and not yet finished; wait() completes it. Destroying a pending request
// waits for it (MPI owns its buffers until then).
class Request {
 public:
  Request();
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  ~Request();
  bool pending() const { return state_ != nullptr; }
  bool test();  // true once finished (and drives MPI's progress meanwhile)
  void wait();  // ends the job when it does not finish within the group's timeout

 private:
  friend class ProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

class ProcessGroup {
 public:
  // Every process of the job (a duplicate of MPI_COMM_WORLD, so xgrad's collectives never meet
  // the program's own). MPI is initialized on the first call when the program runs under mpirun
  // or srun. An XGRAD_DIST_TIMEOUT that is not a number of seconds > 0 is an Error naming it.
  static ProcessGroup& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }

  // Seconds a collective may wait for the other ranks before the job is ended (> 0).
  double timeout() const { return timeout_; }
  void set_timeout(double seconds);

  // Every rank passes a buffer of the same length; each gets the elementwise sum (or mean). A
  // length that differs between ranks is an Error on every rank, naming the call and the lengths;
  // so is a rank that is in another call, naming both calls and ranks.
  void allreduce_sum(float* data, std::size_t n);
  void allreduce_mean(float* data, std::size_t n);
  void allreduce_sum(Array& a) { allreduce_sum(a.data(), a.size()); }
  void allreduce_mean(Array& a) { allreduce_mean(a.data(), a.size()); }
  double allreduce_sum(double v);
  std::uint64_t allreduce_max(std::uint64_t v);
  std::uint64_t allreduce_min(std::uint64_t v);
  // The sum, started now and finished by the returned request. The agreement on the call and the
  // length runs alongside; a difference ends the job when the request is tested or waited for
  // (this rank has a reduction in flight that no other rank will join). `what` names the
  // reduction in that message and in the timeout's ("bucket 2 of 5").
  // A timeout of 0 is the group's.
  Request iallreduce_sum(float* data, std::size_t n, std::string what = "iallreduce_sum", double timeout = 0);

  // Root's buffer is copied to every rank; lengths are checked as for allreduce.
  void broadcast(float* data, std::size_t n, int root = 0);
  void broadcast(Array& a, int root = 0) { broadcast(a.data(), a.size(), root); }
  // Root's string is copied to every rank (any length).
  void broadcast(std::string& s, int root = 0);
  void barrier();
  // The agreement alone: every rank is at `call` with the same n, or it is an Error on every
  // rank naming the ranks and calls that differ (a cheap check before a run of collectives).
  void agree(Call call, std::uint64_t n = 0);

  // Ends every process of the job at once with `code` (MPI_Abort): the way out when one rank
  // fails and the others may be waiting in a collective. Without MPI it exits.
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

// True when this process was started by mpirun or srun (as one rank of a job).
bool launched_by_mpi();

}  // namespace xgrad::distributed
