// The article's configuration table, counted and measured on xgrad's own modules: parameters of
// MultiHeadAttention (with H heads and with one head of the same width) and of a TransformerBlock,
// the formulas' shares, and the measurements of block_measure.hpp, per configuration.
// Shapes: B batch, T length, C d_model, H heads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "block_measure.hpp"
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

struct ConfigsOptions {
  StepOptions step;                                      // the timed training step
  std::vector<std::size_t> share_lengths = {128, 1024};  // T of the FLOP and memory shares (B = 1)
  bool measure_time = true;
};

// Everything the configs tables print about one configuration.
struct ConfigReport {
  ArticleConfig config;
  ModuleCounts counts;
  std::vector<BlockFlops> flops;                 // per share length, B = 1
  std::vector<BlockActivations> memory_formula;  // per share length, B = 1
  std::vector<double> memory_measured;           // bytes, H heads, per share length
  std::vector<double> memory_measured_one_head;  // bytes, 1 head of width C
  StepTimes times, times_one_head;               // when measure_time
};

ConfigReport report_config(const ArticleConfig& config, const ConfigsOptions& options);

}  // namespace claims
