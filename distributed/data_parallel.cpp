// Bucketed gradient averaging during backward. Each bucket is one contiguous buffer holding its
// parameters' gradients and, after them, one flag per parameter (1 when this rank produced a
// gradient for it), so a single reduction also tells every rank which parameters got a gradient
// anywhere. Buckets are reduced strictly in order (0, 1, ...) on every rank, whatever order the
// gradients arrive in, so the collectives always match across ranks.
#include "xgrad/distributed/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "xgrad/core/autograd/gradient_ready.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::distributed {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<std::string> signatures(const NamedTensors& params) {
  std::vector<std::string> out;
  for (const auto& [name, p] : params) out.push_back(name + " " + shape_str(p.shape()));
  return out;
}

std::string join(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += p + '\n';
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t end = s.find('\n', at);
    out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace

double ReductionStats::overlap() const {
  return reduce_seconds > 0 ? std::clamp(1.0 - wait_seconds / reduce_seconds, 0.0, 1.0) : 0.0;
}

// Listens to the passes that reach the parameters: each gradient goes into its bucket as soon as
// it is final, and the pass's end waits for the reductions.
struct DataParallel::State : GradientReadyListener {
  struct Slot {
    Tensor param;
    std::size_t bucket = 0, offset = 0, flag = 0;  // gradient at offset, flag at index `flag`
  };
  struct Bucket {
    Array data;  // gradients, then one flag per parameter
    std::size_t expected = 0, arrived = 0;
    std::vector<std::size_t> slots;
    Request request;
  };
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<char> arrived;
  std::size_t next_launch = 0;
  // A backward pass has handed over gradients and not ended yet, on thread pass_thread. The
  // buckets hold one pass at a time: a pass on a second thread meanwhile is refused.
  std::mutex pass_mutex;
  bool in_pass = false;
  std::thread::id pass_thread;
  Clock::time_point first_launch;
  bool launched_any = false;

  double timeout = 0;
  DataParallel* owner = nullptr;
  GradientWatch watch;  // over slots' parameters, in slot order

  void launch(ProcessGroup& group, std::size_t b) {
    Bucket& bucket = buckets[b];
    if (!launched_any) {
      first_launch = Clock::now();
      launched_any = true;
    }
    bucket.request = group.iallreduce_sum(bucket.data.data(), bucket.data.size(),
                                          "DataParallel: the reduction of bucket " + std::to_string(b) + " of " +
                                              std::to_string(buckets.size()) + " (" +
                                              std::to_string(bucket.data.size()) + " floats)",
                                          timeout);
  }

  void gradient_ready(std::size_t k, Array& grad) override;
  void pass_ended() override;
  void pass_failed() noexcept override;

  // Starts, in order, every bucket whose gradients have all arrived, then lets MPI progress.
  void launch_ready(ProcessGroup& group) {
    while (next_launch < buckets.size() && buckets[next_launch].arrived == buckets[next_launch].expected) {
      launch(group, next_launch++);
    }
    for (std::size_t b = 0; b < next_launch; ++b) {
      if (buckets[b].request.pending()) buckets[b].request.test();
    }
  }
};

DataParallel::DataParallel(nn::Module& module, ProcessGroup& group, const DataParallelOptions& options)
    : module_(module), group_(group), state_(std::make_unique<State>()) {
  if (options.bucket_bytes() < 4)
    fail("DataParallel: bucket_bytes ", options.bucket_bytes(), " is less than one float");
  if (!(options.timeout() >= 0)) fail("DataParallel: timeout ", options.timeout(), " is not a number of seconds >= 0");
  state_->timeout = options.timeout();
  group.agree(Call::data_parallel);
  NamedTensors params = module.named_parameters();
  const std::vector<std::string> mine = signatures(params);

  // Every rank compares its parameters with rank 0's, then all agree on the first difference.
  std::string reference = join(mine);
  group.broadcast(reference, 0);
  const std::vector<std::string> theirs = split_lines(reference);
  std::size_t first_diff = SIZE_MAX;
  for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    if (i >= mine.size() || i >= theirs.size() || mine[i] != theirs[i]) {
      first_diff = i;
      break;
    }
  }
  const std::uint64_t agreed = group.allreduce_min(first_diff);
  if (agreed != SIZE_MAX) {
    auto at = [&](const std::vector<std::string>& v) {
      return agreed < v.size() ? "'" + v[agreed] + "'" : std::string("nothing");
    };
    if (agreed == first_diff) {
      fail("DataParallel: rank ", group.rank(), ": the ranks' models differ at parameter ", agreed, ": rank 0 has ",
           at(theirs), ", this rank has ", at(mine));
    }
    fail("DataParallel: rank ", group.rank(), ": the ranks' models differ at parameter ", agreed, " (rank 0 has ",
         at(theirs), ", as this rank does; another rank has something else)");
  }
  for (auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    group.broadcast(p.mutable_value(), 0);
  }

  // Buckets in reverse registration order, the order backward finishes gradients in.
  State& s = *state_;
  const std::size_t bucket_floats = options.bucket_bytes() / 4;
  std::vector<std::vector<std::size_t>> members(1);
  std::size_t floats = 0;
  // A tensor registered under two names (tied weights) has one gradient, the sum of both uses:
  // it gets one slot, under the name registered first.
  std::unordered_set<const void*> first_use;
  std::vector<bool> duplicate(params.size(), false);
  for (std::size_t i = 0; i < params.size(); ++i)
    duplicate[i] = !first_use.insert(params[i].second.node().get()).second;
  for (std::size_t i = params.size(); i-- > 0;) {
    const Tensor& p = params[i].second;
    if (!p.requires_grad() || duplicate[i]) continue;
    if (floats > 0 && floats + p.size() > bucket_floats) {
      members.emplace_back();
      floats = 0;
    }
    State::Slot slot;
    slot.param = p;
    slot.bucket = members.size() - 1;
    slot.offset = floats;
    floats += p.size();
    members.back().push_back(s.slots.size());
    s.slots.push_back(slot);
  }
  for (const auto& m : members) {
    if (m.empty()) continue;
    State::Bucket bucket;
    std::size_t n = 0;
    for (std::size_t k : m) {
      s.slots[k].bucket = s.buckets.size();
      n += s.slots[k].param.size();
    }
    for (std::size_t j = 0; j < m.size(); ++j) s.slots[m[j]].flag = n + j;
    bucket.data = Array::from_shape({n + m.size()});
    bucket.expected = m.size();
    bucket.slots = m;
    s.buckets.push_back(std::move(bucket));
  }
  s.arrived.assign(s.slots.size(), 0);

  s.owner = this;
  std::vector<Tensor> watched;
  for (const State::Slot& slot : s.slots) watched.push_back(slot.param);
  s.watch = watch_gradients(watched, s);
}

void DataParallel::State::gradient_ready(std::size_t k, Array& grad) {
  std::lock_guard<std::mutex> lock(pass_mutex);
  if (in_pass && pass_thread != std::this_thread::get_id()) {
    fail(
        "DataParallel: a backward pass reached the parameters on a second thread while one on another thread was "
        "under way; DataParallel averages one backward pass at a time per rank (run the passes one after another)");
  }
  if (!in_pass) {
    // A new pass (an earlier one may have failed midway: finish its reductions first).
    for (auto& b : buckets) b.request.wait();
    in_pass = true;
    pass_thread = std::this_thread::get_id();
    next_launch = 0;
    launched_any = false;
    std::fill(arrived.begin(), arrived.end(), 0);
    for (auto& b : buckets) {
      b.arrived = 0;
      std::fill(b.data.begin(), b.data.end(), 0.f);
    }
  }
  Slot& slot = slots[k];
  Bucket& bucket = buckets[slot.bucket];
  if (!arrived[k]) {
    arrived[k] = 1;
    ++bucket.arrived;
  }
  // The gradient goes into the bucket; the parameter itself receives zeros now and the
  // mean over ranks when backward ends.
  std::memcpy(bucket.data.data() + slot.offset, grad.data(), grad.size() * sizeof(float));
  bucket.data.data()[slot.flag] = 1.f;
  std::fill(grad.begin(), grad.end(), 0.f);
  launch_ready(owner->group_);
}

void DataParallel::State::pass_ended() {
  // Held through the reductions, so that a pass on another thread starts only after them.
  std::lock_guard<std::mutex> lock(pass_mutex);
  if (!in_pass || pass_thread != std::this_thread::get_id()) return;  // the pass that was refused
  struct EndPass {
    bool& in_pass;
    ~EndPass() { in_pass = false; }  // also when a reduction fails
  } end_pass{in_pass};
  owner->finish_pass();
}

// The launched reductions stay in flight; the next pass waits for them before reusing the buckets.
// A pass refused on a second thread leaves the one under way alone.
void DataParallel::State::pass_failed() noexcept {
  std::lock_guard<std::mutex> lock(pass_mutex);
  if (pass_thread == std::this_thread::get_id()) in_pass = false;
}

void DataParallel::finish_pass() {
  State& s = *state_;
  const Clock::time_point sweep_end = Clock::now();
  // Gradients that never arrived on this rank count as zeros (their flag stays 0).
  while (s.next_launch < s.buckets.size()) s.launch(group_, s.next_launch++);
  for (auto& b : s.buckets) b.request.wait();
  const Clock::time_point end = Clock::now();
  const float inv = 1.f / static_cast<float>(group_.size());
  std::size_t bytes = 0;
  for (State::Slot& slot : s.slots) {
    const State::Bucket& bucket = s.buckets[slot.bucket];
    if (bucket.data.data()[slot.flag] == 0.f) continue;  // no rank produced a gradient
    const float* sum = bucket.data.data() + slot.offset;
    if (!slot.param.has_grad()) slot.param.set_grad(xt::zeros<float>(slot.param.shape()));
    float* g = slot.param.mutable_grad().data();
    for (std::size_t i = 0, n = slot.param.size(); i < n; ++i) g[i] += sum[i] * inv;
  }
  for (const auto& b : s.buckets) bytes += b.data.size() * sizeof(float);
  stats_.buckets = s.buckets.size();
  stats_.bytes = bytes;
  stats_.reduce_seconds = s.launched_any ? seconds_between(s.first_launch, end) : 0.0;
  stats_.wait_seconds = seconds_between(sweep_end, end);
}

DataParallel::~DataParallel() {
  state_->watch.reset();
  for (auto& b : state_->buckets) {
    if (b.request.pending()) b.request.wait();
  }
}

std::size_t DataParallel::num_buckets() const { return state_->buckets.size(); }

}  // namespace xgrad::distributed
