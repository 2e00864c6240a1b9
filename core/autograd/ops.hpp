/// @file
/// Every differentiable op. Each is a free function that computes its value and records one
/// backward closure next to it (see the ops_*.cpp files). Axes may be negative (from the end).
/// Shape legend: N rows, C classes or channels; matmul multiplies (M, K) by (K, P).
/// An undefined input, a shape that does not fit or an axis out of range is an Error naming the op.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad {

// ---- elementwise, numpy broadcasting (ops_elementwise.cpp) ----
Tensor add(const Tensor& a, const Tensor& b);  ///< a + b, broadcast as in numpy
Tensor sub(const Tensor& a, const Tensor& b);  ///< a - b, broadcast as in numpy
Tensor mul(const Tensor& a, const Tensor& b);  ///< a * b, broadcast as in numpy
Tensor div(const Tensor& a, const Tensor& b);  ///< a / b, broadcast as in numpy
Tensor add(const Tensor& a, float s);          ///< a + s
Tensor sub(const Tensor& a, float s);          ///< a - s
Tensor rsub(float s, const Tensor& a);         ///< s - a
Tensor mul(const Tensor& a, float s);          ///< a * s
Tensor div(const Tensor& a, float s);          ///< a / s
Tensor rdiv(float s, const Tensor& a);         ///< s / a
Tensor neg(const Tensor& a);                   ///< -a

Tensor exp(const Tensor& a);                  ///< e^a; overflows to +inf above about 88.7 (float's range), never NaN
Tensor log(const Tensor& a);                  ///< natural logarithm
Tensor sqrt(const Tensor& a);                 ///< square root
Tensor pow(const Tensor& a, float exponent);  ///< a^exponent
Tensor tanh(const Tensor& a);                 ///< hyperbolic tangent
Tensor sigmoid(const Tensor& a);              ///< 1 / (1 + e^-a), without overflow for very negative a
Tensor relu(const Tensor& a);                 ///< max(a, 0); the gradient at 0 is 0 (as in PyTorch)
/// GELU: `exact` is x * Phi(x) with the erf form of Phi (PyTorch's default);
/// `tanh` is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class GeluApprox { exact, tanh };
/// GELU of every element, in the form `approx` names.
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::exact);
/// The activation of a gated unit: `silu` is x sigmoid(x) (SwiGLU), `gelu` the exact (erf) GELU and
/// `gelu_tanh` its tanh form (GeGLU), as in gelu().
enum class GatedActivation { silu, gelu, gelu_tanh };
/// act(gate) * up elementwise in one kernel, with one kernel for both gradients (dgate = g up act'(gate),
/// dup = g act(gate)): the middle of a gated feed-forward layer, gate and up being two Linear outputs of
/// the same shape. The sigmoid and tanh never overflow (sigmoid is taken as 0 below -87); NaN propagates,
/// and an infinite gate gives what mul(act(gate), up) gives (SiLU of -inf is NaN, as -inf * 0).
Tensor gated_unit(const Tensor& gate, const Tensor& up, GatedActivation activation);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }  ///< add(a, b)
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }  ///< sub(a, b)
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }  ///< mul(a, b)
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }  ///< div(a, b)
inline Tensor operator+(const Tensor& a, float s) { return add(a, s); }          ///< add(a, s)
inline Tensor operator-(const Tensor& a, float s) { return sub(a, s); }          ///< sub(a, s)
inline Tensor operator*(const Tensor& a, float s) { return mul(a, s); }          ///< mul(a, s)
inline Tensor operator/(const Tensor& a, float s) { return div(a, s); }          ///< div(a, s)
inline Tensor operator+(float s, const Tensor& a) { return add(a, s); }          ///< add(a, s)
inline Tensor operator-(float s, const Tensor& a) { return rsub(s, a); }         ///< rsub(s, a)
inline Tensor operator*(float s, const Tensor& a) { return mul(a, s); }          ///< mul(a, s)
inline Tensor operator/(float s, const Tensor& a) { return rdiv(s, a); }         ///< rdiv(s, a)
inline Tensor operator-(const Tensor& a) { return neg(a); }                      ///< neg(a)

// ---- reductions (ops_reduce.cpp) ----
Tensor sum(const Tensor& a);  ///< the sum of all elements, shape ()
/// The sum over `axes` (each listed once); keepdims keeps them as axes of length 1.
Tensor sum(const Tensor& a, const std::vector<int>& axes, bool keepdims = false);
/// The mean of all elements, shape ().
Tensor mean(const Tensor& a);
/// The mean over `axes` (each listed once, none empty); keepdims keeps them as axes of length 1.
Tensor mean(const Tensor& a, const std::vector<int>& axes, bool keepdims = false);
/// Maximum along one axis; the gradient goes to the first maximal element of each slice.
Tensor max(const Tensor& a, int axis, bool keepdims = false);

// ---- shape (ops_shape.cpp) ----
/// A copy of `a` that is a node of its own, so the gradient reaching it can be read apart from
/// a's other uses (probes use it to split a residual's skip and branch paths).
Tensor identity(const Tensor& a);
/// The elements of `a` in row-major order, in `shape`. One entry of `shape` may be -1 and is inferred.
Tensor reshape(const Tensor& a, const std::vector<std::int64_t>& shape);
/// `a` with axes axis0 and axis1 swapped.
Tensor transpose(const Tensor& a, int axis0, int axis1);
/// `a` with its axes reordered: axis k of the result is axis axes[k] of a (as numpy.transpose).
Tensor permute(const Tensor& a, const std::vector<int>& axes);
/// Elements [start, stop) along `axis`.
Tensor slice(const Tensor& a, int axis, std::size_t start, std::size_t stop);
/// The parts joined along `axis`; their shapes must agree on every other axis.
Tensor concat(const std::vector<Tensor>& parts, int axis);
/// Pieces of the given sizes along `axis` (the sizes must add up to the axis length).
std::vector<Tensor> split(const Tensor& a, const std::vector<std::size_t>& sizes, int axis);
/// The parts (all of one shape) joined along a new axis `axis` of the result, which may be from
/// -(rank + 1) to rank (as torch.stack); the gradient of part i is slice i of the result's.
Tensor stack(const std::vector<Tensor>& parts, int axis);
/// `a` cut along `axis` into pieces of ceil(length / n) elements, the last one shorter when n does
/// not divide the length (as torch.chunk: there may be fewer than n pieces, e.g.\ a length of 6
/// in n = 4 gives 3 pieces of 2); an empty axis gives n empty pieces. n = 0 is an Error.
std::vector<Tensor> chunk(const Tensor& a, std::size_t n, int axis);

// ---- indexing and selection (ops_index.cpp); indices are never negative, as in PyTorch ----
/// out[i][j][k] = a[index[i][j][k]][j][k] for axis 0, and so on for the other axes
/// (torch.gather): index has a's rank, is no longer than a on the other axes and gives the
/// output's shape. The gradient of each output element is added into the element it was read from.
Tensor gather(const Tensor& a, int axis, const IndexArray& index);
/// The slices of `a` along `axis` named by the 1-D `ids`, in that order (repeats allowed): the
/// result is a's shape with that axis of length ids.size(); the backward adds each slice's
/// gradient back into the slice it came from.
Tensor index_select(const Tensor& a, int axis, const IndexArray& ids);
/// a where mask is true, b where it is false; mask, a and b broadcast together as in numpy
/// (torch.where). a gets the gradient where mask is true, b where it is false, each summed back
/// over the axes it was broadcast along; a broadcast shape of more elements than size_t counts is
/// an Error. Call it as xgrad::where: with an xt::xarray mask an
/// unqualified where(mask, a, b) also finds xt::where, which does not take tensors.
Tensor where(const Mask& mask, const Tensor& a, const Tensor& b);
/// The position of the largest element of every slice along `axis` (the first one on ties; a NaN
/// counts as the largest, as in PyTorch); keepdims keeps that axis with length 1. No gradient.
IndexArray argmax(const Tensor& a, int axis, bool keepdims = false);
/// What topk() returns: the largest values and where they were along the axis.
struct TopK {
  Tensor values;       ///< the k largest of each slice, largest first; the gradient reaches those elements of a
  IndexArray indices;  ///< their positions along the axis, values' shape
};
/// The k largest elements of every slice along `axis`, largest first, equal values in their order
/// along the axis (NaN counts as the largest). values and indices have a's shape with that axis
/// of length k; k larger than the axis is an Error.
TopK topk(const Tensor& a, std::size_t k, int axis = -1);

// ---- matmul (ops_matmul.cpp), through blas::sgemm ----
/// (..., M, K) @ (..., K, P) -> (..., M, P), batch axes broadcast as in numpy; a 2-D right
/// operand is shared by the whole batch. transpose_a / transpose_b use op(x) = x^T on the last
/// two axes without copying, e.g. matmul(q, k, false, true) is q @ k^T.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
/// y = x weight^T + bias for x (..., in), weight (out, in), bias (out,) or undefined: the affine
/// map of nn::Linear as one call of blas::linear (one GEMM, then the bias added to its rows).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// The activation linear_activation applies: max(z, 0), the exact (erf) GELU or its tanh form (as
/// relu and gelu's GeluApprox::exact and GeluApprox::tanh).
enum class LinearActivation { relu, gelu, gelu_tanh };
/// act(linear(x, weight, bias)) as one op (ops_fused.cpp), shapes as in linear, bias undefined for
/// none. Forward: blas::linear_activation, under oneDNN one matmul primitive with the bias and the
/// activation as post-ops. ReLU keeps its output for backward (z > 0 is y > 0); a GELU keeps z, so
/// while recording its product fuses the bias only and the GELU runs in a pass of its own (without
/// grad mode it is fused too). Backward: dz = g act'(z) and db = the column sums of dz in one pass
/// over g, then dx = dz W and dW = dz^T x. The values of the unfused ops up to rounding (oneDNN's
/// erf and tanh are its own); nn::FeedForward uses it where it measured faster.
Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, LinearActivation a);

// ---- multi-head attention (ops_attention.cpp), heads side by side in the channels ----
/// The attention weights of `heads` heads of width D = C / heads: q (B, T, C), k (B, S, C) ->
/// P (B, H, T, S), P[b, h] = softmax over s of scale * q_h k_h^T, where q_h = q[b, :, hD:(h+1)D].
/// Keys with s > t (causal) or where `mask` (broadcastable to (B, H, T, S)) is true get weight 0,
/// and with causal and a `window` > 0 also keys with s <= t - window (a sliding window: query t
/// sees its last `window` positions, its own included); a query with no key left gets all zeros. The same values, up to
/// the products' rounding, as masked_softmax(matmul(q_heads, k_heads, false, true) * scale, mask) on the heads split
/// out with reshape and permute, without those copies.
Tensor attention_weights(const Tensor& q, const Tensor& k, std::size_t heads, float scale, bool causal = false,
                         const Mask* mask = nullptr, std::size_t window = 0);
/// The scores alone, before any mask or softmax: scale q_h k_h^T, (B, H, T, S). With
/// masked_softmax along the last axis it gives attention_weights' bits (one kernel per formula).
Tensor attention_scores(const Tensor& q, const Tensor& k, std::size_t heads, float scale);
/// The weighted sum of values with heads side by side: P (B, H, T, S), v (B, S, C) -> (B, T, C),
/// out[b, :, hD:(h+1)D] = P[b, h] v_h.
///
/// attention_weights, attention_scores and attend under a bf16 AutocastGuard: their products,
/// forward and backward, take bf16 operands and accumulate in fp32 (blas::gemm_batched at Precision::bf16), as
/// linear's do; softmax and its backward stay fp32.
Tensor attend(const Tensor& weights, const Tensor& v, std::size_t heads);

// ---- tiled attention (ops_flash_attention.cpp): the context without the (B, H, T, S) weights ----
/// Tiles and dropout of flash_attention.
struct FlashAttentionOptions {
  std::size_t query_tile = 128;  ///< queries per tile, 1 .. 1024
  std::size_t key_tile = 128;    ///< keys per tile, 1 .. 1024
  /// Dropout on the weights (in [0, 1); 0: none): the mask dropout(weights, p, true, *generator)
  /// would draw on (B, H, T, S), from one draw of the generator (default_generator() when null),
  /// regenerated tile by tile in backward and never stored.
  float dropout = 0.f;
  Generator* generator = nullptr;  ///< dropout's key is drawn from it (default_generator() when null)
  /// With causal, a sliding window: query t (position S - T + t) sees only keys
  /// S - T + t - window + 1 .. S - T + t, and tiles wholly before that are skipped. 0: no window.
  std::size_t window = 0;
  /// Attend to the first `keys` positions of k and v only (0: all): S is keys, and the positions
  /// after it are never read (a KV cache with room to grow). Their gradients are zero.
  std::size_t keys = 0;
};
/// attend(dropout(attention_weights(q, k, heads, scale, causal)), v, heads) without forming the
/// weights: q (B, T, C), k and v (B, S, C) -> (B, T, C). An online softmax runs over tiles of
/// keys, keeping one log-sum-exp per query row; backward recomputes the weights tile by tile.
/// Memory is O(B T C) rather than O(B H T S). Causal here is bottom-right aligned: query t is
/// position S - T + t and sees keys 0 .. S - T + t (T = S: the usual mask; a KV cache's next T
/// positions otherwise), and tiles wholly above that diagonal are skipped. A query with no key
/// gets a context of zero. Agrees with the unfused ops within fp32 rounding; the same bits on any
/// thread count. Under a bf16 AutocastGuard its tile products take bf16 operands (fp32
/// accumulation, fp32 softmax and gradients), the forward's precision holding for backward, except
/// with at most 8 queries per entry (T, a decoding step's): those multiply in fp32, since each key
/// would be converted to bf16 at every step to be read about once. An
/// Error names the op for shapes that do not fit and tiles out of range.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t heads, float scale,
                       bool causal = false, const FlashAttentionOptions& options = {});

// ---- rotary position embedding (ops_rotary.cpp) ----
/// How RoPE's frequencies f_i = theta^(-2i/r) are scaled for contexts longer than the model was
/// trained on: Hugging Face's rope_scaling (rope_parameters) of these types, with their formulas
/// (transformers 4.57's modeling_rope_utils.py), each for factor >= 1:
///  - none: f_i.
///  - linear: f_i / factor (positions interpolated).
///  - dynamic (NTK): while the call's positions reach L = max position + 1 > original_max_len,
///    theta becomes theta (factor L / original_max_len - (factor - 1))^(r / (r - 2)); below, f_i.
///    From the call's own positions: a cached step turns its query and the cached keys by the
///    frequencies of the sequence so far; what deeper blocks cached at earlier steps keeps the
///    frequencies of those steps, as Hugging Face's cache does.
///  - llama3 (Llama 3.1 and later): with the wavelength w_i = 2 pi / f_i and the original context
///    N = original_max_len, f_i where w_i < N / high_freq_factor, f_i / factor where
///    w_i > N / low_freq_factor, and between them (1 - s) f_i / factor + s f_i with
///    s = (N / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
struct RopeScaling {
  /// The scaling's formula, as Hugging Face's rope_type names it.
  enum class Type {
    none,     ///< f_i ("default")
    linear,   ///< f_i / factor
    dynamic,  ///< dynamic NTK: a larger base past original_max_len
    llama3,   ///< Llama 3.1's blend by wavelength
  };
  Type type = Type::none;            ///< which formula
  float factor = 1.f;                ///< finite and >= 1
  float low_freq_factor = 1.f;       ///< llama3; finite, > 0 and below high_freq_factor
  float high_freq_factor = 4.f;      ///< llama3
  std::size_t original_max_len = 0;  ///< dynamic and llama3: the context trained on (> 0)
};
/// Throws, naming `who` and the field, unless `s` describes a scaling rotary_embedding computes.
void check_rope_scaling(const RopeScaling& s, const char* who);
/// Rotates each head of q or k by its token's position (RoPE), on the attention ops' layout:
/// x (B, T, C) with `heads` heads of width D = C / heads side by side in the channels.
///
/// The pairing is Hugging Face's `rotate_half` (what Llama-layout checkpoints need): within each
/// head's first r = rotary_dim channels (0 means D), channel i < r/2 turns with channel i + r/2 by
/// the angle a = p * theta^(-2i/r), p the token's position:
/// y_i = x_i cos a - x_{i+r/2} sin a, y_{i+r/2} = x_{i+r/2} cos a + x_i sin a; channels r .. D-1
/// pass through (partial rotary, as GPT-NeoX and Phi). positions is (B, T), one row per batch
/// entry (a cached forward continues from the cached length, a padded row counts its real
/// tokens), or (1, T) or (T), shared by every entry; positions are never negative. theta^(-2i/r) and the
/// angle are rounded to float as PyTorch's float32 computes them; their cos and sin are evaluated
/// in double and rounded once; `scaling` scales the frequencies first (RopeScaling), in float as
/// PyTorch's float32 does. The gradient is the transpose rotation (angle negated). An Error
/// naming the op for an odd rotary_dim or one larger than D, heads not dividing C, theta not
/// finite and > 0, and positions of the wrong shape or negative.
Tensor rotary_embedding(const Tensor& x, std::size_t heads, const IndexArray& positions, float theta = 10000.f,
                        std::size_t rotary_dim = 0, const RopeScaling& scaling = {});

// ---- neural-network functions (ops_nn.cpp) ----
/// Numerically stable softmax along `axis`.
Tensor softmax(const Tensor& a, int axis = -1);
/// Numerically stable log-softmax along `axis`.
Tensor log_softmax(const Tensor& a, int axis = -1);
/// Softmax along `axis` over the elements whose mask (broadcastable to a's shape) is false;
/// masked elements get weight 0, and a slice with every element masked is all zeros (never NaN),
/// with zero gradient.
Tensor masked_softmax(const Tensor& a, const Mask& mask, int axis = -1);
/// Where mask (broadcastable to a's shape) is true the result is `value`; there a gets no gradient.
Tensor masked_fill(const Tensor& a, const Mask& mask, float value);
/// The same with one value per element: values has a's shape (activation patching copies another
/// run's values into a region this way).
Tensor masked_fill(const Tensor& a, const Mask& mask, const Array& values);
constexpr std::int64_t kIgnoreIndex = -100;  ///< the target that cross_entropy skips by default, as in PyTorch
/// Mean cross-entropy of logits (..., C) against integer targets (...), skipping targets equal
/// to ignore_index; fused with log-softmax. With every target ignored the loss is 0. A target
/// outside [0, C) that is not ignore_index is an Error.
Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, std::int64_t ignore_index = kIgnoreIndex);
/// cross_entropy(linear(x, weight, bias), targets, ignore_index), the logits never formed whole:
/// x (..., C), weight (V, C), bias (V,) or undefined, targets (...). The rows go through the
/// product, the loss and, while gradients are recorded, the gradients of x, weight and bias, in
/// chunks of max(256, 2^23 / V) rows, so one chunk's logits are held (GPT-2's vocabulary: 51 MB for
/// 256 rows, against 206 MB for a batch of 1024, twice with their gradient). Backward scales the
/// gradients computed in forward. The same values as the two ops to rounding (the weight's
/// gradient is summed chunk by chunk); the same errors as both.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const IndexArray& targets,
                            std::int64_t ignore_index = kIgnoreIndex);
/// Rows of weight (V, C) picked by ids (...) -> (..., C); backward scatter-adds into weight.
Tensor embedding(const Tensor& weight, const IndexArray& ids);
/// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
/// Identity when !training or p == 0. p outside [0, 1) is an Error.
Tensor dropout(const Tensor& a, float p, bool training = true, Generator& gen = default_generator());
/// dropout(gelu(a), p, training, gen) (exact GELU) in one pass: the same draw from gen and the same
/// bits, forward and backward, with one activation fewer kept for backward.
Tensor gelu_dropout(const Tensor& a, float p, bool training = true, Generator& gen = default_generator());
/// Normalizes over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta, with the biased
/// variance; gamma and beta (shape (C,)) may be undefined tensors for no affine part.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps = 1e-5f);
/// Root-mean-square norm over the last axis: x / sqrt(mean(x^2) + eps) * gamma, with no mean
/// subtracted and no shift; gamma (shape (C,)) may be an undefined tensor for no weight.
Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps = 1e-6f);

/// fn(inputs) with its activations recomputed in backward instead of kept (activation
/// checkpointing): forward runs fn on a tape of its own that it drops at once, so only the inputs
/// and the output stay;
/// backward runs fn again on the same inputs (recording, on a tape of its own) and differentiates
/// it at the forward's autocast precision, handing the gradients to the inputs. fn must compute the same both times (a
/// dropout stream restored first; see nn's LanguageModel::set_checkpoint_activations). Every tensor fn reads that
/// requires grad must be among `inputs` (the parameters too): one that is not is an Error in
/// backward, naming it. Under NoGradGuard, or when no input requires grad, it is fn(inputs).
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

}  // namespace xgrad
