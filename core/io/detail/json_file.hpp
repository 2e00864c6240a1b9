// JSON files the library reads (Hugging Face's config.json and index, SAELens's cfg.json): one
// object read and parsed with nlohmann::json, errors naming the file; and values cut short for
// messages. Internal: nlohmann::json is the library's private dependency.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace xgrad::detail {

// A JSON value for a message, cut short.
inline std::string json_shown(const nlohmann::json& value) {
  std::string text = value.dump();
  return text.size() > 120 ? text.substr(0, 117) + "..." : text;
}

// The object in the file at `path` (at most max_bytes); anything else is an Error naming the file.
inline nlohmann::json read_json_object(const std::string& path, const char* who, std::uint64_t max_bytes) {
  const std::string text = read_file(path, who, max_bytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(who, ": '", path, "' is not JSON: ", e.what());
  }
  if (!j.is_object()) fail(who, ": '", path, "' holds a JSON ", j.type_name(), ", not an object");
  return j;
}

}  // namespace xgrad::detail
