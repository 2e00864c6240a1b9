/// @file
/// UTF-8 validation for every name and text that xgrad writes into a file (tensor names,
/// metadata, parameter names): a name that is not UTF-8 is refused where it enters, naming the
/// caller and the offending bytes, instead of failing deep inside a JSON writer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace xgrad {

/// The offset of the first byte that does not begin a well-formed UTF-8 sequence (overlong forms,
/// surrogates and code points past U+10FFFF are ill-formed), or nullopt when all of `s` is UTF-8.
std::optional<std::size_t> first_invalid_utf8(std::string_view s);

/// `s` with every byte that is not printable ASCII, and every backslash, written as `\xNN`, for
/// error messages.
std::string escape_bytes(std::string_view s);

/// Throws an Error `<who>: <what> "<escaped>" is not valid UTF-8 (byte 0xNN at offset K)` unless
/// `s` is UTF-8.
void check_utf8(std::string_view s, const char* who, const char* what);

}  // namespace xgrad
