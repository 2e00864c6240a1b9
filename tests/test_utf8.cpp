// UTF-8 validation (core/io/utf8.hpp): what every name written into a file must pass.
#include <catch2/catch.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

using xgrad::first_invalid_utf8;

TEST_CASE("well-formed UTF-8 passes, in every sequence length") {
  CHECK_FALSE(first_invalid_utf8(""));
  CHECK_FALSE(first_invalid_utf8("blocks.0.attn.w_q.weight"));
  CHECK_FALSE(first_invalid_utf8("\xC3\xA9"));                  // é
  CHECK_FALSE(first_invalid_utf8("\xE4\xBD\xA0\xE5\xA5\xBD"));  // 你好
  CHECK_FALSE(first_invalid_utf8("\xF0\x9F\x98\x80"));          // U+1F600
  CHECK_FALSE(first_invalid_utf8("\xF4\x8F\xBF\xBF"));          // U+10FFFF, the last code point
}

TEST_CASE("ill-formed UTF-8 is found at its first bad byte") {
  CHECK(first_invalid_utf8("ab\xFF") == 2u);            // never a lead byte
  CHECK(first_invalid_utf8("\x80") == 0u);              // a continuation without a lead
  CHECK(first_invalid_utf8("\xC0\xAF") == 0u);          // overlong '/'
  CHECK(first_invalid_utf8("\xE0\x80\xAF") == 0u);      // overlong, three bytes
  CHECK(first_invalid_utf8("\xF0\x80\x80\xAF") == 0u);  // overlong, four bytes
  CHECK(first_invalid_utf8("\xED\xA0\x80") == 0u);      // a surrogate
  CHECK(first_invalid_utf8("\xF4\x90\x80\x80") == 0u);  // past U+10FFFF
  CHECK(first_invalid_utf8("x\xE4\xBD") == 1u);         // cut short
  CHECK(first_invalid_utf8("\xC3\xA9\xC3(") == 2u);     // a bad continuation
}

TEST_CASE("check_utf8 names the caller, the escaped bytes and the offset") {
  CHECK_NOTHROW(xgrad::check_utf8("ok", "save_safetensors", "tensor name"));
  CHECK_THROWS_WITH(xgrad::check_utf8(std::string("a\xFFz", 3), "save_safetensors", "tensor name"),
                    "save_safetensors: tensor name \"a\\xFFz\" is not valid UTF-8 (byte 0xFF at offset 1)");
  CHECK(xgrad::escape_bytes(std::string("\0\\\n", 3)) == "\\x00\\x5C\\x0A");
}
