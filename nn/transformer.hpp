// FeedForward, TransformerBlock and a small decoder-only language model.
//
// TransformerBlock: two residual sublayers of one shape (residual.hpp), the same placement for
// both:
//   Pre-Norm:  x = x + attn(attn.norm(x));  y = x + ffn(ffn.norm(x))
//   Post-Norm: x = attn.norm(x + attn(x));  y = ffn.norm(x + ffn(x))
// LanguageModel: h = embed_scale tok_emb(ids) + pos(T) (or RoPE inside attention); h = block_1..N(h)
//   with a causal mask; Pre-Norm and sandwich add a final norm; logits = head(h) (head.weight may be
//   tok_emb.weight), soft-capped with final_softcap.
//
// Hook points (hook.hpp), besides the attention's and each residual connection's:
//   FeedForward       pre (the activation's input), pre_linear (gated: the up projection),
//                     hidden (after the activation, the gate product and dropout), out
//   TransformerBlock  stream_in, stream_mid, stream_out: the residual stream entering the block,
//                     between its sublayers, and leaving it
//   LanguageModel     tok_embed (B, T, C: the token embeddings, times embed_scale), pos_embed (learned or sinusoidal
//                     positions only: (T, C), or (B, T, C) with a padding mask), embed (their sum),
//                     normalized (Pre-Norm and sandwich: the final norm's output, the head's input), logits
// Shapes: B batch, T length, C d_model, V vocabulary, F FFN width.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/generate.hpp"

namespace xgrad::nn {

/// The options of FeedForward.
struct FeedForwardOptions {
  /// d_model C and d_ff F; the other options at their defaults.
  FeedForwardOptions(std::size_t d_model, std::size_t d_ff) : d_model_(d_model), d_ff_(d_ff) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);             ///< the input and output width C
  XGRAD_REQUIRED_ARG(std::size_t, d_ff);                ///< the hidden width F
  XGRAD_ARG(Activation, activation, Activation::gelu);  ///< act (a gated unit adds the gate projection)
  XGRAD_ARG(float, dropout, 0.1f);  ///< on the hidden activations, while training (its RandomStream)
  XGRAD_ARG(bool, bias, true);      ///< biases of the projections
};

/// Plain: y = linear2(dropout(act(linear1(x)))); gated (swiglu, geglu, geglu_tanh):
/// y = linear2(dropout(act(gate(x)) * linear1(x))), act(gate) * up fused in one op (gated_unit).
/// x (..., C) -> (..., C). Hook points: pre (the activation's input: linear1's output, or the
/// gate's), pre_linear (gated only: linear1's output, the "up" projection), hidden (after the
/// activation, the product and dropout), out. With ReLU (and the tanh GELU without grad mode),
/// act(linear1(x)) is one linear_activation (measured faster; see transformer.cpp) while no hook is
/// attached at pre, which it never forms; with one there, the two run apart (the same result to
/// rounding).
class FeedForward : public Module, public RandomStream {
 public:
  /// Draws linear1 (C -> F), gate (C -> F, gated only) and linear2 (F -> C) from `gen`, from which
  /// the module's RandomStream is also spawned; a dropout outside [0, 1) throws.
  explicit FeedForward(const FeedForwardOptions& options, Generator& gen = default_generator());
  /// y; throws (check_input) when x does not end in d_model.
  Tensor forward(const Tensor& x) const;
  void check_input(const Tensor& x) const;  ///< throws, naming FeedForward and the shape, unless x is (..., d_model)
  /// The options it was built with.
  const FeedForwardOptions& options() const { return options_; }
  std::shared_ptr<Linear> linear1;  ///< the first projection, C -> F (a gated unit's "up")
  std::shared_ptr<Linear> gate;     ///< a gated unit's gate projection, C -> F; null otherwise
  std::shared_ptr<Linear> linear2;  ///< the second projection, F -> C

 private:
  FeedForwardOptions options_;
};

/// The options of TransformerBlock: its attention's and its feed-forward's, composed; the norm
/// placement and norm options are the attention's (attention().norm(), attention().norm_options())
/// and serve both residual connections. The setters below set the nested fields.
struct TransformerBlockOptions {
  /// d_model C and num_heads H (H must divide C); d_ff 4 C; the other options at their defaults.
  TransformerBlockOptions(std::size_t d_model, std::size_t num_heads)
      : attention_(d_model, num_heads), feed_forward_(d_model, 4 * d_model) {}
  XGRAD_REQUIRED_ARG(MultiHeadAttentionOptions, attention);
  XGRAD_REQUIRED_ARG(FeedForwardOptions, feed_forward);
  XGRAD_NESTED_ARG(std::size_t, d_ff, feed_forward_, d_ff);               ///< the feed-forward's hidden width F
  XGRAD_NESTED_ARG(Norm, norm, attention_, norm);                         ///< pre or post, for both sublayers
  XGRAD_NESTED_ARG(NormOptions, norm_options, attention_, norm_options);  ///< both sublayers' norms
  XGRAD_NESTED_ARG(Activation, activation, feed_forward_, activation);
  XGRAD_NESTED_ARG(std::size_t, num_kv_heads, attention_, num_kv_heads);
  XGRAD_NESTED_ARG(AttentionKernel, attention_kernel, attention_, kernel);
  XGRAD_NESTED_ARG(std::size_t, attention_tile, attention_, attention_tile);  ///< the tiled kernel's tile
  /// y = x + attn(attn.norm(x)) + ffn(ffn.norm(x)): both sublayers read the block's input
  /// (GPT-NeoX, Pythia); Pre-Norm only.
  XGRAD_ARG(bool, parallel_residual, false);

 public:
  /// The model width C.
  std::size_t d_model() const { return attention_.d_model(); }
  /// The number of query heads H.
  std::size_t num_heads() const { return attention_.num_heads(); }
  /// The dropout of the attention weights and the FFN hidden (the attention's when they differ).
  float dropout() const { return attention_.dropout(); }
  /// Sets both dropouts.
  TransformerBlockOptions& dropout(float p) {
    attention_.dropout(p);
    feed_forward_.dropout(p);
    return *this;
  }
  /// The eps of both norms.
  float norm_eps() const { return attention_.norm_options().eps(); }
  /// Sets the eps of both norms.
  TransformerBlockOptions& norm_eps(float eps) {
    attention_.norm_eps(eps);
    return *this;
  }
};

/// What TransformerBlock::forward returns.
struct BlockOutput {
  Tensor output;     ///< (B, T, C)
  Tensor attention;  ///< (B, H, T, S), S = T (with a cache: S every cached position)
};

/// Attention then feed-forward, each in its own residual connection with its norm, both placed by
/// options.norm():
/// Pre-Norm x = x + attn(attn.norm(x)); y = x + ffn(ffn.norm(x)),
/// Post-Norm x = attn.norm(x + attn(x)); y = ffn.norm(x + ffn(x)),
/// parallel (Pre-Norm) m = x + attn(attn.norm(x)); y = m + ffn(ffn.norm(x)).
/// Hook points stream_in, stream_mid, stream_out: the residual stream entering the block,
/// between its sublayers (m when parallel), and leaving it.
class TransformerBlock : public Module {
 public:
  /// Builds attn and ffn from `options` and `gen`; norm none, and a feed-forward whose d_model is
  /// not the attention's, throw.
  explicit TransformerBlock(const TransformerBlockOptions& options, Generator& gen = default_generator());
  /// The block's output for x (B, T, C) and the attention weights. With a cache: x holds the
  /// next positions after those the cache holds (see Attention); positions: see Attention::forward.
  BlockOutput forward(const Tensor& x, const AttentionMask& mask = {}, KVCache* cache = nullptr,
                      const IndexArray* positions = nullptr) const;
  std::shared_ptr<MultiHeadAttention> attn;    ///< Residual<Attention>: attn.norm, attn.w_q, ...
  std::shared_ptr<Residual<FeedForward>> ffn;  ///< ffn.norm, ffn.linear1, ffn.linear2

 private:
  TransformerBlockOptions options_;
};

/// The positions a LanguageModel gives its tokens: a learned table added to the token embeddings
/// (LearnedPositionalEncoding, parameters pos_emb.weight), the fixed sinusoidal one, none at
/// all, or rotary (RoPE on every attention's q and k).
enum class Positional { learned, sinusoidal, none, rotary };

/// How a LanguageModel draws its weights.
/// pytorch: each module's PyTorch default (Linear U(+-1/sqrt(in)), Embedding N(0, 1)).
/// gpt2: GPT-2's and Llama's scheme: every Linear weight and embedding table N(0, 0.02), biases
/// 0, norms 1 (and 0), and the residual output projections (attn.w_o, ffn.linear2) N(0, 0.02 /
/// sqrt(2 num_layers)).
enum class Init { pytorch, gpt2 };

/// The options of LanguageModel, e.g.\ LanguageModelOptions(50257, 768, 12, 12).max_len(1024): one
/// flat description of the model, as a checkpoint writes it (weights/model_options_json.hpp) and a
/// config.json maps onto it. Block i's options are derived by block(i): every block gets the same,
/// but for its window (full_attention_layers) and the RoPE base that goes with it (rope_local_theta).
struct LanguageModelOptions {
  /// vocab_size V, d_model C, num_heads H (H must divide C) and num_layers; d_ff 4 C; the other
  /// options at their defaults.
  LanguageModelOptions(std::size_t vocab_size, std::size_t d_model, std::size_t num_heads, std::size_t num_layers)
      : vocab_size_(vocab_size),
        d_model_(d_model),
        num_heads_(num_heads),
        num_layers_(num_layers),
        d_ff_(4 * d_model) {}
  /// A GPT-2-style model: learned positions, Pre-Norm LayerNorm (eps 1e-5), GELU (tanh) MLP of
  /// 4 C, biases, tied embeddings, GPT-2 init.
  static LanguageModelOptions gpt2_style(std::size_t vocab_size, std::size_t d_model, std::size_t num_heads,
                                         std::size_t num_layers);
  /// A Llama-style model: RoPE (theta 10000), Pre-Norm RMSNorm (eps 1e-5), SwiGLU with a hidden
  /// width of 8 C / 3 rounded up to a multiple of 8 (about the parameters of a 4 C MLP), no
  /// biases, untied head, grouped-query attention with num_kv_heads, GPT-2 init.
  static LanguageModelOptions llama_style(std::size_t vocab_size, std::size_t d_model, std::size_t num_heads,
                                          std::size_t num_layers, std::size_t num_kv_heads);

  // The model.
  XGRAD_REQUIRED_ARG(std::size_t, vocab_size);  ///< the number of token ids V
  XGRAD_REQUIRED_ARG(std::size_t, d_model);     ///< the model width C
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);   ///< attention heads per block H
  XGRAD_REQUIRED_ARG(std::size_t, num_layers);  ///< the number of TransformerBlocks
  XGRAD_ARG(std::size_t, max_len, 256);         ///< the most positions a forward takes
  XGRAD_ARG(Positional, positional, Positional::learned);
  XGRAD_ARG(bool, tie_embeddings, false);  ///< head.weight is tok_emb.weight
  XGRAD_ARG(bool, head_bias, true);        ///< the head's bias (none when tied)
  XGRAD_ARG(Init, init, Init::pytorch);
  /// The token embeddings are multiplied by it (Gemma: sqrt(d_model)); the tied head is not.
  XGRAD_ARG(float, embed_scale, 1.f);
  /// Soft-capping of the logits, z -> cap tanh(z / cap) (Gemma 2's final_logit_softcapping); 0: none.
  XGRAD_ARG(float, final_softcap, 0.f);
  // The norms (every block's two and Pre-Norm's final one).
  XGRAD_ARG(Norm, norm, Norm::pre);  ///< pre, post or sandwich (pre and sandwich add final_norm)
  XGRAD_ARG(NormKind, norm_kind, NormKind::layer_norm);
  XGRAD_ARG(float, norm_eps, 1e-5f);   ///< finite and > 0
  XGRAD_ARG(bool, norm_affine, true);  ///< whether the norms have a weight
  XGRAD_ARG(bool, norm_bias, true);    ///< whether the LayerNorms with a weight have a bias
  /// RMSNorms scale by (1 + weight), the weights starting at 0 (Gemma), the q and k norms too.
  XGRAD_ARG(bool, norm_unit_offset, false);
  // The attentions.
  XGRAD_ARG(std::size_t, num_kv_heads, 0);  ///< key/value heads KV (KV divides H); 0: num_heads
  XGRAD_ARG(std::size_t, head_dim, 0);      ///< each head's width D; 0: d_model / num_heads
  XGRAD_ARG(bool, qkv_bias, true);          ///< biases of w_q, w_k and w_v
  XGRAD_ARG(bool, out_bias, true);          ///< the bias of w_o
  XGRAD_ARG(float, rope_theta, 10000.f);    ///< RoPE's base (positional rotary)
  XGRAD_ARG(std::size_t, rotary_dim, 0);    ///< the channels of each head RoPE turns; 0: all
  /// RoPE's frequency scaling (see RopeScaling): its type, factor, llama3's low and high frequency
  /// factors, and the context trained on (dynamic and llama3).
  XGRAD_ARG(RopeScaling::Type, rope_scaling, RopeScaling::Type::none);
  XGRAD_ARG(float, rope_factor, 1.f);
  XGRAD_ARG(float, rope_low_freq_factor, 1.f);
  XGRAD_ARG(float, rope_high_freq_factor, 4.f);
  XGRAD_ARG(std::size_t, rope_original_max_len, 0);
  XGRAD_ARG(bool, qk_norm, false);  ///< an RMSNorm over each head's q and k, before RoPE
  /// Each query sees only its last sliding_window positions (Mistral); 0: every earlier one.
  XGRAD_ARG(std::size_t, sliding_window, 0);
  /// With a sliding_window, the blocks (by index) that attend to every earlier position instead;
  /// empty: every block has the window. Gemma 2 alternates (1, 3, 5, ...), Gemma 3 takes every
  /// sixth (5, 11, ...).
  XGRAD_ARG(std::vector<std::size_t>, full_attention_layers, {});
  /// The RoPE base of the windowed blocks, which then take no rope_scaling (Gemma 3's local base);
  /// 0: rope_theta and the scaling, as the other blocks.
  XGRAD_ARG(float, rope_local_theta, 0.f);
  /// The scores' scale, Q K^T * attn_scale; 0: 1 / sqrt(D) (Gemma: 1 / sqrt(query_pre_attn_scalar)).
  XGRAD_ARG(float, attn_scale, 0.f);
  /// Soft-capping of every attention's scaled scores, s -> cap tanh(s / cap) (Gemma 2); 0: none.
  XGRAD_ARG(float, attn_softcap, 0.f);
  /// Every attention's kernel (see AttentionKernel); not stored in checkpoints.
  XGRAD_ARG(AttentionKernel, attention_kernel, AttentionKernel::automatic);
  XGRAD_ARG(std::size_t, attention_tile, 128);  ///< the tiled kernel's tile
  // The feed-forwards.
  XGRAD_REQUIRED_ARG(std::size_t, d_ff);  ///< the hidden width F
  XGRAD_ARG(Activation, activation, Activation::gelu);
  XGRAD_ARG(bool, ffn_bias, true);  ///< biases of the feed-forward projections
  /// Both sublayers of a block read its input: y = x + attn(norm1(x)) + ffn(norm2(x)) (GPT-NeoX,
  /// Pythia); Pre-Norm only.
  XGRAD_ARG(bool, parallel_residual, false);
  /// The attention-weight and FFN-hidden dropout, while training.
  XGRAD_ARG(float, dropout, 0.1f);

 public:
  /// Sets every bias but the norms': qkv_bias, out_bias, ffn_bias and head_bias.
  LanguageModelOptions& bias(bool on) { return qkv_bias(on).out_bias(on).ffn_bias(on).head_bias(on); }
  /// Every norm's options.
  NormOptions norm_options() const {
    return NormOptions()
        .kind(norm_kind_)
        .eps(norm_eps_)
        .affine(norm_affine_)
        .bias(norm_bias_)
        .unit_offset(norm_unit_offset_);
  }
  /// RoPE's scaling as the attentions take it.
  RopeScaling rope_scaling_options() const {
    return {rope_scaling_, rope_factor_, rope_low_freq_factor_, rope_high_freq_factor_, rope_original_max_len_};
  }
  /// Sets the five rope_ fields from `s`.
  LanguageModelOptions& rope_scaling_options(const RopeScaling& s) {
    return rope_scaling(s.type)
        .rope_factor(s.factor)
        .rope_low_freq_factor(s.low_freq_factor)
        .rope_high_freq_factor(s.high_freq_factor)
        .rope_original_max_len(s.original_max_len);
  }
  /// Block `layer`'s options, derived from these (rotary from positional; the window unless the
  /// block is in full_attention_layers, and with it rope_local_theta).
  TransformerBlockOptions block(std::size_t layer = 0) const;
  /// Whether block `layer` attends through the sliding window.
  bool windowed(std::size_t layer) const;
};

/// Whether LanguageModel::forward returns the attention weights. keep forms them in every block
/// (the full kernel); none lets long inputs take the tiled kernel, which forms none (see
/// AttentionKernel), and returns no attentions. loss runs with none.
enum class Attentions { keep, none };

/// Which positions' logits forward_cached computes. last: each row's last position only, logits
/// (B, 1, V), all that generation reads (the head, the largest product of a prompt with a large
/// vocabulary, then runs on one position); the hook points normalized and logits then see that
/// position only. all: every position, logits (B, T, V).
enum class Logits { all, last };

/// What LanguageModel::forward returns.
struct LanguageModelOutput {
  Tensor logits;  ///< (B, T, V); forward_cached with Logits::last: (B, 1, V)
  /// One (B, H, T, T) per block (forward_cached: (B, H, T, S)); empty with Attentions::none.
  std::vector<Tensor> attentions;
};

/// Keys and values of every block, for LanguageModel::forward_cached.
struct LanguageModelCache {
  std::vector<KVCache> blocks;  ///< one per block; empty until the first forward_cached
  /// (B, length()): which positions seen are padding, when a padded forward_cached filled the cache.
  std::optional<Mask> padding;
  /// The number of positions seen (0 while empty), those a sliding window dropped included.
  std::size_t length() const { return blocks.empty() ? 0 : blocks.front().length(); }
  /// Empties the cache; the reservation stays.
  void clear() { blocks.clear(), padding.reset(); }
  /// Keeps the batch rows `rows` (in that order) of every block's keys, values, positions and of
  /// the padding marks: rows that are done leave a batch. A row outside the batch throws.
  void keep_rows(const std::vector<std::size_t>& rows);
  /// Room for `positions` positions in every block (KVCache::reserve), the blocks the first
  /// forward_cached makes included: steps that record no gradients then write their keys and
  /// values in place instead of copying the held ones. generate and generate_batch reserve what
  /// they will hold. A step past it throws and changes nothing; fewer than a block holds throws.
  void reserve(std::size_t positions);
  std::size_t reserved() const { return reserved_; }  ///< the room reserve() asked for (0: none)

 private:
  std::size_t reserved_ = 0;
};

/// A decoder-only language model: h = embed_scale tok_emb(ids) + positions (learned or
/// sinusoidal; none and rotary add nothing here); h = blocks (causal attention); Pre-Norm and
/// sandwich add final_norm; logits = head(h), soft-capped with final_softcap. With tie_embeddings, head.weight is
/// tok_emb.weight: one parameter (listed once, as tok_emb.weight) that gets gradients from both uses. Hook points
/// tok_embed (the token embeddings), pos_embed (learned or sinusoidal positions only), embed (their sum), normalized
/// (Pre-Norm and sandwich: the final norm's output) and logits (after final_softcap), besides its blocks'.
class LanguageModel : public Module {
 public:
  /// Checks the options (check), then draws every parameter from `gen`.
  explicit LanguageModel(const LanguageModelOptions& options, Generator& gen = default_generator());
  /// Throws, naming the option, for options the constructor refuses (its own and its
  /// attention's), before anything is built.
  static void check(const LanguageModelOptions& options);
  /// The logits for ids (B, T) with T <= max_len; causal attention. An id outside the
  /// vocabulary throws.
  LanguageModelOutput forward(const IndexArray& ids, Attentions attentions = Attentions::keep) const;
  /// A batch of sequences of different lengths: key_padding_mask (B, T) marks padding tokens (true),
  /// anywhere in a row, which no query attends to. Positions count each row's tokens that are not
  /// padding, so a row gets the logits it gets alone whether it is padded on the left or the
  /// right. A padding token's own logits mean nothing; give its target kIgnoreIndex. With a
  /// sliding_window the padding must sit at a row's start or end (the window counts keys by index).
  LanguageModelOutput forward(const IndexArray& ids, const Mask& key_padding_mask,
                              Attentions attentions = Attentions::keep) const;
  /// ids (B, n): the next n positions after the cache.length() positions whose keys and values
  /// `cache` holds (empty: positions 0 .. n-1); appends theirs (a failed call appends nothing).
  /// logits (B, 1, V) of the last new position, or with Logits::all (B, n, V); attentions
  /// (B, H, n, S) per block, over the keys it attended to: the positions its cache held and the n
  /// new ones (S = cache.length() after the call, unless a sliding window had dropped the first
  /// ones). Hook points see the n new positions only (the cache holds what k, v and rot_k returned).
  LanguageModelOutput forward_cached(const IndexArray& ids, LanguageModelCache& cache,
                                     Attentions attentions = Attentions::keep, Logits logits = Logits::last) const;
  /// The same for a batch of sequences of different lengths (batched generation): key_padding_mask
  /// (B, n) marks which new tokens are padding (true); the cache keeps the marks of every position
  /// it has seen, and no query attends to a padding key. Each row's positions count its tokens
  /// that are not padding, so a left-padded row gets the logits it gets alone (up to float
  /// rounding), as forward(ids, key_padding_mask) does. A cache filled by the unpadded call
  /// continues only unpadded, and the unpadded call on a padded cache marks its tokens as real.
  /// With a sliding_window, a row's padding must come before its first real token.
  LanguageModelOutput forward_cached(const IndexArray& ids, const Mask& key_padding_mask, LanguageModelCache& cache,
                                     Attentions attentions = Attentions::keep, Logits logits = Logits::last) const;
  /// Mean next-token cross-entropy of forward(ids) against targets (B, T) (kIgnoreIndex, -100, is skipped).
  /// The head and the loss run as one linear_cross_entropy, the (B, T, V) logits never formed whole,
  /// unless something needs them: a hook at logits, final_softcap, an unmerged adapter on the head.
  /// Targets of another shape than ids, or outside the vocabulary (and not kIgnoreIndex), throw.
  Tensor loss(const IndexArray& ids, const IndexArray& targets) const;
  /// The same for forward(ids, key_padding_mask); give padding tokens the target kIgnoreIndex.
  Tensor loss(const IndexArray& ids, const IndexArray& targets, const Mask& key_padding_mask) const;
  /// Appends at most `count` tokens to `prompt`, stopping earlier on a stop token, a stop string or
  /// the on_token callback (see GenerateOptions, generate.hpp); runs in eval mode without
  /// recording and restores the previous mode, also when it throws (decode or on_token may). Every
  /// prompt id is checked against the vocabulary, whatever max_len is, and ids (prompt + count of
  /// them) that cannot be held are refused before the first step, naming the sizes and the memory
  /// left. An empty prompt and an option out of its range (a negative or NaN temperature, top_p
  /// outside (0, 1], min_p outside [0, 1], a repetition_penalty that is not finite and > 0, a stop
  /// token outside the vocabulary, an empty stop string, stop_strings without decode, a
  /// window_keep of max_len or more) throw before any work, naming the option and its value.
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::size_t count,
                                     const GenerateOptions& options = {}, Generator& gen = default_generator());
  /// The same tokens, with why generation stopped, the prompt's length and the decoded new text.
  Generation generate_with_details(std::vector<std::int64_t> prompt, std::size_t count,
                                   const GenerateOptions& options = {}, Generator& gen = default_generator());
  /// The same, with the attention weights of every position that ran as a query (refused up
  /// front, as the ids are, when they cannot be held for count new tokens).
  Generation generate_with_attention(std::vector<std::int64_t> prompt, std::size_t count,
                                     const GenerateOptions& options = {}, Generator& gen = default_generator());
  /// Batched generation: every prompt continued at once, left-padded to the longest with padding
  /// that no query attends to (forward_cached with a key_padding_mask), each row stopping on its own
  /// (a row that is done leaves the batch). Row b's tokens are what generate(prompts[b]) gives
  /// (up to float rounding in the logits) when it draws from the same stream: with a seed, row b
  /// draws from Generator(*seed + b), as generate with seed + b does; without one, from a stream
  /// spawned from `gen` for each row in order. The options are generate's (checked the same way), but
  /// on_token, which streams one sequence, is refused, and the context does not slide: the longest
  /// prompt and count new tokens must fit in max_len (longest + count - 1 positions), else it throws
  /// before any work. An empty batch or an empty prompt throws, naming it.
  std::vector<Generation> generate_batch(const std::vector<std::vector<std::int64_t>>& prompts, std::size_t count,
                                         const GenerateOptions& options = {}, Generator& gen = default_generator());
  /// The logits forward gives for a last block's output h (B, T, C): the final norm (if any), the
  /// head and final_softcap, without hooks (the logit lens's readout).
  Tensor unembed(const Tensor& h) const;
  /// The options it was built with.
  const LanguageModelOptions& options() const { return options_; }
  /// Activation checkpointing per block: while on, a forward that records (grad mode, no cache,
  /// Attentions::none, no hook attached) keeps each block's input alone and runs the block again
  /// in backward (core's checkpoint), for about one more forward's work. The gradients are the plain
  /// run's bit for bit: the recomputation starts the block's dropout streams where the forward
  /// started them, so the masks are regenerated, not stored. Not while other threads run passes on
  /// this model (the streams are set back during backward). Off for a new model; not saved.
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }
  /// Whether activation checkpointing is on.
  bool checkpoint_activations() const { return checkpoint_activations_; }

  std::shared_ptr<Embedding> tok_emb;                  ///< the token embedding, (V, C)
  std::shared_ptr<LearnedPositionalEncoding> pos_emb;  ///< when positional is learned
  /// When positional is sinusoidal (not a registered module: the table is not saved).
  std::shared_ptr<SinusoidalPositionalEncoding> pos_table;
  std::vector<std::shared_ptr<TransformerBlock>> blocks;  ///< the blocks, registered as "blocks.0" ...
  std::shared_ptr<NormLayer> final_norm;                  ///< Pre-Norm and sandwich only
  std::shared_ptr<Linear> head;                           ///< C -> V (its weight tok_emb's when tied)

 private:
  void check_ids(const IndexArray& ids, std::size_t first) const;  // first: the positions already cached
  void check_targets(const IndexArray& ids, const IndexArray& targets) const;
  // Each position's count of real tokens before it in its row (B, T); throws for a mask of another
  // shape than ids, and for padding between real tokens under a sliding window.
  IndexArray padded_positions(const IndexArray& ids, const Mask& key_padding_mask) const;
  // Sizes an empty cache to the blocks; throws for one of another model or with blocks out of step.
  void check_cache(LanguageModelCache& cache, std::size_t first, std::size_t n) const;
  Tensor head_logits(const Tensor& h) const;  // the head, then final_softcap
  Tensor checkpointed_block(std::size_t i, const Tensor& h, const AttentionMask& mask, const IndexArray* rotary) const;
  // generate.cpp; `who` names the public call in errors
  Generation generate_impl(std::vector<std::int64_t> prompt, std::size_t count, const GenerateOptions& options,
                           Generator& gen, bool keep_attention, const char* who);
  // The one path of every forward: embeds ids at `positions` (B, T) or (T), applies the position
  // scheme, runs the blocks (causal, with the padding mask if given: (B, T), or with a cache
  // (B, cache length + T)) and the final norm, and returns the head's input (B, T, C), or (B, 1, C)
  // with Logits::last; each block's weights go to `weights` with Attentions::keep.
  Tensor run_blocks(const IndexArray& ids, const IndexArray& positions, const Mask* key_padding_mask,
                    LanguageModelCache* cache, Attentions attentions, Logits logits,
                    std::vector<Tensor>& weights) const;
  // run_blocks, then the head.
  LanguageModelOutput run(const IndexArray& ids, const IndexArray& positions, const Mask* key_padding_mask,
                          LanguageModelCache* cache, Attentions attentions, Logits logits = Logits::all) const;
  // The mean cross-entropy of the head's logits on h against targets: the head and the loss fused
  // (linear_cross_entropy) unless a hook, final_softcap or an unmerged adapter must see the logits.
  Tensor head_loss(const Tensor& h, const IndexArray& targets) const;
  LanguageModelOptions options_;
  bool checkpoint_activations_ = false;
};

}  // namespace xgrad::nn
