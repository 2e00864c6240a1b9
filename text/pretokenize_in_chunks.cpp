#include "xgrad/text/detail/pretokenize_in_chunks.hpp"

#include <algorithm>

namespace xgrad::text::detail {

namespace {

// How far past a piece's end GPT-2's pattern can look before it settles on that piece: one
// character after a run (\s+(?!\S), the greedy classes), three from its start ('re, 've, 'll), each
// character up to 4 bytes. A piece that ends this far before the chunk's end is the whole text's.
constexpr std::size_t kLookahead = 64;

}  // namespace

void pretokenize_in_chunks(const Gpt2Pretokenizer& pretokenizer, std::string_view text, std::size_t chunk_bytes,
                           const std::function<void(const std::vector<std::string_view>&)>& on_pieces) {
  chunk_bytes = std::max(chunk_bytes, 2 * kLookahead);
  std::size_t start = 0, size = chunk_bytes;
  while (start < text.size()) {
    if (size >= text.size() - start) {
      on_pieces(pretokenizer.split(text.substr(start)));
      return;
    }
    std::vector<std::string_view> pieces = pretokenizer.split(text.substr(start, size));
    std::size_t keep = 0, kept_bytes = 0, end = 0;
    for (std::string_view piece : pieces) {
      end += piece.size();
      if (end + kLookahead > size) break;
      ++keep;
      kept_bytes = end;
    }
    if (keep == 0) {  // one piece longer than the chunk: a longer chunk
      size *= 2;
      continue;
    }
    pieces.resize(keep);
    on_pieces(pieces);
    start += kept_bytes;
    size = chunk_bytes;
  }
}

}  // namespace xgrad::text::detail
