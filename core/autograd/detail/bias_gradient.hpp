// The bias gradient of a product, shared by linear and linear_cross_entropy so that both sum it
// in the same order. Not API.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xgrad::detail {

/// db += the column sums of G (rows x out). Rows in fixed chunks, each summed into its own partial
/// row, the partials then added in chunk order: every thread reads whole rows (split by columns,
/// two threads ran 2.2x slower than one), and the sums do not depend on the thread count. With
/// g16, each chunk is also rounded to bf16 there while it is in cache (a chunk of 64 rows is at
/// most 256 KB up to out = 1024): one pass over G from memory, not two.
void bias_gradient(const float* G, std::size_t rows, std::size_t out, std::uint16_t* g16, float* db);

}  // namespace xgrad::detail
