/// @file
/// The Unicode operations the tokenizer.json normalizers and pre-tokenizers run on valid UTF-8
/// text (an internal header of text/): reading a code point, the character properties they split
/// on, Unicode normalization and lowercasing (ICU), and the removal of combining marks.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace xgrad::text::detail {

/// The code point that starts at `text[at]` (valid UTF-8), and `at` moved past it.
inline char32_t next_code_point(std::string_view text, std::size_t& at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return at += 1, lead;
  if (lead < 0xE0) return at += 2, ((lead & 0x1Fu) << 6) | (byte(at - 1) & 0x3Fu);
  if (lead < 0xF0) return at += 3, ((lead & 0x0Fu) << 12) | ((byte(at - 2) & 0x3Fu) << 6) | (byte(at - 1) & 0x3Fu);
  at += 4;
  return ((lead & 0x07u) << 18) | ((byte(at - 3) & 0x3Fu) << 12) | ((byte(at - 2) & 0x3Fu) << 6) |
         (byte(at - 1) & 0x3Fu);
}

/// The number of bytes of the UTF-8 character whose lead byte is `lead` (1 for a byte that leads
/// none, so that a walk over bytes that are not UTF-8 still ends).
inline std::size_t utf8_length(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  return 1;
}

/// `c` in UTF-8, appended to `out`.
void append_utf8(std::string& out, char32_t c);

/// Unicode's White_Space property (Rust's char::is_whitespace, Oniguruma's \s): U+0009-000D,
/// U+0020, U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000.
inline bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

/// The bytes of White_Space at the start / end of `text` (Rust's str::trim_start / trim_end).
std::size_t leading_white_space(std::string_view text);
std::size_t trailing_white_space(std::string_view text);

/// Rust's char::is_numeric: the general categories Nd, Nl and No.
bool is_numeric(char32_t c);
/// Rust's tokenizers' punctuation (pre_tokenizers/punctuation.rs is_punc): ASCII punctuation
/// (which holds the symbols $+<=>^`|~) or a general category P*.
bool is_punctuation(char32_t c);
/// Rust regex's \w (Unicode's UTS #18 word class): Alphabetic, M*, Nd, Pc or Join_Control.
bool is_regex_word(char32_t c);

/// The four Unicode normalization forms.
enum class UnicodeForm { nfc, nfd, nfkc, nfkd };
/// `text` in the form (ICU; text already in it, such as ASCII, comes back as it is, checked fast).
std::string unicode_normalize(std::string text, UnicodeForm form);

/// Each code point replaced by its full lowercase mapping without context (Rust's
/// char::to_lowercase, which tokenizers' Lowercase applies one character at a time: "Σ" is always
/// "σ", even at the end of a word, and "İ" is "i̇").
std::string unicode_lowercase(std::string text);

/// `text` without its combining marks (general category M: Mn, Mc, Me).
std::string remove_marks(std::string text);

}  // namespace xgrad::text::detail
