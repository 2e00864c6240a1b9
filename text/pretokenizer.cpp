#include "xgrad/text/pretokenizer.hpp"

#include <string>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "xgrad/core/error.hpp"

namespace xgrad::text {

namespace {

// GPT-2's pattern, with GPT-2's \s (Python regex's: Unicode White_Space). PCRE2's \s (with UCP:
// \p{Z}, \h and \v) also holds U+180E MONGOLIAN VOWEL SEPARATOR, a format character since Unicode
// 6.3 that GPT-2 counts as punctuation, so \s is spelled out without it: [\p{Z}\t\n\x0B\f\r\x{85}].
// Each stays one character class (an alternation repeated per character would take a JIT stack
// frame per character and fail on a long run).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{Z}\t\n\x0B\f\r\x{85}\p{L}\p{N}]+)"
    R"(|[\p{Z}\t\n\x0B\f\r\x{85}]+(?![^\p{Z}\t\n\x0B\f\r\x{85}])|[\p{Z}\t\n\x0B\f\r\x{85}]+)";

// One match block and JIT stack per thread, so split() may run on several threads at once.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() {
    if (!data || !stack || !context) throw Error("Gpt2Pretokenizer: PCRE2 could not allocate its match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

}  // namespace

struct Gpt2Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Gpt2Pretokenizer::Gpt2Pretokenizer() : impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF and UCP give \s, \p{L} and \p{N} their Unicode meaning; MATCH_INVALID_UTF lets the
  // subject hold bytes that are not UTF-8 (they match nothing) instead of refusing it.
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw Error(std::string("Gpt2Pretokenizer: PCRE2 refused GPT-2's pattern at offset ") + std::to_string(offset) +
                ": " + reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // without JIT support, pcre2_match interprets
}

Gpt2Pretokenizer::~Gpt2Pretokenizer() = default;

std::vector<std::string_view> Gpt2Pretokenizer::split(std::string_view text) const {
  thread_local ThreadMatchState state;
  std::vector<std::string_view> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), at, 0, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      pieces.push_back(text.substr(at));  // only bytes that are not UTF-8 are left
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw Error(std::string("Gpt2Pretokenizer::split: PCRE2 failed at byte ") + std::to_string(at) + ": " +
                  reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(state.data);
    if (range[0] > at) pieces.push_back(text.substr(at, range[0] - at));  // skipped invalid bytes
    pieces.push_back(text.substr(range[0], range[1] - range[0]));
    at = range[1];
  }
  return pieces;
}

}  // namespace xgrad::text
