/// @file
/// A tokenizer.json regular expression (Oniguruma's syntax, as Hugging Face's Rust tokenizers runs
/// it) rewritten for PCRE2 with PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE and newlines as LF (an
/// internal header of text/).
#pragma once

#include <string>
#include <string_view>

#include "xgrad/text/detail/hf_fields.hpp"

namespace xgrad::text::detail {

/// The PCRE2 pattern that matches what Oniguruma's `pattern` matches. Rewritten: \s \S (Unicode
/// White_Space, which PCRE2's \s exceeds by U+180E), \w \W \b \B \p{Word} (Oniguruma's word
/// characters), \h \H (hexadecimal digits, not PCRE2's horizontal space), \v (the vertical tab, not
/// PCRE2's vertical space), \O, \uHHHH, (?m) (Oniguruma's dot-all), {,n}, an interval followed by
/// + * or another interval (a repeat in Oniguruma, possessive or an error in PCRE2), {n}? (optional
/// in Oniguruma, lazy in PCRE2), nested classes [a[bc]] and the long names of general categories
/// (\p{Letter} is \p{L}). Refused by name, as an Error at `place`: what has no translation here
/// (class intersection &&, POSIX brackets [:alpha:], a nested negated class, \W \O and a negated
/// \p{Word} inside a class, the options other than i and m, absent groups (?~...), conditionals,
/// callouts, \Q \E \y \Y \C \M, \X (PCRE2 10.42 makes two emoji one grapheme cluster) and the
/// letter escapes neither syntax shares). What PCRE2 itself refuses is left to its compiler.
///
/// Not rewritten, a known difference: under (?i) Oniguruma also matches the multi-character case
/// foldings (ß matches "ss", ﬁ matches "fi"), PCRE2 the one-character ones only.
std::string oniguruma_to_pcre2(std::string_view pattern, const JsonPlace& place);

}  // namespace xgrad::text::detail
