/// @file
/// The allocator of xgrad's Array: the C heap, as std::allocator, except for arrays made over memory
/// something else owns (array_over: the parameters a loader maps from a file). Those are not freed
/// when the array goes; the owner's last reference goes instead.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace xgrad {

/// The memory behind every ArrayAllocator: the C heap, and array_over's adopted spans.
struct ArrayHeap {
  /// `bytes` for `count` elements: the span array_over or zeroed_array asked for, or malloc's.
  static void* allocate(std::size_t bytes, std::size_t count);
  /// Frees what allocate returned, or drops an adopted span's reference to its owner.
  static void deallocate(void* data) noexcept;
};

/// std::allocator's behaviour for Array's elements, and array_over's adopted memory.
template <class T>
struct ArrayAllocator {
  using value_type = T;  ///< the element type
  ArrayAllocator() noexcept = default;
  /// Every ArrayAllocator is the same allocator, whatever its element type.
  template <class U>
  ArrayAllocator(const ArrayAllocator<U>&) noexcept {}
  /// `n` elements, uninitialized.
  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(ArrayHeap::allocate(n * sizeof(T), n));
  }
  /// Frees what allocate returned, or drops an adopted span's owner.
  void deallocate(T* p, std::size_t) noexcept { ArrayHeap::deallocate(p); }
  /// One heap for all: any instance frees what another allocated.
  template <class U>
  bool operator==(const ArrayAllocator<U>&) const noexcept {
    return true;
  }
  /// See operator==.
  template <class U>
  bool operator!=(const ArrayAllocator<U>&) const noexcept {
    return false;
  }
};

/// The number of arrays made by array_over that are alive now (tests count them).
std::size_t adopted_arrays();

}  // namespace xgrad
