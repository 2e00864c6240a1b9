// FeedForward, TransformerBlock and a small decoder-only language model.
//
// TransformerBlock: two residual sublayers of one shape (residual.hpp), the same placement for
// both:
//   Pre-Norm:  x = x + attn(attn.norm(x));  y = x + ffn(ffn.norm(x))
//   Post-Norm: x = attn.norm(x + attn(x));  y = ffn.norm(x + ffn(x))
// LanguageModel: h = tok_emb(ids) + pos(T); h = block_1..N(h) with a causal mask;
//   Pre-Norm adds a final LayerNorm; logits = head(h).
//
// Hook points (hook.hpp), besides the attention's and each residual connection's:
//   FeedForward       pre (linear1's output), hidden (after the activation and dropout), out
//   TransformerBlock  stream_in, stream_mid, stream_out: the residual stream entering the block,
//                     between its sublayers, and leaving it
//   LanguageModel     embed (tokens plus positions), logits
// Shapes: B batch, T length, C d_model, V vocabulary, F FFN width.
#pragma once

#include <memory>
#include <vector>

#include "xgrad/nn/attention.hpp"

namespace xgrad::nn {

struct FeedForwardOptions {
  FeedForwardOptions(std::size_t d_model, std::size_t d_ff) : d_model_(d_model), d_ff_(d_ff) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);
  XGRAD_REQUIRED_ARG(std::size_t, d_ff);
  XGRAD_ARG(Activation, activation, Activation::gelu);
  XGRAD_ARG(float, dropout, 0.1f);  // on the hidden activations, while training (its RandomStream)
};

// y = linear2(dropout(act(linear1(x)))), x (..., C) -> (..., C)
class FeedForward : public Module, public RandomStream {
 public:
  explicit FeedForward(const FeedForwardOptions& options, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const;
  void check_input(const Tensor& x) const;  // (..., d_model)
  std::shared_ptr<Linear> linear1, linear2;

 private:
  FeedForwardOptions options_;
};

struct TransformerBlockOptions {
  TransformerBlockOptions(std::size_t d_model, std::size_t num_heads)
      : d_model_(d_model), num_heads_(num_heads), d_ff_(4 * d_model) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);
  XGRAD_REQUIRED_ARG(std::size_t, d_ff);  // 4 * d_model unless set
  XGRAD_ARG(float, dropout, 0.1f);     // attention weights and FFN hidden
  XGRAD_ARG(Norm, norm, Norm::pre);    // pre or post
  XGRAD_ARG(Activation, activation, Activation::gelu);
  XGRAD_ARG(float, layer_norm_eps, 1e-5f);
};

struct BlockOutput {
  Tensor output;     // (B, T, C)
  Tensor attention;  // (B, H, T, T)
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& options, Generator& gen = default_generator());
  BlockOutput forward(const Tensor& x, const AttentionMask& mask = {}) const;
  std::shared_ptr<MultiHeadAttention> attn;     // Residual<Attention>: attn.norm, attn.w_q, ...
  std::shared_ptr<Residual<FeedForward>> ffn;  // ffn.norm, ffn.linear1, ffn.linear2

 private:
  TransformerBlockOptions options_;
};

enum class Positional { learned, sinusoidal };

struct LanguageModelOptions {
  LanguageModelOptions(std::size_t vocab_size, std::size_t d_model, std::size_t num_heads, std::size_t num_layers)
      : vocab_size_(vocab_size), d_model_(d_model), num_heads_(num_heads), num_layers_(num_layers), d_ff_(4 * d_model) {}
  XGRAD_REQUIRED_ARG(std::size_t, vocab_size);
  XGRAD_REQUIRED_ARG(std::size_t, d_model);
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);
  XGRAD_REQUIRED_ARG(std::size_t, num_layers);
  XGRAD_REQUIRED_ARG(std::size_t, d_ff);  // 4 * d_model unless set
  XGRAD_ARG(std::size_t, max_len, 256);
  XGRAD_ARG(float, dropout, 0.1f);
  XGRAD_ARG(Norm, norm, Norm::pre);
  XGRAD_ARG(Activation, activation, Activation::gelu);
  XGRAD_ARG(Positional, positional, Positional::learned);
  XGRAD_ARG(float, layer_norm_eps, 1e-5f);
};

struct LanguageModelOutput {
  Tensor logits;                   // (B, T, V)
  std::vector<Tensor> attentions;  // one (B, H, T, T) per block
};

struct GenerateOptions {
  float temperature = 1.f;  // 0 picks the most likely token (greedy)
  std::size_t top_k = 0;    // sample among the k most likely tokens; 0 means all
};

class LanguageModel : public Module {
 public:
  explicit LanguageModel(const LanguageModelOptions& options, Generator& gen = default_generator());
  // Throws, naming the option, for options the constructor refuses (its own and its
  // attention's), before anything is built.
  static void check(const LanguageModelOptions& options);
  // ids (B, T) with T <= max_len; causal attention.
  LanguageModelOutput forward(const IndexArray& ids) const;
  // Mean next-token cross-entropy of forward(ids) against targets (B, T) (kIgnoreIndex, -100, is skipped).
  Tensor loss(const IndexArray& ids, const IndexArray& targets) const;
  // Appends `count` tokens to `prompt`, feeding at most the last max_len tokens; runs in eval
  // mode without recording and restores the previous mode.
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::size_t count,
                                     const GenerateOptions& options = {}, Generator& gen = default_generator());
  const LanguageModelOptions& options() const { return options_; }

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<LearnedPositionalEncoding> pos_emb;          // when positional is learned
  std::shared_ptr<SinusoidalPositionalEncoding> pos_table;     // when positional is sinusoidal
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  std::shared_ptr<LayerNorm> final_norm;  // Pre-Norm only
  std::shared_ptr<Linear> head;

 private:
  LanguageModelOptions options_;
};

}  // namespace xgrad::nn
