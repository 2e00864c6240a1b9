// tokenizer.json's BPE model, as Hugging Face's tokenizers runs it (models/bpe/model.rs): a piece
// becomes one symbol per character (the continuing_subword_prefix before every character but the
// first, the end_of_word_suffix after the last), a character outside the vocabulary becomes its
// <0xNN> byte tokens (byte_fallback) or the unk token (fused with the unk before it under fuse_unk,
// dropped without an unk token), and the symbols merge by the merges' ranks.
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/text/detail/bpe_merge.hpp"
#include "xgrad/text/detail/bpe_tables.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"

namespace xgrad::text::detail {

namespace {

std::string in_quotes(std::string_view token) { return "\"" + readable_bytes(token) + "\""; }

class BpeModel : public HfModel {
 public:
  BpeModel(const Json& json, const JsonPlace& place) {
    HfFields f(json, place);
    if (f.type() != "BPE") place.fail("is a model of type \"" + f.type() + "\", not BPE");
    if (const Json* dropout = f.optional("dropout"); dropout && *dropout != 0)
      place.at("dropout").fail("is " + xgrad::detail::json_excerpt(*dropout) +
                               "; xgrad encodes without BPE dropout (null)");
    prefix_ = f.optional_string("continuing_subword_prefix").value_or("");
    suffix_ = f.optional_string("end_of_word_suffix").value_or("");
    fuse_unk_ = f.boolean("fuse_unk", false);
    byte_fallback_ = f.boolean("byte_fallback", false);
    ignore_merges_ = f.boolean("ignore_merges", false);
    read_vocab(f.required("vocab"), place.at("vocab"));
    if (const std::optional<std::string> unk = f.optional_string("unk_token")) {
      unk_id_ = id_of(*unk);
      if (unk_id_ < 0) place.at("unk_token").fail(in_quotes(*unk) + " is not in model.vocab");
    }
    read_merges(f.required("merges"), place.at("merges"));
    f.done();
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        byte_id_[b] = static_cast<std::int32_t>(id_of(name));
        if (byte_id_[b] < 0)
          place.at("byte_fallback")
              .fail(std::string("is true, but model.vocab has no byte token ") + name +
                    " (byte fallback needs all 256)");
      }
    }
    for (int c = 0; c < 128; ++c) {
      const std::string s(1, static_cast<char>(c));
      ascii_first_[c] = static_cast<std::int32_t>(id_of(s));
      ascii_later_[c] = static_cast<std::int32_t>(id_of(prefix_ + s));
    }
    cut_at_metaspace_ = find_metaspace_joins();
    // Whether each token is what its own characters merge into (without affixes, which a piece
    // does not carry).
    if (prefix_.empty() && suffix_.empty()) {
      std::vector<bool> itself(tokens_.size(), false);
      TokenIds ids;
      for (std::size_t id = 0; id < tokens_.size(); ++id) {
        if (tokens_[id].empty()) continue;
        ids.clear();
        tokenize_word(tokens_[id], ids);
        itself[id] = ids.size() == 1 && ids[0] == static_cast<std::int64_t>(id);
      }
      merges_to_itself_ = std::move(itself);
    }
  }

  void tokenize(std::string_view piece, TokenIds& out) const override {
    if (piece.empty()) return;
    if (ignore_merges_ && whole_token(piece, out, true)) return;
    if (piece.size() > kCutWordsOver && cut_at_metaspace_) {
      // A word with no pre-tokenizer before it (Llama 2's and Gemma's layout) is the whole text:
      // cut before each run of U+2581 whose preceding character no token holds right before
      // U+2581 (Gemma: only '>' in ">▁</"). No merge can cross such a cut, as every merge gives
      // a token: the ids are the same, in the time of the words instead of the text.
      std::size_t start = 0;
      const auto metaspace_at = [&](std::size_t at) {
        return piece[at] == kMetaspace[0] && piece[at + 1] == kMetaspace[1] && piece[at + 2] == kMetaspace[2];
      };
      for (std::size_t at = 3; at + 3 <= piece.size(); ++at) {
        if (!metaspace_at(at) || metaspace_at(at - 3)) continue;
        std::size_t before = at - 1;
        while (before > start && (static_cast<unsigned char>(piece[before]) & 0xC0) == 0x80) --before;
        if (joins_metaspace_.count(std::string(piece.substr(before, at - before)))) continue;
        tokenize_part(piece.substr(start, at - start), out);
        start = at;
      }
      tokenize_part(piece.substr(start), out);
      return;
    }
    tokenize_part(piece, out);
  }

  const std::vector<std::string>& vocabulary() const override { return tokens_; }

  std::int64_t id_of(std::string_view token) const override { return index_->find(token); }

 private:
  static constexpr std::size_t kCutWordsOver = 16;
  static constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581, Metaspace's replacement for a space

  // Whether a word may be cut before a run of U+2581 (tokenize): no affixes, and U+2581 is a token.
  // joins_metaspace_ gets the characters some token holds right before U+2581.
  bool find_metaspace_joins() {
    if (!prefix_.empty() || !suffix_.empty() || id_of(kMetaspace) < 0) return false;
    for (const std::string& token : tokens_) {
      for (std::size_t at = token.find(kMetaspace, 1); at != std::string::npos; at = token.find(kMetaspace, at + 1)) {
        if (at >= 3 && token.compare(at - 3, 3, kMetaspace) == 0) continue;
        std::size_t before = at - 1;
        while (before > 0 && (static_cast<unsigned char>(token[before]) & 0xC0) == 0x80) --before;
        joins_metaspace_.insert(token.substr(before, at - before));
      }
    }
    return true;
  }

  // The id of a piece that is a token its own characters merge into (most pieces of a text, such as
  // " the"), or with `any` (ignore_merges, for a whole word) any token: true when it was appended.
  bool whole_token(std::string_view piece, TokenIds& out, bool any) const {
    const std::int32_t whole = index_->find(piece);
    if (whole < 0 || !(any || (!merges_to_itself_.empty() && merges_to_itself_[whole]))) return false;
    out.push_back(whole);
    return true;
  }

  void tokenize_part(std::string_view piece, TokenIds& out) const {
    if (piece.size() > WordCache::kBytes) {
      if (!whole_token(piece, out, false)) tokenize_word(piece, out);
      return;
    }
    // The ids of recent words, per thread and for this model only (as Hugging Face's tokenizers
    // keep a word cache): a text repeats its words, and a small table stays in the processor's
    // cache where the vocabulary (megabytes) and the merges do not. Direct-mapped: a word's slot
    // holds the last word of its hash there.
    thread_local WordCache cache;
    if (cache.model != serial_) {
      cache.slots.assign(WordCache::kSlots, WordCache::Slot{});
      cache.older.assign(WordCache::kSlots / 2, 0);
      cache.model = serial_;
    }
    const std::uint64_t hash = hash_bytes(piece) | 1;  // 0 marks an empty slot
    // Two slots a word may take (a set), from the product's high bits, which every byte reaches;
    // a new word replaces the set's older one.
    const std::size_t set = ((hash * 0x9E3779B97F4A7C15ull) >> (64 - WordCache::kSetBits)) * 2;
    for (std::size_t way = 0; way < 2; ++way) {
      const WordCache::Slot& slot = cache.slots[set + way];
      if (slot.hash == hash && slot.bytes == piece.size() && std::memcmp(slot.word, piece.data(), piece.size()) == 0) {
        out.insert(out.end(), slot.ids, slot.ids + slot.count);
        cache.older[set / 2] = static_cast<std::uint8_t>(1 - way);
        return;
      }
    }
    const std::size_t first = out.size();
    if (!whole_token(piece, out, false)) tokenize_word(piece, out);
    if (out.size() - first > WordCache::kIds) return;
    const std::size_t way = cache.older[set / 2];
    cache.older[set / 2] = static_cast<std::uint8_t>(1 - way);
    WordCache::Slot& slot = cache.slots[set + way];
    slot.hash = hash;
    slot.bytes = static_cast<std::uint8_t>(piece.size());
    slot.count = static_cast<std::uint8_t>(out.size() - first);
    std::memcpy(slot.word, piece.data(), piece.size());
    for (std::size_t i = 0; i < slot.count; ++i) slot.ids[i] = static_cast<std::int32_t>(out[first + i]);
  }

  struct WordCache {
    static constexpr int kSetBits = 13;  // 8,192 sets of two slots: 2 MB a thread
    static constexpr std::size_t kSlots = std::size_t{2} << kSetBits, kBytes = 62, kIds = 14;
    struct Slot {  // two 64-byte cache lines
      std::uint64_t hash = 0;
      std::uint8_t bytes = 0, count = 0;
      char word[kBytes];
      std::int32_t ids[kIds];
    };
    std::uint64_t model = 0;
    std::vector<Slot> slots;
    std::vector<std::uint8_t> older;  // by set: the way a new word takes
  };
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
  }
  const std::uint64_t serial_ = next_serial();  // tells this model's cached words from another's

  void tokenize_word(std::string_view piece, TokenIds& out) const {
    thread_local std::vector<std::int32_t> symbols;
    thread_local std::string symbol;
    symbols.clear();
    std::int32_t pending_unk = -1;  // an unk waiting for fuse_unk's decision
    for (std::size_t at = 0; at < piece.size();) {
      const std::size_t length = std::min(utf8_length(static_cast<unsigned char>(piece[at])), piece.size() - at);
      const bool first = at == 0, last = at + length == piece.size();
      std::int32_t id;
      if (length == 1 && !(last && !suffix_.empty()) && static_cast<unsigned char>(piece[at]) < 128) {
        id = (first ? ascii_first_ : ascii_later_)[static_cast<unsigned char>(piece[at])];
        symbol.assign(first ? "" : prefix_).append(piece.substr(at, 1));
      } else {
        symbol.assign(first ? "" : prefix_).append(piece.substr(at, length)).append(last ? suffix_ : "");
        id = index_->find(symbol);
      }
      at += length;
      if (id >= 0) {
        if (pending_unk >= 0) symbols.push_back(pending_unk);
        pending_unk = -1;
        symbols.push_back(id);
        continue;
      }
      if (byte_fallback_) {
        if (pending_unk >= 0) symbols.push_back(pending_unk);
        pending_unk = -1;
        for (const char byte : symbol) symbols.push_back(byte_id_[static_cast<unsigned char>(byte)]);
        continue;
      }
      if (unk_id_ < 0) continue;  // Hugging Face drops the character when there is no unk token
      if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
      pending_unk = static_cast<std::int32_t>(unk_id_);
    }
    if (pending_unk >= 0) symbols.push_back(pending_unk);
    merge_symbols(*merges_, symbols.data(), symbols.size(), out, "HfTokenizer::encode (BPE)");
  }

  void read_vocab(const Json& vocab, const JsonPlace& place) {
    if (!vocab.is_object()) place.fail("is " + xgrad::detail::json_excerpt(vocab) + ", not an object");
    std::int64_t largest = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
        place.fail("the token " + in_quotes(it.key()) + " has the id " + xgrad::detail::json_excerpt(*it) +
                   ", not an integer >= 0");
      largest = std::max(largest, it->get<std::int64_t>());
    }
    // Ids may have gaps (o200k's do), but an id past twice the vocabulary is a file that lies.
    if (largest >= std::max<std::int64_t>(2 * static_cast<std::int64_t>(vocab.size()), 1024) ||
        largest >= std::numeric_limits<std::int32_t>::max())
      place.fail("holds the id " + std::to_string(largest) + " among only " + std::to_string(vocab.size()) + " tokens");
    tokens_.assign(static_cast<std::size_t>(largest + 1), std::string());
    std::vector<bool> gap(tokens_.size(), true);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const auto id = static_cast<std::size_t>(it->get<std::int64_t>());
      if (!gap[id])
        place.fail("the tokens " + in_quotes(tokens_[id]) + " and " + in_quotes(it.key()) + " both have the id " +
                   std::to_string(id));
      if (it.key().empty()) place.fail("holds an empty token (id " + std::to_string(id) + ")");
      tokens_[id] = it.key();
      gap[id] = false;
    }
    index_ = std::make_unique<TokenIndex>(tokens_, gap);
  }

  void read_merges(const Json& merges, const JsonPlace& place) {
    if (!merges.is_array()) place.fail("is " + xgrad::detail::json_excerpt(merges) + ", not an array");
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
    std::vector<std::int32_t> results;
    pairs.reserve(merges.size());
    results.reserve(merges.size());
    std::unordered_map<std::uint64_t, std::size_t> rank_of;
    rank_of.reserve(merges.size());
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const Json& m = merges[rank];
      const JsonPlace here = place.at(rank);
      std::string left, right;
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          here.fail("is " + xgrad::detail::json_excerpt(m) + ", not two tokens separated by one space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        here.fail("is " + xgrad::detail::json_excerpt(m) + ", neither \"a b\" nor a pair of strings");
      }
      const std::int64_t a = id_of(left), b = id_of(right);
      if (a < 0) here.fail("the token " + in_quotes(left) + " is not in model.vocab");
      if (b < 0) here.fail("the token " + in_quotes(right) + " is not in model.vocab");
      if (!prefix_.empty() && right.compare(0, prefix_.size(), prefix_) != 0)
        here.fail("the right token " + in_quotes(right) + " does not start with the continuing_subword_prefix " +
                  in_quotes(prefix_));
      const std::string joined = left + right.substr(prefix_.size());
      const std::int64_t result = id_of(joined);
      if (result < 0)
        here.fail(in_quotes(left) + " + " + in_quotes(right) + " gives " + in_quotes(joined) + ", not in model.vocab");
      const auto [it, inserted] =
          rank_of.emplace((static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b), rank);
      if (!inserted)
        here.fail("repeats the merge " + in_quotes(left) + " " + in_quotes(right) + " of rank " +
                  std::to_string(it->second));
      pairs.emplace_back(a, b);
      results.push_back(static_cast<std::int32_t>(result));
    }
    merges_ = std::make_unique<MergeTable>(pairs, results);
  }

  std::vector<std::string> tokens_;
  std::unique_ptr<TokenIndex> index_;
  std::unique_ptr<MergeTable> merges_;
  std::string prefix_, suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false, cut_at_metaspace_ = false;
  std::int64_t unk_id_ = -1;
  std::array<std::int32_t, 256> byte_id_{};
  std::array<std::int32_t, 128> ascii_first_{}, ascii_later_{};
  std::vector<bool> merges_to_itself_;  // by id; empty when the model has affixes
  std::unordered_set<std::string> joins_metaspace_;
};

}  // namespace

std::unique_ptr<HfModel> make_hf_bpe_model(const Json& json, const JsonPlace& place) {
  return std::make_unique<BpeModel>(json, place);
}

}  // namespace xgrad::text::detail
