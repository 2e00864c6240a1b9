/// @file
/// Reading one component of a Hugging Face tokenizer.json (an object with a "type" and its
/// options) field by field, so that a field nobody read is refused by name: nothing in a file is
/// silently skipped. An internal header of text/.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"

namespace xgrad::text::detail {

using Json = nlohmann::json;

/// Where a component is: the file ("load_hf_tokenizer: 'dir/tokenizer.json'") and the JSON path
/// ("pre_tokenizer.pretokenizers[1]"). Messages read "<file> <path>: ...".
struct JsonPlace {
  std::string file;
  std::string path;
  JsonPlace at(const std::string& key) const { return {file, path.empty() ? key : path + "." + key}; }
  JsonPlace at(std::size_t index) const { return {file, path + "[" + std::to_string(index) + "]"}; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(file + " " + path + ": " + what); }
};

/// The fields of one component object. Each getter marks its field read; done() refuses the
/// first field no getter read (Hugging Face's option xgrad does not implement, or a misspelling).
class HfFields {
 public:
  /// `object` must be a JSON object (else an Error naming the place and the value).
  HfFields(const Json& object, JsonPlace place) : object_(object), place_(std::move(place)) {
    if (!object_.is_object()) place_.fail("is " + xgrad::detail::json_excerpt(object_) + ", not an object");
    read_.insert("type");
  }
  const JsonPlace& place() const { return place_; }
  /// The "type" field ("" when absent).
  std::string type() const {
    const Json* t = find("type");
    if (!t) return "";
    if (!t->is_string()) place_.at("type").fail("is " + xgrad::detail::json_excerpt(*t) + ", not a string");
    return t->get<std::string>();
  }
  /// The field, or nullptr when it is absent or null.
  const Json* optional(const char* key) {
    read_.insert(key);
    return find(key);
  }
  /// The field; absent or null is an Error.
  const Json& required(const char* key) {
    const Json* v = optional(key);
    if (!v) place_.fail("has no field \"" + std::string(key) + "\"");
    return *v;
  }
  std::string string(const char* key) {
    const Json& v = required(key);
    if (!v.is_string()) place_.at(key).fail("is " + xgrad::detail::json_excerpt(v) + ", not a string");
    return v.get<std::string>();
  }
  std::optional<std::string> optional_string(const char* key) {
    const Json* v = optional(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) place_.at(key).fail("is " + xgrad::detail::json_excerpt(*v) + ", not a string");
    return v->get<std::string>();
  }
  bool boolean(const char* key, bool absent) {
    const Json* v = optional(key);
    if (!v) return absent;
    if (!v->is_boolean()) place_.at(key).fail("is " + xgrad::detail::json_excerpt(*v) + ", not true or false");
    return v->get<bool>();
  }
  std::int64_t integer(const char* key, std::int64_t absent) {
    const Json* v = optional(key);
    if (!v) return absent;
    if (!v->is_number_integer()) place_.at(key).fail("is " + xgrad::detail::json_excerpt(*v) + ", not an integer");
    return v->get<std::int64_t>();
  }
  /// A field read only to be checked elsewhere, or one that changes no id and no text (such as
  /// trim_offsets, which moves offsets xgrad does not report).
  void ignore(const char* key) { read_.insert(key); }
  /// Refuses a field xgrad does not implement unless it holds `neutral` (or is absent or null).
  void require_neutral(const char* key, const Json& neutral, const std::string& why) {
    const Json* v = optional(key);
    if (v && *v != neutral)
      place_.at(key).fail("is " + xgrad::detail::json_excerpt(*v) + "; xgrad implements only " + neutral.dump() + " (" +
                          why + ")");
  }
  /// Refuses the first field no getter read.
  void done() const {
    for (auto it = object_.begin(); it != object_.end(); ++it)
      if (!read_.count(it.key()))
        place_.at(it.key()).fail("is a field xgrad does not implement for " +
                                 (type().empty() ? std::string("this component") : "type " + type()) + " (value " +
                                 xgrad::detail::json_excerpt(it.value()) + ")");
  }

 private:
  const Json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& object_;
  JsonPlace place_;
  std::set<std::string> read_;
};

}  // namespace xgrad::text::detail
