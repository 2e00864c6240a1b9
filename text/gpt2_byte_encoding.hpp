/// @file
/// GPT-2's printable form of raw bytes (its `bytes_to_unicode` table): each byte is one Unicode
/// character, printable ASCII and most of Latin-1 standing for themselves and the other 68 bytes
/// (space, control bytes, ...) for U+0100..U+0143, so that a token's bytes can be a JSON key and
/// a merges.txt word. vocab.json, merges.txt and tokenizer.json write tokens in this form.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace xgrad::text {

/// The printable form of `bytes` (UTF-8, one character per byte; " hi" gives "Ġhi").
std::string gpt2_printable_from_bytes(std::string_view bytes);

/// The bytes whose printable form is `printable`, or nullopt when `printable` is not UTF-8 or
/// holds a character outside the table.
std::optional<std::string> gpt2_bytes_from_printable(std::string_view printable);

}  // namespace xgrad::text
