// Counting xgrad's MultiHeadAttention and TransformerBlock at the article's sizes, and each
// configuration's report.
#include "configs.hpp"

#include <tuple>

#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"

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

nn::TransformerBlockOptions block_options(const BlockSize& s) {
  return nn::TransformerBlockOptions(s.d_model, s.heads).d_ff(s.ffn_width()).norm(nn::Norm::pre);
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
    if (ends_with(name, "w_q.weight") || ends_with(name, "w_k.weight") || ends_with(name, "w_v.weight"))
      c.qkv_weights += t.size();
  }
  c.block = nn::TransformerBlock(block_options(s), gen).num_parameters();
  return c;
}

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

}  // namespace claims
