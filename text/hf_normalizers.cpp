// tokenizer.json's normalizers, with the semantics of Hugging Face's Rust tokenizers
// (tokenizers/src/normalizers/*.rs) where its JavaScript port differs: Prepend leaves an empty
// text empty, Lowercase maps each character without context, Strip strips Unicode White_Space.
// A field Rust requires is required here too; a field xgrad does not read is refused by name.
#include <memory>
#include <string>
#include <vector>

#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"

namespace xgrad::text::detail {

namespace {

// How deep Sequences may nest (the JSON reader already stops at 64 levels of JSON).
constexpr int kMaxNesting = 64;

class UnicodeNormalizer final : public HfNormalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  std::string normalize(std::string text) const override { return unicode_normalize(std::move(text), form_); }

 private:
  UnicodeForm form_;
};

// normalizers/utils.rs Lowercase -> NormalizedString::lowercase: char::to_lowercase one character
// at a time (JavaScript's toLowerCase would make a final Σ "ς"; Rust keeps "σ").
class Lowercase final : public HfNormalizer {
 public:
  std::string normalize(std::string text) const override { return unicode_lowercase(std::move(text)); }
};

// normalizers/strip.rs StripAccents: removes what is_combining_mark says (general category M).
class StripAccents final : public HfNormalizer {
 public:
  std::string normalize(std::string text) const override { return remove_marks(std::move(text)); }
};

// normalizers/replace.rs: every match (an empty one too) replaced by the content.
class Replace final : public HfNormalizer {
 public:
  Replace(const Json& pattern, std::string content, const JsonPlace& place)
      : pattern_(pattern, place), content_(std::move(content)) {}
  std::string normalize(std::string text) const override {
    std::string out;
    std::size_t copied = 0;
    bool any = false;
    pattern_.for_each_match(text, [&](std::size_t begin, std::size_t end) {
      if (!any) out.reserve(text.size() + text.size() / 2 + content_.size());  // " " to "▁": 1.36x on English
      any = true;
      out.append(text, copied, begin - copied);
      out += content_;
      copied = end;
    });
    if (!any) return text;
    out.append(text, copied, std::string::npos);
    return out;
  }

 private:
  HfPattern pattern_;
  std::string content_;
};

// normalizers/prepend.rs: `if !normalized.is_empty()`. The JavaScript port prepends to an empty
// text too; in its pipeline a normalizer never sees an empty section, so only a direct call differs.
class Prepend final : public HfNormalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

// normalizers/strip.rs Strip -> NormalizedString::lrstrip, which strips char::is_whitespace
// (Unicode White_Space: U+0085 yes, U+FEFF no; JavaScript's trim has it the other way round).
class Strip final : public HfNormalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    const std::size_t lead = left_ ? leading_white_space(text) : 0;
    if (lead == text.size()) return std::string();
    const std::size_t trail = right_ ? trailing_white_space(text) : 0;
    return lead == 0 && trail == 0 ? text : text.substr(lead, text.size() - lead - trail);
  }

 private:
  bool left_, right_;
};

class Sequence final : public HfNormalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<HfNormalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<HfNormalizer>> steps_;
};

std::unique_ptr<HfNormalizer> make_normalizer(const Json& json, const JsonPlace& place, int nesting) {
  if (json.is_null()) return nullptr;
  HfFields fields(json, place);
  const std::string type = fields.type();
  std::unique_ptr<HfNormalizer> made;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    made = std::make_unique<UnicodeNormalizer>(type == "NFC"    ? UnicodeForm::nfc
                                               : type == "NFD"  ? UnicodeForm::nfd
                                               : type == "NFKC" ? UnicodeForm::nfkc
                                                                : UnicodeForm::nfkd);
  } else if (type == "Lowercase") {
    made = std::make_unique<Lowercase>();
  } else if (type == "StripAccents") {
    made = std::make_unique<StripAccents>();
  } else if (type == "Replace") {
    const std::string content = fields.string("content");
    made = std::make_unique<Replace>(fields.required("pattern"), content, place.at("pattern"));
  } else if (type == "Prepend") {
    made = std::make_unique<Prepend>(fields.string("prepend"));
  } else if (type == "Strip") {
    if (!fields.optional("strip_left")) place.fail("has no field \"strip_left\"");
    if (!fields.optional("strip_right")) place.fail("has no field \"strip_right\"");
    made = std::make_unique<Strip>(fields.boolean("strip_left", false), fields.boolean("strip_right", false));
  } else if (type == "Sequence") {
    if (nesting >= kMaxNesting) place.fail("nests Sequences more than " + std::to_string(kMaxNesting) + " deep");
    const Json& list = fields.required("normalizers");
    if (!list.is_array()) place.at("normalizers").fail("is " + xgrad::detail::json_excerpt(list) + ", not a list");
    std::vector<std::unique_ptr<HfNormalizer>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const JsonPlace at = place.at("normalizers").at(i);
      if (list[i].is_null()) at.fail("is null, not a normalizer");
      steps.push_back(make_normalizer(list[i], at, nesting + 1));
    }
    made = std::make_unique<Sequence>(std::move(steps));
  } else if (type.empty()) {
    place.fail("has no field \"type\"");
  } else if (type == "BertNormalizer" || type == "Precompiled" || type == "Nmt" || type == "ByteLevel") {
    place.at("type").fail("is \"" + type + "\", a normalizer xgrad does not implement");
  } else {
    place.at("type").fail("is \"" + type + "\", which is no normalizer xgrad knows");
  }
  fields.done();
  return made;
}

}  // namespace

std::unique_ptr<HfNormalizer> make_hf_normalizer(const Json& json, const JsonPlace& place) {
  return make_normalizer(json, place, 0);
}

}  // namespace xgrad::text::detail
