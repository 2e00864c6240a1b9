// examples/minimal_gpt run as a user runs it (a child process under a time and memory limit): on a
// small text its loss falls well below what a model without context reaches and it prints a
// sample in the text's alphabet; the same run gives the same output; bad arguments and files end
// with one line on stderr and exit 2, an output that cannot be written with exit 1.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_program.hpp"
#include "test_files.hpp"
#include "xgrad/core/random.hpp"

using xgrad::testing::Limits;
using xgrad::testing::Outcome;
using xgrad::testing::TempDir;
using xgrad::testing::write_bytes;

namespace {

const std::string kSampleHeader = "sample (16 bytes of prompt, 200 generated):\n";

Outcome run(const TempDir& dir, const std::vector<std::string>& args, const Limits& limits = {}) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/minimal_gpt", args, limits);
}

// About `bytes` bytes of short sentences from a few word lists: learnable in sixty steps.
std::string sentences(std::size_t bytes) {
  const std::vector<std::string> subjects = {"the cat", "the old dog", "a small bird", "my neighbour", "the teacher"};
  const std::vector<std::string> verbs = {"saw", "found", "painted", "carried", "followed", "built"};
  const std::vector<std::string> objects = {"a red boat", "the green door", "two apples", "an empty basket", "a house"};
  const std::vector<std::string> places = {"near the river", "in the garden", "at the market", "on the hill"};
  xgrad::Generator gen(7);
  std::string text;
  while (text.size() < bytes) {
    text += subjects[gen.below(subjects.size())] + " " + verbs[gen.below(verbs.size())] + " " +
            objects[gen.below(objects.size())];
    if (gen.below(2) == 0) text += " " + places[gen.below(places.size())];
    text += ".\n";
  }
  return text;
}

// Entropy in nats of the text's byte frequencies: the loss of the best model that ignores context.
double unigram_entropy(const std::string& text) {
  std::vector<double> count(256, 0.0);
  for (unsigned char c : text) count[c] += 1;
  double h = 0;
  for (double n : count) {
    if (n > 0) h -= n / static_cast<double>(text.size()) * std::log(n / static_cast<double>(text.size()));
  }
  return h;
}

struct Row {
  std::size_t step;
  float train, valid;
};

// The "step N  train loss X  valid loss Y" lines of the output.
std::vector<Row> loss_rows(const std::string& out) {
  std::vector<Row> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    Row r{};
    if (std::sscanf(line.c_str(), "step %zu  train loss %f  valid loss %f", &r.step, &r.train, &r.valid) == 3) {
      rows.push_back(r);
    }
  }
  return rows;
}

// Exited by itself with `code`, nothing on stdout, and one line "minimal_gpt: error: ..." on
// stderr holding every part.
void require_refused(const Outcome& o, int code, const std::vector<std::string>& parts) {
  INFO(o);
  REQUIRE_FALSE(o.timed_out);
  REQUIRE(o.exited);
  REQUIRE(o.code == code);
  REQUIRE_THAT(o.err, Catch::StartsWith("minimal_gpt: error: "));
  REQUIRE(o.err.find('\n') == o.err.size() - 1);
  for (const std::string& p : parts) REQUIRE_THAT(o.err, Catch::Contains(p));
  if (code == 2) REQUIRE(o.out.empty());
}

}  // namespace

TEST_CASE("the loss falls below a context-free model's and a sample in the text's alphabet follows",
          "[examples][minimal_gpt][gemm][long]") {
  TempDir dir("xgrad_minimal_gpt");
  const std::string text = sentences(8000);
  write_bytes(dir.file("text.txt"), text);
  const Outcome o = run(dir, {"text.txt", "60"});
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 0);
  REQUIRE(o.err.empty());
  REQUIRE_THAT(o.out, Catch::StartsWith("text: " + std::to_string(text.size()) + " bytes ("));

  // A line at step 1 and every tenth of the run.
  const std::vector<Row> rows = loss_rows(o.out);
  REQUIRE(rows.size() == 11);
  REQUIRE(rows.front().step == 1);
  for (std::size_t i = 1; i < rows.size(); ++i) REQUIRE(rows[i].step == 6 * i);
  // Untrained, the model is close to uniform over 256 bytes (ln 256 = 5.55). A loop that does not
  // update stays there; one that learns only byte frequencies stops at the unigram entropy.
  const double unigram = unigram_entropy(text);
  CHECK(unigram > 2.5);
  CHECK(unigram < 3.2);
  REQUIRE(rows.front().train > 5.f);
  REQUIRE(rows.front().valid > 5.f);
  REQUIRE(rows.back().train < rows.front().train - 2.5f);
  REQUIRE(rows.back().valid < rows.front().valid - 2.5f);
  REQUIRE(rows.back().valid < unigram - 0.5);

  // The sample: the text's first 16 bytes, then 200 drawn almost only from the bytes the text uses
  // (an untrained model draws about 1 in 10 from them).
  const std::size_t at = o.out.find(kSampleHeader);
  REQUIRE(at != std::string::npos);
  const std::string sample = o.out.substr(at + kSampleHeader.size());
  REQUIRE(sample.size() == 16 + 200 + 1);
  REQUIRE(sample.substr(0, 16) == text.substr(0, 16));
  REQUIRE(sample.back() == '\n');
  const std::set<char> alphabet(text.begin(), text.end());
  std::size_t known = 0;
  for (std::size_t i = 16; i < 216; ++i) known += alphabet.count(sample[i]);
  REQUIRE(known >= 190);
}

TEST_CASE("the same run prints the same bytes, and STEPS is decimal", "[examples][minimal_gpt][gemm]") {
  TempDir dir("xgrad_minimal_gpt_same");
  write_bytes(dir.file("text.txt"), sentences(3000));
  const Outcome a = run(dir, {"text.txt", "10"}), b = run(dir, {"text.txt", "10"}), c = run(dir, {"text.txt", "010"});
  INFO(a);
  REQUIRE(a.code == 0);
  REQUIRE(loss_rows(a.out).back().step == 10);
  REQUIRE(b.out == a.out);
  REQUIRE(c.out == a.out);
}

TEST_CASE("bad arguments and files exit 2 with one line naming the problem",
          "[examples][minimal_gpt][bad_input][gemm]") {
  TempDir dir("xgrad_minimal_gpt_bad");
  const std::string text = sentences(3000);
  write_bytes(dir.file("text.txt"), text);
  const std::string usage = "usage: minimal_gpt TEXT_FILE [STEPS]";
  require_refused(run(dir, {}), 2, {usage});
  require_refused(run(dir, {"text.txt", "10", "extra"}), 2, {usage});
  require_refused(run(dir, {"--help"}), 2, {usage});

  require_refused(run(dir, {"missing.txt"}), 2, {"the text file", "'missing.txt'", "No such file or directory"});
  require_refused(run(dir, {dir.path}), 2, {"the text file", "it is a folder"});
  require_refused(run(dir, {"/dev/zero"}), 2, {"the text file", "'/dev/zero'", "not a regular file"});
  if (::geteuid() != 0) {  // root reads any file
    write_bytes(dir.file("locked.txt"), text);
    ::chmod(dir.file("locked.txt").c_str(), 0);
    require_refused(run(dir, {"locked.txt"}), 2, {"the text file", "'locked.txt'", "Permission denied"});
  }
  // One training and one validation window of 33 bytes each: 66 bytes train, 65 do not.
  write_bytes(dir.file("short.txt"), text.substr(0, 65));
  require_refused(run(dir, {"short.txt"}), 2,
                  {"the text file 'short.txt' is too short: 65 bytes, fewer than 66",
                   "(a training and a validation window of 33 bytes)"});
  write_bytes(dir.file("just.txt"), text.substr(0, 66));
  const Outcome just = run(dir, {"just.txt", "1"});
  INFO(just);
  REQUIRE(just.code == 0);
  REQUIRE(loss_rows(just.out).size() == 1);

  for (const std::string steps : {"0", "-5", "abc", "1e3", "0x10", " 5", "", "100000001", "18446744073709551617"}) {
    require_refused(run(dir, {"text.txt", steps}), 2,
                    {"STEPS '" + steps + "' is not a whole number from 1 to 100000000"});
  }
}

TEST_CASE("an output that cannot be written ends the run with exit 1", "[examples][minimal_gpt][bad_input][gemm]") {
  TempDir dir("xgrad_minimal_gpt_full");
  write_bytes(dir.file("text.txt"), sentences(3000));
  Limits full;
  full.file_size = 64;  // stdout's file: the first line does not fit, as on a full disk
  const Outcome o = run(dir, {"text.txt", "10"}, full);
  require_refused(o, 1, {"cannot write the output: File too large"});
  REQUIRE(o.out.size() == 64);
}
