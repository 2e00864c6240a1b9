// The bf16 copies of parameters, one per (storage, version), least recently used first out, and
// of activations and held parameters (hold_bf16_copies), on their storage (detail/bf16_cache.hpp).
#include <atomic>
#include <list>
#include <mutex>
#include <unordered_map>

#include "xgrad/core/autograd/detail/bf16_cache.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/kernels/blas.hpp"

namespace xgrad::detail {

namespace {

struct Entry {
  const Storage* key;
  std::weak_ptr<Storage> storage;  // expired, or another storage at the same address: stale
  std::uint64_t version;
  std::shared_ptr<const blas::Bf16Vector> copy;
};

struct Cache {
  std::mutex mutex;
  std::list<Entry> lru;  // most recently used first
  std::unordered_map<const Storage*, std::list<Entry>::iterator> index;
  std::size_t bytes = 0;
  std::size_t conversions = 0;

  void erase(std::list<Entry>::iterator it) {
    bytes -= it->copy->size() * sizeof(std::uint16_t);
    index.erase(it->key);
    lru.erase(it);
  }
};

Cache& cache() {
  static Cache c;
  return c;
}

// The copy kept on the storage (hold_bf16_copies, activation_bf16) when it is of the storage's
// version, else null.
std::shared_ptr<const blas::Bf16Vector> kept_copy(const Storage& storage) {
  const auto kept = std::static_pointer_cast<const Bf16Value>(std::atomic_load(&storage.bf16));
  if (!kept || kept->version != storage.version) return nullptr;
  return {kept, &kept->bits};  // shares ownership with the kept value
}

}  // namespace

std::shared_ptr<const blas::Bf16Vector> bf16_copy(const Node& node) {
  const std::shared_ptr<Storage>& storage = node.storage;
  if (auto kept = kept_copy(*storage)) return kept;
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  const auto found = c.index.find(storage.get());
  if (found != c.index.end()) {
    const auto it = found->second;
    if (it->storage.lock() == storage && it->version == storage->version) {
      c.lru.splice(c.lru.begin(), c.lru, it);
      return it->copy;
    }
    c.erase(it);  // an older version, or a dead storage whose address was reused
  }
  const Array& value = node.value();
  auto copy = std::make_shared<blas::Bf16Vector>(value.size());
  blas::to_bf16(value.data(), value.size(), copy->data());
  ++c.conversions;
  const std::size_t bytes = copy->size() * sizeof(std::uint16_t);
  if (bytes > kBf16CacheBytes) return copy;  // larger than the whole cache: used once, not kept
  // Make room: copies of dead storages first, then the least recently used.
  for (auto it = c.lru.begin(); it != c.lru.end();) {
    auto next = std::next(it);
    if (it->storage.expired()) c.erase(it);
    it = next;
  }
  while (!c.lru.empty() && (c.lru.size() >= kBf16CacheEntries || c.bytes + bytes > kBf16CacheBytes))
    c.erase(std::prev(c.lru.end()));
  c.lru.push_front({storage.get(), storage, storage->version, copy});
  c.index[storage.get()] = c.lru.begin();
  c.bytes += bytes;
  return copy;
}

namespace {
std::atomic<std::size_t> activation_conversions{0};
}  // namespace

std::shared_ptr<const blas::Bf16Vector> activation_bf16(const Node& node) {
  Storage& storage = *node.storage;
  // Two threads may both convert one value; either copy is the same bits.
  if (auto kept = kept_copy(storage)) return kept;
  const Array& value = node.value();
  auto made = std::make_shared<Bf16Value>();
  made->version = storage.version;
  made->bits.resize(value.size());
  blas::to_bf16(value.data(), value.size(), made->bits.data());
  std::atomic_store(&storage.bf16, std::shared_ptr<const void>(made));
  activation_conversions.fetch_add(1, std::memory_order_relaxed);
  return {made, &made->bits};
}

std::size_t activation_bf16_conversions() { return activation_conversions.load(); }

std::size_t bf16_conversions() {
  const std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().conversions;
}

std::size_t bf16_cache_entries() {
  const std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().lru.size();
}

std::size_t bf16_cache_bytes() {
  const std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().bytes;
}

void clear_bf16_cache() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.lru.clear();
  c.index.clear();
  c.bytes = 0;
}

}  // namespace xgrad::detail

namespace xgrad {

std::size_t hold_bf16_copies(const std::vector<Tensor>& tensors) {
  std::size_t bytes = 0;
  for (const Tensor& t : tensors) {
    check_defined(t, "hold_bf16_copies");
    bytes += detail::activation_bf16(*t.node())->size() * sizeof(std::uint16_t);
  }
  return bytes;
}

}  // namespace xgrad
