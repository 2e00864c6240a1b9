// An outside program on xgrad::text: GPT-2's pre-tokenization and the bytes tokenizer.
#include <cstdio>

#include <xgrad/text/bytes_tokenizer.hpp>
#include <xgrad/text/pretokenizer.hpp>

int main() {
  const xgrad::text::Gpt2Pretokenizer pre;
  const xgrad::text::BytesTokenizer bytes;
  const auto pieces = pre.split("Hello world, 北京!");
  std::printf("text: %zu pieces, %zu byte tokens\n", pieces.size(), bytes.encode("Hello world, 北京!").size());
  return pieces.size() == 5 ? 0 : 1;
}
