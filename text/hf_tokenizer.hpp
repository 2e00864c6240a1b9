/// @file
/// The tokenizers today's models ship as a Hugging Face tokenizer.json (Llama 3, Qwen, Gemma,
/// Mistral, Phi-3, SmolLM2, GPT-4o's o200k, GPT-2), run as Hugging Face's tokenizers runs them:
/// added tokens, normalizer, pre-tokenizer, model (BPE or Unigram), post-processor and decoder,
/// each read from the file. Anything in the file that xgrad does not implement is refused by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text {

/// A tokenizer.json pipeline (kind "hf").
///
/// encode(text, specials) gives the ids of Hugging Face's `encode(text, add_special_tokens=False)`;
/// encode_for_model adds what the post-processor's template adds (`add_special_tokens=True`, such
/// as Llama 3's `<|begin_of_text|>`). Text that is not UTF-8 is first decoded as a browser's or
/// node's TextDecoder decodes it (each maximal ill-formed subsequence becomes U+FFFD), as Hugging
/// Face's tokenizers see such bytes. The added tokens are matched in any text; with
/// SpecialText::ordinary the special ones are not (Hugging Face's split_special_tokens), so user
/// text cannot forge them.
///
/// decode(ids) gives Hugging Face's `decode(ids, skip_special_tokens=False)` text: the decoder's
/// output (U+FFFD where the ids cut a character), then the cleanup of spaces before punctuation
/// when tokenizer_config.json asks for it (clean_up_tokenization_spaces). token_bytes(id) is
/// decode({id}).
///
/// Immutable after construction: encode and decode may run on several threads at once.
class HfTokenizer : public Tokenizer {
 public:
  /// Builds the pipeline of a tokenizer.json document and a tokenizer_config.json document ("" for
  /// none). `source` names where they come from in messages ("load_hf_tokenizer: 'dir'").
  HfTokenizer(std::string_view tokenizer_json, std::string_view config_json, const std::string& source);
  ~HfTokenizer() override;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  TokenIds encode(std::string_view text, SpecialText specials = SpecialText::as_reference) const override;
  TokenIds encode_for_model(std::string_view text, SpecialText specials = SpecialText::as_reference) const override;
  std::string decode(const TokenIds& ids) const override;
  std::string token_bytes(std::int64_t id) const override;
  std::size_t vocab_size() const override;
  SpecialTokens special_tokens() const override;
  std::string kind() const override { return "hf"; }
  /// {"kind":"hf","tokenizer":<tokenizer.json>,"config":<tokenizer_config.json or null>}, both
  /// documents as parsed (keys sorted), so two copies of one file have one identity.
  std::string to_json() const override;

  /// Rebuilds the tokenizer of to_json's document; a malformed one is an Error starting with `who`.
  static std::unique_ptr<HfTokenizer> from_json(std::string_view json, const std::string& who);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The tokenizer of `path`: a folder holding tokenizer.json (and tokenizer_config.json, read when
/// present), or a tokenizer.json file alone. A missing or unreadable file, a document that is not
/// a tokenizer, or a component or option xgrad does not implement is an Error starting
/// "load_hf_tokenizer" that names the file, the JSON path and the value.
std::unique_ptr<HfTokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace xgrad::text
