// Choosing, training and using a run's tokenizer.
#include "tokenizers.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "xgrad/core/error.hpp"
#include "xgrad/text/bpe_trainer.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/load_tokenizer.hpp"

namespace lm {

namespace {

// Saves a trained vocabulary in `dir`; when resuming, files already there must hold that tokenizer.
void save_trained(const xgrad::text::BpeVocabulary& vocabulary, const xgrad::text::Tokenizer& trained,
                  const std::string& dir, bool resuming) {
  const bool saved = std::filesystem::exists(dir + "/vocab.json") || std::filesystem::exists(dir + "/merges.txt");
  if (!resuming || !saved) return xgrad::text::save_gpt2_vocabulary(vocabulary, dir);
  const auto there = xgrad::text::load_tokenizer("bpe", dir, "--save-tokenizer");
  if (there->identity() != trained.identity())
    xgrad::fail("--save-tokenizer: '", dir, "' holds the tokenizer ", xgrad::text::describe(there->identity()),
                ", not the one trained now (", xgrad::text::describe(trained.identity()), "); choose another folder");
}

}  // namespace

std::shared_ptr<const xgrad::text::Tokenizer> make_tokenizer(const TokenizerChoice& choice,
                                                             std::string_view training_text, bool resuming) {
  if (!choice.spec.empty() && choice.train_vocab > 0)
    xgrad::fail("--tokenizer and --train-tokenizer both name the tokenizer: give one");
  if (!choice.save_dir.empty() && choice.train_vocab == 0)
    xgrad::fail("--save-tokenizer saves the tokenizer --train-tokenizer trains");
  if (choice.train_vocab > 0) {
    const auto start = std::chrono::steady_clock::now();
    const xgrad::text::BpeVocabulary vocabulary = xgrad::text::train_byte_level_bpe(
        {std::string(training_text)},
        xgrad::text::BpeTrainerOptions(choice.train_vocab).special_tokens({"<|endoftext|>"}));
    auto tokenizer = std::make_shared<xgrad::text::ByteLevelBpe>(vocabulary);
    const std::string fewer = tokenizer->vocab_size() < choice.train_vocab
                                  ? " (of " + std::to_string(choice.train_vocab) + " asked: no pair left occurs twice)"
                                  : "";
    std::printf("tokenizer: a byte-level BPE of %zu tokens%s trained on %zu bytes in %.2f s\n", tokenizer->vocab_size(),
                fewer.c_str(), training_text.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!choice.save_dir.empty()) save_trained(vocabulary, *tokenizer, choice.save_dir, resuming);
    return tokenizer;
  }
  if (choice.spec.empty()) return std::make_shared<xgrad::text::BytesTokenizer>();
  if (choice.spec.size() > 2) xgrad::fail("--tokenizer takes a kind and a path, not ", choice.spec.size(), " values");
  return xgrad::text::load_tokenizer(choice.spec[0], choice.spec.size() > 1 ? choice.spec[1] : "", "--tokenizer");
}

void sample_text(xgrad::nn::LanguageModel& model, const xgrad::text::Tokenizer& tokenizer, const std::string& prompt,
                 std::size_t count, const SampleOptions& s, std::uint64_t seed) {
  const xgrad::text::TokenIds ids = tokenizer.encode(prompt);
  if (ids.empty()) xgrad::fail("--prompt '", prompt, "' encodes to no tokens");
  xgrad::nn::GenerateOptions o;
  o.temperature = s.temperature;
  o.top_k = s.top_k;
  o.top_p = s.top_p;
  o.min_p = s.min_p;
  o.repetition_penalty = s.repetition_penalty;
  o.seed = seed;
  o.stop_strings = s.stop;
  // An imported model's embedding may have more rows than the tokenizer has tokens (padded).
  if (tokenizer.vocab_size() < model.options().vocab_size()) o.vocab_limit = tokenizer.vocab_size();
  const std::optional<std::int64_t> eos = s.ignore_eos ? std::nullopt : tokenizer.special_tokens().eos;
  if (eos) o.stop_tokens = {*eos};
  // The new text is the whole sequence's less the prompt's, so that a tokenizer that decodes a token
  // by its neighbours (SentencePiece's leading space) prints what decoding it all would; the EOS
  // that ends the sample is not printed.
  const std::string before = tokenizer.decode(ids);
  o.decode = [&](const xgrad::text::TokenIds& fresh) {
    const bool ends = eos && !fresh.empty() && fresh.back() == *eos;
    xgrad::text::TokenIds all = ids;
    all.insert(all.end(), fresh.begin(), fresh.end() - (ends ? 1 : 0));
    std::string text = tokenizer.decode(all);
    if (text.compare(0, before.size(), before) == 0) return text.substr(before.size());
    return tokenizer.decode(xgrad::text::TokenIds(fresh.begin(), fresh.end() - (ends ? 1 : 0)));
  };
  o.on_token = [](std::int64_t, const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  std::fwrite(before.data(), 1, before.size(), stdout);
  std::fflush(stdout);
  // bf16: each weight's bf16 copy made once and kept, half the bytes read per token
  if (s.precision == xgrad::Precision::bf16) xgrad::hold_bf16_copies(model.parameters());
  const xgrad::AutocastGuard guard(s.precision);
  model.generate(ids, count, o);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace lm
