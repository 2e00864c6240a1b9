// A tiny GPT trained on the bytes of a text file, then asked to continue the text's first bytes:
// xgrad's whole training loop in one file. Usage: minimal_gpt TEXT_FILE [STEPS]
// Shapes: B windows per batch, T bytes per window, V = 256 byte values.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>  // with the xgrad::text library for the bytes tokenizer and the batches

using namespace xgrad;

namespace {

constexpr std::size_t kContext = 32;                           // T: the bytes the model sees at once
constexpr std::size_t kBatch = 16;                             // B
constexpr std::size_t kSteps = 1000, kMaxSteps = 100'000'000;  // STEPS: its default and its limit
constexpr std::size_t kMaxValid = 64;                          // validation windows
constexpr std::size_t kPrompt = 16, kSampleBytes = 200;
constexpr std::uint64_t kSeed = 1337;

// One line on stderr; exit 2 for a bad command line, 1 for a run that failed.
[[noreturn]] void quit(int code, const std::string& what) {
  std::fprintf(stderr, "minimal_gpt: error: %s\n", what.c_str());
  std::exit(code);
}

// Output that cannot be written (a full disk) ends the run.
void flush() {
  if (std::fflush(stdout) != 0) quit(1, std::string("cannot write the output: ") + std::strerror(errno));
}

// STEPS: digits only, from 1 to kMaxSteps ("-5", "1e3", "0x10" and "0" are refused).
std::size_t parse_steps(const std::string& s) {
  const bool digits = !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
  const std::size_t n = digits ? std::stoul(s) : 0;
  if (n < 1 || n > kMaxSteps) {
    quit(2, "STEPS '" + s.substr(0, 40) + "' is not a whole number from 1 to " + std::to_string(kMaxSteps));
  }
  return n;
}

// Trains on all but the last n_valid bytes of the text, then samples from the model.
int run(const std::string& text, std::size_t n_valid, std::size_t steps) {
  // Tokens are bytes. Batches come from the text library: windows of T + 1 ids, whose first T are
  // the ids (B, T) and whose last T the targets (B, T), the byte after each id.
  const text::BytesTokenizer bytes;
  const text::TokenVector train(bytes.encode(std::string_view(text).substr(0, text.size() - n_valid)));
  const text::TokenVector held_out(bytes.encode(std::string_view(text).substr(text.size() - n_valid)));
  // Validation: one batch of the held-out text's first consecutive windows (up to kMaxValid).
  const std::size_t windows = std::min(kMaxValid, (held_out.size() - 1) / kContext);
  const text::TokenBatch valid = text::evaluation_windows(held_out, windows, kContext, 1).at(0);

  // The model: 256 byte embeddings plus learned positions, 2 Pre-Norm blocks of 4 heads, a head to
  // 256 logits per position. No dropout (its default is 0.1): both losses measure the same function.
  Generator gen(kSeed);  // initial weights, batches and the sample: same seed, same output
  nn::LanguageModel model(nn::LanguageModelOptions(bytes.vocab_size(), 64, 4, 2).max_len(kContext).dropout(0.f), gen);
  optim::AdamW optimizer(model.named_parameters(), optim::AdamW::defaults(3e-3f));
  // Warm up for a tenth of the run, then decay the learning rate along a cosine to a tenth.
  const optim::LrSchedule schedule(optim::ScheduleOptions(3e-3f)
                                       .warmup_steps(steps / 10)
                                       .total_steps(steps)
                                       .decay(optim::Decay::cosine)
                                       .min_lr(3e-4f));
  std::printf("text: %zu bytes (%zu to train on, %zu held out)  model: %zu parameters  steps: %zu of %zu x %zu bytes\n",
              text.size(), train.size(), held_out.size(), model.num_parameters(), steps, kBatch, kContext);

  // The loop: forward, backward, update. A line at step 1 and every tenth of the run: the step's
  // batch loss (before its update) and the held-out loss (after it).
  const std::size_t every = std::max<std::size_t>(1, steps / 10);
  for (std::size_t step = 1; step <= steps; ++step) {
    const text::TokenBatch b = text::random_windows(train, kContext, kBatch, gen);  // at random offsets
    const Tensor loss = model.loss(b.ids, b.targets);  // mean cross-entropy of the (B, T, V) logits
    optimizer.zero_grad();
    loss.backward();
    const float train_loss = loss.item();
    optim::check_finite(step, train_loss, optimizer.params());  // a NaN stops the run, naming the step
    optim::clip_grad_norm(optimizer.params(), 1.f);
    optimizer.set_lr(schedule.lr(step - 1));
    optimizer.step();
    if (step == 1 || step % every == 0 || step == steps) {
      NoGradGuard no_grad;  // the held-out loss records nothing for backward
      const float valid_loss = model.loss(valid.ids, valid.targets).item();
      std::printf("step %5zu  train loss %.4f  valid loss %.4f\n", step, train_loss, valid_loss);
      flush();
    }
  }

  // Generation: the first bytes of the text, continued by sampling one byte at a time.
  nn::GenerateOptions sampling;
  sampling.temperature = 0.8f;
  const std::vector<std::int64_t> ids =
      model.generate(bytes.encode(std::string_view(text).substr(0, kPrompt)), kSampleBytes, sampling, gen);
  std::printf("sample (%zu bytes of prompt, %zu generated):\n", kPrompt, kSampleBytes);
  const std::string sample = bytes.decode(ids);
  std::fwrite(sample.data(), 1, sample.size(), stdout);
  std::putchar('\n');
  flush();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || argv[1][0] == '-') quit(2, "usage: minimal_gpt TEXT_FILE [STEPS]");
  const std::size_t steps = argc == 3 ? parse_steps(argv[2]) : kSteps;
  // The text: its last tenth (at least one window) is held out for validation.
  std::string text;
  try {
    text = read_file(argv[1], "the text file", std::uint64_t{1} << 30);
  } catch (const Error& e) {
    quit(2, e.what());  // missing, a folder, a device, unreadable, over 1 GiB
  } catch (const std::exception& e) {
    quit(1, e.what());  // no memory for it
  }
  const std::size_t n_valid = std::max(text.size() / 10, kContext + 1);
  if (text.size() < n_valid + kContext + 1) {
    quit(2, "the text file '" + std::string(argv[1]) + "' is too short: " + std::to_string(text.size()) +
                " bytes, fewer than " + std::to_string(2 * (kContext + 1)) +
                " (a training and a validation window of " + std::to_string(kContext + 1) + " bytes)");
  }
  try {
    return run(text, n_valid, steps);
  } catch (const std::exception& e) {
    quit(1, e.what());  // a NaN loss, memory that ran out
  }
}
