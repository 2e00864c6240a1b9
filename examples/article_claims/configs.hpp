// The article's configuration table, counted and measured on xgrad's own modules: parameters of
// MultiHeadAttention (with H heads and with one head of the same width) and of a TransformerBlock,
// the activation bytes a block's forward keeps for backward, and the time of a training step.
// Shapes: B batch, T length, C d_model, H heads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sizes.hpp"

namespace claims {

// A row of the article's table: d_model, heads (d_k = 64 in all four) and its label.
struct ArticleConfig {
  BlockSize size;
  std::string label;        // the article's words
  std::string article_use;  // the models the article names for it
};
std::vector<ArticleConfig> article_configs();

// Parameters counted from the modules' named_parameters().
struct ModuleCounts {
  std::size_t attention = 0;           // MultiHeadAttention with H heads
  std::size_t attention_one_head = 0;  // MultiHeadAttention with 1 head of width C
  std::size_t qkv_weights = 0;         // w_q, w_k and w_v weights of the H-head module
  std::size_t block = 0;               // TransformerBlock, d_ff from the size
};
ModuleCounts count_module_params(const BlockSize& size);

struct StepOptions {
  std::size_t batch = 8, seq_len = 128;
  std::size_t steps = 7;  // timed steps, after one untimed warm-up step
  float dropout = 0.1f;   // attention weights and FFN hidden, as in the article's module
  bool causal = true;
  std::uint64_t seed = 0;
};

// Medians over the timed steps of one Pre-Norm TransformerBlock on random input:
// forward + backward of mean(block(x)), and the AdamW update that follows.
struct StepTimes {
  double forward_backward_ms = 0, optimizer_ms = 0;
};
// The block of `size` and the same block with one head of width C, their steps alternating, so
// the load of a shared machine falls on both alike. Returns {H heads, 1 head}.
std::pair<StepTimes, StepTimes> time_block_steps(const BlockSize& size, const StepOptions& options);

// Heap bytes (glibc's mallinfo2) that one training-mode forward of the block leaves allocated
// until backward: the activations the tape holds, plus the block's output.
double measured_activation_bytes(const BlockSize& size, const StepOptions& options);

}  // namespace claims

namespace claims {

struct ConfigsOptions {
  StepOptions step;                                   // the timed training step
  std::vector<std::size_t> share_lengths = {128, 1024};  // T of the FLOP and memory shares (B = 1)
  bool measure_time = true;
};

// Everything the configs tables print about one configuration.
struct ConfigReport {
  ArticleConfig config;
  ModuleCounts counts;
  std::vector<BlockFlops> flops;                   // per share length, B = 1
  std::vector<BlockActivations> memory_formula;    // per share length, B = 1
  std::vector<double> memory_measured;             // bytes, H heads, per share length
  std::vector<double> memory_measured_one_head;    // bytes, 1 head of width C
  StepTimes times, times_one_head;                 // when measure_time
};

ConfigReport report_config(const ArticleConfig& config, const ConfigsOptions& options);

// The attention-weight bytes the measurements imply: the bytes that grow with H, from
// m_H = rest + H w and m_1 = rest + w, so H w = H (m_H - m_1) / (H - 1). 0 for H = 1.
double measured_attention_weight_bytes(double bytes_h_heads, double bytes_one_head, std::size_t heads);

}  // namespace claims
