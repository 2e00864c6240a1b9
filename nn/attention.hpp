// Multi-head attention, the classic module: per-head scaled dot-product attention in subspaces
// of size D = d_model / H, dropout on the attention weights, masks, and (MultiHeadAttention) the
// residual connection with its norm placed Pre-Norm or Post-Norm; grouped-query attention,
// QK-norm and rotary positions as options.
//
//   head_h  = softmax(Q_h K_h^T / sqrt(D) + mask) V_h     with Q_h = query W_q[h], K_h = key W_k[h],
//                                                           V_h = value W_v[h]
// Self-attention takes query = key = value = x; cross-attention takes key and value of another
// length S and, optionally, other widths (kdim, vdim, as PyTorch's nn.MultiheadAttention).
//   Attention(x) = concat(head_1 .. head_H) W_o
//   MultiHeadAttention = Residual<Attention> (residual.hpp), by options.norm():
//     Pre-Norm:  y = x + Attention(norm(x))
//     Post-Norm: y = norm(x + Attention(x))
//     none:      y = Attention(x)            (no residual, no norm: compose your own)
//
// Hook points of Attention (hook.hpp), in forward order:
//   q          (B, T, H D) the query projection, heads side by side (head h is channels hD .. (h+1)D)
//   k, v       (B, S, KV D) the key and value projections, after QK-norm (with a KVCache: the new
//              positions, T; the cache holds what the hooks returned)
//   rot_q      (B, T, H D) q turned by RoPE (rotary only)
//   rot_k      (B, S, KV D) k turned by RoPE (rotary only; with a KVCache the new positions, but
//              every position the step attends to with dynamic scaling)
//   scores     (B, H, T, S) scale Q_h K_h^T (soft-capped with logit_softcap) before masks and
//              softmax (formed only while hooked or capped)
//   pattern    (B, H, T, S) the attention weights, before dropout
//   context    (B, T, H D) each head's output, side by side, before W_o
//   z          (B, T, H, D) the same values with a head axis (formed only while hooked)
//   result     (B, T, H, C) each head's share of out, z_h W_o[h] without W_o's bias: out is their
//              sum plus the bias (formed only while hooked; out is then computed from it)
//   out        (B, T, C) the attention's output
//
// Shapes: B batch, T query length, S key length (S = T: self-attention), C = d_model,
// H heads, KV key/value heads (KV divides H; query head h uses key/value head h / (H / KV)),
// D = C / H unless head_dim sets another width (the q, context and z points are then H D wide).
#pragma once

#include <memory>
#include <optional>

#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/options.hpp"
#include "xgrad/nn/random_stream.hpp"
#include "xgrad/nn/residual.hpp"

namespace xgrad::nn {

/// Which kernel computes the attention (the context, and the weights when they are formed).
///  - full: the weights (B, H, T, S) are formed and kept for backward (attention_weights, attend).
///  - tiled: flash_attention, tile by tile with an online softmax; memory grows as T, not T S.
///    No weights are formed, so AttentionOutput::weights is undefined.
///  - automatic: tiled from kTiledFromKeys keys on, full below (measured: bench_attention_kernels).
/// Whatever the choice, the full kernel runs when the weights are needed: AttentionMask's
/// need_weights, a hook on scores or pattern, or a mask other than causal (attn_mask,
/// key_padding_mask, additive_mask), and with logit_softcap. The kernels agree within fp32 rounding, dropout included
/// (tiled regenerates the mask the full kernel draws, from the same generator draw).
enum class AttentionKernel { automatic, tiled, full };

/// Where automatic switches to the tiled kernel. In a training step of the benchmark's shapes
/// (bench_attention_kernels, one thread) the tiled kernel ran 1.08 times faster at T 512, 1.14 at
/// T 1024 and 1.42 at T 4096, and 0.94 to 1.01 at T 64, 128 and 256, where the weights the full
/// kernel forms come for free (docs/speed.md, "Tiled attention").
inline constexpr std::size_t kTiledFromKeys = 512;

/// The options of Attention and MultiHeadAttention:
/// MultiHeadAttentionOptions(512, 8).dropout(0.1f).norm(Norm::post), for example.
struct MultiHeadAttentionOptions {
  /// d_model C and num_heads H (H must divide C); the other options at their defaults.
  MultiHeadAttentionOptions(std::size_t d_model, std::size_t num_heads) : d_model_(d_model), num_heads_(num_heads) {}
  XGRAD_REQUIRED_ARG(std::size_t, d_model);    ///< the model width C, of the query and the output
  XGRAD_REQUIRED_ARG(std::size_t, num_heads);  ///< the number of query heads H
  /// The number of key/value heads KV (grouped-query attention; 1 is multi-query): it must divide
  /// num_heads, and query head h uses key/value head h / (H / KV). 0 means num_heads.
  XGRAD_ARG(std::size_t, num_kv_heads, 0);
  /// On the attention weights, while training; masks come from the module's RandomStream.
  XGRAD_ARG(float, dropout, 0.1f);
  XGRAD_ARG(Norm, norm, Norm::pre);                     ///< where MultiHeadAttention's norm sits
  XGRAD_ARG(NormOptions, norm_options, NormOptions());  ///< the norm's kind, eps, weight and bias
  XGRAD_NESTED_ARG(float, norm_eps, norm_options_, eps);
  XGRAD_ARG(bool, qkv_bias, true);  ///< biases of w_q, w_k and w_v
  XGRAD_ARG(bool, out_bias, true);  ///< the bias of w_o
  XGRAD_ARG(std::size_t, kdim, 0);  ///< width of the key input; 0: d_model
  XGRAD_ARG(std::size_t, vdim, 0);  ///< width of the value input; 0: d_model
  /// Rotary position embedding (RoPE) of q and k in self-attention, Hugging Face's rotate_half
  /// pairing (see rotary_embedding in core/autograd/ops.hpp).
  XGRAD_ARG(bool, rotary, false);
  XGRAD_ARG(float, rope_theta, 10000.f);  ///< RoPE's base: finite and > 0
  /// RoPE's frequency scaling for long contexts (linear, dynamic, llama3; see RopeScaling).
  XGRAD_ARG(RopeScaling, rope_scaling, RopeScaling());
  /// The channels of each head that RoPE turns (even, at most D; 0 means D): partial rotary.
  XGRAD_ARG(std::size_t, rotary_dim, 0);
  /// An RMSNorm (eps and unit_offset from norm_options, with a weight) over each head's q and each
  /// key head's k, before RoPE (QK-norm).
  XGRAD_ARG(bool, qk_norm, false);
  /// Sliding-window attention (Mistral): under the causal mask, the query at position p sees only
  /// keys p - sliding_window + 1 .. p, in both kernels; a KVCache then keeps only the last
  /// sliding_window positions. 0: no window.
  XGRAD_ARG(std::size_t, sliding_window, 0);
  /// The scores' scale: Q_h K_h^T * scale; 0 means 1 / sqrt(D) (Gemma: 1 / sqrt(query_pre_attn_scalar)).
  XGRAD_ARG(float, scale, 0.f);
  /// Soft-capping of the scaled scores, s -> cap tanh(s / cap), before masks and softmax (Gemma 2);
  /// 0: none. The full kernel computes a capped attention (the tiled kernel has no cap).
  XGRAD_ARG(float, logit_softcap, 0.f);
  /// The attention kernel (see AttentionKernel); a runtime choice that checkpoints do not store.
  XGRAD_ARG(AttentionKernel, kernel, AttentionKernel::automatic);
  /// The tiled kernel's query and key tile, 1 .. 1024 (128 ran long's step 1.1 times faster than 64).
  XGRAD_ARG(std::size_t, attention_tile, 128);

 public:
  /// Sets qkv_bias and out_bias together.
  MultiHeadAttentionOptions& bias(bool on) { return qkv_bias(on).out_bias(on); }
  /// KV: num_kv_heads, or num_heads when that is 0.
  std::size_t kv_heads() const { return num_kv_heads_ ? num_kv_heads_ : num_heads_; }
  /// D, each head's width: the one set, or d_model / num_heads.
  std::size_t head_dim() const { return head_dim_ ? head_dim_ : num_heads_ ? d_model_ / num_heads_ : 0; }
  /// Sets D (0: d_model / num_heads, which H must then divide). With another D, w_q maps C to
  /// H D and w_o maps H D back to C (Qwen 3, Gemma).
  MultiHeadAttentionOptions& head_dim(std::size_t d) {
    head_dim_ = d;
    return *this;
  }
  /// Whether head_dim was set (not derived from d_model / num_heads).
  bool head_dim_set() const { return head_dim_ != 0; }
  /// The scores' scale as applied: scale, or 1 / sqrt(head_dim()) when that is 0.
  float score_scale() const;

 private:
  std::size_t head_dim_ = 0;
};

/// Masks for one forward call. In the boolean masks true marks a key that may NOT be attended to.
/// A query left with no key gets weights of zero (and so a context of zero), never NaN, and no
/// gradient flows through its scores.
struct AttentionMask {
  /// Query t sees keys 0..t only (with a KVCache holding P positions: query t is position P + t,
  /// and sees 0..P + t).
  bool causal = false;
  std::optional<Mask> attn_mask;         ///< broadcastable to (B, H, T, S)
  std::optional<Mask> key_padding_mask;  ///< (B, S): true marks padding keys
  /// Added to the scaled scores before the softmax, broadcastable to (B, H, T, S), as PyTorch's
  /// float attn_mask; -inf blocks a key, and +inf or NaN is an error.
  std::optional<Array> additive_mask;
  /// Whether the caller reads AttentionOutput::weights. false lets the tiled kernel run (see
  /// AttentionKernel), and weights is then undefined whenever it does.
  bool need_weights = true;
};

/// The keys and values an Attention has projected so far, for generating one position at a time:
/// forward(x, mask, &cache) projects only x's positions, appends them, and attends over all.
/// It holds only the KV key/value heads (grouped-query attention shrinks it by H / KV), after
/// QK-norm and RoPE: each key is turned once, at its position. With dynamic RoPE scaling, whose
/// frequencies follow the sequence's length, keys are held unturned, with the positions given
/// (per row), and all turned again at each step. With a
/// sliding_window it keeps only the last sliding_window positions: the earlier ones are dropped.
///
/// Appending copies every held key and value into new tensors, unless room was reserved: then a
/// step that records no gradients (no q, k or v requiring grad) writes its positions after the
/// held ones, in storage allocated once for `reserved()` positions, so a step's cost no longer
/// grows with the positions held. A sliding window and dynamic RoPE scaling still copy. A copy of
/// a cache shares what it holds and moves to storage of its own at its first such step, so copies
/// go on independently. While gradients are recorded the held tensors keep their autograd history:
/// run cached steps under NoGradGuard (generate does) unless a backward through every step is
/// wanted.
class KVCache {
 public:
  KVCache() = default;  ///< empty, no room reserved
  /// Shares what `other` holds; its first step that writes in place moves it to storage of its own.
  KVCache(const KVCache& other);
  KVCache& operator=(const KVCache& other);          ///< as the copy constructor
  KVCache(KVCache&&) noexcept = default;             ///< takes `other`'s storage and room
  KVCache& operator=(KVCache&&) noexcept = default;  ///< takes `other`'s storage and room

  /// The keys and the values held, each (B, P, KV * D): the P positions held, the last ones seen;
  /// undefined while empty. With room reserved they are copies.
  Tensor keys() const;
  Tensor values() const;  ///< as keys()
  /// The batch rows held (0 while empty).
  std::size_t rows() const { return k_.defined() ? k_.shape()[0] : 0; }
  /// P, the number of positions held (0 while empty).
  std::size_t held() const { return held_; }
  /// The number of positions seen, dropped ones included: the next position's index.
  std::size_t length() const { return dropped + held_; }
  /// Room for `positions` positions held in all (0: none, every step copies). A step that would
  /// hold more throws, naming the reservation, and leaves the cache as it was. Fewer than held()
  /// throws.
  void reserve(std::size_t positions);
  std::size_t reserved() const { return reserved_; }  ///< the room reserve() asked for (0: none)
  /// The positions its storage has: held() and the room after them that is its own to write
  /// (held() while it copies at each step).
  std::size_t capacity() const { return owns_room_ ? k_.shape()[1] : held_; }
  /// Keeps the batch rows `rows` (in that order), positions included. A row outside the batch throws.
  void keep_rows(const std::vector<std::size_t>& rows);
  /// Empties the cache; the reservation stays.
  void clear();

  /// (B, P): with dynamic RoPE scaling, the held keys' positions when forward was given positions
  /// (a left-padded batch's rows count their own tokens); empty when the keys' indices are their
  /// positions.
  std::optional<IndexArray> positions;
  /// Whether the keys held are turned by RoPE; a cache continues only in an attention that holds them alike.
  bool turned = false;
  /// The positions seen before the held ones, which a sliding window no longer needs.
  std::size_t dropped = 0;

 private:
  friend class Attention;
  // Writes k and v (B, T, KV D) after the held positions, into room of its own for reserved_
  // positions (made, the held positions copied in, when it has none or too little).
  void write_after_held(const Tensor& k, const Tensor& v);
  // (B, P, KV D) exactly, or (B, R, KV D) of which the first held_ positions are held.
  Tensor k_, v_;
  std::size_t held_ = 0, reserved_ = 0;
  bool owns_room_ = false;  // whether the positions after held_ in k_ and v_ are this cache's to write
};

/// What Attention::forward returns.
struct AttentionOutput {
  Tensor output;  ///< (B, T, C)
  /// (B, H, T, S), before dropout; a query whose keys are all masked gets zeros. Undefined when
  /// the tiled kernel ran (need_weights false).
  Tensor weights;
};
/// The main tensor of an AttentionOutput, for Residual: its output.
inline Tensor& residual_output(AttentionOutput& out) { return out.output; }

/// The attention sublayer alone: projections, heads (grouped-query when num_kv_heads < num_heads;
/// one query position, a decoding step, attends each key/value head's group of query heads as rows
/// of that head rather than repeating its keys and values for each), QK-norm and RoPE when asked,
/// dropout on the weights, masks. norm and norm_options belong to the
/// residual connection around it (MultiHeadAttention). Hook points, in forward order: q (B, T, C),
/// k and v (B, S, KV * D) (after QK-norm, before RoPE; with a KVCache the new positions only),
/// rot_q and rot_k (with rotary: q and k turned), scores (B, H, T, S; before masks and softmax, formed only while
/// hooked), pattern (B, H, T, S; the weights before dropout), context (B, T, C; the heads' outputs side by side, before
/// w_o), z (B, T, H, D; context with a head axis, formed only while hooked), result (B, T, H, C; each head's share of
/// out before w_o's bias, formed only while hooked) and out (B, T, C).
class Attention : public Module, public RandomStream {
 public:
  /// Checks the options (check), then draws the four projections from `gen`, from which the
  /// module's RandomStream is also spawned.
  explicit Attention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator());
  /// Throws, naming the option, for options the constructor refuses (a program can check its
  /// settings before it builds anything).
  static void check(const MultiHeadAttentionOptions& options);
  /// Self-attention of x (B, T, d_model). With a cache, x holds the next T positions of sequences
  /// whose earlier positions the cache holds; their keys and values are appended to it.
  /// `positions` (B, T) or (T), for RoPE: each new query's and key's position; null means cache
  /// length + 0 .. T - 1. Throws unless kdim and vdim are d_model, for a cache that does not
  /// continue x or holds keys turned otherwise (another attention's), and, with dynamic RoPE
  /// scaling, for a cache filled with positions continued without them or the reverse.
  AttentionOutput forward(const Tensor& x, const AttentionMask& mask = {}, KVCache* cache = nullptr,
                          const IndexArray* positions = nullptr) const;
  /// Attention of query (B, T, d_model) over key (B, S, kdim) and value (B, S, vdim).
  /// Throws naming the input whose shape does not fit, for S = 0, and with rotary (which has no
  /// positions to give keys of another sequence).
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const AttentionMask& mask = {}) const;
  /// Throws, naming MultiHeadAttention and the shape, unless query is (B, T, d_model).
  void check_input(const Tensor& query) const;
  /// The options it was built with.
  const MultiHeadAttentionOptions& options() const { return options_; }

  /// The projections: w_q of the query (d_model -> d_model), w_k of the key (kdim -> KV * D), w_v
  /// of the value (vdim -> KV * D) and w_o of the heads' joined outputs (d_model -> d_model).
  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;
  /// With qk_norm, the RMSNorms (weight (D,)) over each head's q (q_norm) and over each key head's
  /// k (k_norm); null otherwise.
  std::shared_ptr<RMSNorm> q_norm, k_norm;

 private:
  Tensor norm_heads(const std::shared_ptr<RMSNorm>& norm, const Tensor& x) const;
  // Whether the tiled kernel computes this call (see AttentionKernel).
  bool tiled(const AttentionMask& mask, std::size_t T, std::size_t S, std::size_t offset, bool room) const;
  // k and v hold S keys, or more (a KVCache's room), of which the first S are attended.
  AttentionOutput attend_heads(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t S,
                               const AttentionMask& mask, std::size_t offset, std::size_t window) const;
  AttentionOutput attend_grouped(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t S,
                                 const AttentionMask& mask) const;
  Tensor project_out(const Tensor& context) const;  // context -> z -> result -> out, the points on the way
  MultiHeadAttentionOptions options_;
};

/// The article's module: Attention inside its residual connection and norm. Parameters:
/// w_q, w_k, w_v, w_o (weights (C, C), (KV D, kdim), (KV D, vdim), (C, C); biases when asked),
/// q_norm and k_norm with qk_norm, and, unless norm is none, norm. In cross-attention, forward(query, key, value,
/// mask), the residual path and the norm are the query's; key and value enter the projections as given (as the memory
/// does in PyTorch's nn.TransformerDecoderLayer).
class MultiHeadAttention : public Residual<Attention> {
 public:
  /// Attention(options, gen) with the norm options.norm_options() describe, placed by
  /// options.norm().
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options, Generator& gen = default_generator())
      : Residual<Attention>(options.norm(), options.d_model(), options.norm_options(), options, gen) {}
};

/// The combined boolean mask (true = blocked) for a (B, H, T, S) score tensor, or nullopt when
/// `mask` asks for none; queries are positions offset to offset + T - 1 for the causal mask (and,
/// with a `window` > 0, see only keys within `window` positions of their own), and the -inf
/// entries of additive_mask count as blocked. Throws naming the mask whose shape or values do not
/// fit.
std::optional<Mask> combine_masks(const AttentionMask& mask, std::size_t B, std::size_t H, std::size_t T, std::size_t S,
                                  std::size_t offset = 0, std::size_t window = 0);

}  // namespace xgrad::nn
