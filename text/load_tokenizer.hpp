/// @file
/// Opening a tokenizer by the kind and path a program's `--tokenizer` option names.
#pragma once

#include <memory>
#include <string>

#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text {

/// "bytes" (no path); "gpt2" or "bpe": a folder holding vocab.json and merges.txt, or a Hugging
/// Face tokenizer.json (a BPE model with the ByteLevel pre-tokenizer); "spm": a SentencePiece
/// .model file; "hf": a Hugging Face tokenizer folder (tokenizer.json and tokenizer_config.json)
/// or tokenizer.json, run as its whole pipeline (HfTokenizer). Another kind, a path given to "bytes" or missing for the
/// others is an Error naming `who`, the kind and the path.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& path,
                                          const std::string& who = "load_tokenizer");

}  // namespace xgrad::text
