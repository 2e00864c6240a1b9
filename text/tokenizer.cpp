#include "xgrad/text/tokenizer.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/hf_tokenizer.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"

namespace xgrad::text {

namespace {

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The length of the well-formed UTF-8 sequence starting at s[i], or 0 when none starts there.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;   // no overlong forms
    if (c == 0xED) high = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace

bool operator==(const TokenizerIdentity& a, const TokenizerIdentity& b) {
  return a.kind == b.kind && a.vocab_size == b.vocab_size && a.digest == b.digest;
}
bool operator!=(const TokenizerIdentity& a, const TokenizerIdentity& b) { return !(a == b); }

std::string describe(const TokenizerIdentity& identity) {
  return identity.kind + ", " + std::to_string(identity.vocab_size) + " ids, digest " + identity.digest;
}

std::string readable_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    if (bytes[i] == '\\') {
      out += "\\\\";
      ++i;
      continue;
    }
    const std::size_t n = utf8_sequence_length(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(bytes[i]));
      out += hex;
      ++i;
    }
  }
  return out;
}

void Tokenizer::check_id(std::int64_t id, std::size_t position, const char* who) const {
  if (id < 0 || static_cast<std::uint64_t>(id) >= vocab_size())
    throw Error(std::string(who) + ": id " + std::to_string(id) + " at position " + std::to_string(position) +
                " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ") of this " + kind() +
                " tokenizer");
}

std::string Tokenizer::decode(const TokenIds& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) check_id(ids[i], i, "Tokenizer::decode");
  std::string out;
  for (std::int64_t id : ids) out += token_bytes(id);
  return out;
}

std::vector<std::string> Tokenizer::token_strings(const TokenIds& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) check_id(ids[i], i, "Tokenizer::token_strings");
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (std::int64_t id : ids) out.push_back(readable_bytes(token_bytes(id)));
  return out;
}

TokenizerIdentity Tokenizer::identity() const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(to_json())));
  return {kind(), vocab_size(), hex};
}

TokenIds BytesTokenizer::encode(std::string_view text, SpecialText) const {
  TokenIds ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string BytesTokenizer::token_bytes(std::int64_t id) const {
  check_id(id, 0, "BytesTokenizer::token_bytes");
  return std::string(1, static_cast<char>(id));
}

std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json, const std::string& who) {
  nlohmann::json doc = xgrad::detail::parse_json(json, who + ": the tokenizer document");
  if (!doc.is_object() || !doc.contains("kind") || !doc["kind"].is_string())
    throw Error(who + ": the tokenizer document has no string field \"kind\"");
  const std::string kind = doc["kind"].get<std::string>();
  if (kind == "bytes") return std::make_unique<BytesTokenizer>();
  if (kind == "byte_bpe") return ByteLevelBpe::from_json(json, who);
  if (kind == "sentencepiece") return SentencePieceTokenizer::from_json(json, who);
  if (kind == "hf") return HfTokenizer::from_json(json, who);
  throw Error(who + ": unknown tokenizer kind \"" + readable_bytes(kind) + "\" (bytes, byte_bpe, sentencepiece)");
}

}  // namespace xgrad::text
