// Timing a TransformerBlock's training step and measuring the bytes its forward keeps.
#include "block_measure.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"

namespace claims {

using namespace xgrad;

namespace {

nn::TransformerBlockOptions block_options(const BlockSize& s, float dropout) {
  return nn::TransformerBlockOptions(s.d_model, s.heads).d_ff(s.ffn_width()).dropout(dropout).norm(nn::Norm::pre);
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Allocated bytes in every malloc arena, plus mmap'ed blocks.
double heap_bytes_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
}

// One block, its optimizer and its input, stepped one training step at a time.
class TimedBlock {
 public:
  TimedBlock(const BlockSize& s, const StepOptions& o)
      : gen_(o.seed),
        block_(block_options(s, o.dropout), gen_),
        opt_(block_.named_parameters()),
        x_(gen_.normal({o.batch, o.seq_len, s.d_model}, 0.f, 1.f)) {
    block_.train();
    mask_.causal = o.causal;
  }
  // Times one step; the first one (it allocates the gradients and the moments) is not kept.
  void step() {
    const auto start = std::chrono::steady_clock::now();
    opt_.zero_grad();
    mean(block_.forward(x_, mask_).output).backward();
    const double pass = milliseconds_since(start);
    const auto update_start = std::chrono::steady_clock::now();
    opt_.step();
    const double update = milliseconds_since(update_start);
    if (warm_) {
      passes_.push_back(pass);
      updates_.push_back(update);
    }
    warm_ = true;
  }
  StepTimes medians() const { return {median(passes_), median(updates_)}; }

 private:
  Generator gen_;
  nn::TransformerBlock block_;
  optim::AdamW opt_;
  Tensor x_;
  nn::AttentionMask mask_;
  bool warm_ = false;
  std::vector<double> passes_, updates_;
};

}  // namespace

std::pair<StepTimes, StepTimes> time_block_steps(const BlockSize& s, const StepOptions& o) {
  BlockSize one_head = s;
  one_head.heads = 1;
  TimedBlock many(s, o), one(one_head, o);
  for (std::size_t step = 0; step <= o.steps; ++step) {
    many.step();
    one.step();
  }
  return {many.medians(), one.medians()};
}

double measured_activation_bytes(const BlockSize& s, const StepOptions& o) {
  Generator gen(o.seed);
  nn::TransformerBlock block(block_options(s, o.dropout), gen);
  block.train();
  const Tensor x(gen.normal({o.batch, o.seq_len, s.d_model}, 0.f, 1.f));
  nn::AttentionMask mask;
  mask.causal = o.causal;
  // On one thread: a pool thread that first takes work inside the measured forward (on a loaded
  // machine the first step may not have woken it) allocates its own state there, 14 KB more.
  const int threads = num_threads();
  set_num_threads(1);
  // One step first, so the parameters' gradients exist before the measured forward.
  mean(block.forward(x, mask).output).backward();
  const double before = heap_bytes_in_use();
  const Tensor y = block.forward(x, mask).output;
  const double after = heap_bytes_in_use();
  mean(y).backward();  // releases the tape
  set_num_threads(threads);
  return after - before;
}

double measured_attention_weight_bytes(double bytes_h_heads, double bytes_one_head, std::size_t heads) {
  if (heads < 2) return 0;
  const double H = static_cast<double>(heads);
  return H * (bytes_h_heads - bytes_one_head) / (H - 1);
}

}  // namespace claims
