#include <algorithm>

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "xgrad/text/detail/hf_added_tokens.hpp"
#include "xgrad/text/detail/hf_components.hpp"

namespace xgrad::text::detail {

namespace {

// Rust regex's \w, which single_word tests: Alphabetic, marks, decimal digits, connector
// punctuation and the joiners.
bool is_word_character(UChar32 c) {
  if (c < 0) return false;
  constexpr std::uint32_t mask = U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK;
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(c) & mask) != 0 ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

bool word_before(std::string_view text, std::size_t at) {
  if (at == 0) return false;
  UChar32 c;
  auto i = static_cast<std::int32_t>(at);
  U8_PREV(reinterpret_cast<const std::uint8_t*>(text.data()), 0, i, c);
  return is_word_character(c);
}

bool word_after(std::string_view text, std::size_t at) {
  if (at >= text.size()) return false;
  UChar32 c;
  auto i = static_cast<std::int32_t>(at);
  U8_NEXT(reinterpret_cast<const std::uint8_t*>(text.data()), i, static_cast<std::int32_t>(text.size()), c);
  return is_word_character(c);
}

}  // namespace

int HfAddedTokenMatcher::child(int node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  const auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, 0),
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return it != children.end() && it->first == byte ? it->second : -1;
}

void HfAddedTokenMatcher::add(std::string_view text, int token) {
  starts_[static_cast<unsigned char>(text[0])] = true;
  int node = 0;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    int next = child(node, byte);
    if (next < 0) {
      next = static_cast<int>(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[node].children;
      children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, 0),
                                       [](const auto& a, const auto& b) { return a.first < b.first; }),
                      {byte, next});
    }
    node = next;
  }
  nodes_[node].token = token;
  if (texts_.size() <= static_cast<std::size_t>(token)) texts_.resize(token + 1);
  texts_[token] = std::string(text);
}

std::vector<HfSection> HfAddedTokenMatcher::split(std::string_view text,
                                                  const std::vector<HfAddedToken>& tokens) const {
  std::vector<HfSection> sections;
  std::size_t plain = 0;  // where the current plain section began
  for (std::size_t at = 0; at < text.size();) {
    if (!starts_[static_cast<unsigned char>(text[at])]) {
      ++at;
      continue;
    }
    int node = 0, found = -1;
    std::size_t found_end = 0;
    for (std::size_t i = at; i < text.size(); ++i) {
      node = child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = i + 1;
      }
    }
    if (found < 0) {
      ++at;
      continue;
    }
    // A single_word match touching a word character is passed over, as a whole (the search goes on
    // after it, as tokenizers' non-overlapping match iterator does).
    if (tokens[found].single_word && (word_before(text, at) || word_after(text, found_end))) {
      at = found_end;
      continue;
    }
    if (at > plain) sections.push_back({text.substr(plain, at - plain), -1});
    sections.push_back({text.substr(at, found_end - at), found});
    at = plain = found_end;
  }
  if (plain < text.size()) sections.push_back({text.substr(plain), -1});
  for (std::size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].token < 0) continue;
    const HfAddedToken& t = tokens[sections[i].token];
    if (t.lstrip && i > 0 && sections[i - 1].token < 0) {
      std::string_view& before = sections[i - 1].text;
      before.remove_suffix(trailing_js_space(before));
    }
    if (t.rstrip && i + 1 < sections.size() && sections[i + 1].token < 0) {
      std::string_view& after = sections[i + 1].text;
      after.remove_prefix(leading_js_space(after));
    }
  }
  return sections;
}

}  // namespace xgrad::text::detail
