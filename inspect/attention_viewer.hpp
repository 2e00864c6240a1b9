// A self-contained HTML attention viewer: one file, no network, no other file. Tokens label both
// axes; the reader picks a layer and a head, and hovering a cell shows the query, the key and
// the weight. The page opens on layer L, head H when its address ends with "#layer=L&head=H".
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xgrad/inspect/activation_cache.hpp"

namespace xgrad::inspect {

/// The page for sequence `batch` of every "*.pattern" point in the cache (one layer each, in the
/// cache's order), with tokens (T labels, any UTF-8) on both axes. Throws, naming the point,
/// when the cache has no pattern, a pattern is not (B, H, T, T) with T = tokens.size() or holds
/// a weight that is not finite, or batch >= B.
std::string attention_viewer_html(const ActivationCache& cache, const std::vector<std::string>& tokens,
                                  std::size_t batch = 0, const std::string& title = "attention");

}  // namespace xgrad::inspect
