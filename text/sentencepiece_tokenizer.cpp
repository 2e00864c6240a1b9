#include "xgrad/text/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace xgrad::text {

namespace {

constexpr std::uint64_t kMaxModelBytes = 1ull << 30;  // a real model is well under 100 MB

// A user's string in a message: readable_bytes, with control characters (NUL above all, which would
// cut the message short where it is read as a C string) written as \xNN too.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : readable_bytes(s)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

std::string quoted(const std::string& s) { return "'" + shown(s) + "'"; }

// A protobuf varint at b[pos], moving pos past it; false when b ends inside it or it is longer
// than 64 bits.
bool read_varint(std::string_view b, std::size_t& pos, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= b.size()) return false;
    const auto c = static_cast<unsigned char>(b[pos++]);
    v |= static_cast<std::uint64_t>(c & 0x7F) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

// What is wrong with `b` as a serialized ModelProto, or "" when nothing is. Walks the top-level
// fields by protobuf's wire format: a cut-short file ends inside a field, and the fields SentencePiece
// writes last (trainer_spec 2, normalizer_spec 3) after the pieces (1) must all be there, since a
// file cut between two pieces still parses.
std::string model_proto_problem(std::string_view b) {
  if (b.empty()) return "it holds no bytes";
  std::size_t pos = 0;
  const auto varint = [&](std::uint64_t& v) { return read_varint(b, pos, v); };
  bool has[4] = {false, false, false, false};
  while (pos < b.size()) {
    const std::size_t start = pos;
    const std::string at = " at byte offset " + std::to_string(start);
    std::uint64_t key = 0;
    if (!varint(key)) return "a field key" + at + " runs past the end (cut short?)";
    const std::uint64_t field = key >> 3, wire = key & 7;
    if (field == 0) return "field number 0" + at + " (not protobuf)";
    std::uint64_t length = 0;
    switch (wire) {
      case 0:
        if (!varint(length)) return "field " + std::to_string(field) + at + " runs past the end (cut short?)";
        length = 0;
        break;
      case 1:
        length = 8;
        break;
      case 2:
        if (!varint(length))
          return "the length of field " + std::to_string(field) + at + " runs past the end (cut short?)";
        break;
      case 5:
        length = 4;
        break;
      default:
        return "field " + std::to_string(field) + at + " has wire type " + std::to_string(wire) +
               ", which SentencePiece's ModelProto never uses";
    }
    if (length > b.size() - pos)
      return "field " + std::to_string(field) + at + " needs " + std::to_string(length) + " bytes, but only " +
             std::to_string(b.size() - pos) + " follow (the file is cut short)";
    pos += static_cast<std::size_t>(length);
    if (field >= 1 && field <= 3) {
      if (wire != 2) return "field " + std::to_string(field) + at + " is not a message";
      has[field] = true;
    }
  }
  if (!has[1]) return "it holds no pieces (field 1)";
  if (!has[2]) return "it lacks the trainer_spec (field 2): cut short after the pieces?";
  if (!has[3]) return "it lacks the normalizer_spec (field 3): cut short after the trainer_spec?";
  return "";
}

// One field of a protobuf message: its number, wire type, the bytes of a length-delimited field
// (else empty) and the value of a varint one (else 0).
struct ProtoField {
  std::uint64_t number, wire;
  std::string_view payload;
  std::uint64_t varint;
};

// The fields of one protobuf message, in order; false when the bytes are not a message.
bool message_fields(std::string_view b, std::vector<ProtoField>& out) {
  std::size_t pos = 0;
  const auto varint = [&](std::uint64_t& v) { return read_varint(b, pos, v); };
  while (pos < b.size()) {
    std::uint64_t key = 0, length = 0, value = 0;
    if (!varint(key)) return false;
    const std::uint64_t wire = key & 7;
    if (wire == 0) {
      if (!varint(value)) return false;
    } else if (wire == 1 || wire == 5) {
      length = wire == 1 ? 8 : 4;
    } else if (wire != 2 || !varint(length)) {
      return false;
    }
    if (length > b.size() - pos) return false;
    out.push_back({key >> 3, wire, wire == 2 ? b.substr(pos, length) : std::string_view(), value});
    pos += static_cast<std::size_t>(length);
  }
  return true;
}

// What is wrong with a precompiled_charsmap (SentencePiece's normalization rules: a uint32 size, a
// Darts double-array trie of that many bytes, then the NUL-terminated replacement strings), or "".
// SentencePiece walks the trie without bounds checks, so a corrupt one makes encode read outside
// it; this checks every index a walk can reach: from each node unit i, its children i ^ offset ^ c
// for every byte c (all below (i ^ offset) | 0xFF), and each leaf's value inside the strings.
std::string charsmap_problem(std::string_view blob) {
  if (blob.empty()) return "";  // no rules: the identity
  const auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(blob[at + k]);
    return v;
  };
  if (blob.size() <= 4) return "it holds " + std::to_string(blob.size()) + " bytes, fewer than a trie";
  const std::uint32_t trie_bytes = u32(0);
  if (trie_bytes < 4 || trie_bytes >= blob.size() - 4)
    return "its trie size " + std::to_string(trie_bytes) + " does not fit in its " + std::to_string(blob.size()) +
           " bytes with the strings after it";
  const std::size_t units = trie_bytes / 4, strings = blob.size() - 4 - trie_bytes;
  if (blob.back() != '\0') return "its replacement strings do not end with a NUL byte";
  const auto unit = [&](std::size_t i) { return u32(4 + 4 * i); };
  for (std::size_t i = 0; i < units; ++i) {
    const std::uint32_t u = unit(i);
    if (i != 0 && (u >> 31)) continue;  // a value unit, never walked through
    const std::size_t base = i ^ ((u >> 10) << ((u & (1u << 9)) >> 6));
    if ((base | 0xFF) >= units)
      return "trie unit " + std::to_string(i) + " leads to unit " + std::to_string(base) + ", past its " +
             std::to_string(units) + " units";
    if (((u >> 8) & 1) && (unit(base) & 0x7FFFFFFFu) >= strings)
      return "trie unit " + std::to_string(i) + " names the replacement string at " +
             std::to_string(unit(base) & 0x7FFFFFFFu) + ", past its " + std::to_string(strings) + " bytes";
  }
  return "";
}

// The first problem of the charsmaps of normalizer_spec (field 3) and denormalizer_spec (field 5)
// of a ModelProto, as "normalizer_spec.precompiled_charsmap: ...", or "". Messages that are not
// protobuf are left to SentencePiece's parser.
std::string model_charsmap_problem(std::string_view model) {
  std::vector<ProtoField> top, spec;
  if (!message_fields(model, top)) return "";
  for (const std::uint64_t which : {3, 5}) {
    std::string_view charsmap;  // protobuf: the last one wins, across every copy of the message
    for (const ProtoField& field : top) {
      if (field.number != which || field.wire != 2) continue;
      spec.clear();
      if (!message_fields(field.payload, spec)) return "";
      for (const ProtoField& f : spec)
        if (f.number == 2 && f.wire == 2) charsmap = f.payload;
    }
    const std::string problem = charsmap_problem(charsmap);
    if (!problem.empty())
      return std::string(which == 3 ? "normalizer_spec" : "denormalizer_spec") + ".precompiled_charsmap: " + problem;
  }
  return "";
}

// What the model says of its dummy-prefix ▁ and its normalization rules (the last copy of each
// field wins, as protobuf merges them): normalizer_spec.add_dummy_prefix and escape_whitespaces
// (default true) and precompiled_charsmap, trainer_spec.treat_whitespace_as_suffix (default false).
struct SpaceSpec {
  bool add_dummy_prefix = true, escape_whitespaces = true, whitespace_as_suffix = false;
  std::string_view charsmap;
};

SpaceSpec space_spec(std::string_view model) {
  SpaceSpec spec;
  std::vector<ProtoField> top, inner;
  if (!message_fields(model, top)) return spec;
  for (const ProtoField& field : top) {
    if ((field.number != 2 && field.number != 3) || field.wire != 2) continue;
    inner.clear();
    if (!message_fields(field.payload, inner)) continue;
    for (const ProtoField& f : inner) {
      if (field.number == 3 && f.number == 3 && f.wire == 0) spec.add_dummy_prefix = f.varint != 0;
      if (field.number == 3 && f.number == 5 && f.wire == 0) spec.escape_whitespaces = f.varint != 0;
      if (field.number == 3 && f.number == 2 && f.wire == 2) spec.charsmap = f.payload;
      if (field.number == 2 && f.number == 24 && f.wire == 0) spec.whitespace_as_suffix = f.varint != 0;
    }
  }
  return spec;
}

bool ascii_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Why the normalization rules could treat a space between two ASCII letters or digits otherwise
// than as one space of its own, or "": a rule whose key holds the space next to a letter or digit,
// a rule for " " giving another text, or one for a key ending in a letter or digit giving text that
// ends in a space. Walks every key of the (checked, charsmap_problem) trie; see charsmap_problem
// for its layout.
std::string walk_charsmap_for_cuts(std::string_view blob) {
  const auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(blob[at + k]);
    return v;
  };
  const std::uint32_t trie_bytes = u32(0);
  std::vector<std::uint32_t> unit(trie_bytes / 4);
  for (std::size_t i = 0; i < unit.size(); ++i) unit[i] = u32(4 + 4 * i);
  const std::size_t units = unit.size();
  const std::string_view strings = blob.substr(4 + trie_bytes);
  const auto offset = [](std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  struct Node {
    std::size_t index, depth;
    char last;  // the key's last byte so far
  };
  std::vector<Node> stack{{0, 0, '\0'}};
  while (!stack.empty()) {
    const Node node = stack.back();
    stack.pop_back();
    const std::uint32_t u = unit[node.index];
    const std::size_t base = node.index ^ offset(u);
    if (((u >> 8) & 1) && node.depth > 0) {
      const std::size_t at = unit[base] & 0x7FFFFFFFu;
      const std::string_view value = strings.substr(at, strings.find('\0', at) - at);
      if (node.depth == 1 && node.last == ' ' && value != " ")
        return "its normalization rules turn a space into \"" + shown(value) + "\"";
      if (ascii_alnum(node.last) && !value.empty() && value.back() == ' ')
        return "a normalization rule for a key ending in '" + std::string(1, node.last) +
               "' gives text ending in a space";
    }
    for (unsigned c = 1; c < 256; ++c) {
      const std::size_t child = base ^ c;
      if (child >= units || (unit[child] & 0x800000FFu) != c) continue;
      const char byte = static_cast<char>(c);
      if ((ascii_alnum(node.last) && byte == ' ') || (node.last == ' ' && ascii_alnum(byte)))
        return "a normalization rule's key holds a space next to a letter or digit";
      stack.push_back({child, node.depth + 1, byte});
    }
  }
  return "";
}

// walk_charsmap_for_cuts, once per rule set and process: it takes about 50 ms on nmt_nfkc's rules,
// which every model of that rule set shares.
std::string charsmap_cut_problem(std::string_view blob) {
  if (blob.empty()) return "";
  static std::mutex mutex;
  static std::map<std::string, std::string, std::less<>> walked;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = walked.find(blob);
  if (it == walked.end()) it = walked.emplace(std::string(blob), walk_charsmap_for_cuts(blob)).first;
  return it->second;
}

// "<0x0A>" -> 0x0A; -1 for anything else.
int byte_piece_value(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = piece[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const std::uint32_t v = static_cast<unsigned char>(in[i]) << 16 | static_cast<unsigned char>(in[i + 1]) << 8 |
                            static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kBase64[(v >> s) & 63];
  }
  if (i < in.size()) {
    std::uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kBase64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Strict base64 (padded, no whitespace); on failure, `error` says where.
bool base64_decode(std::string_view in, std::string& out, std::string& error) {
  if (in.size() % 4 != 0) {
    error = "its length " + std::to_string(in.size()) + " is not a multiple of 4";
    return false;
  }
  out.clear();
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    std::uint32_t v = 0;
    int pad = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      int d = -1;
      if (c >= 'A' && c <= 'Z') d = c - 'A';
      if (c >= 'a' && c <= 'z') d = c - 'a' + 26;
      if (c >= '0' && c <= '9') d = c - '0' + 52;
      if (c == '+') d = 62;
      if (c == '/') d = 63;
      const bool last_quad = i + 4 == in.size();
      if (c == '=' && last_quad && k >= 2 && (k == 3 || in[i + 3] == '=')) {
        ++pad;
        d = 0;
      }
      if (d < 0 || (pad > 0 && c != '=')) {
        error = "character " + shown(std::string(1, c)) + " at offset " + std::to_string(i + k) + " is not base64";
        return false;
      }
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    out += static_cast<char>(v >> 16 & 0xFF);
    if (pad < 2) out += static_cast<char>(v >> 8 & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
  }
  return true;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::string serialized_model, const std::string& who,
                                               const std::string& source)
    : serialized_model_(std::move(serialized_model)),
      processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::string problem = model_proto_problem(serialized_model_);
  if (problem.empty()) problem = model_charsmap_problem(serialized_model_);
  if (!problem.empty()) throw Error(who + ": " + source + " is not a SentencePiece model: " + problem);
  const auto status = processor_->LoadFromSerializedProto(serialized_model_);
  if (!status.ok())
    throw Error(who + ": " + source + " is not a valid SentencePiece model; SentencePiece says: " + status.ToString());
  const int n = processor_->GetPieceSize();
  if (n <= 0) throw Error(who + ": " + source + " holds a SentencePiece model without pieces");
  pieces_.resize(static_cast<std::size_t>(n));
  for (int id = 0; id < n; ++id) {
    Piece& p = pieces_[static_cast<std::size_t>(id)];
    p.text = processor_->IdToPiece(id);
    if (processor_->IsControl(id)) {
      p.special = true;
    } else if (processor_->IsUnknown(id)) {
      p.special = true;
      const auto s = processor_->Decode(std::vector<int>{id}, &p.bytes);
      if (!s.ok()) throw Error(who + ": " + source + ": SentencePiece cannot decode its unknown id: " + s.ToString());
    } else if (processor_->IsByte(id) && byte_piece_value(p.text) >= 0) {
      p.bytes = std::string(1, static_cast<char>(byte_piece_value(p.text)));
    } else {
      p.bytes = replace_all(p.text, "\xE2\x96\x81", " ");
    }
    if (p.special && !p.text.empty()) {
      special_texts_.emplace_back(p.text, id);
      special_first_bytes_[static_cast<unsigned char>(p.text[0])] = true;
    }
  }
  std::stable_sort(special_texts_.begin(), special_texts_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  find_cuts();
  const auto special = [](int id) { return id >= 0 ? std::optional<std::int64_t>(id) : std::nullopt; };
  specials_.bos = special(processor_->bos_id());
  specials_.eos = special(processor_->eos_id());
  specials_.pad = special(processor_->pad_id());
  specials_.unk = special(processor_->unk_id());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::find_cuts() {
  const SpaceSpec spec = space_spec(serialized_model_);
  if (spec.whitespace_as_suffix) cut_problem_ = "the model puts its ▁ after words (treat_whitespace_as_suffix)";
  // SentencePiece joins unknown pieces next to each other into one: the space must be a piece.
  const std::string space = spec.escape_whitespaces ? "\xE2\x96\x81" : " ";
  const int space_id = processor_->PieceToId(space);
  if (cut_problem_.empty() && (processor_->IsUnknown(space_id) || processor_->IsControl(space_id)))
    cut_problem_ =
        "it has no piece " + quoted(space) + " (unknown text on both sides of a cut would be one unknown id)";
  for (std::size_t id = 0; id < pieces_.size() && cut_problem_.empty(); ++id) {
    const std::string& p = pieces_[id].text;
    for (std::size_t k = 1; k < p.size() && cut_problem_.empty(); ++k) {
      const bool space = p[k] == ' ' || p.compare(k, 3, "\xE2\x96\x81") == 0;
      const bool after_space = p[k - 1] == ' ' || (k >= 3 && p.compare(k - 3, 3, "\xE2\x96\x81") == 0);
      if (space && !after_space)
        cut_problem_ =
            "its piece " + quoted(p) + " (id " + std::to_string(id) + ") joins a character to the space after it";
    }
  }
  if (cut_problem_.empty()) cut_problem_ = charsmap_cut_problem(spec.charsmap);
  if (!cut_problem_.empty()) return;
  // The same model with add_dummy_prefix the other way round (a later normalizer_spec field 3
  // overrides the model's; protobuf merges the two messages).
  const std::string flip = std::string("\x1A\x02\x18") + (spec.add_dummy_prefix ? '\0' : '\1');
  flipped_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = flipped_->LoadFromSerializedProto(serialized_model_ + flip);
  if (!status.ok()) {
    cut_problem_ = "SentencePiece refuses it with add_dummy_prefix flipped: " + status.ToString();
    return;
  }
  with_prefix_ = spec.add_dummy_prefix ? processor_.get() : flipped_.get();
  without_prefix_ = spec.add_dummy_prefix ? flipped_.get() : processor_.get();
}

void SentencePieceTokenizer::encode_part(const sentencepiece::SentencePieceProcessor& processor, std::string_view part,
                                         TokenIds& out) const {
  std::vector<int> ids;
  const auto status = processor.Encode(part, &ids);
  if (!status.ok()) throw Error("SentencePieceTokenizer::encode: SentencePiece failed: " + status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

// SentencePiece holds 100 to 200 bytes for each byte of the text it encodes, so a long text goes
// to it in parts. A part ends before a space between two ASCII letters or digits; the next part
// starts after that space and is encoded with the dummy-prefix ▁, which stands for it. Where the
// model's pieces and normalization rules never join such a space to a neighbour (find_cuts), the
// ids are those of the whole text: no piece spans the cut, so BPE merges and unigram paths alike
// fall apart there.
void SentencePieceTokenizer::encode_ordinary(std::string_view text, const PartSizes& sizes, TokenIds& out) const {
  const auto space_cut = [&](std::size_t at) {
    return at + 1 < text.size() && text[at] == ' ' && ascii_alnum(text[at - 1]) && ascii_alnum(text[at + 1]);
  };
  if (!cut_problem_.empty()) {
    if (text.size() > sizes.max_run)
      throw Error("SentencePieceTokenizer::encode: a text of " + std::to_string(text.size()) +
                  " bytes is more than this model encodes at once (" + std::to_string(sizes.max_run) +
                  "; SentencePiece holds 100 to 200 bytes for each), and it cannot be cut at spaces without "
                  "changing its ids: " +
                  cut_problem_ + "; split the text into smaller documents");
    encode_part(*processor_, text, out);
    return;
  }
  const sentencepiece::SentencePieceProcessor* processor = processor_.get();
  std::size_t start = 0;
  while (text.size() - start > sizes.part) {
    // The last cut within the part's size, else the first one after it within a run's size.
    std::size_t cut = 0;
    for (std::size_t at = start + sizes.part; at > start && !cut; --at)
      if (space_cut(at)) cut = at;
    const std::size_t run_end = std::min(text.size(), start + sizes.max_run);
    for (std::size_t at = start + sizes.part + 1; at < run_end && !cut; ++at)
      if (space_cut(at)) cut = at;
    if (cut) {
      encode_part(*processor, text.substr(start, cut - start), out);
      start = cut + 1;
      processor = with_prefix_;
      continue;
    }
    if (text.size() - start <= sizes.max_run) break;
    // A run of max_run bytes without such a space (one long word, text without spaces): cut at a
    // character boundary away from whitespace, the next part without the dummy prefix. The ids next
    // to this cut may differ from the whole text's.
    std::size_t at = start + sizes.max_run;
    const auto bad = [&](std::size_t i) {
      return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80 || ascii_space(text[i]) || ascii_space(text[i - 1]);
    };
    for (int k = 0; k < 64 && at > start + 1 && bad(at); ++k) --at;
    while (at > start + 1 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
    encode_part(*processor, text.substr(start, at - start), out);
    start = at;
    processor = without_prefix_;
  }
  encode_part(*processor, text.substr(start), out);
}

TokenIds SentencePieceTokenizer::encode(std::string_view text, SpecialText specials) const {
  return encode_in_parts(text, specials, PartSizes());
}

TokenIds SentencePieceTokenizer::encode_in_parts(std::string_view text, SpecialText specials,
                                                 const PartSizes& sizes) const {
  if (sizes.part == 0 || sizes.max_run < sizes.part)
    throw Error("SentencePieceTokenizer::encode_in_parts: parts of " + std::to_string(sizes.part) +
                " bytes and runs of " + std::to_string(sizes.max_run) +
                " (parts of at least 1 byte, runs at least as long)");
  TokenIds out;
  if (specials != SpecialText::match || special_texts_.empty()) {
    encode_ordinary(text, sizes, out);
    return out;
  }
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (!special_first_bytes_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const auto hit = std::find_if(special_texts_.begin(), special_texts_.end(),
                                  [&](const auto& s) { return text.compare(i, s.first.size(), s.first) == 0; });
    if (hit == special_texts_.end()) {
      ++i;
      continue;
    }
    if (i > start) encode_ordinary(text.substr(start, i - start), sizes, out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) encode_ordinary(text.substr(start), sizes, out);
  return out;
}

std::string SentencePieceTokenizer::decode(const TokenIds& ids) const {
  std::vector<int> narrow(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], i, "SentencePieceTokenizer::decode");
    narrow[i] = static_cast<int>(ids[i]);
  }
  std::string out;
  const auto status = processor_->Decode(narrow, &out);
  if (!status.ok()) throw Error("SentencePieceTokenizer::decode: SentencePiece failed: " + status.ToString());
  return out;
}

std::string SentencePieceTokenizer::token_bytes(std::int64_t id) const {
  check_id(id, 0, "SentencePieceTokenizer::token_bytes");
  return pieces_[static_cast<std::size_t>(id)].bytes;
}

const std::string& SentencePieceTokenizer::piece(std::int64_t id) const {
  check_id(id, 0, "SentencePieceTokenizer::piece");
  return pieces_[static_cast<std::size_t>(id)].text;
}

std::vector<std::string> SentencePieceTokenizer::token_strings(const TokenIds& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) check_id(ids[i], i, "SentencePieceTokenizer::token_strings");
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (std::int64_t id : ids) {
    const Piece& p = pieces_[static_cast<std::size_t>(id)];
    out.push_back(readable_bytes(p.special ? p.text : p.bytes));
  }
  return out;
}

std::string SentencePieceTokenizer::to_json() const {
  return R"({"kind":"sentencepiece","model":")" + base64_encode(serialized_model_) + "\"}";
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_json(std::string_view json,
                                                                          const std::string& who) {
  nlohmann::json doc = xgrad::detail::parse_json(json, who + ": the tokenizer document");
  if (!doc.is_object()) throw Error(who + ": the tokenizer document is not a JSON object");
  if (!doc.contains("kind") || !doc["kind"].is_string() || doc["kind"].get<std::string>() != "sentencepiece")
    throw Error(who + ": field \"kind\" of the tokenizer document must be \"sentencepiece\", got " +
                (doc.contains("kind") ? shown(xgrad::detail::json_excerpt(doc["kind"])) : std::string("nothing")));
  if (!doc.contains("model") || !doc["model"].is_string())
    throw Error(who + ": the tokenizer document has no string field \"model\" (the serialized model, base64)");
  std::string model, error;
  if (!base64_decode(doc["model"].get_ref<const std::string&>(), model, error))
    throw Error(who + ": field \"model\" of the tokenizer document is not base64: " + error);
  return std::make_unique<SentencePieceTokenizer>(std::move(model), who, "field \"model\" of the tokenizer document");
}

std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& path) {
  std::string bytes = read_file(path, "load_sentencepiece", kMaxModelBytes);
  return std::make_unique<SentencePieceTokenizer>(std::move(bytes), "load_sentencepiece", quoted(path));
}

namespace {

// The lines of the files, one after the other, as SentencePiece's own reader (std::getline per
// file) gives them, read through xgrad's ReadableFile. A read error ends the lines with a status
// (never an exception through SentencePiece's code) and is kept in error().
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    try {
      done_ = !next_line();
      if (!done_ && !line_.empty()) ++non_empty_lines_;
    } catch (const std::exception& e) {
      error_ = e.what();
      status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, error_);
      done_ = true;
    }
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  const std::string& error() const { return error_; }
  std::size_t non_empty_lines() const { return non_empty_lines_; }

 private:
  bool next_line() {
    for (;;) {
      if (file_) {
        const std::size_t nl = buffer_.find('\n', pos_);
        if (nl != std::string::npos) {
          line_.assign(buffer_, pos_, nl - pos_);
          pos_ = nl + 1;
          return true;
        }
        buffer_.erase(0, pos_);
        pos_ = 0;
        const std::size_t had = buffer_.size();
        buffer_.resize(had + kChunk);
        const std::size_t got = file_->read_some(&buffer_[had], kChunk);
        buffer_.resize(had + got);
        if (got > 0) continue;
        file_.reset();
        if (!buffer_.empty()) {  // a last line without its newline
          line_.swap(buffer_);
          buffer_.clear();
          return true;
        }
      }
      if (next_file_ == files_.size()) return false;
      file_ = std::make_unique<ReadableFile>(files_[next_file_++], "train_sentencepiece");
    }
  }

  static constexpr std::size_t kChunk = 1 << 20;
  const std::vector<std::string>& files_;
  std::size_t next_file_ = 0;
  std::unique_ptr<ReadableFile> file_;
  std::string buffer_, line_, error_;
  std::size_t pos_ = 0, non_empty_lines_ = 0;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

// One field of SentencePiece's comma-separated lists, quoted as its parser (util::StrSplitAsCSV)
// reads it back: in double quotes, a quote doubled.
std::string csv_field(const std::string& s) { return "\"" + replace_all(s, "\"", "\"\"") + "\""; }

std::string csv(const std::vector<std::string>& fields) {
  std::string out;
  for (const auto& f : fields) out += (out.empty() ? "" : ",") + csv_field(f);
  return out;
}

void check_options(const SentencePieceTrainerOptions& o) {
  const std::string who = "train_sentencepiece: option ";
  if (o.vocab_size() < 1 || o.vocab_size() > static_cast<std::size_t>(INT_MAX))
    throw Error(who + "vocab_size " + std::to_string(o.vocab_size()) + " must be in [1, " + std::to_string(INT_MAX) +
                "]");
  if (o.model_type() != "bpe" && o.model_type() != "unigram")
    throw Error(who + "model_type \"" + shown(o.model_type()) + "\" must be \"bpe\" or \"unigram\"");
  if (!(o.character_coverage() >= 0.98 && o.character_coverage() <= 1.0)) {
    char v[32];
    std::snprintf(v, sizeof v, "%g", o.character_coverage());
    throw Error(who + "character_coverage " + v + " must be in [0.98, 1] (SentencePiece's range)");
  }
  if (o.num_threads() < 1 || o.num_threads() > 128)
    throw Error(who + "num_threads " + std::to_string(o.num_threads()) + " must be in [1, 128]");
  if (o.input_sentence_size() > 0 && o.input_sentence_size() <= 100)
    throw Error(who + "input_sentence_size " + std::to_string(o.input_sentence_size()) +
                " must be 0 (all lines) or more than 100");
  if (o.max_sentence_length() < 10 || o.max_sentence_length() > (1u << 30))
    throw Error(who + "max_sentence_length " + std::to_string(o.max_sentence_length()) + " must be in [10, 2^30]");
  if (o.max_sentencepiece_length() < 1 || o.max_sentencepiece_length() > 512)
    throw Error(who + "max_sentencepiece_length " + std::to_string(o.max_sentencepiece_length()) +
                " must be in [1, 512]");
  static const char* const rules[] = {"nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"};
  if (std::find(std::begin(rules), std::end(rules), o.normalization_rule_name()) == std::end(rules))
    throw Error(who + "normalization_rule_name \"" + shown(o.normalization_rule_name()) +
                "\" must be nmt_nfkc, nfkc, nmt_nfkc_cf, nfkc_cf or identity");
  const long long vocab = static_cast<long long>(o.vocab_size());
  if (o.unk_id() < 0 || o.unk_id() >= vocab)
    throw Error(who + "unk_id " + std::to_string(o.unk_id()) + " must be in [0, vocab_size " + std::to_string(vocab) +
                ") (a model always has an unknown piece)");
  const std::pair<const char*, int> ids[] = {
      {"unk_id", o.unk_id()}, {"bos_id", o.bos_id()}, {"eos_id", o.eos_id()}, {"pad_id", o.pad_id()}};
  for (std::size_t i = 0; i < 4; ++i) {
    if (ids[i].second >= vocab)
      throw Error(who + ids[i].first + " " + std::to_string(ids[i].second) + " must be below vocab_size " +
                  std::to_string(vocab) + " (or negative: none)");
    for (std::size_t j = 0; j < i; ++j)
      if (ids[i].second >= 0 && ids[i].second == ids[j].second)
        throw Error(who + ids[i].first + " " + std::to_string(ids[i].second) + " is also " + ids[j].first);
  }
  std::unordered_map<std::string, std::string> seen;  // piece -> the option naming it
  const std::pair<const char*, const std::string*> pieces[] = {{"unk_piece", &o.unk_piece()},
                                                               {"bos_piece", &o.bos_piece()},
                                                               {"eos_piece", &o.eos_piece()},
                                                               {"pad_piece", &o.pad_piece()}};
  for (const auto& [name, p] : pieces) {
    const std::string at = std::string(name) + " \"" + shown(*p) + "\"";
    if (p->empty() || p->find('\0') != std::string::npos)
      throw Error(who + at + " must be non-empty and hold no NUL byte");
    const auto [it, added] = seen.emplace(*p, name);
    if (!added) throw Error(who + at + " is also " + it->second);
  }
  for (const auto* list : {"user_defined_symbols", "control_symbols"}) {
    const auto& symbols = list[0] == 'u' ? o.user_defined_symbols() : o.control_symbols();
    for (std::size_t i = 0; i < symbols.size(); ++i) {
      const std::string& s = symbols[i];
      const std::string at = std::string(list) + "[" + std::to_string(i) + "] \"" + shown(s) + "\"";
      if (s.empty() || s.find('\0') != std::string::npos)
        throw Error(who + at + " must be non-empty and hold no NUL byte");
      const auto [it, added] = seen.emplace(s, at);
      if (!added) throw Error(who + at + " is also " + it->second);
    }
  }
}

std::string flag(bool b) { return b ? "true" : "false"; }

}  // namespace

void train_sentencepiece(const std::vector<std::string>& input_files, const SentencePieceTrainerOptions& o,
                         const std::string& model_path) {
  check_options(o);
  if (input_files.empty()) throw Error("train_sentencepiece: no input files");
  for (const auto& f : input_files) ReadableFile(f, "train_sentencepiece");  // refuses folders and missing files
  check_writable_file(model_path, "train_sentencepiece");

  char coverage[32];
  std::snprintf(coverage, sizeof coverage, "%.9g", static_cast<double>(static_cast<float>(o.character_coverage())));
  std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type()},
      {"vocab_size", std::to_string(o.vocab_size())},
      {"character_coverage", coverage},
      {"byte_fallback", flag(o.byte_fallback())},
      {"unk_id", std::to_string(o.unk_id())},
      {"bos_id", std::to_string(o.bos_id() < 0 ? -1 : o.bos_id())},
      {"eos_id", std::to_string(o.eos_id() < 0 ? -1 : o.eos_id())},
      {"pad_id", std::to_string(o.pad_id() < 0 ? -1 : o.pad_id())},
      {"unk_piece", o.unk_piece()},
      {"bos_piece", o.bos_piece()},
      {"eos_piece", o.eos_piece()},
      {"pad_piece", o.pad_piece()},
      {"num_threads", std::to_string(o.num_threads())},
      {"input_sentence_size", std::to_string(o.input_sentence_size())},
      {"shuffle_input_sentence", flag(o.shuffle_input_sentence())},
      {"max_sentence_length", std::to_string(o.max_sentence_length())},
      {"max_sentencepiece_length", std::to_string(o.max_sentencepiece_length())},
      {"split_digits", flag(o.split_digits())},
      {"split_by_whitespace", flag(o.split_by_whitespace())},
      {"allow_whitespace_only_pieces", flag(o.allow_whitespace_only_pieces())},
      {"normalization_rule_name", o.normalization_rule_name()},
      {"add_dummy_prefix", flag(o.add_dummy_prefix())},
      {"remove_extra_whitespaces", flag(o.remove_extra_whitespaces())},
      {"hard_vocab_limit", flag(o.hard_vocab_limit())},
      {"minloglevel", o.verbose() ? "0" : "2"},
  };
  if (!o.user_defined_symbols().empty()) args["user_defined_symbols"] = csv(o.user_defined_symbols());
  if (!o.control_symbols().empty()) args["control_symbols"] = csv(o.control_symbols());

  FileLines lines(input_files);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  std::string files;
  for (const auto& f : input_files) files += (files.empty() ? "" : ", ") + quoted(f);
  if (!lines.error().empty()) throw Error(lines.error());
  if (!status.ok() && lines.non_empty_lines() == 0)
    throw Error("train_sentencepiece: " + files + " hold no line of text to train on");
  if (!status.ok())
    throw Error("train_sentencepiece: SentencePiece could not train on " + files + ": " + status.ToString());
  if (model.empty()) throw Error("train_sentencepiece: SentencePiece gave an empty model for " + files);
  write_file_atomically(model_path, model, "train_sentencepiece");
}

}  // namespace xgrad::text
