// What the oneDNN engine files (core/kernels/gemm_onednn*.cpp, the only ones that include
// oneDNN's headers) share: the CPU engine, a float's bits for cache keys, and the cache of built
// primitives. A program's products have a handful of shapes (times the pieces the kernel threads
// split them into), so each primitive is built (and JIT-compiled) once and kept; the cache is
// emptied past `max_entries`, so it cannot grow without bound.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include <dnnl.hpp>

namespace xgrad::blas::detail {

// The one CPU engine every primitive and memory object is made on.
inline dnnl::engine& onednn_cpu() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A float's bits, so that alpha and beta can be part of a cache key exactly.
inline std::int64_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Built primitives by key, shared by the threads. get() returns a copy (dnnl objects are
// reference-counted handles) taken under the lock: another thread may empty the cache as soon as
// it is released.
template <class Key, class Built>
class PrimitiveCache {
 public:
  explicit PrimitiveCache(std::size_t max_entries) : max_entries_(max_entries) {}
  template <class Build>
  Built get(const Key& key, Build build) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= max_entries_) cache_.clear();
    return cache_.emplace(key, build()).first->second;
  }

 private:
  std::size_t max_entries_;
  std::mutex mutex_;
  std::map<Key, Built> cache_;
};

}  // namespace xgrad::blas::detail
