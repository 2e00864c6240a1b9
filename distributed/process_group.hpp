// A group of processes that train together, on MPI (Open MPI, the C API): rank, size, and the
// collectives data-parallel training needs (allreduce, broadcast, barrier) on float32 buffers.
// Launched with mpirun or srun; a program started without either is a group of one and never
// touches MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad::distributed {

// A collective started and not yet finished; wait() or ProcessGroup::wait_all completes it.
class Request {
 public:
  Request() = default;
  bool pending() const { return handle_ != 0; }
  bool test();  // true once finished (and drives MPI's progress meanwhile)
  void wait();

 private:
  friend class ProcessGroup;
  std::uintptr_t handle_ = 0;  // an MPI_Request, kept opaque so this header needs no mpi.h
};

class ProcessGroup {
 public:
  // Every process of the job (MPI_COMM_WORLD). MPI is initialized on the first call when the
  // program runs under mpirun or srun, and finalized at exit.
  static ProcessGroup& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }

  // Every rank passes a buffer of the same length; each gets the elementwise sum (or mean). A
  // length that differs between ranks is an Error on every rank, naming the call and the lengths.
  void allreduce_sum(float* data, std::size_t n);
  void allreduce_mean(float* data, std::size_t n);
  void allreduce_sum(Array& a) { allreduce_sum(a.data(), a.size()); }
  void allreduce_mean(Array& a) { allreduce_mean(a.data(), a.size()); }
  double allreduce_sum(double v);
  std::uint64_t allreduce_max(std::uint64_t v);
  std::uint64_t allreduce_min(std::uint64_t v);
  // The sum, started now and finished by the returned request (no length check: the caller
  // agreed on the lengths beforehand).
  Request iallreduce_sum(float* data, std::size_t n);

  // Root's buffer is copied to every rank; lengths are checked as for allreduce.
  void broadcast(float* data, std::size_t n, int root = 0);
  void broadcast(Array& a, int root = 0) { broadcast(a.data(), a.size(), root); }
  // Root's string is copied to every rank (any length).
  void broadcast(std::string& s, int root = 0);
  void barrier();

  // Ends every process of the job at once with `code` (MPI_Abort): the way out when one rank
  // fails and the others may be waiting in a collective. Without MPI it exits.
  [[noreturn]] void abort(int code);

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  ProcessGroup();
  void check_lengths(const char* call, std::size_t n);
  int rank_ = 0, size_ = 1;
};

// True when this process was started by mpirun or srun (as one rank of a job).
bool launched_by_mpi();

}  // namespace xgrad::distributed
