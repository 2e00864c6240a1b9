// tokenizer.json's Unigram model: the most likely segmentation of a piece into the vocabulary's
// pieces (Viterbi over the characters, each piece scored by its log-probability), as Hugging Face's
// Rust tokenizers does it (tokenizers/src/models/unigram/model.rs, encode_optimized and tokenize,
// itself sentencepiece's unigram_model.cc): a character no piece of one character covers is unk,
// scored min score - 10; consecutive unks are fused into one; a fused string that is no piece
// becomes its bytes' <0xNN> pieces when byte_fallback is set, else unk. The JS (@huggingface/
// tokenizers 0.2.0) agrees except that it scores the unk piece written in the text as unk (Rust, and
// xgrad, keep its own score), fuses unks across pre-tokenized pieces, and has no byte fallback.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"

namespace xgrad::text::detail {

namespace {

constexpr double kUnkPenalty = 10.0;  // unk's score is the lowest piece's minus this (model.rs K_UNK_PENALTY)

// The vocabulary's pieces as a byte trie laid out breadth first, so that each node's children are
// contiguous and sorted by byte: walking a text from one position visits the pieces that are
// prefixes of it, shortest first, in one step per byte (a binary search among at most 256 children).
class PieceTrie {
 public:
  // `pieces` must be distinct.
  explicit PieceTrie(const std::vector<std::string>& pieces) {
    std::vector<std::uint32_t> order(pieces.size());
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return pieces[a] < pieces[b]; });
    // Node k stands for the prefix of length depth[k] shared by the sorted pieces [lo[k], hi[k]).
    // The pieces that are exactly that prefix come first in the range; the rest group by their next
    // byte, in order, which gives the children in order. Every node is visited once, in order.
    std::vector<std::uint32_t> lo{0}, hi{static_cast<std::uint32_t>(order.size())};
    std::vector<std::size_t> depth{0};
    nodes_.push_back(Node{});
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      std::uint32_t i = lo[k];
      const std::size_t d = depth[k];
      if (i < hi[k] && pieces[order[i]].size() == d) nodes_[k].piece = static_cast<std::int32_t>(order[i++]);
      nodes_[k].first_child = static_cast<std::uint32_t>(nodes_.size());
      while (i < hi[k]) {
        const char byte = pieces[order[i]][d];
        std::uint32_t j = i + 1;
        while (j < hi[k] && pieces[order[j]][d] == byte) ++j;
        Node child;
        child.byte = static_cast<unsigned char>(byte);
        nodes_.push_back(child);
        lo.push_back(i);
        hi.push_back(j);
        depth.push_back(d + 1);
        ++nodes_[k].child_count;
        i = j;
      }
    }
  }

  // Calls visit(piece id, length in bytes) for each piece that begins `text`, shortest first.
  template <class Visit>
  void prefixes(std::string_view text, Visit&& visit) const {
    std::uint32_t node = 0;
    for (std::size_t length = 1; length <= text.size(); ++length) {
      const Node& parent = nodes_[node];
      const auto first = nodes_.begin() + parent.first_child, last = first + parent.child_count;
      const auto byte = static_cast<unsigned char>(text[length - 1]);
      const auto child = std::lower_bound(first, last, byte, [](const Node& n, unsigned char b) { return n.byte < b; });
      if (child == last || child->byte != byte) return;
      node = static_cast<std::uint32_t>(child - nodes_.begin());
      if (child->piece >= 0) visit(child->piece, length);
    }
  }

 private:
  struct Node {
    std::int32_t piece = -1;  // the id of the piece that ends here, or -1
    std::uint32_t first_child = 0;
    std::uint16_t child_count = 0;
    unsigned char byte = 0;  // the byte on the edge from the parent
  };
  std::vector<Node> nodes_;
};

// One token of a segmentation: where it begins (a byte offset) and its id.
struct PathToken {
  std::size_t begin;
  std::int32_t id;
};

class HfUnigramModel : public HfModel {
 public:
  HfUnigramModel(std::vector<std::string> pieces, std::vector<double> scores, std::optional<std::int64_t> unk_id,
                 bool byte_fallback, JsonPlace place)
      : pieces_(std::move(pieces)),
        scores_(std::move(scores)),
        unk_id_(unk_id),
        byte_fallback_(byte_fallback),
        place_(std::move(place)),
        trie_(pieces_) {
    // ids_ views pieces_, which never changes (and the model is never copied: see below).
    for (std::size_t id = 0; id < pieces_.size(); ++id) ids_.emplace(pieces_[id], static_cast<std::int64_t>(id));
    unk_score_ = *std::min_element(scores_.begin(), scores_.end()) - kUnkPenalty;
    if (byte_fallback_)
      for (int b = 0; b < 256; ++b) byte_ids_[b] = id_of(byte_piece(b));
  }

  // The <0xNN> piece of a byte, as Rust writes it (format!("<0x{byte:02X}>")).
  static std::string byte_piece(int byte) {
    char text[8];
    std::snprintf(text, sizeof text, "<0x%02X>", byte);
    return text;
  }

  void tokenize(std::string_view piece, TokenIds& out) const override {
    const std::vector<PathToken> path = best_path(piece);
    const auto is_unk = [&](std::size_t i) { return unk_id_ && path[i].id == *unk_id_; };
    for (std::size_t i = 0; i < path.size();) {
      if (!is_unk(i)) {
        out.push_back(path[i++].id);
        continue;
      }
      // A run of unks is one string (Rust's fuse_unk): a piece, its bytes' pieces, or unk.
      std::size_t j = i + 1;
      while (j < path.size() && is_unk(j)) ++j;
      const std::size_t begin = path[i].begin, end = j < path.size() ? path[j].begin : piece.size();
      const std::string_view fused = piece.substr(begin, end - begin);
      if (const std::int64_t known = id_of(fused); known >= 0) {
        out.push_back(known);
      } else if (byte_fallback_) {
        for (const char byte : fused) out.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
      } else {
        out.push_back(*unk_id_);
      }
      i = j;
    }
  }

  HfUnigramModel(const HfUnigramModel&) = delete;
  HfUnigramModel& operator=(const HfUnigramModel&) = delete;

  const std::vector<std::string>& vocabulary() const override { return pieces_; }

  std::int64_t id_of(std::string_view token) const override {
    const auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }

 private:
  // The tokens of the best segmentation of `text` as (begin byte, id), in order. best[e] is the
  // best path over text[0, e): its score, where its last token begins and that token's id. Paths
  // are extended from each character's start in order, and a path replaces another ending at the
  // same place only when it scores more: on a tie the earlier-found one stays, the one whose last
  // token is longest (model.rs, encode_optimized). Memory: one entry per byte of `text`.
  std::vector<PathToken> best_path(std::string_view text) const {
    struct Best {
      double score = 0;
      std::uint32_t length = 0;  // of the last token in bytes; 0 while no path ends here
      std::int32_t id = 0;       // of the last token
    };                           // 16 bytes a byte of text
    std::vector<Best> best(text.size() + 1);
    for (std::size_t begin = 0; begin < text.size();) {
      const double so_far = best[begin].score;
      const std::size_t char_length =
          std::min(utf8_length(static_cast<unsigned char>(text[begin])), text.size() - begin);
      bool has_single_character = false;
      const auto offer = [&](std::size_t length, std::int32_t id, double score) {
        Best& target = best[begin + length];
        const double candidate = score + so_far;
        if (target.length == 0 || candidate > target.score)
          target = Best{candidate, static_cast<std::uint32_t>(length), id};
      };
      trie_.prefixes(text.substr(begin), [&](std::int32_t id, std::size_t length) {
        offer(length, id, scores_[static_cast<std::size_t>(id)]);
        if (length == char_length) has_single_character = true;
      });
      if (!has_single_character) {
        if (!unk_id_)
          place_.fail("has no unk_id, and the text holds " +
                      xgrad::detail::json_excerpt(Json(std::string(text.substr(begin, char_length)))) + " at byte " +
                      std::to_string(begin) + ", which no piece of one character covers");
        offer(char_length, static_cast<std::int32_t>(*unk_id_), unk_score_);
      }
      begin += char_length;
    }
    std::vector<PathToken> path;
    for (std::size_t end = text.size(); end > 0; end -= best[end].length)
      path.push_back(PathToken{end - best[end].length, best[end].id});
    std::reverse(path.begin(), path.end());
    return path;
  }

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  std::optional<std::int64_t> unk_id_;
  bool byte_fallback_;
  JsonPlace place_;  // "model", for the one error tokenize can raise
  PieceTrie trie_;
  std::unordered_map<std::string_view, std::int64_t> ids_;  // views into pieces_
  double unk_score_ = 0;
  std::array<std::int64_t, 256> byte_ids_{};
};

}  // namespace

std::unique_ptr<HfModel> make_hf_unigram_model(const Json& json, const JsonPlace& place) {
  HfFields fields(json, place);
  if (fields.type() != "Unigram")
    place.at("type").fail("is " + xgrad::detail::json_excerpt(Json(fields.type())) + ", not \"Unigram\"");
  const Json& vocab = fields.required("vocab");
  const JsonPlace vocab_place = place.at("vocab");
  if (!vocab.is_array()) vocab_place.fail("is " + xgrad::detail::json_excerpt(vocab) + ", not an array");
  if (vocab.empty()) vocab_place.fail("is empty; a Unigram model needs at least one piece");
  if (vocab.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    vocab_place.fail("holds " + std::to_string(vocab.size()) + " pieces, more than xgrad's 2^31 - 1");
  std::vector<std::string> pieces;
  std::vector<double> scores;
  pieces.reserve(vocab.size());
  scores.reserve(vocab.size());
  std::unordered_map<std::string, std::size_t> first_id;
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    const Json& entry = vocab[id];
    const JsonPlace entry_place = vocab_place.at(id);
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number())
      entry_place.fail("is " + xgrad::detail::json_excerpt(entry) + ", not [piece, score]");
    const double score = entry[1].get<double>();
    if (!std::isfinite(score)) entry_place.at(1).fail("is " + std::to_string(score) + ", not a finite score");
    std::string piece = entry[0].get<std::string>();
    if (piece.size() > std::numeric_limits<std::uint32_t>::max())  // a token's length is kept in 32 bits
      entry_place.at(0).fail("is a piece of " + std::to_string(piece.size()) + " bytes, more than 2^32 - 1");
    if (const auto [it, fresh] = first_id.emplace(piece, id); !fresh)
      entry_place.fail("repeats the piece " + xgrad::detail::json_excerpt(entry[0]) + " of id " +
                       std::to_string(it->second));
    pieces.push_back(std::move(piece));
    scores.push_back(score);
  }
  std::optional<std::int64_t> unk_id;
  if (const Json* unk = fields.optional("unk_id")) {
    if (!unk->is_number_integer() || unk->get<std::int64_t>() < 0 ||
        unk->get<std::int64_t>() >= static_cast<std::int64_t>(pieces.size()))
      place.at("unk_id").fail("is " + xgrad::detail::json_excerpt(*unk) + ", not an id of the vocabulary's " +
                              std::to_string(pieces.size()) + " pieces");
    unk_id = unk->get<std::int64_t>();
  }
  const bool byte_fallback = fields.boolean("byte_fallback", false);
  if (byte_fallback)
    for (int b = 0; b < 256; ++b)
      if (!first_id.count(HfUnigramModel::byte_piece(b)))
        place.at("byte_fallback")
            .fail("is true but the vocabulary has no piece " + HfUnigramModel::byte_piece(b) +
                  " (byte fallback needs all 256 <0xNN> pieces)");
  fields.done();
  return std::make_unique<HfUnigramModel>(std::move(pieces), std::move(scores), unk_id, byte_fallback, place);
}

}  // namespace xgrad::text::detail
