// Array's allocator (array_allocator.hpp) and array_over. An adopted span is registered by its
// first element; freeing looks there only while some adopted array lives, so ordinary arrays pay
// one relaxed atomic load.
#include "xgrad/core/autograd/array_allocator.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

// What the calling thread's next allocation of `count` elements is: `data` (array_over), or zeroed
// memory (zeroed_array).
struct Pending {
  void* data = nullptr;
  bool zeroed = false;
  std::size_t count = 0;
};
thread_local Pending pending;

// Each adopted span's owner, by its first element. Never destroyed, so arrays freed during static
// destruction still find it.
struct Registry {
  std::mutex mutex;
  std::map<const void*, std::shared_ptr<const void>> owners;
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}
std::atomic<std::size_t> adopted{0};

std::size_t elements(const Shape& shape) {
  std::size_t count = 1;
  for (const std::size_t d : shape) count *= d;
  return count;
}

}  // namespace

void* ArrayHeap::allocate(std::size_t bytes, std::size_t count) {
  const Pending p = pending;
  if (p.count == count && (p.data || p.zeroed)) {
    pending = {};
    if (p.data) return p.data;
  }
  // calloc: memory fresh from the system is known to be zero and is not written, so a loader's
  // model costs no pass over its weights before they are read.
  void* data = p.zeroed && p.count == count ? std::calloc(1, bytes) : std::malloc(bytes);
  if (!data && bytes > 0) throw std::bad_alloc();
  return data;
}

void ArrayHeap::deallocate(void* data) noexcept {
  if (adopted.load(std::memory_order_relaxed) > 0) {
    std::shared_ptr<const void> owner;  // released after the lock
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      auto it = r.owners.find(data);
      if (it != r.owners.end()) {
        owner = std::move(it->second);
        r.owners.erase(it);
        adopted.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (owner) return;
  }
  std::free(data);
}

Array zeroed_array(const Shape& shape) {
  pending = {nullptr, true, elements(shape)};
  Array a = Array::from_shape(shape);
  pending = {};
  return a;
}

std::size_t adopted_arrays() { return adopted.load(std::memory_order_relaxed); }

Array array_over(float* data, const Shape& shape, std::shared_ptr<const void> owner) {
  const std::size_t count = elements(shape);
  if (count == 0) return Array::from_shape(shape);
  if (!data || reinterpret_cast<std::uintptr_t>(data) % alignof(float) != 0) {
    fail("array_over: the floats of an array of ", count, " elements start at an address not aligned for float");
  }
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.owners.emplace(data, std::move(owner)).second) {
      fail("array_over: another live array already starts at this address");
    }
    adopted.fetch_add(1, std::memory_order_relaxed);
  }
  pending = {data, false, count};
  Array a = Array::from_shape(shape);  // its one allocation takes `data`
  pending = {};
  if (a.data() != data) fail("array_over: the array did not take the memory it was given");
  return a;
}

}  // namespace xgrad
