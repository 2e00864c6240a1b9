/// @file
/// Gpt2Pretokenizer::split over a long text a chunk at a time, so that the pieces of a text of
/// gigabytes are never all held at once (16 bytes each), with the pieces of the whole text.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

#include "xgrad/text/pretokenizer.hpp"

namespace xgrad::text::detail {

/// Calls on_pieces with consecutive runs of the pieces pretokenizer.split(text) gives, in order,
/// each run from about chunk_bytes of text (more where one piece is longer). A chunk is cut only
/// between two pieces that end well before its end, where splitting the whole text cuts too.
void pretokenize_in_chunks(const Gpt2Pretokenizer& pretokenizer, std::string_view text, std::size_t chunk_bytes,
                           const std::function<void(const std::vector<std::string_view>&)>& on_pieces);

}  // namespace xgrad::text::detail
