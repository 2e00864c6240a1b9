/// @file
/// The roles of special tokens told by their texts (an internal header of text/), for tokenizers
/// whose files do not name them.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>

#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text::detail {

/// bos `<s>`, `<bos>`, `<|bos|>`, `<|startoftext|>`, `<|begin_of_text|>`, `[BOS]`; eos `</s>`,
/// `<eos>`, `<|eos|>`, `<|end_of_text|>`, `[EOS]`; pad `<pad>`, `<|pad|>`, `<|padding|>`, `[PAD]`;
/// unk `<unk>`, `<|unk|>`, `[UNK]` (the first text of a list that `special_id` finds);
/// `<|endoftext|>` is bos and eos where no text above gave them (GPT-2).
inline SpecialTokens special_roles_by_text(const std::function<std::optional<std::int64_t>(const char*)>& special_id) {
  const auto first_of = [&](std::initializer_list<const char*> texts) -> std::optional<std::int64_t> {
    for (const char* text : texts)
      if (const std::optional<std::int64_t> id = special_id(text)) return id;
    return std::nullopt;
  };
  SpecialTokens roles;
  roles.bos = first_of({"<s>", "<bos>", "<|bos|>", "<|startoftext|>", "<|begin_of_text|>", "[BOS]"});
  roles.eos = first_of({"</s>", "<eos>", "<|eos|>", "<|end_of_text|>", "[EOS]"});
  roles.pad = first_of({"<pad>", "<|pad|>", "<|padding|>", "[PAD]"});
  roles.unk = first_of({"<unk>", "<|unk|>", "[UNK]"});
  const std::optional<std::int64_t> end_of_text = first_of({"<|endoftext|>"});
  if (!roles.bos) roles.bos = end_of_text;
  if (!roles.eos) roles.eos = end_of_text;
  return roles;
}

}  // namespace xgrad::text::detail
