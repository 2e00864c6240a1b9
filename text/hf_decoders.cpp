// tokenizer.json's decoders: the tokens' strings back to the pieces of the text. The semantics are
// those of Hugging Face's JavaScript tokenizers (@huggingface/tokenizers 0.2.0, src/core/decoder/),
// which are Rust's (tokenizers/src/decoders/) except where a comment says which one is followed.
// Every decoder keeps `added` beside `tokens`: one flag per token, true for an added token.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"

namespace xgrad::text::detail {

namespace {

using Tokens = std::vector<std::string>;
using Flags = std::vector<bool>;

// A string of the file as a message quotes it (bounded, bytes that are not UTF-8 replaced).
std::string quoted(const std::string& text) { return xgrad::detail::json_excerpt(Json(text)); }

// The number of characters of UTF-8 `text`.
std::size_t character_count(std::string_view text) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < text.size(); i += utf8_length(static_cast<unsigned char>(text[i]))) ++count;
  return count;
}

// The field `key`, which must be a string of exactly one character (Rust reads it as a `char`).
std::string one_character(HfFields& fields, const char* key, const std::optional<std::string>& absent) {
  const std::optional<std::string> value = fields.optional_string(key);
  if (!value && !absent) fields.place().fail("has no field \"" + std::string(key) + "\"");
  const std::string text = value ? *value : *absent;
  if (character_count(text) != 1)
    fields.place().at(key).fail("is " + quoted(text) + "; it must be exactly one character");
  return text;
}

// `added` as long as `tokens` (a missing flag is false), so that no decoder reads past it.
void match_flags(const Tokens& tokens, Flags& added) { added.resize(tokens.size(), false); }

// Each run of tokens that `bytes_of` gives bytes for becomes one token, the run's bytes decoded with
// U+FFFD for each maximal ill-formed subpart (the JS's TextDecoder); every other token passes
// through as it is, with its flag.
template <typename BytesOf>
void join_byte_runs(Tokens& tokens, Flags& added, BytesOf bytes_of) {
  match_flags(tokens, added);
  Tokens out;
  Flags out_added;
  std::string run;
  bool in_run = false;
  const auto end_run = [&] {
    if (!in_run) return;
    out.push_back(replace_invalid_utf8(run));
    out_added.push_back(false);
    run.clear();
    in_run = false;
  };
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (const std::optional<std::string> bytes = bytes_of(tokens[i], added[i])) {
      run += *bytes;
      in_run = true;
      continue;
    }
    end_run();
    out.push_back(std::move(tokens[i]));
    out_added.push_back(added[i]);
  }
  end_run();
  tokens = std::move(out);
  added = std::move(out_added);
}

// ByteLevel: each run of tokens that are not added tokens is joined, its characters mapped back to
// the bytes GPT-2's table prints them as; an added token passes through as it is (JS's ByteLevel
// decoder). A token with a character outside the table gives its own UTF-8 bytes, as Rust's does
// (pre_tokenizers/byte_level.rs, decode_chain); the JS maps such a character to the byte 0.
class ByteLevelDecoder : public HfDecoder {
 public:
  void decode_chain(Tokens& tokens, Flags& added) const override {
    join_byte_runs(tokens, added, [](const std::string& token, bool is_added) -> std::optional<std::string> {
      if (is_added) return std::nullopt;
      std::optional<std::string> bytes = gpt2_bytes_from_printable(token);
      return bytes ? bytes : token;
    });
  }
};

// The byte of a token "<0xNN>" (exactly 6 characters, two hexadecimal digits of either case), or -1.
// The JS reads the two characters with parseInt, which also takes "<0x1z>" as 0x01 and "<0x 1>",
// "<0x+1>" as 1; xgrad takes two hexadecimal digits only.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = digit(token[3]), low = digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

// ByteFallback: each run of "<0xNN>" tokens becomes one token, its bytes decoded with U+FFFD for
// each maximal ill-formed subpart (the JS's TextDecoder). Rust writes one U+FFFD per byte of a run
// that is not all UTF-8 (decoders/byte_fallback.rs); xgrad follows the JS. The JS's TextDecoder also
// drops a byte order mark at the start of a run; xgrad keeps it, as Rust does.
class ByteFallbackDecoder : public HfDecoder {
 public:
  void decode_chain(Tokens& tokens, Flags& added) const override {
    join_byte_runs(tokens, added, [](const std::string& token, bool) -> std::optional<std::string> {
      const int byte = fallback_byte(token);
      if (byte < 0) return std::nullopt;
      return std::string(1, static_cast<char>(byte));
    });
  }
};

// Fuse: all tokens joined into one (an added token only when it was the one token).
class FuseDecoder : public HfDecoder {
 public:
  void decode_chain(Tokens& tokens, Flags& added) const override {
    match_flags(tokens, added);
    const bool one_added = tokens.size() == 1 && added[0];
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
    added.assign(1, one_added);
  }
};

// Strip: up to `start` leading and up to `stop` trailing characters equal to `content` removed
// from each token, counted in characters. When the two cuts cross the token becomes "" (the JS's
// slice; Rust would panic).
class StripDecoder : public HfDecoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(Tokens& tokens, Flags& added) const override {
    match_flags(tokens, added);
    for (std::string& token : tokens) {
      const std::string_view text = token;
      std::size_t begin = 0;
      for (std::size_t n = 0; n < start_ && text.substr(begin).compare(0, content_.size(), content_) == 0; ++n)
        begin += content_.size();
      std::size_t end = text.size();
      for (std::size_t n = 0;
           n < stop_ && end >= content_.size() && text.compare(end - content_.size(), content_.size(), content_) == 0;
           ++n)
        end -= content_.size();
      token = end > begin ? token.substr(begin, end - begin) : std::string();
    }
  }

 private:
  std::string content_;  // one character
  std::size_t start_, stop_;
};

// `text` with every non-overlapping occurrence of `pattern` (not empty), left to right, replaced by
// `content`.
std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content) {
  std::string out;
  std::size_t from = 0;
  for (std::size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, from)) {
    out.append(text, from, at - from);
    out += content;
    from = at + pattern.size();
  }
  out.append(text, from, std::string::npos);
  return out;
}

// Replace {"String": pattern}: each occurrence of the pattern in each token replaced by `content`.
class ReplaceDecoder : public HfDecoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(Tokens& tokens, Flags& added) const override {
    match_flags(tokens, added);
    for (std::string& token : tokens) token = replace_all(token, pattern_, content_);
  }

 private:
  std::string pattern_, content_;
};

// Metaspace: the replacement character back to a space in every token, and the first token's
// leading space removed (the JS's decoder) unless the prepend_scheme is "never" (then nothing is
// removed, as in Rust). Rust drops every replacement character of the first token, not one leading
// space (pre_tokenizers/metaspace.rs, decode_chain); with the scheme "always" or "first" xgrad
// follows the JS, which ignores the scheme.
class MetaspaceDecoder : public HfDecoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(Tokens& tokens, Flags& added) const override {
    match_flags(tokens, added);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(tokens[i], replacement_, " ");
      if (i == 0 && strip_first_ && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
    }
  }

 private:
  std::string replacement_;  // one character
  bool strip_first_;
};

class SequenceDecoder : public HfDecoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<HfDecoder>> decoders) : decoders_(std::move(decoders)) {}
  void decode_chain(Tokens& tokens, Flags& added) const override {
    for (const auto& decoder : decoders_) decoder->decode_chain(tokens, added);
  }

 private:
  std::vector<std::unique_ptr<HfDecoder>> decoders_;
};

std::size_t count_field(HfFields& fields, const char* key) {
  const std::int64_t value = fields.integer(key, 0);
  if (value < 0) fields.place().at(key).fail("is " + std::to_string(value) + ", not a count of characters");
  return static_cast<std::size_t>(value);
}

std::unique_ptr<HfDecoder> make_decoder(HfFields& fields) {
  const std::string type = fields.type();
  const JsonPlace& place = fields.place();
  if (type == "ByteLevel") {
    // The pre-tokenizer's options, stored with the decoder too; none changes the decoded text.
    fields.boolean("add_prefix_space", false);
    fields.boolean("trim_offsets", false);
    fields.boolean("use_regex", false);
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    std::string content = one_character(fields, "content", std::nullopt);
    const std::size_t start = count_field(fields, "start"), stop = count_field(fields, "stop");
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  if (type == "Replace") {
    const Json& pattern = fields.required("pattern");
    HfFields pattern_fields(pattern, place.at("pattern"));
    if (pattern_fields.optional("Regex"))
      place.at("pattern").at("Regex").fail(
          "is a regular expression; xgrad's Replace decoder implements only {\"String\": ...} patterns");
    std::string literal = pattern_fields.string("String");
    pattern_fields.done();
    if (literal.empty()) place.at("pattern").at("String").fail("is \"\"; a Replace decoder needs a pattern to find");
    return std::make_unique<ReplaceDecoder>(std::move(literal), fields.string("content"));
  }
  if (type == "Metaspace") {
    std::string replacement = one_character(fields, "replacement", std::string("\xE2\x96\x81"));  // ▁, the JS's default
    const std::optional<std::string> scheme = fields.optional_string("prepend_scheme");
    if (scheme && *scheme != "always" && *scheme != "first" && *scheme != "never")
      place.at("prepend_scheme").fail("is " + quoted(*scheme) + ", not \"always\", \"first\" or \"never\"");
    // Files older than prepend_scheme say add_prefix_space; false means "never" (Rust refuses false
    // beside a scheme other than "never", and so does xgrad).
    bool never = scheme && *scheme == "never";
    const Json* add_prefix_space = fields.optional("add_prefix_space");
    if (add_prefix_space && !add_prefix_space->is_boolean())
      place.at("add_prefix_space").fail("is " + xgrad::detail::json_excerpt(*add_prefix_space) + ", not true or false");
    if (add_prefix_space && !add_prefix_space->get<bool>()) {
      if (scheme && !never)
        place.at("add_prefix_space")
            .fail("is false but prepend_scheme is " + quoted(*scheme) + " (false means \"never\")");
      never = true;
    }
    fields.boolean("split", true);      // splitting is the pre-tokenizer's; decoding ignores it
    fields.optional_string("str_rep");  // older files' copy of the replacement; Rust ignores it
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), !never);
  }
  if (type == "Sequence") {
    const Json& list = fields.required("decoders");
    if (!list.is_array()) place.at("decoders").fail("is " + xgrad::detail::json_excerpt(list) + ", not an array");
    std::vector<std::unique_ptr<HfDecoder>> decoders;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) place.at("decoders").at(i).fail("is null, not a decoder");
      decoders.push_back(make_hf_decoder(list[i], place.at("decoders").at(i)));
    }
    return std::make_unique<SequenceDecoder>(std::move(decoders));
  }
  if (type == "WordPiece" || type == "BPEDecoder" || type == "CTC")
    place.at("type").fail("is " + quoted(type) + ", a decoder xgrad does not implement");
  if (type.empty()) place.fail("has no \"type\"; xgrad reads decoders by their type");
  place.at("type").fail("is " + quoted(type) + ", not a decoder type of tokenizer.json");
}

}  // namespace

std::unique_ptr<HfDecoder> make_hf_decoder(const Json& json, const JsonPlace& place) {
  if (json.is_null()) return nullptr;
  HfFields fields(json, place);
  std::unique_ptr<HfDecoder> decoder = make_decoder(fields);
  fields.done();
  return decoder;
}

}  // namespace xgrad::text::detail
