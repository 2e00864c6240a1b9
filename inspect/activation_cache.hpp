// Activation cache: run a model once and keep the value at its hook points (nn/hook.hpp) by full
// name, e.g. "blocks.0.attn.pattern", without changing what the run computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"

/// Looking inside a model: activation caches and patching at hook points, probes of activations
/// and gradients, head importance, the logit lens, head statistics and detectors, SVG pictures and
/// an HTML attention viewer.
namespace xgrad::inspect {

/// Chooses hook points by full name.
using PointFilter = std::function<bool(const std::string& name)>;

/// The points a cache takes unless told otherwise: all but "*.scores" and "*.result" (forming
/// them costs time and memory: the scores apart from the fused softmax, result H times the size
/// of out) and the residual connections' ".residual.skip" and ".residual.branch", which are
/// copies of ".residual.in".
bool default_points(const std::string& name);
/// Points whose full name ends with one of the suffixes, such as {".pattern", "stream_out"}.
PointFilter points_ending_with(std::vector<std::string> suffixes);
/// The points named, by full name in xgrad's or TransformerLens's spelling, such as
/// {"blocks.0.attn.z", "blocks.1.attn.hook_pattern"}.
PointFilter points_named(const std::vector<std::string>& names);

/// Values of a model's hook points by full name, in the order a run reached them (see
/// cache_activations).
class ActivationCache {
 public:
  /// Adds the value of point `name`; throws if `name` is already held.
  void insert(const std::string& name, Array value);
  /// True when the value of point `name` (xgrad's or TransformerLens's spelling) is held.
  bool has(const std::string& name) const;
  /// The value of point `name`, in xgrad's spelling ("blocks.0.attn.z") or TransformerLens's
  /// ("blocks.0.attn.hook_z"; see hook_names.hpp). Throws naming the point and the nearest names
  /// held, in both spellings, if it is not held.
  const Array& at(const std::string& name) const;
  /// The points held, in the order the run reached them.
  std::vector<std::string> names() const { return order_; }
  /// The number of points held.
  std::size_t size() const { return order_.size(); }
  /// The bytes of the values held.
  std::size_t bytes() const;

 private:
  const Array* find(const std::string& name) const;  // null when not held
  std::vector<std::string> order_;
  std::map<std::string, Array> values_;
};

/// Runs `run` (which should call root's forward once) with a recording hook at every point of
/// root's tree that `which` accepts, and returns copies of the values those points saw, after
/// any other hook attached before this call. The result of the run is unchanged, bit for bit.
/// Throws, naming the point, when a point is reached twice (cache each forward on its own), and
/// when `which` accepts no point of the tree or `run` is empty. The hooks sit on the module, so a
/// forward that another thread runs on it meanwhile is recorded too: cache a module no other
/// thread uses.
///
/// With stop_after_last, the run ends as soon as every chosen point is held: the rest of the
/// forward, and whatever `run` does after it, does not happen (`bench_inspect` on `small`, batch
/// 8: the first block's attn.z alone in 0.002 s against 0.046 s for the whole forward). A chosen
/// point the run never reaches means no early end.
ActivationCache cache_activations(nn::Module& root, const std::function<void()>& run,
                                  const PointFilter& which = default_points, bool stop_after_last = false);

/// What cache_generation returns: the tokens generate returned, and one cache per forward step.
struct GenerationCache {
  std::vector<std::int64_t> tokens;    ///< the prompt and the generated tokens
  std::vector<ActivationCache> steps;  ///< steps[i]: the forward that chose generated token i
};

/// Runs model.generate(prompt, count, options, gen) with the chosen points recorded at every
/// forward step: `count` caches. generate runs without its KV cache while hooks are attached, so
/// step i's points see the whole context, the prompt and the i tokens chosen so far (until the
/// context slides past max_len). The tokens are generate's. Errors as generate's and as
/// cache_activations' (a filter that accepts no point).
GenerationCache cache_generation(nn::LanguageModel& model, std::vector<std::int64_t> prompt, std::size_t count,
                                 const nn::GenerateOptions& options, Generator& gen,
                                 const PointFilter& which = default_points);

}  // namespace xgrad::inspect
