// tokenizer.json's pre-tokenizers with the semantics of Hugging Face's Rust tokenizers
// (tokenizers/src/pre_tokenizers/*.rs and NormalizedString::split in tokenizer/normalizer.rs),
// which its JavaScript port simplifies: every SplitDelimiterBehavior, Metaspace's split, Digits
// on every numeric character, Punctuation's behavior. A field Rust requires is required here too;
// a field xgrad does not read is refused by name.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"

namespace xgrad::text::detail {

namespace {

constexpr int kMaxNesting = 64;  // Sequences in Sequences (the JSON reader stops at 64 levels)

// GPT-2's pattern, which ByteLevel splits by (pre_tokenizers/byte_level.rs RE).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A stretch of a piece, and whether the pattern matched it.
struct Segment {
  std::size_t begin, end;
  bool match;
};

// tokenizer/pattern.rs `impl Pattern for &SysRegex`: the matches with the stretches between them.
void segments_of_matches(const std::vector<std::pair<std::size_t, std::size_t>>& matches, std::size_t size,
                         std::vector<Segment>& out) {
  std::size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) out.push_back({previous, begin, false});
    out.push_back({begin, end, true});
    previous = end;
  }
  if (previous != size) out.push_back({previous, size, false});
}

// tokenizer/pattern.rs `impl Pattern for F: Fn(char) -> bool`: each character that holds is a
// match of its own; the runs between them are not.
template <typename Predicate>
void segments_of_characters(std::string_view text, Predicate holds, std::vector<Segment>& out) {
  std::size_t run = 0, at = 0;
  while (at < text.size()) {
    const std::size_t begin = at;
    if (holds(next_code_point(text, at))) {
      if (run < begin) out.push_back({run, begin, false});
      out.push_back({begin, at, true});
      run = at;
    }
  }
  if (run < text.size()) out.push_back({run, text.size(), false});
}

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior behavior_of(const std::string& name, const JsonPlace& place) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  place.fail("is \"" + name + "\", not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// tokenizer/normalizer.rs NormalizedString::split: the stretches each behavior keeps, in order
// (the empty ones are dropped by the caller, as PreTokenizedString::split does).
void apply_behavior(std::vector<Segment>& segments, Behavior behavior) {
  std::vector<Segment> kept;
  kept.reserve(segments.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::isolated:
      return;
    case Behavior::removed:
      for (const Segment& s : segments)
        if (!s.match) kept.push_back(s);
      break;
    case Behavior::contiguous:  // runs of matches, and runs of the rest, each one stretch
      for (const Segment& s : segments) {
        if (s.match == previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.match;
      }
      break;
    case Behavior::merged_with_previous:  // a match joins the stretch before it
      for (const Segment& s : segments) {
        if (s.match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous_match = s.match;
      }
      break;
    case Behavior::merged_with_next:  // a match joins the stretch after it (Rust folds from the end)
      for (auto s = segments.rbegin(); s != segments.rend(); ++s) {
        if (s->match && !previous_match && !kept.empty()) {
          kept.back().begin = s->begin;
        } else {
          kept.push_back(*s);
        }
        previous_match = s->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  segments.swap(kept);
}

// Every pre-tokenizer here splits each piece into stretches of it. `first_at_start` tells whether
// pieces[0] begins where the input does (Rust's `offsets_original().0 == 0`, which Metaspace's
// prepend_scheme "first" asks); a step that drops the start of pieces[0] clears it.
class PieceSplitter : public HfPreTokenizer {
 public:
  void split(std::vector<std::string>& pieces, std::size_t section) const final {
    bool first_at_start = section == 0;
    run(pieces, first_at_start);
    // Rust drops every empty piece (PreTokenizedString::split); ByteLevel without its regex and
    // Metaspace without split pass an empty text through.
    pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const std::string& p) { return p.empty(); }),
                 pieces.end());
  }
  virtual void run(std::vector<std::string>& pieces, bool& first_at_start) const = 0;

 protected:
  // The non-empty stretches `cut` keeps of each piece (cut(piece, segments) fills the segments).
  template <typename Cut>
  static void split_each(std::vector<std::string>& pieces, bool& first_at_start, Cut cut) {
    // Buffers kept per thread: a text's every section passes here.
    thread_local std::vector<std::string> out;
    thread_local std::vector<Segment> segments;
    out.clear();
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const std::string& piece = pieces[i];
      segments.clear();
      cut(piece, segments);
      const std::size_t before = out.size();
      if (segments.size() == 1 && segments[0].begin == 0 && segments[0].end == piece.size()) {
        out.push_back(std::move(pieces[i]));  // the piece whole: moved, not copied
        continue;
      }
      if (out.capacity() < before + segments.size())
        out.reserve(std::max(2 * out.capacity(), before + segments.size()));
      for (const Segment& s : segments) {
        if (s.end == s.begin) continue;
        if (i == 0 && out.size() == before && s.begin != 0) first_at_start = false;
        out.emplace_back(piece, s.begin, s.end - s.begin);
      }
      if (i == 0 && out.size() == before) first_at_start = false;  // pieces[0] is gone
    }
    pieces.swap(out);
  }
};

// pre_tokenizers/split.rs: the pattern's matches (with `invert`, the stretches between them are
// the delimiters) treated by the behavior.
class Split final : public PieceSplitter {
 public:
  Split(const Json& pattern, const JsonPlace& place, Behavior behavior, bool invert)
      : pattern_(pattern, place), behavior_(behavior), invert_(invert) {}
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    split_each(pieces, first_at_start, [&](std::string_view piece, std::vector<Segment>& segments) {
      thread_local std::vector<std::pair<std::size_t, std::size_t>> matches;
      pattern_.find_all(piece, matches);
      segments_of_matches(matches, piece.size(), segments);
      if (invert_)
        for (Segment& s : segments) s.match = !s.match;
      apply_behavior(segments, behavior_);
    });
  }

 private:
  HfPattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Splits on each character a predicate holds for, treated by the behavior (Digits, Punctuation,
// WhitespaceSplit, CharDelimiterSplit, BertPreTokenizer's two steps).
template <typename Predicate>
class CharacterSplit final : public PieceSplitter {
 public:
  CharacterSplit(Predicate holds, Behavior behavior) : holds_(holds), behavior_(behavior) {}
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    split_each(pieces, first_at_start, [&](std::string_view piece, std::vector<Segment>& segments) {
      segments_of_characters(piece, holds_, segments);
      apply_behavior(segments, behavior_);
    });
  }

 private:
  Predicate holds_;
  Behavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PieceSplitter> split_on(Predicate holds, Behavior behavior) {
  return std::make_unique<CharacterSplit<Predicate>>(holds, behavior);
}

// pre_tokenizers/whitespace.rs Whitespace: the matches of Rust regex's \w+|[^\w\s]+ (inverted,
// Removed: what lies between them, whitespace, is dropped).
class Whitespace final : public PieceSplitter {
 public:
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    split_each(pieces, first_at_start, [](std::string_view piece, std::vector<Segment>& segments) {
      std::size_t at = 0;
      while (at < piece.size()) {
        const std::size_t begin = at;
        const char32_t c = next_code_point(piece, at);
        if (is_white_space(c)) continue;
        const bool word = is_regex_word(c);
        std::size_t end = at;
        while (end < piece.size()) {
          std::size_t next = end;
          const char32_t d = next_code_point(piece, next);
          if (word ? !is_regex_word(d) : is_regex_word(d) || is_white_space(d)) break;
          end = next;
        }
        segments.push_back({begin, end, true});
        at = end;
      }
    });
  }
};

// pre_tokenizers/fixed_length.rs: pieces of `length` characters (the last one shorter).
class FixedLength final : public PieceSplitter {
 public:
  explicit FixedLength(std::size_t length) : length_(length) {}
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    split_each(pieces, first_at_start, [&](std::string_view piece, std::vector<Segment>& segments) {
      std::size_t at = 0;
      while (at < piece.size()) {
        const std::size_t begin = at;
        for (std::size_t n = 0; n < length_ && at < piece.size(); ++n)
          at += utf8_length(static_cast<unsigned char>(piece[at]));
        segments.push_back({begin, at, false});
      }
    });
  }

 private:
  std::size_t length_;
};

// pre_tokenizers/byte_level.rs: a space before each piece that does not start with one (when
// add_prefix_space; Rust and JavaScript alike do it for every piece, not only the first), GPT-2's
// split (when use_regex), then each byte as GPT-2's printable character.
class ByteLevel final : public PieceSplitter {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const JsonPlace& place)
      : add_prefix_space_(add_prefix_space),
        pattern_(use_regex ? std::make_unique<HfPattern>(Json{{"Regex", kGpt2Pattern}}, place) : nullptr) {}
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    if (add_prefix_space_)
      for (std::string& piece : pieces)
        if (!piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
    if (pattern_)
      split_each(pieces, first_at_start, [&](std::string_view piece, std::vector<Segment>& segments) {
        thread_local std::vector<std::pair<std::size_t, std::size_t>> matches;
        pattern_->find_all(piece, matches);
        segments_of_matches(matches, piece.size(), segments);
      });
    for (std::string& piece : pieces) piece = gpt2_printable_from_bytes(piece);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<HfPattern> pattern_;
};

enum class PrependScheme { always, first, never };

// pre_tokenizers/metaspace.rs: each ' ' becomes the replacement, the replacement goes before a
// piece that does not start with it (always; first: only before the piece the input starts with;
// never), then (split) each replacement starts a new piece (MergedWithNext). The JavaScript port
// never splits and prepends "first" to every piece of section 0.
class Metaspace final : public PieceSplitter {
 public:
  Metaspace(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_code_(replacement), scheme_(scheme), split_(split) {
    append_utf8(replacement_, replacement);
  }
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      std::string& piece = pieces[i];
      if (piece.find(' ') != std::string::npos) {
        std::string replaced;
        replaced.reserve(piece.size() + piece.size() / 2);
        for (const char c : piece) c == ' ' ? replaced += replacement_ : replaced += c;
        piece.swap(replaced);
      }
      const bool starts_with_replacement = piece.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend =
          scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && i == 0 && first_at_start);
      if (prepend && !starts_with_replacement && !piece.empty()) piece.insert(0, replacement_);
    }
    if (split_)
      split_each(pieces, first_at_start, [&](std::string_view piece, std::vector<Segment>& segments) {
        segments_of_characters(
            piece, [&](char32_t c) { return c == replacement_code_; }, segments);
        apply_behavior(segments, Behavior::merged_with_next);
      });
  }

 private:
  char32_t replacement_code_;
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class BertPreTokenizer final : public PieceSplitter {
 public:
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    whitespace_->run(pieces, first_at_start);
    punctuation_->run(pieces, first_at_start);
  }

 private:
  std::unique_ptr<PieceSplitter> whitespace_ = split_on(is_white_space, Behavior::removed);
  std::unique_ptr<PieceSplitter> punctuation_ = split_on(is_punctuation, Behavior::isolated);
};

class Sequence final : public PieceSplitter {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PieceSplitter>> steps) : steps_(std::move(steps)) {}
  void run(std::vector<std::string>& pieces, bool& first_at_start) const override {
    for (const auto& step : steps_) step->run(pieces, first_at_start);
  }

 private:
  std::vector<std::unique_ptr<PieceSplitter>> steps_;
};

// The one code point of a field Rust reads as a `char`.
char32_t one_character(HfFields& fields, const char* key) {
  const std::string text = fields.string(key);
  std::size_t at = 0;
  const char32_t c = text.empty() ? 0 : next_code_point(text, at);
  if (text.empty() || at != text.size())
    fields.place().at(key).fail("is " + Json(text).dump() + ", not a single character");
  return c;
}

bool required_boolean(HfFields& fields, const char* key) {
  if (!fields.optional(key)) fields.place().fail("has no field \"" + std::string(key) + "\"");
  return fields.boolean(key, false);
}

std::unique_ptr<PieceSplitter> make_pre_tokenizer(const Json& json, const JsonPlace& place, int nesting);

std::unique_ptr<PieceSplitter> make_metaspace(HfFields& fields, const JsonPlace& place) {
  const char32_t replacement = one_character(fields, "replacement");
  fields.optional_string("str_rep");  // written by old versions, read by none (metaspace.rs `_str_rep`)
  PrependScheme scheme = PrependScheme::always;
  const std::optional<std::string> scheme_name = fields.optional_string("prepend_scheme");
  if (scheme_name) {
    if (*scheme_name == "always") {
      scheme = PrependScheme::always;
    } else if (*scheme_name == "first") {
      scheme = PrependScheme::first;
    } else if (*scheme_name == "never") {
      scheme = PrependScheme::never;
    } else {
      place.at("prepend_scheme").fail("is \"" + *scheme_name + "\", not one of always, first, never");
    }
  }
  // Old files say add_prefix_space instead: false means never. Rust refuses false beside a
  // prepend_scheme other than never, and (a quirk: the absent scheme defaults to always first)
  // false alone; xgrad reads false alone as never, which is what such a file meant.
  if (fields.optional("add_prefix_space") && !fields.boolean("add_prefix_space", true)) {
    if (scheme_name && scheme != PrependScheme::never)
      place.at("add_prefix_space").fail("is false, which contradicts prepend_scheme \"" + *scheme_name + "\"");
    scheme = PrependScheme::never;
  }
  return std::make_unique<Metaspace>(replacement, scheme, fields.boolean("split", true));
}

std::unique_ptr<PieceSplitter> make_pre_tokenizer(const Json& json, const JsonPlace& place, int nesting) {
  HfFields fields(json, place);
  const std::string type = fields.type();
  std::unique_ptr<PieceSplitter> made;
  if (type == "Split") {
    const Json& pattern = fields.required("pattern");
    const Behavior behavior = behavior_of(fields.string("behavior"), place.at("behavior"));
    made = std::make_unique<Split>(pattern, place.at("pattern"), behavior, required_boolean(fields, "invert"));
  } else if (type == "ByteLevel") {
    const bool add_prefix_space = required_boolean(fields, "add_prefix_space");
    if (!fields.optional("trim_offsets")) place.fail("has no field \"trim_offsets\"");
    fields.ignore("trim_offsets");  // moves offsets, which xgrad does not report
    made = std::make_unique<ByteLevel>(add_prefix_space, fields.boolean("use_regex", true), place);
  } else if (type == "Metaspace") {
    made = make_metaspace(fields, place);
  } else if (type == "Digits") {
    const bool individual = required_boolean(fields, "individual_digits");
    made = split_on(is_numeric, individual ? Behavior::isolated : Behavior::contiguous);
  } else if (type == "Punctuation") {
    const std::optional<std::string> behavior = fields.optional_string("behavior");
    made = split_on(is_punctuation, behavior ? behavior_of(*behavior, place.at("behavior")) : Behavior::isolated);
  } else if (type == "Whitespace") {
    made = std::make_unique<Whitespace>();
  } else if (type == "WhitespaceSplit") {
    made = split_on(is_white_space, Behavior::removed);
  } else if (type == "BertPreTokenizer") {
    made = std::make_unique<BertPreTokenizer>();
  } else if (type == "CharDelimiterSplit") {
    const char32_t delimiter = one_character(fields, "delimiter");
    made = split_on([delimiter](char32_t c) { return c == delimiter; }, Behavior::removed);
  } else if (type == "FixedLength") {
    const std::int64_t length = fields.integer("length", 5);
    if (length < 1) place.at("length").fail("is " + std::to_string(length) + ", not a length of at least 1");
    made = std::make_unique<FixedLength>(static_cast<std::size_t>(length));
  } else if (type == "Sequence") {
    if (nesting >= kMaxNesting) place.fail("nests Sequences more than " + std::to_string(kMaxNesting) + " deep");
    const Json& list = fields.required("pretokenizers");
    if (!list.is_array()) place.at("pretokenizers").fail("is " + xgrad::detail::json_excerpt(list) + ", not a list");
    std::vector<std::unique_ptr<PieceSplitter>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const JsonPlace at = place.at("pretokenizers").at(i);
      if (list[i].is_null()) at.fail("is null, not a pre-tokenizer");
      steps.push_back(make_pre_tokenizer(list[i], at, nesting + 1));
    }
    made = std::make_unique<Sequence>(std::move(steps));
  } else if (type.empty()) {
    place.fail("has no field \"type\"");
  } else if (type == "UnicodeScripts") {
    place.at("type").fail("is \"UnicodeScripts\", a pre-tokenizer xgrad does not implement");
  } else if (type == "Replace") {
    place.at("type").fail("is \"Replace\", which only the JavaScript port has as a pre-tokenizer (Rust has none)");
  } else {
    place.at("type").fail("is \"" + type + "\", which is no pre-tokenizer xgrad knows");
  }
  fields.done();
  return made;
}

}  // namespace

std::unique_ptr<HfPreTokenizer> make_hf_pre_tokenizer(const Json& json, const JsonPlace& place) {
  if (json.is_null()) return nullptr;
  return make_pre_tokenizer(json, place, 0);
}

}  // namespace xgrad::text::detail
