/// @file
/// The trivial tokenizer: each byte is its own id (vocabulary 256, no special tokens).
#pragma once

#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text {

/// Ids 0..255, one per byte; decode is exact for any bytes.
class BytesTokenizer : public Tokenizer {
 public:
  TokenIds encode(std::string_view text, SpecialText specials = SpecialText::as_reference) const override;
  std::string token_bytes(std::int64_t id) const override;
  std::size_t vocab_size() const override { return 256; }
  SpecialTokens special_tokens() const override { return {}; }
  std::string kind() const override { return "bytes"; }
  std::string to_json() const override { return R"({"kind":"bytes"})"; }
};

}  // namespace xgrad::text
