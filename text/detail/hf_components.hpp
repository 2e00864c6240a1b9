/// @file
/// The stages of a Hugging Face tokenizer.json pipeline as xgrad builds them (an internal header
/// of text/): the normalizer, the pre-tokenizer, the model and the decoder, each made from its
/// JSON object by one factory that refuses, by name and JSON path, any type or option it does not
/// implement. Text between the stages is valid UTF-8 (HfTokenizer replaces invalid bytes first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/text/detail/hf_fields.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text::detail {

/// A callable passed by reference for the duration of one call (never stored): no allocation, one
/// indirect call.
template <typename Signature>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): a lambda converts, as std::function's does
      : object_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

/// A regular expression of tokenizer.json ({"Regex": "..."} in Oniguruma's syntax, run in PCRE2
/// with Unicode classes; or {"String": "..."}, matched literally). Immutable; matching is safe on
/// several threads at once.
class HfPattern {
 public:
  /// Compiles `pattern` (a JSON object with one of the two keys); a pattern PCRE2 cannot compile
  /// is an Error naming the place, the offset and PCRE2's reason.
  HfPattern(const Json& pattern, const JsonPlace& place);
  ~HfPattern();
  HfPattern(const HfPattern&) = delete;
  HfPattern& operator=(const HfPattern&) = delete;
  /// The non-overlapping matches in `text`, left to right, as [begin, end) byte offsets, as
  /// Hugging Face's Rust tokenizers finds them (the onig crate's find_iter): an empty match is
  /// one too (Split cuts there, Replace inserts there), except one that starts where the previous
  /// match ended; an empty text has none. A match that backtracks past PCRE2's limits is an Error
  /// naming the place.
  /// Each match handed to `each(begin, end)` as it is found (`each` may match other patterns).
  void for_each_match(std::string_view text, FunctionRef<void(std::size_t, std::size_t)> each) const;
  /// The same, into `matches` (cleared first, so that a caller may keep one buffer).
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// normalizer: text in, text out.
class HfNormalizer {
 public:
  virtual ~HfNormalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};
/// The normalizer of `json` (null: nullptr). Types: NFC, NFD, NFKC, NFKD, Lowercase, Replace,
/// Prepend, Strip, StripAccents, Sequence.
std::unique_ptr<HfNormalizer> make_hf_normalizer(const Json& json, const JsonPlace& place);

/// pre_tokenizer: a text cut into pieces, each handed to `each` as soon as it is made (so what a
/// pre-tokenizer holds is bounded by one piece per stage, never all the text's pieces). `section`
/// is the index of the text's section among those the added tokens cut the input into
/// (Metaspace's prepend_scheme "first" prepends only in section 0, and there only to the piece
/// that starts the input, as Rust's `offsets_original().0 == 0`). Empty pieces are dropped. A
/// piece is valid until `each` returns.
class HfPreTokenizer {
 public:
  virtual ~HfPreTokenizer() = default;
  virtual void split(std::string_view text, std::size_t section, FunctionRef<void(std::string_view)> each) const = 0;
};
/// The pre-tokenizer of `json` (null: nullptr). Types: Split, ByteLevel, Metaspace, Digits,
/// Punctuation, Whitespace, WhitespaceSplit, Sequence.
std::unique_ptr<HfPreTokenizer> make_hf_pre_tokenizer(const Json& json, const JsonPlace& place);

/// model: one piece of the pre-tokenizer to ids.
class HfModel {
 public:
  virtual ~HfModel() = default;
  virtual void tokenize(std::string_view piece, TokenIds& out) const = 0;
  /// Every id's token string as tokenizer.json writes it (ids with no token: "").
  virtual const std::vector<std::string>& vocabulary() const = 0;
  /// The id of a token string, or -1.
  virtual std::int64_t id_of(std::string_view token) const = 0;
};
/// The model of `json`: BPE (hf_bpe_model.cpp) or Unigram (hf_unigram_model.cpp).
std::unique_ptr<HfModel> make_hf_bpe_model(const Json& json, const JsonPlace& place);
std::unique_ptr<HfModel> make_hf_unigram_model(const Json& json, const JsonPlace& place);

/// decoder: the tokens' strings to the pieces of the text (joined at the end).
class HfDecoder {
 public:
  virtual ~HfDecoder() = default;
  /// `added[i]` says tokens[i] is an added token (ByteLevel keeps those as they are).
  virtual void decode_chain(std::vector<std::string>& tokens, std::vector<bool>& added) const = 0;
};
/// The decoder of `json` (null: nullptr). Types: ByteLevel, ByteFallback, Fuse, Strip, Replace,
/// Metaspace, Sequence.
std::unique_ptr<HfDecoder> make_hf_decoder(const Json& json, const JsonPlace& place);

/// Invalid UTF-8 replaced by U+FFFD as the WHATWG decoder (a browser's, node's TextDecoder) does:
/// one U+FFFD for each maximal subpart of an ill-formed sequence.
std::string replace_invalid_utf8(std::string_view bytes);

/// JavaScript's String.prototype.trimStart / trimEnd whitespace (the WhiteSpace and
/// LineTerminator productions: \t \n \v \f \r, space, U+00A0, U+1680, U+2000-200A, U+2028, U+2029,
/// U+202F, U+205F, U+3000, U+FEFF): the number of bytes of it at the start / end of `text`.
std::size_t leading_js_space(std::string_view text);
std::size_t trailing_js_space(std::string_view text);

}  // namespace xgrad::text::detail
