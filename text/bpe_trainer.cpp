#include "xgrad/text/bpe_trainer.hpp"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/text/detail/pretokenize_in_chunks.hpp"
#include "xgrad/text/pretokenizer.hpp"

namespace xgrad::text {

namespace {

constexpr std::size_t kLargestVocabSize = 2147483647;      // ids fit an int32 (and the words' uint32 symbols)
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;  // text pre-tokenized at a time

void check_options(const BpeTrainerOptions& options, const char* who) {
  if (options.min_frequency() == 0)
    fail(who, ": min_frequency 0: a merged pair must occur at least once (min_frequency >= 1)");
  const auto& specials = options.special_tokens();
  for (std::size_t i = 0; i < specials.size(); ++i) {
    const std::string& s = specials[i];
    const std::string what = "special token " + std::to_string(i);
    if (s.empty()) fail(who, ": ", what, " is empty");
    check_utf8(s, who, what.c_str());
    if (s.size() == 1)
      fail(who, ": ", what, " \"", escape_bytes(s), "\" is one byte, which is the byte token ",
           static_cast<unsigned>(static_cast<unsigned char>(s[0])), " already");
    for (std::size_t j = 0; j < i; ++j)
      if (specials[j] == s) fail(who, ": special tokens ", j, " and ", i, " are both \"", escape_bytes(s), "\"");
  }
  if (options.vocab_size() > kLargestVocabSize)
    fail(who, ": vocab_size ", options.vocab_size(), " is more than the ", kLargestVocabSize,
         " ids this trainer builds");
  if (options.vocab_size() < 256 + specials.size())
    fail(who, ": vocab_size ", options.vocab_size(), " is below the 256 byte tokens plus the ", specials.size(),
         " special token", specials.size() == 1 ? "" : "s", " (", 256 + specials.size(), ")");
}

// The distinct pre-tokenized pieces of the texts and how often each occurs. The runs of bytes
// that are not UTF-8 (pieces of their own) are left out: ByteLevelBpe encodes them byte by byte,
// never merged, so a merge learnt from them would never be used.
class WordCounter {
 public:
  explicit WordCounter(const std::vector<std::string>& specials) : specials_(specials) {}

  void add(std::string_view text) {
    std::vector<std::size_t> next;  // the first occurrence of each special at or after `at`
    for (const std::string& s : specials_) next.push_back(text.find(s));
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t match = std::string_view::npos, length = 0;
      for (std::size_t k = 0; k < specials_.size(); ++k) {
        if (next[k] != std::string_view::npos && next[k] < at) next[k] = text.find(specials_[k], at);
        if (next[k] == std::string_view::npos) continue;
        if (next[k] < match || (next[k] == match && specials_[k].size() > length)) {
          match = next[k];
          length = specials_[k].size();
        }
      }
      if (match == std::string_view::npos) {
        add_ordinary(text.substr(at));
        break;
      }
      add_ordinary(text.substr(at, match - at));
      at = match + length;
    }
  }

  std::unordered_map<std::string, std::uint64_t> counts;

 private:
  void add_ordinary(std::string_view part) {
    if (part.empty()) return;
    detail::pretokenize_in_chunks(pretokenizer_, part, kChunkBytes,
                                  [this](const std::vector<std::string_view>& pieces) {
      for (std::string_view piece : pieces)
        if (!first_invalid_utf8(piece)) ++counts[std::string(piece)];
    });
  }

  const std::vector<std::string>& specials_;
  Gpt2Pretokenizer pretokenizer_;
};

using PairKey = std::uint64_t;
PairKey pair_key(std::uint32_t left, std::uint32_t right) { return (PairKey{left} << 32) | right; }
std::uint32_t left_of(PairKey k) { return static_cast<std::uint32_t>(k >> 32); }
std::uint32_t right_of(PairKey k) { return static_cast<std::uint32_t>(k); }

constexpr std::uint32_t kNone = UINT32_MAX;  // no neighbour (a word's end); a merged-away symbol

struct Candidate {
  std::uint64_t count;
  std::uint32_t left, right;
};

// The BPE merges on counted words, with pair counts kept up to date merge by merge. All words'
// symbols sit in one array as doubly linked lists (a merge links its left symbol past the right
// one), and each pair indexes the positions where it starts, so a merge visits its occurrences
// only, however long the word (an index entry may be stale: it is checked when visited). The
// most frequent pair comes from a heap whose stale entries are fixed when they reach its top.
class Trainer {
 public:
  Trainer(const std::unordered_map<std::string, std::uint64_t>& counts, const BpeTrainerOptions& options)
      : options_(options), heap_(Order{&tokens_}) {
    for (int b = 0; b < 256; ++b) add_token(std::string(1, static_cast<char>(b)));
    std::size_t total = 0;
    for (const auto& entry : counts) total += entry.first.size();
    if (total >= kNone) fail("train_byte_level_bpe: the distinct words hold ", total, " bytes, more than 2^32 - 2");
    symbols_.reserve(total);
    next_.reserve(total);
    previous_.reserve(total);
    frequency_.reserve(total);
    for (const auto& [text, frequency] : counts) {
      const auto begin = static_cast<std::uint32_t>(symbols_.size());
      for (std::size_t i = 0; i < text.size(); ++i) {
        const auto at = static_cast<std::uint32_t>(begin + i);
        symbols_.push_back(static_cast<unsigned char>(text[i]));
        previous_.push_back(i > 0 ? at - 1 : kNone);
        next_.push_back(i + 1 < text.size() ? at + 1 : kNone);
        frequency_.push_back(frequency);
        if (i > 0) {
          const PairKey k = pair_key(symbols_[at - 1], symbols_[at]);
          pair_counts_[k] += frequency;
          pair_positions_[k].push_back(at - 1);
        }
      }
    }
    std::vector<Candidate> all;
    all.reserve(pair_counts_.size());
    for (const auto& [k, count] : pair_counts_) all.push_back({count, left_of(k), right_of(k)});
    heap_ = Heap(Order{&tokens_}, std::move(all));
  }

  BpeVocabulary run() {
    const std::size_t target = options_.vocab_size() - options_.special_tokens().size();
    while (tokens_.size() < target && !heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      const auto found = pair_counts_.find(pair_key(top.left, top.right));
      const std::uint64_t count = found == pair_counts_.end() ? 0 : found->second;
      if (count != top.count) {
        // A count only falls while its entry waits, except when a merge rebuilds an older token
        // (then the pair got a fresh entry with its new count, and this one is dropped).
        if (count > 0 && count < top.count) heap_.push({count, top.left, top.right});
        continue;
      }
      if (count < options_.min_frequency()) break;
      merge(top.left, top.right);
    }
    BpeVocabulary vocabulary;
    vocabulary.merges = std::move(merges_);
    for (const std::string& s : options_.special_tokens()) {
      vocabulary.special_tokens.push_back(static_cast<std::int64_t>(tokens_.size()));
      tokens_.push_back(s);
    }
    vocabulary.tokens = std::move(tokens_);
    return vocabulary;
  }

 private:
  // Heap order: the larger count first, then the pair whose left bytes, then right bytes, come
  // first (std::string compares bytes as unsigned char).
  struct Order {
    const std::vector<std::string>* tokens;
    bool operator()(const Candidate& a, const Candidate& b) const {
      if (a.count != b.count) return a.count < b.count;
      const auto& t = *tokens;
      if (a.left != b.left) return t[a.left] > t[b.left];
      return t[a.right] > t[b.right];
    }
  };
  using Heap = std::priority_queue<Candidate, std::vector<Candidate>, Order>;

  std::uint32_t add_token(std::string bytes) {
    const auto id = static_cast<std::uint32_t>(tokens_.size());
    token_ids_.emplace(bytes, id);
    tokens_.push_back(std::move(bytes));
    return id;
  }

  void merge(std::uint32_t left, std::uint32_t right) {
    const PairKey k = pair_key(left, right);
    std::string bytes = tokens_[left] + tokens_[right];
    const auto existing = token_ids_.find(bytes);
    const std::uint32_t merged = existing != token_ids_.end() ? existing->second : add_token(std::move(bytes));
    if (merged_pairs_.insert(k).second) merges_.emplace_back(left, right);

    std::vector<std::uint32_t> positions;
    if (const auto it = pair_positions_.find(k); it != pair_positions_.end()) {
      positions = std::move(it->second);
      pair_positions_.erase(it);
    }
    // In position order, so that in each word the occurrences are merged left to right: the
    // left neighbour of an occurrence is the word as merged so far (the merged token when
    // occurrences touch), the right one the word not merged yet, and touching occurrences'
    // changes to the counts cancel as they should.
    std::sort(positions.begin(), positions.end());
    touched_.clear();
    for (const std::uint32_t at : positions) {
      if (symbols_[at] != left) continue;  // stale: merged away, or merged into another token
      const std::uint32_t second = next_[at];
      if (second == kNone || symbols_[second] != right) continue;
      const std::uint64_t f = frequency_[at];
      if (const std::uint32_t before = previous_[at]; before != kNone) {
        decrease(pair_key(symbols_[before], left), f);
        increase(pair_key(symbols_[before], merged), f, before);
      }
      const std::uint32_t after = next_[second];
      if (after != kNone) {
        decrease(pair_key(right, symbols_[after]), f);
        increase(pair_key(merged, symbols_[after]), f, at);
        previous_[after] = at;
      }
      symbols_[at] = merged;
      symbols_[second] = kNone;
      next_[at] = after;
    }
    pair_counts_.erase(k);  // every occurrence is merged

    // Pairs with the new token are the only ones whose counts grew: they get fresh entries.
    std::sort(touched_.begin(), touched_.end());
    touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    for (const PairKey t : touched_) {
      const auto it = pair_counts_.find(t);
      if (it != pair_counts_.end()) heap_.push({it->second, left_of(t), right_of(t)});
    }
  }

  void decrease(PairKey k, std::uint64_t by) {
    const auto it = pair_counts_.find(k);
    if (it == pair_counts_.end()) return;  // never: the pair was counted from this word
    it->second -= by;
    if (it->second == 0) pair_counts_.erase(it);
  }

  // A pair with the merged token, starting at `at`: counted, indexed, and given a fresh heap
  // entry after the merge.
  void increase(PairKey k, std::uint64_t by, std::uint32_t at) {
    pair_counts_[k] += by;
    pair_positions_[k].push_back(at);
    touched_.push_back(k);
  }

  const BpeTrainerOptions& options_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::uint32_t> token_ids_;
  std::vector<std::pair<std::int64_t, std::int64_t>> merges_;
  std::unordered_set<PairKey> merged_pairs_;
  // Every word's symbols, one position per byte of the distinct words: the token there (kNone
  // once merged into the symbol before it), the neighbours, and the word's frequency.
  std::vector<std::uint32_t> symbols_, next_, previous_;
  std::vector<std::uint64_t> frequency_;
  std::unordered_map<PairKey, std::uint64_t> pair_counts_;
  std::unordered_map<PairKey, std::vector<std::uint32_t>> pair_positions_;
  std::vector<PairKey> touched_;
  Heap heap_;
};

}  // namespace

BpeVocabulary train_byte_level_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options) {
  check_options(options, "train_byte_level_bpe");
  WordCounter counter(options.special_tokens());
  for (const std::string& text : texts) counter.add(text);
  return Trainer(counter.counts, options).run();
}

BpeVocabulary train_byte_level_bpe_files(const std::vector<std::string>& paths, const BpeTrainerOptions& options) {
  const char* who = "train_byte_level_bpe_files";
  check_options(options, who);
  WordCounter counter(options.special_tokens());
  for (const std::string& path : paths) counter.add(read_file(path, who));
  return Trainer(counter.counts, options).run();
}

}  // namespace xgrad::text
