// tokenizer.json's patterns: {"Regex": ...} in Oniguruma's syntax, rewritten for PCRE2 and run with
// JIT, or {"String": ...} matched literally; matches found in the order and with the empty-match
// rule of the onig crate's find_iter, which Hugging Face's Rust tokenizers splits and replaces by.
#include <string>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/hf_oniguruma.hpp"
#include "xgrad/text/detail/hf_unicode.hpp"

namespace xgrad::text::detail {

namespace {

// Oniguruma's default retry limit is also 10 million; past it a match is an Error, not a hang.
constexpr std::uint32_t kMatchLimit = 10'000'000;
constexpr std::uint32_t kHeapLimitKiB = 256 * 1024;  // the interpreter's backtracking memory
constexpr std::size_t kJitStackMax = 256 * 1024 * 1024;

// One match block, JIT stack and match context per thread, shared by every pattern, so that
// matching may run on several threads at once.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, kJitStackMax, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() {
    if (!data || !stack || !context) throw Error("HfPattern: PCRE2 could not allocate its match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
    pcre2_set_match_limit(context, kMatchLimit);
    pcre2_set_heap_limit(context, kHeapLimitKiB);
  }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof message);
  return reinterpret_cast<const char*>(message);
}

}  // namespace

struct HfPattern::Impl {
  JsonPlace place;
  pcre2_code* code = nullptr;  // null for a String pattern
  bool jit = false;            // PCRE2 compiled the pattern to machine code
  std::string literal;
  ~Impl() { pcre2_code_free(code); }

  // The leftmost match at or after `from` as [begin, end), or false. `state`: this thread's.
  // The text is valid UTF-8 (find_all checked it once: PCRE2 would check it on every call).
  bool search(std::string_view text, std::size_t from, ThreadMatchState& state, std::size_t& begin,
              std::size_t& end) const {
    if (!code) {
      const std::size_t at = text.find(literal, from);
      if (at == std::string_view::npos) return false;
      begin = at;
      end = at + literal.size();
      return true;
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    // pcre2_jit_match skips pcre2_match's checks, which cost as much as the match on short pieces.
    int rc = jit ? pcre2_jit_match(code, subject, text.size(), from, 0, state.data, state.context)
                 : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // a long run of a repeated group: the interpreter's heap
      rc = pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0)
      place.at("Regex").fail("failed on a text of " + std::to_string(text.size()) + " bytes at byte " +
                             std::to_string(from) + ": " + pcre2_message(rc) +
                             " (the pattern backtracks too much on it)");
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(state.data);
    begin = range[0];
    end = range[1];
    return true;
  }
};

HfPattern::HfPattern(const Json& pattern, const JsonPlace& place) : impl_(std::make_unique<Impl>()) {
  impl_->place = place;
  HfFields fields(pattern, place);
  if (pattern.contains("type")) place.at("type").fail("is a field a pattern does not have (it has Regex or String)");
  const std::optional<std::string> regex = fields.optional_string("Regex");
  const std::optional<std::string> literal = fields.optional_string("String");
  fields.done();
  if (regex && literal) place.fail("has both \"Regex\" and \"String\"; a pattern is one of them");
  if (!regex && !literal) place.fail("has neither \"Regex\" nor \"String\"");
  if (literal) {
    impl_->literal = *literal;
    return;
  }
  const std::string translated = oniguruma_to_pcre2(*regex, place.at("Regex"));
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  if (!context) throw Error("HfPattern: PCRE2 could not allocate a compile context");
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);  // Oniguruma's . ^ $ know only \n as a newline
  pcre2_set_bsr(context, PCRE2_BSR_UNICODE);     // \R as Oniguruma's
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF and UCP give \d and \p{..} their Unicode meaning; MULTILINE makes ^ and $ line anchors,
  // as they always are in Oniguruma.
  impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, &error, &offset, context);
  pcre2_compile_context_free(context);
  if (!impl_->code) {
    std::string what =
        "is not a pattern PCRE2 compiles: " + pcre2_message(error) + " at offset " + std::to_string(offset);
    if (translated != *regex) what += " of its PCRE2 form " + Json(translated).dump();
    place.at("Regex").fail(what);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;  // else pcre2_match interprets
}

HfPattern::~HfPattern() = default;

// The onig crate's FindMatches: each search starts where the last match ended; an empty match
// right where the previous match ended is skipped by searching again one character further.
void HfPattern::for_each_match(std::string_view text, FunctionRef<void(std::size_t, std::size_t)> each) const {
  if (text.empty()) return;  // tokenizer/pattern.rs: an empty text has no match, not even ""
  if (impl_->code && first_invalid_utf8(text))
    impl_->place.at("Regex").fail("cannot match a text that is not valid UTF-8");
  // `each` may match other patterns on this thread: the state is read before it is called.
  thread_local ThreadMatchState state;
  std::size_t from = 0, begin = 0, end = 0, last_end = 0;
  bool any = false;
  while (from <= text.size() && impl_->search(text, from, state, begin, end)) {
    if (begin == end && any && end == last_end) {
      if (end == text.size()) break;
      from = end + utf8_length(static_cast<unsigned char>(text[end]));
      continue;
    }
    any = true;
    last_end = from = end;
    each(begin, end);
  }
}

void HfPattern::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const {
  matches.clear();
  for_each_match(text, [&](std::size_t begin, std::size_t end) { matches.emplace_back(begin, end); });
}

}  // namespace xgrad::text::detail
