/// @file
/// The lookup tables ByteLevelBpe encodes with (an internal header of text/): ordinary tokens by
/// their bytes, and merges by their (left id, right id) pair, both open-addressing arrays built
/// once and only read afterwards, so that any number of threads may look up at once.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/text/bpe_vocabulary.hpp"

namespace xgrad::text::detail {

constexpr std::uint32_t kNoRank = std::numeric_limits<std::uint32_t>::max();

inline std::uint64_t hash_bytes(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

inline std::size_t table_capacity(std::size_t entries) {
  std::size_t capacity = 16;
  while (capacity < entries * 2) capacity *= 2;
  return capacity;
}

// The ordinary tokens by their bytes: open addressing, each slot an id or -1.
class TokenIndex {
 public:
  explicit TokenIndex(const std::vector<std::string>& tokens, const std::vector<bool>& special) : tokens_(&tokens) {
    slots_.assign(table_capacity(tokens.size()), -1);
    mask_ = slots_.size() - 1;
    for (std::size_t id = 0; id < tokens.size(); ++id)
      if (!special[id]) insert(static_cast<std::int32_t>(id));
  }
  // The id of the ordinary token with these bytes, or -1.
  std::int32_t find(std::string_view bytes) const {
    for (std::size_t slot = hash_bytes(bytes) & mask_;; slot = (slot + 1) & mask_) {
      const std::int32_t id = slots_[slot];
      if (id < 0 || (*tokens_)[id] == bytes) return id;
    }
  }

 private:
  void insert(std::int32_t id) {
    std::size_t slot = hash_bytes((*tokens_)[id]) & mask_;
    while (slots_[slot] >= 0) slot = (slot + 1) & mask_;
    slots_[slot] = id;
  }
  const std::vector<std::string>* tokens_;
  std::vector<std::int32_t> slots_;
  std::size_t mask_ = 0;
};

// The merges by their (left, right) pair: the rank and the id of the merged token.
class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank = kNoRank;
    std::int32_t result = -1;
  };
  // The merge of rank r joins merges[r] into the token results[r].
  MergeTable(const std::vector<std::pair<std::int64_t, std::int64_t>>& merges,
             const std::vector<std::int32_t>& results) {
    keys_.assign(table_capacity(merges.size()), kEmpty);
    values_.resize(keys_.size());
    mask_ = keys_.size() - 1;
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const auto [left, right] = merges[rank];
      const std::uint64_t key = pack(static_cast<std::int32_t>(left), static_cast<std::int32_t>(right));
      std::size_t slot = hash(key);
      while (keys_[slot] != kEmpty) slot = (slot + 1) & mask_;
      keys_[slot] = key;
      values_[slot] = {static_cast<std::uint32_t>(rank), results[rank]};
    }
  }
  // A byte-level vocabulary's merges: each gives the ordinary token of its parts' bytes joined.
  MergeTable(const BpeVocabulary& v, const TokenIndex& index) : MergeTable(v.merges, results_of(v, index)) {}
  Merge find(std::int32_t left, std::int32_t right) const {
    const std::uint64_t key = pack(left, right);
    for (std::size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      if (keys_[slot] == key) return values_[slot];
      if (keys_[slot] == kEmpty) return {};
    }
  }

 private:
  static std::vector<std::int32_t> results_of(const BpeVocabulary& v, const TokenIndex& index) {
    std::vector<std::int32_t> results(v.merges.size());
    for (std::size_t rank = 0; rank < v.merges.size(); ++rank)
      results[rank] = index.find(v.tokens[v.merges[rank].first] + v.tokens[v.merges[rank].second]);
    return results;
  }
  static constexpr std::uint64_t kEmpty = ~0ull;
  static std::uint64_t pack(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  std::size_t hash(std::uint64_t key) const { return ((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<std::uint64_t> keys_;
  std::vector<Merge> values_;
  std::size_t mask_ = 0;
};

}  // namespace xgrad::text::detail
