// A small pool of kernel threads (see parallel.hpp). A step runs hundreds of kernels back to back,
// and a wake-up through a condition variable took tens of microseconds here: long enough for the
// calling thread to finish a short kernel's ranges alone while its worker was still waking. So a
// worker that finishes a job watches for the next one for a short while (kSpin) before it sleeps,
// and the calling thread watches for its job's end the same way before it blocks. Idle longer
// than that, workers sleep on a condition variable and take no core.
#include "xgrad/core/kernels/parallel.hpp"

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/blas.hpp"

namespace xgrad {

namespace {

thread_local bool inside_body = false;

// How long a thread watches for the next job or for its job's end before it blocks.
constexpr std::chrono::microseconds kSpin{200};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return done();
  }
}

// One parallel_for call: ranges are claimed through `next` by whichever thread is free.
struct Job {
  const std::function<void(std::size_t, std::size_t)>* body;
  std::size_t n, ranges;
  std::atomic<std::size_t> next{0}, done{0};
  std::atomic<std::size_t> workers_inside{0};  // changed under the pool's mutex, read while spinning
  std::mutex error_mutex;
  std::exception_ptr error;

  void work() {
    inside_body = true;
    for (std::size_t r; (r = next.fetch_add(1)) < ranges;) {
      try {
        (*body)(r * n / ranges, (r + 1) * n / ranges);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1);
    }
    inside_body = false;
  }
};

class Pool {
 public:
  ~Pool() { stop_workers(1); }

  // Reads without the run lock once started, so a body may ask (its caller holds that lock).
  int threads() {
    if (const int t = threads_.load()) return t;
    std::lock_guard<std::mutex> lock(run_mutex_);
    ensure_started();
    return threads_;
  }

  // Grows or shrinks the pool; when a thread cannot be started, the pool keeps its previous size and
  // the Error names the count asked for, how many started and the OS's reason.
  void resize(int threads) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    blas::set_num_threads(1);
    const int before = static_cast<int>(workers_.size()) + 1;
    if (threads <= before) {
      stop_workers(threads);
      threads_ = threads;
      return;
    }
    const std::string why = start_workers(threads);
    if (why.empty()) return;
    const int running = static_cast<int>(workers_.size()) + 1;
    stop_workers(before);
    threads_ = before;
    fail("set_num_threads(", threads, "): could not start thread ", running + 1, " of ", threads, " (", running,
         " running, the calling thread included): ", why, limits(), "; the pool keeps its ", before,
         before == 1 ? " thread" : " threads");
  }

  void run(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& body) {
    // Inside a body (this thread may hold run_mutex_ already: try_lock on it would be undefined),
    // or another user thread's kernels hold the pool: run here, serially.
    if (inside_body) return body(0, n);
    std::unique_lock<std::mutex> run_lock(run_mutex_, std::try_to_lock);
    if (!run_lock.owns_lock()) return body(0, n);
    ensure_started();
    const std::size_t ranges = std::min<std::size_t>(threads_.load(), n / std::max<std::size_t>(grain, 1));
    if (ranges <= 1) {
      run_lock.unlock();
      return body(0, n);
    }
    Job job;
    job.body = &body;
    job.n = n;
    job.ranges = ranges;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    job.work();
    auto finished = [&] { return job.done.load() == ranges && job.workers_inside.load() == 0; };
    spin_until(finished);
    {
      // Checked again under the lock: a worker may pick the job up until job_ is reset.
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, finished);
      job_ = nullptr;  // under the lock: no worker can pick the finished job up any more
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // First use: take over OpenBLAS's default thread count, and leave OpenBLAS itself one thread. The
  // default is a guess, not a request: when the system refuses threads, those that started stay.
  void ensure_started() {
    if (threads_ == 0) {
      const int threads = std::max(1, blas::num_threads());
      blas::set_num_threads(1);
      start_workers(threads);
      threads_ = static_cast<int>(workers_.size()) + 1;
    }
  }

  // Starts workers until the pool has `threads` threads (the calling thread is one); returns the
  // OS's reason when one cannot be started (the pool then has the threads that did start), else "".
  std::string start_workers(int threads) {
    while (static_cast<int>(workers_.size()) + 1 < threads) {
      const int index = static_cast<int>(workers_.size());
      active_ = index + 1;
      try {
        workers_.emplace_back([this, index] { worker_loop(index); });
      } catch (const std::system_error& e) {
        active_ = index;
        return e.code().message();
      }
    }
    threads_ = threads;
    return "";
  }

  // Stops the workers past the first threads - 1, so that `threads` remain.
  void stop_workers(int threads) {
    const std::size_t keep = static_cast<std::size_t>(std::max(threads, 1) - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_ = static_cast<int>(std::min(keep, workers_.size()));
    }
    wake_.notify_all();
    for (std::size_t i = keep; i < workers_.size(); ++i) workers_[i].join();
    if (workers_.size() > keep) workers_.resize(keep);
  }

  // The limits that decide how many threads a process may start, for an error message.
  static std::string limits() {
    std::string out;
    for (const auto& [name, which] :
         {std::pair<const char*, int>{"RLIMIT_NPROC", RLIMIT_NPROC}, {"RLIMIT_AS", RLIMIT_AS}}) {
      rlimit rl{};
      if (::getrlimit(which, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        out += std::string(out.empty() ? " (" : ", ") + name + " is " + std::to_string(rl.rlim_cur) +
               (which == RLIMIT_AS ? " bytes" : "");
      }
    }
    return out.empty() ? out : out + ")";
  }

  // Worker `index` runs jobs until index >= active_.
  void worker_loop(int index) {
    std::uint64_t seen = 0;
    auto stopped = [&] { return index >= active_.load(); };
    for (;;) {
      Job* job = nullptr;
      spin_until([&] { return stopped() || generation_.load() != seen; });
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopped() || generation_.load() != seen; });
        if (stopped()) return;
        seen = generation_;
        job = job_;
        if (!job) continue;
        ++job->workers_inside;
      }
      job->work();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --job->workers_inside;
      }
      finished_.notify_all();
    }
  }

  std::mutex run_mutex_;         // one parallel_for (or resize) at a time
  std::atomic<int> threads_{0};  // 0 until first use; written under run_mutex_
  std::vector<std::thread> workers_;

  std::mutex mutex_;  // guards job_ and the changes of generation_, active_ (when lowered) and Job::workers_inside
  std::condition_variable wake_, finished_;
  Job* job_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> active_{0};  // workers 0 .. active_ - 1 run; the others return
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads: thread count must be at least 1, got ", n);
  // Past this the pool would start threads until the system runs out of them (a root process has
  // no RLIMIT_NPROC: set_num_threads(INT_MAX) would take every thread of the machine first).
  if (n > kMaxThreads) {
    fail("set_num_threads(", n, "): more than the ", kMaxThreads, " threads the pool takes (this machine has ",
         std::thread::hardware_concurrency(), " hardware threads)");
  }
  if (inside_body) fail("set_num_threads: called from inside a parallel_for body");
  pool().resize(n);
}

int num_threads() { return pool().threads(); }

void parallel_for(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& body) {
  if (n == 0) return;
  pool().run(n, grain, body);
}

}  // namespace xgrad
