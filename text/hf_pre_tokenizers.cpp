// tokenizer.json's pre-tokenizers with the semantics of Hugging Face's Rust tokenizers
// (tokenizers/src/pre_tokenizers/*.rs and NormalizedString::split in tokenizer/normalizer.rs),
// which its JavaScript port simplifies: every SplitDelimiterBehavior, Metaspace's split, Digits
// on every numeric character, Punctuation's behavior. A field Rust requires is required here too;
// a field xgrad does not read is refused by name.
#include <algorithm>
#include <deque>
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

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior behavior_of(const std::string& name, const JsonPlace& place) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  place.fail("is \"" + name + "\", not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// A piece and whether it begins where the input does (Rust's `offsets_original().0 == 0`, which
// Metaspace's prepend_scheme "first" asks; only the first piece of section 0 can).
using Next = FunctionRef<void(std::string_view piece, bool at_start)>;

// tokenizer/normalizer.rs NormalizedString::split: the stretches of a piece, each marked as a match
// of the delimiter or not, come in order; the behavior decides which are kept and which join, and
// each non-empty stretch it keeps goes on to `next` as soon as it is whole (Rust folds over all of
// them; each behavior needs one stretch of look-back).
class Stretches {
 public:
  Stretches(Behavior behavior, std::string_view piece, bool at_start, Next next)
      : behavior_(behavior), piece_(piece), at_start_(at_start), next_(next) {}
  Stretches(const Stretches&) = delete;
  Stretches& operator=(const Stretches&) = delete;

  void add(std::size_t begin, std::size_t end, bool match) {
    switch (behavior_) {
      case Behavior::isolated:
        return hand_on(begin, end);
      case Behavior::removed:
        if (!match) hand_on(begin, end);
        return;
      case Behavior::contiguous:  // runs of matches, and runs of the rest, each one stretch
        if (pending_ && pending_match_ == match) {
          pending_end_ = end;
          return;
        }
        break;
      case Behavior::merged_with_previous:  // a match joins the stretch before it
        if (match && pending_ && !previous_match_) {
          pending_end_ = end;
          previous_match_ = match;
          return;
        }
        break;
      case Behavior::merged_with_next:  // a match joins the stretch after it (Rust folds from the end)
        if (pending_ && pending_match_ && !match) {
          hand_on(pending_begin_, end);
          pending_ = false;
          previous_match_ = match;
          return;
        }
        break;
    }
    finish();
    pending_ = true;
    pending_begin_ = begin;
    pending_end_ = end;
    pending_match_ = previous_match_ = match;
  }

  // The matches of `pattern` in the piece and the stretches between them (tokenizer/pattern.rs
  // `impl Pattern for &SysRegex`), with `invert` the other way round.
  void add_matches(const HfPattern& pattern, bool invert) {
    std::size_t previous = 0;
    pattern.for_each_match(piece_, [&](std::size_t begin, std::size_t end) {
      if (previous != begin) add(previous, begin, invert);
      add(begin, end, !invert);
      previous = end;
    });
    if (previous != piece_.size()) add(previous, piece_.size(), invert);
  }

  // tokenizer/pattern.rs `impl Pattern for F: Fn(char) -> bool`: each character that holds is a
  // match of its own; the runs between them are not.
  template <typename Predicate>
  void add_characters(Predicate holds) {
    std::size_t run = 0, at = 0;
    while (at < piece_.size()) {
      const std::size_t begin = at;
      if (holds(next_code_point(piece_, at))) {
        if (run < begin) add(run, begin, false);
        add(begin, at, true);
        run = at;
      }
    }
    if (run < piece_.size()) add(run, piece_.size(), false);
  }

  // The stretch still held back; call once after the last add.
  void finish() {
    if (pending_) hand_on(pending_begin_, pending_end_);
    pending_ = false;
  }

 private:
  void hand_on(std::size_t begin, std::size_t end) {
    if (end != begin) next_(piece_.substr(begin, end - begin), at_start_ && begin == 0);
  }

  Behavior behavior_;
  std::string_view piece_;
  bool at_start_;
  Next next_;
  bool pending_ = false, pending_match_ = false, previous_match_ = false;
  std::size_t pending_begin_ = 0, pending_end_ = 0;
};

// The text a stage rewrites (ByteLevel, Metaspace) stays in use while the stages after it run on
// its pieces: each running stage takes buffers of its own from this thread's stack of them.
struct Scratch {
  std::string text, mapped;
};

class ScratchLease {
 public:
  ScratchLease() : pool_(pool()) {
    if (pool_.used == pool_.levels.size()) pool_.levels.emplace_back();  // a deque: earlier levels stay put
    scratch_ = &pool_.levels[pool_.used++];
  }
  ~ScratchLease() { --pool_.used; }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch& operator*() const { return *scratch_; }
  Scratch* operator->() const { return scratch_; }

 private:
  struct Pool {
    std::deque<Scratch> levels;
    std::size_t used = 0;
  };
  static Pool& pool() {
    thread_local Pool p;
    return p;
  }
  Pool& pool_;
  Scratch* scratch_;
};

// Every pre-tokenizer here cuts each piece into stretches of it and hands them on one by one.
class PieceSplitter : public HfPreTokenizer {
 public:
  void split(std::string_view text, std::size_t section, FunctionRef<void(std::string_view)> each) const final {
    // Rust drops every empty piece (PreTokenizedString::split); ByteLevel without its regex and
    // Metaspace without split pass an empty text through.
    run(text, section == 0, [&](std::string_view piece, bool) {
      if (!piece.empty()) each(piece);
    });
  }
  virtual void run(std::string_view piece, bool at_start, Next next) const = 0;
};

// pre_tokenizers/split.rs: the pattern's matches (with `invert`, the stretches between them are
// the delimiters) treated by the behavior.
class Split final : public PieceSplitter {
 public:
  Split(const Json& pattern, const JsonPlace& place, Behavior behavior, bool invert)
      : pattern_(pattern, place), behavior_(behavior), invert_(invert) {}
  void run(std::string_view piece, bool at_start, Next next) const override {
    Stretches stretches(behavior_, piece, at_start, next);
    stretches.add_matches(pattern_, invert_);
    stretches.finish();
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
  void run(std::string_view piece, bool at_start, Next next) const override {
    Stretches stretches(behavior_, piece, at_start, next);
    stretches.add_characters(holds_);
    stretches.finish();
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
  void run(std::string_view piece, bool at_start, Next next) const override {
    std::size_t at = 0;
    while (at < piece.size()) {
      const std::size_t begin = at;
      const char32_t c = next_code_point(piece, at);
      if (is_white_space(c)) continue;
      const bool word = is_regex_word(c);
      std::size_t end = at;
      while (end < piece.size()) {
        std::size_t after = end;
        const char32_t d = next_code_point(piece, after);
        if (word ? !is_regex_word(d) : is_regex_word(d) || is_white_space(d)) break;
        end = after;
      }
      next(piece.substr(begin, end - begin), at_start && begin == 0);
      at = end;
    }
  }
};

// pre_tokenizers/fixed_length.rs: pieces of `length` characters (the last one shorter).
class FixedLength final : public PieceSplitter {
 public:
  explicit FixedLength(std::size_t length) : length_(length) {}
  void run(std::string_view piece, bool at_start, Next next) const override {
    std::size_t at = 0;
    while (at < piece.size()) {
      const std::size_t begin = at;
      for (std::size_t n = 0; n < length_ && at < piece.size(); ++n)
        at += utf8_length(static_cast<unsigned char>(piece[at]));
      next(piece.substr(begin, at - begin), at_start && begin == 0);
    }
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
  void run(std::string_view piece, bool at_start, Next next) const override {
    const ScratchLease scratch;
    if (add_prefix_space_ && !piece.empty() && piece[0] != ' ') {
      scratch->text.assign(1, ' ').append(piece);
      piece = scratch->text;
    }
    const auto hand_on = [&](std::string_view stretch, bool starts) {
      scratch->mapped = gpt2_printable_from_bytes(stretch);
      next(scratch->mapped, starts);
    };
    if (!pattern_) return hand_on(piece, at_start);
    Stretches stretches(Behavior::isolated, piece, at_start, hand_on);
    stretches.add_matches(*pattern_, false);
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
  void run(std::string_view piece, bool at_start, Next next) const override {
    const ScratchLease scratch;
    const bool prepend =
        !piece.empty() && (scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && at_start));
    if (piece.find(' ') != std::string_view::npos || prepend) {
      std::string& replaced = scratch->text;
      replaced.clear();
      for (const char c : piece) c == ' ' ? replaced += replacement_ : replaced += c;
      if (prepend && replaced.compare(0, replacement_.size(), replacement_) != 0) replaced.insert(0, replacement_);
      piece = replaced;
    }
    if (!split_) return next(piece, at_start);
    Stretches stretches(Behavior::merged_with_next, piece, at_start, next);
    stretches.add_characters([&](char32_t c) { return c == replacement_code_; });
    stretches.finish();
  }

 private:
  char32_t replacement_code_;
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class BertPreTokenizer final : public PieceSplitter {
 public:
  void run(std::string_view piece, bool at_start, Next next) const override {
    whitespace_->run(piece, at_start,
                     [&](std::string_view word, bool starts) { punctuation_->run(word, starts, next); });
  }

 private:
  std::unique_ptr<PieceSplitter> whitespace_ = split_on(is_white_space, Behavior::removed);
  std::unique_ptr<PieceSplitter> punctuation_ = split_on(is_punctuation, Behavior::isolated);
};

class Sequence final : public PieceSplitter {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PieceSplitter>> steps) : steps_(std::move(steps)) {}
  void run(std::string_view piece, bool at_start, Next next) const override { run_from(0, piece, at_start, next); }

 private:
  void run_from(std::size_t step, std::string_view piece, bool at_start, Next next) const {
    if (step == steps_.size()) return next(piece, at_start);
    steps_[step]->run(piece, at_start,
                      [&](std::string_view part, bool starts) { run_from(step + 1, part, starts, next); });
  }
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
