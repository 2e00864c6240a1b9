// bf16 copies' buffers: vectors whose new elements start uninitialized, for buffers that
// to_bf16 fills whole right after (zeroing them first cost a third as much as the conversion).
// Not API.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace xgrad::blas {

// An allocator whose resize constructs nothing: new elements are left uninitialized.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
// bf16 values (their bits), as the bf16 products read them.
using Bf16Vector = std::vector<std::uint16_t, UninitializedAllocator<std::uint16_t>>;

}  // namespace xgrad::blas
