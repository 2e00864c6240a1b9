#include "xgrad/text/gpt2_byte_encoding.hpp"

#include <array>
#include <cstdint>

namespace xgrad::text {

namespace {

struct ByteTable {
  std::array<char32_t, 256> code_of_byte{};
  std::array<std::int16_t, 324> byte_of_code{};  // -1 where no byte maps to the code point

  ByteTable() {
    byte_of_code.fill(-1);
    const auto kept = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t code = kept(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      code_of_byte[b] = code;
      byte_of_code[code] = static_cast<std::int16_t>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

}  // namespace

std::string gpt2_printable_from_bytes(std::string_view bytes) {
  const ByteTable& t = table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    const char32_t c = t.code_of_byte[b];
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {  // every code point of the table is below U+0800: two bytes
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

std::optional<std::string> gpt2_bytes_from_printable(std::string_view printable) {
  const ByteTable& t = table();
  std::string out;
  out.reserve(printable.size());
  for (std::size_t i = 0; i < printable.size();) {
    const auto c0 = static_cast<unsigned char>(printable[i]);
    char32_t code = 0;
    if (c0 < 0x80) {
      code = c0;
      i += 1;
    } else if (c0 >= 0xC2 && c0 <= 0xDF && i + 1 < printable.size() &&
               (static_cast<unsigned char>(printable[i + 1]) & 0xC0) == 0x80) {
      code = (static_cast<char32_t>(c0 & 0x1F) << 6) | (static_cast<unsigned char>(printable[i + 1]) & 0x3F);
      i += 2;
    } else {
      return std::nullopt;  // not UTF-8, or a character past U+07FF: outside the table
    }
    if (code >= t.byte_of_code.size() || t.byte_of_code[code] < 0) return std::nullopt;
    out += static_cast<char>(t.byte_of_code[code]);
  }
  return out;
}

}  // namespace xgrad::text
