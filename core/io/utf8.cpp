// UTF-8 validation (RFC 3629) and byte escaping for messages.
#include "xgrad/core/io/utf8.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "xgrad/core/error.hpp"

namespace xgrad {

std::optional<std::size_t> first_invalid_utf8(std::string_view s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    if (i + 8 <= s.size()) {  // eight ASCII bytes at a time, the common case
      std::uint64_t word;
      std::memcpy(&word, s.data() + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char lead = byte(i);
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      len = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      len = 3;
      if (lead == 0xE0) lo = 0xA0;  // no overlong three-byte forms
      if (lead == 0xED) hi = 0x9F;  // no surrogates U+D800..U+DFFF
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      len = 4;
      if (lead == 0xF0) lo = 0x90;  // no overlong four-byte forms
      if (lead == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return i;
    }
    i += len;
  }
  return std::nullopt;
}

std::string escape_bytes(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F && b != '\\') {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  }
  return out;
}

void check_utf8(std::string_view s, const char* who, const char* what) {
  const auto bad = first_invalid_utf8(s);
  if (!bad) return;
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned char>(s[*bad]));
  fail(who, ": ", what, " \"", escape_bytes(s), "\" is not valid UTF-8 (byte ", buf, " at offset ", *bad, ")");
}

}  // namespace xgrad
