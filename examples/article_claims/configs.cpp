// Counting and timing xgrad's MultiHeadAttention and TransformerBlock at the article's sizes.
#include "configs.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "xgrad/core/ops.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"

namespace claims {

using namespace xgrad;

std::vector<ArticleConfig> article_configs() {
  return {{{256, 4, 0}, "small", "lightweight NLP tasks"},
          {{512, 8, 0}, "standard", "BERT-base, GPT-2 small"},
          {{768, 12, 0}, "large", "BERT-large, GPT-2 medium"},
          {{1024, 16, 0}, "huge", "GPT-3, T5-large"}};
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

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

}  // namespace

ModuleCounts count_module_params(const BlockSize& s) {
  Generator gen(0);
  ModuleCounts c;
  const nn::MultiHeadAttention many(nn::MultiHeadAttentionOptions(s.d_model, s.heads), gen);
  const nn::MultiHeadAttention one(nn::MultiHeadAttentionOptions(s.d_model, 1), gen);
  c.attention = many.num_parameters();
  c.attention_one_head = one.num_parameters();
  for (const auto& [name, t] : many.named_parameters()) {
    if (ends_with(name, "w_q.weight") || ends_with(name, "w_k.weight") || ends_with(name, "w_v.weight")) c.qkv_weights += t.size();
  }
  c.block = nn::TransformerBlock(block_options(s, 0.1f), gen).num_parameters();
  return c;
}

namespace {

// One block, its optimizer and its input, stepped one training step at a time.
class TimedBlock {
 public:
  TimedBlock(const BlockSize& s, const StepOptions& o)
      : gen_(o.seed), block_(block_options(s, o.dropout), gen_), opt_(block_.named_parameters()),
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
  // One step first, so the parameters' gradients exist before the measured forward.
  mean(block.forward(x, mask).output).backward();
  const double before = heap_bytes_in_use();
  const Tensor y = block.forward(x, mask).output;
  const double after = heap_bytes_in_use();
  mean(y).backward();  // releases the tape
  return after - before;
}

}  // namespace claims

namespace claims {

ConfigReport report_config(const ArticleConfig& config, const ConfigsOptions& o) {
  ConfigReport r;
  r.config = config;
  r.counts = count_module_params(config.size);
  BlockSize one_head = config.size;
  one_head.heads = 1;
  for (std::size_t T : o.share_lengths) {
    r.flops.push_back(block_flops(config.size, 1, static_cast<double>(T)));
    r.memory_formula.push_back(block_activation_bytes(config.size, 1, static_cast<double>(T), o.step.dropout > 0));
    StepOptions m = o.step;
    m.batch = 1;
    m.seq_len = T;
    r.memory_measured.push_back(measured_activation_bytes(config.size, m));
    r.memory_measured_one_head.push_back(measured_activation_bytes(one_head, m));
  }
  if (o.measure_time) std::tie(r.times, r.times_one_head) = time_block_steps(config.size, o.step);
  return r;
}

double measured_attention_weight_bytes(double bytes_h_heads, double bytes_one_head, std::size_t heads) {
  if (heads < 2) return 0;
  const double H = static_cast<double>(heads);
  return H * (bytes_h_heads - bytes_one_head) / (H - 1);
}

}  // namespace claims
