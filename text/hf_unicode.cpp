// The Unicode side of the tokenizer.json pipeline: invalid UTF-8 replaced as a WHATWG decoder does,
// JavaScript's and Unicode's whitespace, character properties, normalization forms, lowercasing and
// mark removal (ICU for the tables).
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"

namespace xgrad::text::detail {

namespace {

bool all_ascii(std::string_view text) {
  for (const char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// JavaScript's WhiteSpace and LineTerminator (String.prototype.trim): White_Space without U+0085,
// plus U+FEFF.
bool is_js_space(char32_t c) { return c == 0xFEFF || (c != 0x85 && is_white_space(c)); }

// The code point that ends at text[end - 1] (valid UTF-8), and `end` moved to its first byte.
char32_t previous_code_point(std::string_view text, std::size_t& end) {
  std::size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  std::size_t at = begin;
  const char32_t c = next_code_point(text, at);
  end = begin;
  return c;
}

template <typename Predicate>
std::size_t leading(std::string_view text, Predicate in_set) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t next = at;
    if (!in_set(next_code_point(text, next))) break;
    at = next;
  }
  return at;
}

template <typename Predicate>
std::size_t trailing(std::string_view text, Predicate in_set) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t begin = end;
    if (!in_set(previous_code_point(text, begin))) break;
    end = begin;
  }
  return text.size() - end;
}

std::uint32_t category_mask(char32_t c) { return U_MASK(u_charType(static_cast<UChar32>(c))); }

const icu::Normalizer2& normalizer_of(UnicodeForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case UnicodeForm::nfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case UnicodeForm::nfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case UnicodeForm::nfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case UnicodeForm::nfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || !n)
    throw Error(std::string("ICU could not load its normalization data: ") + u_errorName(status));
  return *n;
}

}  // namespace

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The WHATWG UTF-8 decoder (encoding.spec.whatwg.org, "UTF-8 decoder"): a lead byte fixes how
// many continuation bytes follow and the range the first of them must be in (E0: A0-BF, no
// overlong; ED: 80-9F, no surrogate; F0: 90-BF; F4: 80-8F, nothing past U+10FFFF). At the first
// byte that does not fit, the bytes so far are one U+FFFD and that byte is read again as a lead.
std::string replace_invalid_utf8(std::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  std::size_t at = 0;
  while (at < bytes.size()) {
    const unsigned char lead = static_cast<unsigned char>(bytes[at]);
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++at;
      continue;
    }
    std::size_t continuations = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      continuations = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuations = 2;
      if (lead == 0xE0) lower = 0xA0;
      if (lead == 0xED) upper = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuations = 3;
      if (lead == 0xF0) lower = 0x90;
      if (lead == 0xF4) upper = 0x8F;
    } else {  // 80-C1 (a continuation or an overlong two-byte lead) and F5-FF lead nothing
      out += kReplacement;
      ++at;
      continue;
    }
    std::size_t end = at + 1;
    bool complete = true;
    for (std::size_t k = 0; k < continuations; ++k, ++end) {
      const unsigned char b = end < bytes.size() ? static_cast<unsigned char>(bytes[end]) : 0;
      if (end >= bytes.size() || b < lower || b > upper) {
        complete = false;
        break;
      }
      lower = 0x80;
      upper = 0xBF;
    }
    if (complete) {
      out.append(bytes.data() + at, end - at);
    } else {
      out += kReplacement;
    }
    at = end;
  }
  return out;
}

std::size_t leading_js_space(std::string_view text) { return leading(text, is_js_space); }
std::size_t trailing_js_space(std::string_view text) { return trailing(text, is_js_space); }
std::size_t leading_white_space(std::string_view text) { return leading(text, is_white_space); }
std::size_t trailing_white_space(std::string_view text) { return trailing(text, is_white_space); }

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return (category_mask(c) & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK)) != 0;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
  return (category_mask(c) & U_GC_P_MASK) != 0;
}

bool is_regex_word(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const auto code = static_cast<UChar32>(c);
  return (category_mask(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(code, UCHAR_ALPHABETIC) || u_hasBinaryProperty(code, UCHAR_JOIN_CONTROL);
}

std::string unicode_normalize(std::string text, UnicodeForm form) {
  if (all_ascii(text)) return text;  // ASCII is in every form
  const icu::Normalizer2& normalizer = normalizer_of(form);
  UErrorCode status = U_ZERO_ERROR;
  const icu::StringPiece piece(text.data(), static_cast<std::int32_t>(text.size()));
  if (normalizer.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return text;
  status = U_ZERO_ERROR;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  icu::StringByteSink<std::string> sink(&out);
  normalizer.normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU could not normalize a text: ") + u_errorName(status));
  return out;
}

std::string unicode_lowercase(std::string text) {
  std::size_t at = 0;
  while (at < text.size() && static_cast<unsigned char>(text[at]) < 0x80) {
    if (text[at] >= 'A' && text[at] <= 'Z') text[at] = static_cast<char>(text[at] + ('a' - 'A'));
    ++at;
  }
  if (at == text.size()) return text;
  std::string out = text.substr(0, at);
  out.reserve(text.size() + 8);
  while (at < text.size()) {
    const char32_t c = next_code_point(text, at);
    if (c == 0x130) {  // SpecialCasing.txt's one unconditional lowercase of two code points
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))));
  }
  return out;
}

std::string remove_marks(std::string text) {
  if (all_ascii(text)) return text;
  std::string out;
  out.reserve(text.size());
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t begin = at;
    const char32_t c = next_code_point(text, at);
    if (c < 0x300 || (category_mask(c) & U_GC_M_MASK) == 0) out.append(text, begin, at - begin);
  }
  return out;
}

}  // namespace xgrad::text::detail
