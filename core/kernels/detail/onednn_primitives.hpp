// What the oneDNN engine files (core/kernels/gemm_onednn*.cpp, the only ones that include
// oneDNN's headers) share: the CPU engine, a float's bits for cache keys, and the cache of built
// primitives. A program's products have a handful of shapes (times the pieces the kernel threads
// split them into), so each primitive is built (and JIT-compiled) once and kept; the cache is
// emptied past `max_entries`, so it cannot grow without bound.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

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

// A built primitive with its memory objects and argument map, made once per thread and kept: a
// call points the memories at its buffers (set_data_handle) and runs. Making four memory objects
// and an argument map on every call cost about 2 us, as much as a 64 x 64 x 64 product: the tiled
// attention kernel's products are that small and number thousands per training step.
class BoundPrimitive {
 public:
  BoundPrimitive() = default;
  // `descs` pairs each execution argument (DNNL_ARG_SRC, ...) with its memory descriptor.
  BoundPrimitive(dnnl::primitive primitive, std::initializer_list<std::pair<int, dnnl::memory::desc>> descs)
      : primitive_(std::move(primitive)) {
    for (const auto& [arg, desc] : descs) {
      args_.emplace(arg, dnnl::memory(desc, onednn_cpu(), DNNL_MEMORY_NONE));
      order_.push_back(arg);
    }
  }
  // Runs on the calling thread's stream with each argument at its buffer, in the order the
  // descriptors were given; the scratchpad, if one was given, is the thread's own.
  void run(std::initializer_list<const void*> buffers) {
    thread_local dnnl::stream stream(onednn_cpu());
    thread_local std::vector<std::uint8_t> scratch;
    std::size_t i = 0;
    for (const void* buffer : buffers) args_.at(order_[i++]).set_data_handle(const_cast<void*>(buffer));
    const auto pad = args_.find(DNNL_ARG_SCRATCHPAD);
    if (pad != args_.end()) {
      const std::size_t bytes = pad->second.get_desc().get_size();
      if (scratch.size() < bytes) scratch.resize(bytes);
      pad->second.set_data_handle(scratch.data());
    }
    primitive_.execute(stream, args_);
    stream.wait();
  }

 private:
  dnnl::primitive primitive_;
  std::unordered_map<int, dnnl::memory> args_;
  std::vector<int> order_;
};

// One thread's bound primitives by key, each made by `bind` on the thread's first call with that
// key; emptied past `max_entries`, so it cannot grow without bound.
template <class Key>
class BoundOnThisThread {
 public:
  explicit BoundOnThisThread(std::size_t max_entries) : max_entries_(max_entries) {}
  template <class Bind>
  BoundPrimitive& get(const Key& key, Bind bind) {
    auto it = bound_.find(key);
    if (it != bound_.end()) return it->second;
    if (bound_.size() >= max_entries_) bound_.clear();
    return bound_.emplace(key, bind()).first->second;
  }

 private:
  std::size_t max_entries_;
  std::map<Key, BoundPrimitive> bound_;
};

}  // namespace xgrad::blas::detail
