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

// The distinct pre-tokenized pieces of the texts and how often each occurs.
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
      for (std::string_view piece : pieces) ++counts[std::string(piece)];
    });
  }

  const std::vector<std::string>& specials_;
  Gpt2Pretokenizer pretokenizer_;
};

using PairKey = std::uint64_t;
PairKey pair_key(std::uint32_t left, std::uint32_t right) { return (PairKey{left} << 32) | right; }

struct Word {
  std::vector<std::uint32_t> symbols;
  std::uint64_t frequency = 0;
};

struct Candidate {
  std::uint64_t count;
  std::uint32_t left, right;
};

// The BPE merges on counted words, with pair counts kept up to date merge by merge: the words
// holding a pair are indexed (an index entry may be stale: the word is checked when merged), and
// the most frequent pair comes from a heap whose stale entries are fixed when they reach its top.
class Trainer {
 public:
  Trainer(const std::unordered_map<std::string, std::uint64_t>& counts, const BpeTrainerOptions& options)
      : options_(options), heap_(Order{&tokens_}) {
    for (int b = 0; b < 256; ++b) add_token(std::string(1, static_cast<char>(b)));
    if (counts.size() > UINT32_MAX)
      fail("train_byte_level_bpe: ", counts.size(), " distinct words, more than 2^32 - 1");
    words_.reserve(counts.size());
    for (const auto& [text, frequency] : counts) {
      Word w;
      w.frequency = frequency;
      w.symbols.reserve(text.size());
      for (unsigned char c : text) w.symbols.push_back(c);
      words_.push_back(std::move(w));
    }
    visited_.assign(words_.size(), 0);
    for (std::uint32_t i = 0; i < words_.size(); ++i) {
      const Word& w = words_[i];
      for (std::size_t j = 0; j + 1 < w.symbols.size(); ++j) {
        const PairKey k = pair_key(w.symbols[j], w.symbols[j + 1]);
        pair_counts_[k] += w.frequency;
        index_word(k, i);
      }
    }
    std::vector<Candidate> all;
    all.reserve(pair_counts_.size());
    for (const auto& [k, count] : pair_counts_)
      all.push_back({count, static_cast<std::uint32_t>(k >> 32), static_cast<std::uint32_t>(k)});
    heap_ = Heap(Order{&tokens_}, std::move(all));
  }

  BpeVocabulary run() {
    const std::size_t target = options_.vocab_size() - options_.special_tokens().size();
    while (tokens_.size() < target && !heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      const PairKey k = pair_key(top.left, top.right);
      const auto found = pair_counts_.find(k);
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

  void index_word(PairKey k, std::uint32_t word) {
    auto& words = pair_words_[k];
    if (words.empty() || words.back() != word) words.push_back(word);
  }

  void merge(std::uint32_t left, std::uint32_t right) {
    const PairKey k = pair_key(left, right);
    std::string bytes = tokens_[left] + tokens_[right];
    const auto existing = token_ids_.find(bytes);
    const std::uint32_t merged = existing != token_ids_.end() ? existing->second : add_token(std::move(bytes));
    if (merged_pairs_.insert(k).second) merges_.emplace_back(left, right);

    std::vector<std::uint32_t> words;
    if (const auto it = pair_words_.find(k); it != pair_words_.end()) {
      words = std::move(it->second);
      pair_words_.erase(it);
    }
    ++step_;
    touched_.clear();
    for (std::uint32_t w : words) {
      if (visited_[w] == step_) continue;
      visited_[w] = step_;
      merge_in_word(w, left, right, merged);
    }
    pair_counts_.erase(k);  // every occurrence is merged: its count is 0

    // Pairs with the new token are the only ones whose counts grew: they get fresh entries.
    std::sort(touched_.begin(), touched_.end());
    touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    for (PairKey t : touched_) {
      const auto it = pair_counts_.find(t);
      if (it != pair_counts_.end() && it->second > 0)
        heap_.push({it->second, static_cast<std::uint32_t>(t >> 32), static_cast<std::uint32_t>(t)});
    }
  }

  void merge_in_word(std::uint32_t index, std::uint32_t left, std::uint32_t right, std::uint32_t merged) {
    Word& w = words_[index];
    auto& s = w.symbols;
    const std::size_t n = s.size();
    std::size_t first = 0;
    while (first + 1 < n && !(s[first] == left && s[first + 1] == right)) ++first;
    if (first + 1 >= n) return;  // a stale index entry: the word no longer holds the pair

    // Only the pairs from the one before the first occurrence on can change.
    const std::size_t from = first > 0 ? first - 1 : 0;
    for (std::size_t j = from; j + 1 < n; ++j) decrease(pair_key(s[j], s[j + 1]), w.frequency);
    std::size_t out = first;
    for (std::size_t j = first; j < n;) {
      if (j + 1 < n && s[j] == left && s[j + 1] == right) {
        s[out++] = merged;
        j += 2;
      } else {
        s[out++] = s[j++];
      }
    }
    s.resize(out);
    for (std::size_t j = from; j + 1 < out; ++j) {
      const PairKey p = pair_key(s[j], s[j + 1]);
      pair_counts_[p] += w.frequency;
      if (s[j] == merged || s[j + 1] == merged) {
        index_word(p, index);
        touched_.push_back(p);
      }
    }
  }

  void decrease(PairKey k, std::uint64_t by) {
    auto it = pair_counts_.find(k);
    it->second -= by;  // the pair was counted from this word
  }

  const BpeTrainerOptions& options_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::uint32_t> token_ids_;
  std::vector<std::pair<std::int64_t, std::int64_t>> merges_;
  std::unordered_set<PairKey> merged_pairs_;
  std::vector<Word> words_;
  std::vector<std::uint32_t> visited_;  // the step that last merged in each word
  std::uint32_t step_ = 0;
  std::unordered_map<PairKey, std::uint64_t> pair_counts_;
  std::unordered_map<PairKey, std::vector<std::uint32_t>> pair_words_;
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
