#include "xgrad/text/load_tokenizer.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/hf_tokenizer.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"

namespace xgrad::text {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& path, const std::string& who) {
  if (kind == "bytes") {
    if (!path.empty())
      throw Error(who + ": the bytes tokenizer takes no path (\"" + readable_bytes(path) + "\" given)");
    return std::make_unique<BytesTokenizer>();
  }
  if (kind != "gpt2" && kind != "bpe" && kind != "spm" && kind != "hf")
    throw Error(who + ": unknown tokenizer \"" + readable_bytes(kind) +
                "\" (bytes, gpt2 DIR, bpe PATH, spm FILE, hf DIR)");
  if (path.empty()) throw Error(who + ": the " + kind + " tokenizer needs a path");
  // The loaders' messages name the file and the entry; this one adds who asked and for which kind.
  try {
    if (kind == "spm") return load_sentencepiece(path);
    if (kind == "hf") return load_hf_tokenizer(path);
    return load_byte_level_bpe(path);  // gpt2 and bpe: a folder of vocab.json + merges.txt, or a tokenizer.json
  } catch (const Error& e) {
    throw Error(who + ": the " + kind + " tokenizer: " + e.what());
  }
}

}  // namespace xgrad::text
