/// @file
/// A JSON value as a message may quote it: nlohmann's dump() recurses once per level of nesting,
/// so a hostile file of a million nested brackets would overflow the stack while an error message
/// is being written. json_excerpt walks the value without recursion first.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace xgrad::text::detail {

/// `value.dump()` cut to `max_chars` (with "..."), when the value nests at most 16 levels and holds
/// at most 1000 values; otherwise "an array of N elements" / "an object of N fields".
template <class Json>
std::string json_excerpt(const Json& value, std::size_t max_chars = 200) {
  constexpr std::size_t kMaxDepth = 16, kMaxValues = 1000;
  bool small = true;
  std::size_t visited = 0;
  std::vector<std::pair<const Json*, std::size_t>> stack{{&value, 1}};
  while (!stack.empty() && small) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (++visited > kMaxValues || depth > kMaxDepth) small = false;
    if (v->is_structured() && small)
      for (const auto& child : *v) stack.emplace_back(&child, depth + 1);
  }
  if (!small)
    return value.is_array() ? "an array of " + std::to_string(value.size()) + " elements"
                            : "an object of " + std::to_string(value.size()) + " fields";
  std::string text = value.dump();
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

}  // namespace xgrad::text::detail
