// The one reader of JSON that comes from a file (config.json, index files, cfg.json,
// tokenizer documents, checkpoint metadata): nesting bounded before nlohmann::json builds the
// value, parse errors cut short, and values quoted in messages as bounded excerpts. nlohmann's
// copy, comparison and dump() recurse once per level, so a file of a million nested brackets
// would otherwise overflow the stack in whatever step touches the value next.
// Internal: nlohmann::json is a private dependency of the libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::detail {

// Deeper than any file the library reads (tokenizer.json nests 6 levels).
inline constexpr std::size_t kMaxJsonDepth = 64;

// The offset of the first '[' or '{' (outside strings) that opens level max_depth + 1, or npos.
inline std::size_t json_too_deep_at(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

// nlohmann's words for a parse error without its "[json.exception.parse_error.101] " tag, cut:
// it quotes the token read, which may be a number of 10,000 digits or bytes that are not UTF-8.
inline std::string json_error_text(const std::exception& e) {
  std::string what = e.what();
  if (what.compare(0, 1, "[") == 0 && what.find("] ") != std::string::npos) what.erase(0, what.find("] ") + 2);
  if (what.size() > 160) what = what.substr(0, 160) + "...";
  return escape_bytes(what);
}

// The JSON value in `text`. `source` begins every message ("load_llama: 'dir/config.json'",
// "reader: the tokenizer document"). `callback` is nlohmann's parser callback, if any.
inline nlohmann::json parse_json(std::string_view text, const std::string& source,
                                 const nlohmann::json::parser_callback_t& callback = nullptr) {
  if (const std::size_t at = json_too_deep_at(text, kMaxJsonDepth); at != std::string_view::npos) {
    fail(source, " nests arrays and objects deeper than ", kMaxJsonDepth, " levels (byte ", at, ")");
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    fail(source, " is not JSON: ", json_error_text(e));
  }
}

// The object in the file at `path` (at most max_bytes); anything else is an Error naming the file.
inline nlohmann::json read_json_object(const std::string& path, const char* who, std::uint64_t max_bytes) {
  const std::string source = std::string(who) + ": '" + path + "'";
  nlohmann::json j = parse_json(read_file(path, who, max_bytes), source);
  if (!j.is_object()) fail(source, " holds a JSON ", j.type_name(), ", not an object");
  return j;
}

// A JSON value as a message quotes it: its text cut to max_chars (bytes that are not UTF-8
// replaced) when it nests at most 16 levels and holds at most 1000 values, otherwise "an array of
// N elements" or "an object of N fields". Bounded work for any value.
inline std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = 120) {
  constexpr std::size_t kMaxDepth = 16, kMaxValues = 1000;
  bool small = true;
  std::size_t visited = 0;
  std::vector<std::pair<const nlohmann::json*, std::size_t>> stack{{&value, 1}};
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
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) {
    std::size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    text = text.substr(0, cut) + "...";
  }
  return text;
}

}  // namespace xgrad::detail
