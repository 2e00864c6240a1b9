/// @file
/// The BPE merge loop over a word's symbols (an internal header of text/): the adjacent pair of
/// lowest merge rank is merged first, the leftmost of equal ranks, until no pair is a merge. Short
/// words merge in arrays with a linear search for the lowest rank; long ones (a long run of one
/// character class) through a heap, so that a huge word costs n log n, not n^2.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/text/detail/bpe_tables.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text::detail {

constexpr std::size_t kShortWord = 96;

/// Merges the `size` token ids at `symbols` and appends the result to `out`.
inline void merge_symbols(const MergeTable& merges, const std::int32_t* symbols, std::size_t size, TokenIds& out,
                          const char* who) {
  if (size <= kShortWord) {
    std::int32_t part[kShortWord];
    std::uint32_t rank[kShortWord];
    std::int32_t result[kShortWord];
    std::size_t n = size;
    for (std::size_t i = 0; i < n; ++i) part[i] = symbols[i];
    const auto rate = [&](std::size_t i) {
      const MergeTable::Merge m = merges.find(part[i], part[i + 1]);
      rank[i] = m.rank;
      result[i] = m.result;
    };
    for (std::size_t i = 0; i + 1 < n; ++i) rate(i);
    while (n > 1) {
      std::size_t best = 0;
      for (std::size_t i = 1; i + 1 < n; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == kNoRank) break;
      part[best] = result[best];
      for (std::size_t i = best + 1; i + 1 < n; ++i) {
        part[i] = part[i + 1];
        rank[i] = rank[i + 1];
        result[i] = result[i + 1];
      }
      --n;
      if (best > 0) rate(best - 1);
      if (best + 1 < n) rate(best);
    }
    out.insert(out.end(), part, part + n);
    return;
  }
  if (size > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(std::string(who) + ": a word of " + std::to_string(size) +
                " symbols (one run of one character class), more than 2^31 - 1");
  const auto n = static_cast<std::int32_t>(size);
  std::vector<std::int32_t> id(symbols, symbols + size), next(n), prev(n);
  for (std::int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    std::uint32_t rank;
    std::int32_t at, left, right, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : at > o.at; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto offer = [&](std::int32_t at) {
    if (at < 0 || next[at] < 0) return;
    const MergeTable::Merge m = merges.find(id[at], id[next[at]]);
    if (m.rank != kNoRank) heap.push({m.rank, at, id[at], id[next[at]], m.result});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // A symbol keeps its start position, so the same ids at the same place are the same pair.
    if (id[c.at] != c.left || next[c.at] < 0 || id[next[c.at]] != c.right) continue;
    const std::int32_t gone = next[c.at];
    id[c.at] = c.result;
    id[gone] = -1;
    next[c.at] = next[gone];
    if (next[gone] >= 0) prev[next[gone]] = c.at;
    offer(prev[c.at]);
    offer(c.at);
  }
  for (std::int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

}  // namespace xgrad::text::detail
