#include "xgrad/text/byte_level_bpe.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/text/detail/bpe_merge.hpp"
#include "xgrad/text/detail/bpe_tables.hpp"
#include "xgrad/text/detail/pretokenize_in_chunks.hpp"
#include "xgrad/text/detail/special_roles.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"
#include "xgrad/text/pretokenizer.hpp"

namespace xgrad::text {

namespace {

using detail::kNoRank;
using detail::MergeTable;
using detail::TokenIndex;

std::string in_quotes(std::string_view bytes) { return "\"" + readable_bytes(bytes) + "\""; }

// The text encode pre-tokenizes at once (pretokenize_in_chunks).
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

// Whether each id is outside the BPE (no merge builds or uses it): the special tokens, and the
// added tokens that are not ordinary tokens too. An added token is an ordinary token too when no
// other ordinary token has its bytes and it is a single byte or what a merge gives. Ids out of range
// are skipped (check_bpe_vocabulary refuses them).
std::vector<bool> outside_the_bpe(const BpeVocabulary& v) {
  const std::size_t n = v.tokens.size();
  const auto in_range = [n](std::int64_t id) { return id >= 0 && static_cast<std::uint64_t>(id) < n; };
  std::vector<bool> outside(n, false), added(n, false);
  for (const std::int64_t id : v.special_tokens)
    if (in_range(id)) outside[id] = true;
  for (const std::int64_t id : v.added_tokens)
    if (in_range(id) && !outside[id]) added[id] = true;
  if (v.added_tokens.empty()) return outside;
  std::unordered_map<std::string_view, std::size_t> plain, added_of;  // ordinary tokens, added ones
  for (std::size_t id = 0; id < n; ++id)
    if (!outside[id] && !added[id]) plain.emplace(v.tokens[id], id);
  for (std::size_t id = 0; id < n; ++id) {
    if (!added[id]) continue;
    outside[id] = true;
    if (plain.count(v.tokens[id])) continue;
    added_of.emplace(v.tokens[id], id);
    if (v.tokens[id].size() == 1) outside[id] = false;
  }
  for (const auto& [left, right] : v.merges) {
    if (!in_range(left) || !in_range(right)) continue;
    const std::string joined = v.tokens[left] + v.tokens[right];
    if (plain.count(joined)) continue;
    const auto it = added_of.find(joined);
    if (it != added_of.end()) outside[it->second] = false;
  }
  return outside;
}

// Ids listed in `list` (each one `article` `what` in messages): each in [0, n) and listed once.
std::vector<bool> listed(const std::vector<std::int64_t>& list, std::size_t n, const std::string& who,
                         const std::string& what, const char* article) {
  std::vector<bool> flags(n, false);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::int64_t id = list[i];
    if (id < 0 || static_cast<std::uint64_t>(id) >= n)
      throw Error(who + ": " + what + " " + std::to_string(i) + " has the id " + std::to_string(id) +
                  ", outside the vocabulary [0, " + std::to_string(n) + ")");
    if (flags[id]) throw Error(who + ": the id " + std::to_string(id) + " is listed twice as " + article + " " + what);
    flags[id] = true;
  }
  return flags;
}

}  // namespace

void check_bpe_vocabulary(const BpeVocabulary& v, const std::string& who) {
  const std::size_t n = v.tokens.size();
  if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(who + ": " + std::to_string(n) + " tokens, more than 2^31 - 1");
  const std::vector<bool> special = listed(v.special_tokens, n, who, "special token", "a");
  const std::vector<bool> added = listed(v.added_tokens, n, who, "added token", "an");
  const std::vector<bool> later = listed(v.matched_later, n, who, "matched-later token", "a");
  for (std::size_t id = 0; id < n; ++id) {
    if (added[id] && special[id])
      throw Error(who + ": the id " + std::to_string(id) + " is both a special and an added token");
    if (later[id] && !special[id] && !added[id])
      throw Error(who + ": the id " + std::to_string(id) + " is matched later but is neither special nor added");
  }
  std::unordered_map<std::string_view, std::size_t> matched;  // the added and special tokens by text
  for (const std::vector<std::int64_t>* list : {&v.added_tokens, &v.special_tokens}) {
    for (const std::int64_t id : *list) {
      const auto [it, inserted] = matched.emplace(v.tokens[id], id);
      if (!inserted && (added[id] || added[it->second]))
        throw Error(who + ": ids " + std::to_string(it->second) + " and " + std::to_string(id) +
                    " are both matched as the text " + in_quotes(v.tokens[id]));
    }
  }
  const std::vector<bool> outside = outside_the_bpe(v);
  std::unordered_map<std::string_view, std::size_t> id_of;
  id_of.reserve(n);
  for (std::size_t id = 0; id < n; ++id) {
    if (v.tokens[id].empty()) throw Error(who + ": the token of id " + std::to_string(id) + " is empty");
    if (outside[id]) continue;
    const auto [it, inserted] = id_of.emplace(v.tokens[id], id);
    if (!inserted)
      throw Error(who + ": ids " + std::to_string(it->second) + " and " + std::to_string(id) + " are both the bytes " +
                  in_quotes(v.tokens[id]));
  }
  for (int b = 0; b < 256; ++b) {
    if (!id_of.count(std::string(1, static_cast<char>(b)))) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw Error(who + ": no ordinary token is the single byte " + hex + " (byte-level BPE needs all 256)");
    }
  }
  std::vector<std::int64_t> made_by(n, -1);  // the lowest rank whose merge gives the token
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    const auto [left, right] = v.merges[rank];
    if (left < 0 || right < 0 || static_cast<std::uint64_t>(std::max(left, right)) >= n) continue;  // refused below
    const auto result = id_of.find(v.tokens[left] + v.tokens[right]);
    if (result != id_of.end() && made_by[result->second] < 0) made_by[result->second] = static_cast<std::int64_t>(rank);
  }
  std::unordered_map<std::uint64_t, std::size_t> rank_of_pair;
  rank_of_pair.reserve(v.merges.size());
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    const auto [left, right] = v.merges[rank];
    const std::string where = who + ": the merge of rank " + std::to_string(rank);
    for (const std::int64_t part : {left, right}) {
      if (part < 0 || static_cast<std::uint64_t>(part) >= n)
        throw Error(where + " names the id " + std::to_string(part) + ", outside the vocabulary [0, " +
                    std::to_string(n) + ")");
      if (special[part]) throw Error(where + " names the special token " + std::to_string(part));
      if (outside[part])
        throw Error(where + " names the added token " + std::to_string(part) + " " + in_quotes(v.tokens[part]) +
                    ", which is not an ordinary token (neither a single byte nor what a merge gives)");
      if (v.tokens[part].size() > 1 && (made_by[part] < 0 || made_by[part] >= static_cast<std::int64_t>(rank))) {
        throw Error(where + " uses the id " + std::to_string(part) + " " + in_quotes(v.tokens[part]) + ", which " +
                    (made_by[part] < 0 ? std::string("no merge makes")
                                       : "only the later merge of rank " + std::to_string(made_by[part]) + " makes") +
                    ": the ranks do not match");
      }
    }
    const std::string joined = v.tokens[left] + v.tokens[right];
    const auto result = id_of.find(joined);
    if (result == id_of.end())
      throw Error(where + " (ids " + std::to_string(left) + " + " + std::to_string(right) + ") gives " +
                  in_quotes(joined) + ", which is no ordinary token");
    const std::uint64_t key = (static_cast<std::uint64_t>(left) << 32) | static_cast<std::uint64_t>(right);
    const auto [it, inserted] = rank_of_pair.emplace(key, rank);
    if (!inserted) throw Error(where + " repeats the merge of rank " + std::to_string(it->second));
  }
}

struct ByteLevelBpe::Impl {
  // Texts matched whole before the BPE, longest first (so that at one position the longest wins).
  using Texts = std::vector<std::pair<std::string, std::int64_t>>;

  BpeVocabulary vocabulary;
  std::vector<bool> outside;  // outside_the_bpe
  std::array<std::int32_t, 256> byte_id{};
  TokenIndex index;
  MergeTable merges;
  // passes[m][p]: the texts matched in pass p (0, then 1 in the text between pass 0's matches),
  // m = 1 for SpecialText::match (special and added tokens), 0 for ordinary (added tokens only).
  Texts passes[2][2];
  // Whether the merges make the token of its own bytes, so that a piece equal to it may skip them
  // (for GPT-2 every token; a vocabulary can hold a token its merges reach only through others).
  std::vector<bool> merges_to_itself;
  Gpt2Pretokenizer pretokenizer;

  explicit Impl(BpeVocabulary v)
      : vocabulary(std::move(v)),
        outside(outside_the_bpe(vocabulary)),
        index(vocabulary.tokens, outside),
        merges(vocabulary, index) {
    for (int b = 0; b < 256; ++b) byte_id[b] = index.find(std::string(1, static_cast<char>(b)));
    std::vector<bool> later(vocabulary.tokens.size(), false);
    for (const std::int64_t id : vocabulary.matched_later) later[id] = true;
    for (const std::int64_t id : vocabulary.special_tokens)
      passes[1][later[id]].emplace_back(vocabulary.tokens[id], id);
    for (const std::int64_t id : vocabulary.added_tokens)
      for (const int m : {0, 1}) passes[m][later[id]].emplace_back(vocabulary.tokens[id], id);
    for (auto& mode : passes)
      for (Texts& texts : mode)
        std::stable_sort(texts.begin(), texts.end(),
                         [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    merges_to_itself.assign(vocabulary.tokens.size(), false);
    TokenIds ids;
    for (std::size_t id = 0; id < vocabulary.tokens.size(); ++id) {
      if (outside[id]) continue;
      ids.clear();
      merge(vocabulary.tokens[id], ids);
      merges_to_itself[id] = ids.size() == 1 && ids[0] == static_cast<std::int64_t>(id);
    }
  }

  void encode_piece(std::string_view piece, TokenIds& out) const {
    if (piece.size() == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    // The pre-tokenizer's pieces are valid UTF-8 but for the runs of invalid bytes between them,
    // which go byte by byte.
    if (std::any_of(piece.begin(), piece.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }) &&
        first_invalid_utf8(piece)) {
      for (const char c : piece) out.push_back(byte_id[static_cast<unsigned char>(c)]);
      return;
    }
    const std::int32_t whole = index.find(piece);
    if (whole >= 0 && (vocabulary.ignore_merges || merges_to_itself[whole])) {
      out.push_back(whole);
      return;
    }
    merge(piece, out);
  }

  void merge(std::string_view piece, TokenIds& out) const {
    std::int32_t on_stack[detail::kShortWord];
    std::vector<std::int32_t> on_heap(piece.size() > detail::kShortWord ? piece.size() : 0);
    std::int32_t* symbols = on_heap.empty() ? on_stack : on_heap.data();
    for (std::size_t i = 0; i < piece.size(); ++i) symbols[i] = byte_id[static_cast<unsigned char>(piece[i])];
    detail::merge_symbols(merges, symbols, piece.size(), out, "ByteLevelBpe::encode");
  }

  // A chunk at a time, so that the pieces of a long text (16 bytes each, about 4 a word) are never
  // all held at once: only its ids are.
  void encode_ordinary(std::string_view text, TokenIds& out) const {
    if (text.empty()) return;
    detail::pretokenize_in_chunks(pretokenizer, text, kChunkBytes, [&](const std::vector<std::string_view>& pieces) {
      for (const std::string_view piece : pieces) encode_piece(piece, out);
    });
  }

  // The texts of passes[mode][pass] matched whole (the earliest occurrence first, the longest where
  // two start at one place), the text between them through the later passes, then the BPE.
  void encode_matching(std::string_view text, int mode, int pass, TokenIds& out) const {
    while (pass < 2 && passes[mode][pass].empty()) ++pass;
    if (pass == 2) {
      encode_ordinary(text, out);
      return;
    }
    const Texts& list = passes[mode][pass];
    std::vector<std::size_t> found(list.size(), 0);  // each text's next occurrence at or after `start`
    std::vector<bool> searched(list.size(), false);
    std::size_t start = 0;
    while (true) {
      std::size_t best = list.size(), best_at = std::string_view::npos;
      for (std::size_t k = 0; k < list.size(); ++k) {
        if (!searched[k] || (found[k] != std::string_view::npos && found[k] < start)) {
          found[k] = text.find(list[k].first, start);
          searched[k] = true;
        }
        if (found[k] < best_at) {  // strict: at one position the longest (listed first) wins
          best_at = found[k];
          best = k;
        }
      }
      if (best == list.size()) {
        encode_matching(text.substr(start), mode, pass + 1, out);
        return;
      }
      encode_matching(text.substr(start, best_at - start), mode, pass + 1, out);
      out.push_back(list[best].second);
      start = best_at + list[best].first.size();
    }
  }
};

ByteLevelBpe::ByteLevelBpe(BpeVocabulary vocabulary) {
  check_bpe_vocabulary(vocabulary, "ByteLevelBpe");
  impl_ = std::make_unique<Impl>(std::move(vocabulary));
}

ByteLevelBpe::~ByteLevelBpe() = default;

TokenIds ByteLevelBpe::encode(std::string_view text, SpecialText specials) const {
  TokenIds ids;
  ids.reserve(text.size() / 3 + 1);
  impl_->encode_matching(text, specials == SpecialText::match ? 1 : 0, 0, ids);
  return ids;
}

std::string ByteLevelBpe::token_bytes(std::int64_t id) const {
  check_id(id, 0, "ByteLevelBpe::token_bytes");
  return impl_->vocabulary.tokens[id];
}

std::size_t ByteLevelBpe::vocab_size() const { return impl_->vocabulary.tokens.size(); }

const BpeVocabulary& ByteLevelBpe::vocabulary() const { return impl_->vocabulary; }

SpecialTokens ByteLevelBpe::special_tokens() const {
  return detail::special_roles_by_text([&](const char* text) -> std::optional<std::int64_t> {
    for (const std::int64_t id : impl_->vocabulary.special_tokens)
      if (impl_->vocabulary.tokens[id] == text) return id;
    return std::nullopt;
  });
}

std::string ByteLevelBpe::to_json() const {
  const BpeVocabulary& v = impl_->vocabulary;
  std::string out = R"({"kind":"byte_bpe","tokens":[)";
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    if (id) out += ',';
    out += nlohmann::json(gpt2_printable_from_bytes(v.tokens[id])).dump();
  }
  out += R"(],"merges":[)";
  for (std::size_t rank = 0; rank < v.merges.size(); ++rank) {
    if (rank) out += ',';
    out += '[' + std::to_string(v.merges[rank].first) + ',' + std::to_string(v.merges[rank].second) + ']';
  }
  const auto ids = [&](const char* name, const std::vector<std::int64_t>& list) {
    out += std::string(R"(],")") + name + R"(":[)";
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(list[i]);
    }
  };
  ids("special_tokens", v.special_tokens);
  // Written only when used, so that a vocabulary without them keeps its document (and identity).
  if (!v.added_tokens.empty()) ids("added_tokens", v.added_tokens);
  if (!v.matched_later.empty()) ids("matched_later", v.matched_later);
  out += ']';
  if (v.ignore_merges) out += R"(,"ignore_merges":true)";
  out += '}';
  return out;
}

std::unique_ptr<ByteLevelBpe> ByteLevelBpe::from_json(std::string_view json, const std::string& who) {
  nlohmann::json doc = xgrad::detail::parse_json(json, who + ": the byte_bpe tokenizer document");
  if (!doc.is_object()) throw Error(who + ": the byte_bpe tokenizer document is not a JSON object");
  const auto field = [&](const char* name) -> const nlohmann::json& {
    if (!doc.contains(name) || !doc[name].is_array())
      throw Error(who + ": the byte_bpe tokenizer document has no array field \"" + name + "\"");
    return doc[name];
  };
  if (!doc.contains("kind") || doc["kind"] != "byte_bpe")
    throw Error(who + ": the document's field \"kind\" is " +
                (doc.contains("kind") ? xgrad::detail::json_excerpt(doc["kind"]) : "missing") + ", not \"byte_bpe\"");
  const auto integer = [&](const nlohmann::json& j, const std::string& where) {
    if (!j.is_number_integer())
      throw Error(who + ": " + where + " is " + xgrad::detail::json_excerpt(j) + ", not an integer id");
    return j.get<std::int64_t>();
  };
  BpeVocabulary v;
  const nlohmann::json& tokens = field("tokens");
  v.tokens.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string where = "\"tokens\"[" + std::to_string(i) + "]";
    if (!tokens[i].is_string())
      throw Error(who + ": " + where + " is " + xgrad::detail::json_excerpt(tokens[i]) + ", not a string");
    std::optional<std::string> bytes = gpt2_bytes_from_printable(tokens[i].get_ref<const std::string&>());
    if (!bytes)
      throw Error(who + ": " + where + " " + xgrad::detail::json_excerpt(tokens[i]) +
                  " is not in GPT-2's printable byte form");
    v.tokens.push_back(std::move(*bytes));
  }
  const nlohmann::json& merges = field("merges");
  v.merges.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string where = "\"merges\"[" + std::to_string(r) + "]";
    if (!merges[r].is_array() || merges[r].size() != 2)
      throw Error(who + ": " + where + " is " + xgrad::detail::json_excerpt(merges[r]) + ", not a pair of ids");
    v.merges.emplace_back(integer(merges[r][0], where + "[0]"), integer(merges[r][1], where + "[1]"));
  }
  const auto read_ids = [&](const char* name, std::vector<std::int64_t>& list) {
    const nlohmann::json& a = field(name);
    for (std::size_t i = 0; i < a.size(); ++i)
      list.push_back(integer(a[i], "\"" + std::string(name) + "\"[" + std::to_string(i) + "]"));
  };
  read_ids("special_tokens", v.special_tokens);
  if (doc.contains("added_tokens")) read_ids("added_tokens", v.added_tokens);
  if (doc.contains("matched_later")) read_ids("matched_later", v.matched_later);
  if (doc.contains("ignore_merges")) {
    if (!doc["ignore_merges"].is_boolean())
      throw Error(who + ": \"ignore_merges\" is " + xgrad::detail::json_excerpt(doc["ignore_merges"]) +
                  ", not true or false");
    v.ignore_merges = doc["ignore_merges"].get<bool>();
  }
  check_bpe_vocabulary(v, who);
  return std::make_unique<ByteLevelBpe>(std::move(v));
}

}  // namespace xgrad::text
