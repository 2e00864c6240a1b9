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

#include <xgrad/xgrad.hpp>

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

// Next-byte prediction: ids (B, T) are windows of the text, targets (B, T) the byte after each id.
struct Batch {
  IndexArray ids, targets;
};

Batch windows(const std::string& text, const std::vector<std::size_t>& starts) {
  Batch b{IndexArray::from_shape({starts.size(), kContext}), IndexArray::from_shape({starts.size(), kContext})};
  for (std::size_t i = 0; i < starts.size(); ++i) {
    for (std::size_t t = 0; t < kContext; ++t) {
      b.ids(i, t) = static_cast<unsigned char>(text[starts[i] + t]);
      b.targets(i, t) = static_cast<unsigned char>(text[starts[i] + t + 1]);
    }
  }
  return b;
}

// B windows at random offsets of the training text.
Batch random_batch(const std::string& text, Generator& gen) {
  std::vector<std::size_t> starts(kBatch);
  for (std::size_t& s : starts) s = gen.below(text.size() - kContext);
  return windows(text, starts);
}

// Trains on all but the last n_valid bytes of the text, then samples from the model.
int run(const std::string& text, std::size_t n_valid, std::size_t steps) {
  const std::string train = text.substr(0, text.size() - n_valid), held_out = text.substr(text.size() - n_valid);
  std::vector<std::size_t> valid_starts;
  for (std::size_t s = 0; s + kContext < held_out.size() && valid_starts.size() < kMaxValid; s += kContext) {
    valid_starts.push_back(s);
  }
  const Batch valid = windows(held_out, valid_starts);

  // The model: 256 byte embeddings plus learned positions, 2 Pre-Norm blocks of 4 heads, a head to
  // 256 logits per position. No dropout (its default is 0.1): both losses measure the same function.
  Generator gen(kSeed);  // initial weights, batches and the sample: same seed, same output
  nn::LanguageModel model(nn::LanguageModelOptions(256, 64, 4, 2).max_len(kContext).dropout(0.f), gen);
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
    const Batch b = random_batch(train, gen);
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
  std::vector<std::int64_t> bytes;
  for (std::size_t i = 0; i < kPrompt; ++i) bytes.push_back(static_cast<unsigned char>(text[i]));
  nn::GenerateOptions sampling;
  sampling.temperature = 0.8f;
  bytes = model.generate(bytes, kSampleBytes, sampling, gen);
  std::printf("sample (%zu bytes of prompt, %zu generated):\n", kPrompt, kSampleBytes);
  for (std::int64_t b : bytes) std::putchar(static_cast<int>(b));
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
