// Little-endian byte strings for building safetensors files by hand in the checkpoint tests,
// independent of the host's byte order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace xgrad::testing {

inline std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

inline std::uint64_t read_u64_le(const std::string& s, std::size_t at = 0) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// float32 bytes from the bit pattern.
inline std::string f32_le(const std::vector<float>& values) {
  std::string s;
  for (float f : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  return s;
}

}  // namespace xgrad::testing
