// Encoding speed of a tokenizer (GPT-2's byte-level BPE by default, or any kind load_tokenizer
// opens, such as `--kind hf DIR` for a tokenizer.json pipeline): for each file, the whole file
// encoded on one thread `--repeats` times (after one untimed encode), the median in MB/s (10^6
// bytes of input a second). bench/tokenize_js.mjs measures js-tiktoken or Hugging Face's
// JavaScript tokenizers the same way, and bench/compare_tokenize.py alternates the two.
//     build/bench/bench_tokenize [--kind hf] [--tokenizer DIR] [--repeats 15] [--json] FILE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/text/load_tokenizer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"bench_tokenize: a tokenizer's encode speed, one thread"};
  std::string kind = "gpt2", tokenizer = "tests/fixtures/gpt2_tokenizer";
  int repeats = 15;
  bool json = false;
  std::vector<std::string> files;
  app.add_option("--kind", kind, "the tokenizer's kind, as train_lm's --tokenizer names it (gpt2, bpe, spm, hf)");
  app.add_option("--tokenizer", tokenizer, "the tokenizer's path (for gpt2: a folder with vocab.json + merges.txt)");
  app.add_option("--repeats", repeats, "timed encodes of each file")->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "one JSON line per file instead of the table");
  app.add_option("files", files, "the texts to encode")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto bpe = xgrad::text::load_tokenizer(kind, tokenizer, "bench_tokenize");
    if (!json) std::printf("%-40s %10s %10s %10s\n", "file", "bytes", "tokens", "MB/s");
    for (const std::string& file : files) {
      const std::string text = xgrad::read_file(file, "bench_tokenize");
      std::size_t tokens = bpe->encode(text).size();  // untimed: page faults, first allocations
      std::vector<double> rates;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        tokens = bpe->encode(text).size();
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        rates.push_back(static_cast<double>(text.size()) / 1e6 / dt.count());
      }
      std::sort(rates.begin(), rates.end());
      const double median = rates[rates.size() / 2];
      if (json)
        std::printf("{\"file\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"mb_per_s\": %.3f}\n", file.c_str(),
                    text.size(), tokens, median);
      else
        std::printf("%-40s %10zu %10zu %10.2f\n", file.c_str(), text.size(), tokens, median);
    }
  } catch (const xgrad::Error& e) {
    std::fprintf(stderr, "bench_tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
