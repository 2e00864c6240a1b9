// The bf16 copies of parameters that bf16 products read (ops_matmul.cpp), made once per update
// of the parameter rather than once per product, and of activations, made once per value. Not API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/detail/bf16_vector.hpp"

namespace xgrad::detail {

/// The bf16 copy of `node`'s value: the one kept on its storage when it is of the current version
/// (hold_bf16_copies), else from the cache. A cached copy is keyed by the node's storage and the storage's
/// version (which every in-place write bumps: Tensor::mutable_value, so every optimizer step), so
/// products with the same parameter between two updates share one conversion. The cache holds at
/// most kBf16CacheEntries copies and kBf16CacheBytes bytes (least recently used go first), and is
/// safe to use from several threads.
std::shared_ptr<const blas::Bf16Vector> bf16_copy(const Node& node);

inline constexpr std::size_t kBf16CacheEntries = 1024;                ///< copies kept at most
inline constexpr std::size_t kBf16CacheBytes = std::size_t{1} << 29;  ///< bytes of copies kept at most (512 MB)

/// A value's bf16 bits and the storage version they were made from.
struct Bf16Value {
  std::uint64_t version;
  blas::Bf16Vector bits;
};

/// The bf16 copy of an activation's value (any node: parameters too, though they are better
/// served by bf16_copy), kept on its storage: the products that read one activation (q, k and v
/// of one input, and each Linear's dW = G^T X in backward) round it once. Made again after an
/// in-place write. Safe when several threads read one value.
std::shared_ptr<const blas::Bf16Vector> activation_bf16(const Node& node);

/// A product operand from `offset` elements into a value: its float32 values, with its bf16 copy
/// when there is one (bf16_copy's or activation_bf16's); the GEMM door multiplies whichever form
/// the product's precision asks for.
inline blas::Operand with_copy(const float* value, const std::shared_ptr<const blas::Bf16Vector>& copy,
                               std::size_t offset = 0) {
  return {value + offset, copy ? copy->data() + offset : nullptr};
}

/// How many conversions activation_bf16 has made so far (tests check that a copy is reused).
std::size_t activation_bf16_conversions();
/// How many conversions bf16_copy has made so far (tests check that a copy is reused).
std::size_t bf16_conversions();
/// Copies held now, and their bytes.
std::size_t bf16_cache_entries();
std::size_t bf16_cache_bytes();
/// Drops every copy.
void clear_bf16_cache();

}  // namespace xgrad::detail
