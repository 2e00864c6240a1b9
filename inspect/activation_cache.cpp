// ActivationCache and the recording run.
#include "xgrad/inspect/activation_cache.hpp"

#include <mutex>
#include <set>
#include <utility>

#include "xgrad/core/error.hpp"
#include "xgrad/inspect/hook_names.hpp"

namespace xgrad::inspect {

bool default_points(const std::string& name) {
  using nn::point_ends_with;
  return !point_ends_with(name, "scores") && !point_ends_with(name, "result") &&
         !point_ends_with(name, "residual.skip") && !point_ends_with(name, "residual.branch");
}

PointFilter points_named(const std::vector<std::string>& names) {
  std::set<std::string> wanted;
  for (const std::string& n : names) wanted.insert(from_transformer_lens(n).value_or(n));
  return [wanted = std::move(wanted)](const std::string& name) { return wanted.count(name) != 0; };
}

PointFilter points_ending_with(std::vector<std::string> suffixes) {
  return [suffixes = std::move(suffixes)](const std::string& name) {
    for (const std::string& s : suffixes) {
      if (nn::point_ends_with(name, s)) return true;
    }
    return false;
  };
}

void ActivationCache::insert(const std::string& name, Array value) {
  if (!values_.emplace(name, std::move(value)).second) fail("ActivationCache: point '", name, "' is already held");
  order_.push_back(name);
}

const Array* ActivationCache::find(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    if (const auto point = from_transformer_lens(name)) it = values_.find(*point);
  }
  return it == values_.end() ? nullptr : &it->second;
}

bool ActivationCache::has(const std::string& name) const { return find(name) != nullptr; }

const Array& ActivationCache::at(const std::string& name) const {
  if (const Array* value = find(name)) return *value;
  std::vector<std::string> both = order_;
  for (const std::string& p : order_) {
    if (const auto tl = to_transformer_lens(p)) both.push_back(*tl);
  }
  std::string near;
  for (const std::string& n : near_names(name, both)) near += (near.empty() ? "" : ", ") + n;
  fail("ActivationCache: no point named '", name, "' (", order_.size(), " held",
       order_.empty() ? "" : "; nearest: ", near, ")");
}

std::size_t ActivationCache::bytes() const {
  std::size_t total = 0;
  for (const auto& [name, value] : values_) total += value.size() * sizeof(float);
  return total;
}

namespace {
// Thrown by the last chosen point's hook to end the run early; caught below, never seen outside.
struct StopAfterLastPoint {};

// The points of root's tree that `which` accepts (all without a filter); none is an Error.
std::vector<std::string> chosen_points(const nn::Module& root, const PointFilter& which, const char* who) {
  std::vector<std::string> chosen;
  const std::vector<std::string> all = root.hook_points();
  for (const std::string& point : all) {
    if (!which || which(point)) chosen.push_back(point);
  }
  if (chosen.empty()) fail(who, ": the filter accepts none of the module's ", all.size(), " hook points");
  return chosen;
}
}  // namespace

ActivationCache cache_activations(nn::Module& root, const std::function<void()>& run, const PointFilter& which,
                                  bool stop_after_last) {
  if (!run) fail("cache_activations: no function to run");
  struct Shared {
    std::mutex mutex;  // the run may reach points from several threads
    ActivationCache cache;
    std::string repeated;
    bool closed = false;  // set before the cache is moved out: a late call records nothing
  };
  auto shared = std::make_shared<Shared>();
  const std::vector<std::string> chosen = chosen_points(root, which, "cache_activations");
  const std::size_t last = stop_after_last ? chosen.size() : 0;  // 0: never stop
  std::vector<nn::HookHandle> hooks;
  for (const std::string& point : chosen) {
    hooks.push_back(root.add_forward_hook(point, [shared, point, last](const Tensor& t) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      if (shared->closed) return Tensor();
      if (shared->cache.has(point)) {
        if (shared->repeated.empty()) shared->repeated = point;
      } else {
        shared->cache.insert(point, t.value());
        if (shared->cache.size() == last) throw StopAfterLastPoint{};
      }
      return Tensor();
    }));
  }
  try {
    run();
  } catch (const StopAfterLastPoint&) {
    // every chosen point is held: the rest of the run was not needed
  }
  hooks.clear();
  std::lock_guard<std::mutex> lock(shared->mutex);
  shared->closed = true;
  if (!shared->repeated.empty()) {
    fail("cache_activations: point '", shared->repeated, "' was reached more than once; cache one forward per call");
  }
  return std::move(shared->cache);
}

GenerationCache cache_generation(nn::LanguageModel& model, std::vector<std::int64_t> prompt, std::size_t count,
                                 const nn::GenerateOptions& options, Generator& gen, const PointFilter& which) {
  struct Shared {
    std::mutex mutex;
    std::vector<ActivationCache> steps;
  };
  auto shared = std::make_shared<Shared>();
  const std::vector<std::string> chosen = chosen_points(model, which, "cache_generation");
  std::vector<nn::HookHandle> hooks;
  for (const std::string& point : chosen) {
    hooks.push_back(model.add_forward_hook(point, [shared, point](const Tensor& t) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      // every step reaches each chosen point once: a point the current step holds starts the next
      if (shared->steps.empty() || shared->steps.back().has(point)) shared->steps.emplace_back();
      shared->steps.back().insert(point, t.value());
      return Tensor();
    }));
  }
  GenerationCache out;
  out.tokens = model.generate(std::move(prompt), count, options, gen);
  hooks.clear();
  std::lock_guard<std::mutex> lock(shared->mutex);
  out.steps = std::move(shared->steps);
  return out;
}

}  // namespace xgrad::inspect
