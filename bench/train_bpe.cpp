// How long train_byte_level_bpe takes on about 10 MB of English-like text, on one core. Two
// corpora: the licence texts of /usr/share/common-licenses concatenated and repeated to the size
// (few distinct words), and generated text (a lexicon of made-up words drawn with Zipf's law,
// capitals, numbers, punctuation and line breaks: tens of thousands of distinct words, as real
// text of that size has). --file trains on a file of your own instead, repeated to the size.
// Each corpus is timed --reps times; the table gives the fastest run and the median.
//     build/bench/bench_train_bpe [--megabytes 10] [--vocab-size 4096] [--reps 3] [--file PATH]
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/bpe_trainer.hpp"
#include "xgrad/text/pretokenizer.hpp"

using namespace xgrad;

namespace {

std::string repeated_to(const std::string& text, std::size_t bytes) {
  if (text.empty()) fail("bench_train_bpe: the text to repeat is empty");
  std::string out;
  out.reserve(bytes + text.size());
  while (out.size() < bytes) out += text;
  out.resize(bytes);
  return out;
}

std::string licence_texts() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses"))
    if (entry.is_regular_file() && !entry.is_symlink()) paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  std::string all;
  for (const auto& p : paths) all += read_file(p, "bench_train_bpe") + "\n";
  return all;
}

// Made-up words from syllables, drawn by rank with weight 1 / rank (Zipf), some capitalized,
// with numbers, punctuation and line breaks between them.
std::string generated_text(std::size_t bytes) {
  Generator gen(0);
  const char* onsets[] = {"",  "b", "c", "d", "f", "g",  "h",  "l",  "m",  "n",
                          "p", "r", "s", "t", "w", "th", "st", "ch", "pr", "tr"};
  const char* vowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "io", "ai"};
  const char* codas[] = {"", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "rt", "ck"};
  const std::size_t lexicon_size = 60000;
  std::vector<std::string> lexicon;
  for (std::size_t i = 0; i < lexicon_size; ++i) {
    const std::size_t syllables = 1 + gen.below(3) + (i > 1000 ? 1 : 0);
    std::string w;
    for (std::size_t s = 0; s < syllables; ++s) {
      w += onsets[gen.below(std::size(onsets))];
      w += vowels[gen.below(std::size(vowels))];
      w += codas[gen.below(std::size(codas))];
    }
    lexicon.push_back(w);
  }
  std::vector<double> cumulative(lexicon_size);
  double total = 0;
  for (std::size_t i = 0; i < lexicon_size; ++i) cumulative[i] = total += 1.0 / static_cast<double>(i + 1);
  const char* punctuation[] = {",", ".", ";", "!", "?", " -", ":"};
  std::string out;
  out.reserve(bytes + 64);
  bool sentence_start = true;
  while (out.size() < bytes) {
    const double u = (static_cast<double>(gen.next_u64() >> 11) / 9007199254740992.0) * total;
    std::string w = lexicon[std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()];
    if (gen.below(50) == 0) w = std::to_string(gen.below(10000));
    if (sentence_start || gen.below(20) == 0) w[0] = static_cast<char>(std::toupper(w[0]));
    sentence_start = false;
    if (!out.empty() && out.back() != '\n') out += ' ';
    out += w;
    const auto r = gen.below(100);
    if (r < 12) {
      out += punctuation[gen.below(std::size(punctuation))];
      sentence_start = out.back() == '.';
      if (r < 2) out += '\n';
    }
  }
  out.resize(bytes);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t megabytes = 10, vocab_size = 4096, reps = 3;
  std::string file;
  CLI::App app{"train_byte_level_bpe on about 10 MB of English-like text, one core", "bench_train_bpe"};
  app.add_option("--megabytes", megabytes, "text size in MB (10^6 bytes)")
      ->transform(cli::count(1, 10000))
      ->capture_default_str();
  app.add_option("--vocab-size", vocab_size, "vocabulary size, with the 256 bytes and <|endoftext|>")
      ->transform(cli::count(257, 1000000))
      ->capture_default_str();
  app.add_option("--reps", reps, "runs of each corpus")->transform(cli::count(1, 100))->capture_default_str();
  app.add_option("--file", file, "train on this file (repeated to the size) instead of the two corpora");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_train_bpe", [&] {
    const std::size_t bytes = megabytes * 1000000;
    std::vector<std::pair<std::string, std::string>> corpora;
    if (!file.empty()) {
      corpora.emplace_back(file, repeated_to(read_file(file, "bench_train_bpe"), bytes));
    } else {
      corpora.emplace_back("licences repeated", repeated_to(licence_texts(), bytes));
      corpora.emplace_back("generated", generated_text(bytes));
    }
    const auto options = text::BpeTrainerOptions(vocab_size).special_tokens({"<|endoftext|>"});
    std::printf("%-18s %6s %9s %9s %7s %6s %13s %11s %11s\n", "corpus", "MB", "pieces", "distinct", "merges", "ids",
                "pretokenize s", "train min s", "train med s");
    for (const auto& [name, text] : corpora) {
      text::Gpt2Pretokenizer pretokenizer;
      auto t0 = std::chrono::steady_clock::now();
      const auto pieces = pretokenizer.split(text);
      const double split_seconds = seconds_since(t0);
      const std::size_t distinct = std::unordered_set<std::string_view>(pieces.begin(), pieces.end()).size();
      std::vector<double> times;
      text::BpeVocabulary vocabulary;
      for (std::size_t r = 0; r < reps; ++r) {
        t0 = std::chrono::steady_clock::now();
        vocabulary = text::train_byte_level_bpe({text}, options);
        times.push_back(seconds_since(t0));
      }
      std::sort(times.begin(), times.end());
      std::printf("%-18s %6.1f %9zu %9zu %7zu %6zu %13.3f %11.3f %11.3f\n", name.c_str(), text.size() / 1e6,
                  pieces.size(), distinct, vocabulary.merges.size(), vocabulary.tokens.size(), split_seconds,
                  times.front(), times[times.size() / 2]);
    }
  });
}
