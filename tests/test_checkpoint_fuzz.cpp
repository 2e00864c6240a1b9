// A deterministic mutation fuzzer for the checkpoint reader: parse_safetensors and
// weights::load_checkpoint on inputs mutated from the committed seed corpus in tests/fuzz_corpus/.
// Every mutation is drawn from an xgrad::Generator with a fixed seed, so every run tries the same
// inputs, and input i can be rebuilt on its own. Not coverage-guided: a bounded list sized for CI
// (also under ASan/UBSan). The single-edit and single-file truncation tests live in
// test_checkpoint.cpp.
//
// The rule checked for every input: parse_safetensors either returns contents that match the
// bytes (every tensor inside the data, the data covered exactly, the values equal the file's
// bytes, the sum of tensor sizes <= the input length), or throws xgrad::Error. Any other
// exception, a crash or a sanitizer report is a bug in the reader.
//
// Reproducing a failure: a failing check writes the input to fuzz-failure-<n>.safetensors in the
// working directory; a sanitizer report writes it to fuzz-crash-input.safetensors; a plain crash
// shows the input's index in Catch's "with message" lines, and
//   XGRAD_FUZZ_INPUT=<index> test_checkpoint_fuzz "[write_fuzz_input]"
// writes that input. Keep such an input as tests/fuzz_corpus/crash-<what>.safetensors: every
// corpus file is judged on every run. Regenerate the seed corpus with
// test_checkpoint_fuzz "[regenerate_corpus]".
// Environment: XGRAD_FUZZ_ITERATIONS overrides the number of random mutations (default 50000).
#include <catch2/catch.hpp>

#include <cxxabi.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "safetensors_bytes.hpp"
#include "small_models.hpp"
#include "test_files.hpp"

using namespace xgrad;
using testing::f32_le;
using testing::read_bytes;
using testing::read_u64_le;
using testing::small_lm;
using testing::TempDir;
using testing::u64_le;
using testing::write_bytes;
namespace fs = std::filesystem;

namespace {

// ----------------------------------------------------------------------------------------------
// Bytes
// ----------------------------------------------------------------------------------------------

std::string f32_bits_le(std::uint32_t bits) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file from a header text and data: the header is padded with spaces so the data
// starts 8-byte aligned (as save_safetensors does).
std::string st_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

// The header text and the data of a file whose 8-byte length fits; false otherwise.
bool split_file(const std::string& file, std::string& header, std::string& data) {
  if (file.size() < 8) return false;
  const std::uint64_t n = read_u64_le(file);
  if (n > file.size() - 8) return false;
  header = file.substr(8, n);
  data = file.substr(8 + n);
  return true;
}

std::string join_file(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// ----------------------------------------------------------------------------------------------
// The seed corpus
// ----------------------------------------------------------------------------------------------

struct Seed {
  std::string name;  // file name in tests/fuzz_corpus/
  std::string bytes;
  bool valid;  // parse_safetensors accepts it
};

// The seed corpus: small valid and near-valid safetensors files, built byte by byte from
// literal header texts (not with save_safetensors, so a change in the writer cannot silently
// change the corpus). The committed files in tests/fuzz_corpus/ are exactly these bytes (checked
// by "the committed seed corpus equals its generator"); regenerate them with
// test_checkpoint_fuzz "[regenerate_corpus]". Headers are compact (no spaces) so the textual
// JSON edits of the fuzzer find their keys.
std::vector<Seed> make_seed_corpus() {
  std::vector<Seed> seeds;
  // One (2, 3) tensor.
  seeds.push_back({"one_tensor.safetensors",
                   st_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
                           f32_le({0.5f, -1.25f, 2.f, -3.75f, 1e-3f, 65504.f})),
                   true});
  // Three tensors, listed in the header out of offset order.
  seeds.push_back({"several_tensors.safetensors",
                   st_file(R"({"b":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]},)"
                           R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("c":{"dtype":"F32","shape":[1,3],"data_offsets":[32,44]}})",
                           f32_le({1.f, 2.f, 3.f, 4.f, -1.f, -2.f, -3.f, -4.f, 0.25f, 0.125f, 0.0625f})),
                   true});
  // A 0-d scalar.
  seeds.push_back({"scalar.safetensors",
                   st_file(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", f32_le({3.5f})), true});
  // Zero-length axes: empty tensors at both ends of a 2-element vector.
  seeds.push_back({"zero_axis.safetensors",
                   st_file(R"({"e":{"dtype":"F32","shape":[0,3,2],"data_offsets":[0,0]},)"
                           R"("v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("z":{"dtype":"F32","shape":[5,0],"data_offsets":[8,8]}})",
                           f32_le({-7.f, 7.f})),
                   true});
  // Metadata with escapes and raw UTF-8; special float values (-0, inf, a NaN with payload, a
  // denormal) in the data.
  seeds.push_back({"metadata.safetensors",
                   st_file(R"({"__metadata__":{"format":"pt","step":"12","note":"quote \" backslash \\ caf)"
                           "\xc3\xa9"
                           R"( \u2603"},"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("y":{"dtype":"F32","shape":[1,1],"data_offsets":[12,16]}})",
                           f32_bits_le(0x80000000u) + f32_bits_le(0x7f800000u) + f32_bits_le(0x7fc01234u) +
                               f32_bits_le(0x00000001u)),
                   true});
  // No tensors at all.
  seeds.push_back({"empty.safetensors", st_file("{}", ""), true});
  // Near-valid: 4 bytes after the last tensor that no tensor covers.
  seeds.push_back({"near_valid_trailing_bytes.safetensors",
                   st_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
                           f32_le({0.5f, -1.25f, 2.f, -3.75f, 1e-3f, 65504.f, 9.f})),
                   false});
  // Near-valid: a 4-byte hole between two tensors.
  seeds.push_back({"near_valid_hole.safetensors",
                   st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                           f32_le({1.f, 2.f, 3.f, 4.f})),
                   false});
  return seeds;
}

std::string corpus_dir() { return std::string(XGRAD_SOURCE_DIR) + "/tests/fuzz_corpus"; }

std::vector<std::string> seed_bytes() {
  std::vector<std::string> out;
  for (const Seed& s : make_seed_corpus()) out.push_back(s.bytes);
  return out;
}

// ----------------------------------------------------------------------------------------------
// The verdict on one input
// ----------------------------------------------------------------------------------------------

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

// Checks accepted contents against the bytes they came from; returns what is wrong, or "".
std::string check_contents(const std::string& bytes, const SafetensorsContents& c) {
  if (bytes.size() < 8) return "accepted an input of " + std::to_string(bytes.size()) + " bytes";
  const std::uint64_t n = read_u64_le(bytes);
  if (n > bytes.size() - 8) return "accepted a header length " + std::to_string(n) + " beyond the input";
  const std::uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  // Sizes first, with overflow-checked arithmetic: no tensor claims more than the data holds.
  std::uint64_t total = 0;
  std::set<std::string> names;
  for (const auto& [name, a] : c.tensors) {
    if (!names.insert(name).second) return "tensor '" + name + "' returned twice";
    std::uint64_t count = 1;
    bool zero = false, overflow = false;
    for (std::size_t d : a.shape()) {
      if (d == 0)
        zero = true;
      else if (count > std::numeric_limits<std::uint64_t>::max() / d)
        overflow = true;
      else
        count *= d;
    }
    if (zero)
      count = 0;
    else if (overflow)
      return "tensor '" + name + "' has a shape whose element count overflows 64 bits";
    if (count != a.size())
      return "tensor '" + name + "' has " + std::to_string(a.size()) + " elements, its shape says " +
             std::to_string(count);
    if (a.size() > data_size / 4)
      return "tensor '" + name + "' claims " + std::to_string(a.size()) + " floats, the data has " +
             std::to_string(data_size) + " bytes";
    total += 4 * a.size();
    if (total > bytes.size())
      return "the tensors claim " + std::to_string(total) + " bytes, more than the " + std::to_string(bytes.size()) +
             "-byte input";
  }
  // xtensor computes row-major strides and backstrides in std::ptrdiff_t (xstrides.hpp,
  // compute_strides and adapt_strides), so an accepted shape must keep those products in range:
  // a zero-size tensor such as (0, 2^62, 2^62) passes every size check but overflows them,
  // which is undefined behaviour (UBSan: signed integer overflow) while the Array is built.
  for (const auto& [name, a] : c.tensors) {
    std::int64_t size = 1;
    for (std::size_t i = a.dimension(); i-- > 0;) {
      const auto dim = static_cast<std::int64_t>(a.shape()[i]);
      std::int64_t stride = size, back = 0;
      if (__builtin_mul_overflow(stride, dim, &size))
        return "tensor '" + name + "' of shape " + shape_str(a.shape()) +
               " has row-major strides that overflow std::ptrdiff_t";
      if (a.shape()[i] == 1) stride = 0;
      if (__builtin_mul_overflow(stride, static_cast<std::int64_t>(a.shape()[i] - 1), &back))
        return "tensor '" + name + "' of shape " + shape_str(a.shape()) +
               " has backstrides that overflow std::ptrdiff_t";
    }
  }
  if (total != data_size)
    return "the tensors cover " + std::to_string(total) + " of " + std::to_string(data_size) + " data bytes";

  // Then meaning, from an independent read of the header: the same names, offsets, values and
  // metadata.
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const std::exception& e) {
    return std::string("accepted a header nlohmann::json cannot parse: ") + e.what();
  }
  if (!header.is_object()) return "accepted a header that is not an object";
  std::size_t entries = 0;
  for (auto it = header.begin(); it != header.end(); ++it) entries += it.key() == "__metadata__" ? 0 : 1;
  if (entries != c.tensors.size())
    return "the header has " + std::to_string(entries) + " entries, the result " + std::to_string(c.tensors.size());
  for (const auto& [name, a] : c.tensors) {
    if (!header.contains(name)) return "tensor '" + name + "' is not in the header";
    const nlohmann::json& off = header[name]["data_offsets"];
    const std::uint64_t b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
    if (e < b || e > data_size || e - b != 4 * a.size()) return "tensor '" + name + "' does not match its data_offsets";
    if (a.size() && std::memcmp(a.data(), data + b, 4 * a.size()) != 0)
      return "tensor '" + name + "' values differ from the file's bytes";
  }
  Metadata meta;
  if (header.contains("__metadata__")) {
    for (auto it = header["__metadata__"].begin(); it != header["__metadata__"].end(); ++it)
      meta[it.key()] = it.value().get<std::string>();
  }
  if (meta != c.metadata) return "the metadata differs from the header's";
  return "";
}

struct Verdict {
  bool accepted = false;
  std::string problem;  // empty when the input was handled correctly
};

Verdict judge(const std::string& bytes) {
  Verdict v;
  try {
    const SafetensorsContents c = parse_safetensors(bytes, "fuzz");
    v.accepted = true;
    v.problem = check_contents(bytes, c);
  } catch (const Error&) {
    v.accepted = false;
  } catch (const std::exception& e) {
    v.problem = "threw " + demangle(typeid(e).name()) + ", not xgrad::Error: " + e.what();
  } catch (...) {
    v.problem = "threw something that is not a std::exception";
  }
  return v;
}

// A sanitizer report ends the process before Catch can say which input caused it. So the
// input being judged is kept in a global, and the sanitizers' hooks write it to
// fuzz-crash-input.safetensors in the working directory and name it on stderr: UBSan calls
// __ubsan_on_report (defined below; a no-op hook without UBSan), ASan a death callback. GCC
// links ASan and UBSan as two runtimes, each with its own death callback, hence both hooks.
#if defined(__SANITIZE_ADDRESS__)
#define XGRAD_FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XGRAD_FUZZ_ASAN 1
#endif
#endif

const std::string* g_current_input = nullptr;  // the input being judged, or null
std::string g_current_label;

void write_all_fd(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Only plain system calls: the process is dying, possibly on a signal stack. Once per run.
void save_current_input() {
  static bool done = false;
  if (g_current_input == nullptr || done) return;
  done = true;
  const char head[] = "\ncheckpoint fuzz: a sanitizer report on input ";
  const char tail[] = "; the input is saved as fuzz-crash-input.safetensors in the working directory\n";
  write_all_fd(2, head, sizeof head - 1);
  write_all_fd(2, g_current_label.data(), g_current_label.size());
  const int fd = ::open("fuzz-crash-input.safetensors", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    write_all_fd(fd, g_current_input->data(), g_current_input->size());
    ::close(fd);
  }
  write_all_fd(2, tail, sizeof tail - 1);
}

}  // namespace

extern "C" void __ubsan_on_report() { save_current_input(); }

#ifdef XGRAD_FUZZ_ASAN
extern "C" void __sanitizer_set_death_callback(void (*callback)(void));
namespace {
const bool g_death_callback_set = (__sanitizer_set_death_callback(save_current_input), true);
}  // namespace
#endif

namespace {

// Judges `bytes` with the sanitizer death callback pointed at it.
struct CurrentInput {
  CurrentInput(const std::string& bytes, const std::string& label) {
    g_current_label = label;
    g_current_input = &bytes;
  }
  ~CurrentInput() { g_current_input = nullptr; }
};

// Saves a failing input where it can be picked up and fails the test naming it.
void fail_with_input(const std::string& bytes, const std::string& label, const std::string& problem) {
  static int saved = 0;
  const std::string path = "fuzz-failure-" + std::to_string(saved++) + ".safetensors";
  write_bytes(path, bytes);
  FAIL("input " << label << ": " << problem << " (input saved to " << fs::absolute(path).string() << ")");
}

// ----------------------------------------------------------------------------------------------
// Mutations
// ----------------------------------------------------------------------------------------------

const unsigned char kInterestingBytes[] = {0x00, 0xff, '"', '{', '}', ',', '0',  '1',  '4',  '7',  '8',  '9', '[',
                                           ']',  ':',  '-', '.', 'e', ' ', '\\', 0x7f, 0x80, 0xc3, 0x01, 0x10};

// Numbers that sit at the edges: 0, small sizes, 2^31, 2^32, 2^62 (2^62 floats = 2^64 bytes),
// 2^63, 2^64 - 1, 2^64 (does not fit), negative, fractional, exponents, very long.
const char* const kInterestingNumbers[] = {"0",
                                           "1",
                                           "2",
                                           "3",
                                           "4",
                                           "7",
                                           "8",
                                           "12",
                                           "16",
                                           "24",
                                           "-1",
                                           "-0",
                                           "-4",
                                           "65536",
                                           "2147483648",
                                           "4294967295",
                                           "4294967296",
                                           "4611686018427387904",
                                           "4611686018427387903",
                                           "9223372036854775807",
                                           "9223372036854775808",
                                           "-9223372036854775808",
                                           "18446744073709551615",
                                           "18446744073709551616",
                                           "18446744073709551612",
                                           "100000000000000000000000000000",
                                           "1e3",
                                           "1e30",
                                           "1E2",
                                           "2.5",
                                           "0.0",
                                           "4.0",
                                           "1e-7",
                                           "0x10",
                                           "00",
                                           "01"};

const char* const kDtypes[] = {"\"F16\"", "\"BF16\"",  "\"F64\"",     "\"I64\"",       "\"U8\"", "\"BOOL\"",
                               "\"f32\"", "\"\"",      "\"F32 \"",    "\"F3\\u0032\"", "32",     "null",
                               "true",    "[\"F32\"]", "{\"F32\":1}", "\"F32\""};

const char* const kShapes[] = {"[]",
                               "[0]",
                               "[1]",
                               "[2]",
                               "[3]",
                               "[6]",
                               "[1,1,1,1,1,1]",
                               "[0,4611686018427387904,4611686018427387904]",
                               "[4611686018427387904]",
                               "[18446744073709551615,0]",
                               "[0,18446744073709551615,18446744073709551615]",
                               "[4294967296,4294967296]",
                               "[-2,-3]",
                               "[2.0,3]",
                               "[\"2\",3]",
                               "[null]",
                               "[[2],3]",
                               "null",
                               "3",
                               "{}",
                               "[2,3,"};

const char* const kValues[] = {"null",
                               "true",
                               "false",
                               "0",
                               "-1",
                               "\"\"",
                               "\"x\"",
                               "[]",
                               "{}",
                               "[0,0]",
                               "[[[[[[[[]]]]]]]]",
                               "{\"a\":{\"b\":{\"c\":{}}}}",
                               "1e999",
                               "\"\\u0000\"",
                               "\"\\ud800\"",
                               "\"\xff\""};

// The offsets (begin of the value) of every JSON value that follows `"key":` in `text`.
std::vector<std::size_t> values_of_key(const std::string& text, const std::string& key) {
  std::vector<std::size_t> out;
  const std::string pat = "\"" + key + "\":";
  for (std::size_t p = text.find(pat); p != std::string::npos; p = text.find(pat, p + 1)) out.push_back(p + pat.size());
  return out;
}

// The end (one past) of the JSON value starting at `at`, by bracket matching that skips strings;
// a scalar ends at the next ',', '}' or ']'. Bounded by the text, so broken JSON is fine.
std::size_t value_end(const std::string& text, std::size_t at) {
  if (at >= text.size()) return text.size();
  const char c0 = text[at];
  if (c0 == '"') {
    std::size_t i = at + 1;
    while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
    return std::min(i + 1, text.size());
  }
  if (c0 == '[' || c0 == '{') {
    int depth = 0;
    for (std::size_t i = at; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '"') {
        ++i;
        while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if (c == ']' || c == '}') {
        if (--depth == 0) return i + 1;
      }
    }
    return text.size();
  }
  std::size_t i = at;
  while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ']') ++i;
  return i;
}

// Every maximal run of digits, with a leading '-' if there is one: [begin, end).
std::vector<std::pair<std::size_t, std::size_t>> number_tokens(const std::string& text) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] >= '0' && text[i] <= '9') {
      std::size_t b = i > 0 && text[i - 1] == '-' ? i - 1 : i;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
      out.emplace_back(b, i);
    } else {
      ++i;
    }
  }
  return out;
}

// Draws mutations of corpus files. Each input is a function of (corpus, seed) only.
class Mutator {
 public:
  Mutator(const std::vector<std::string>& corpus, Generator& g) : corpus_(corpus), g_(g) {}

  // One input: a corpus file with 1 to 4 stacked mutations; `what` lists them.
  std::string input(std::string& what) {
    std::string bytes = corpus_[pick(corpus_.size())];
    const std::size_t rounds = 1 + (pick(2) ? 0 : (pick(2) ? 1 : 1 + pick(3)));
    for (std::size_t r = 0; r < rounds; ++r) {
      if (r) what += "+";
      mutate(bytes, what);
    }
    return bytes;
  }

 private:
  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(g_.below(n)); }
  std::uint64_t u64() { return (static_cast<std::uint64_t>(g_.next_u32()) << 32) | g_.next_u32(); }
  char interesting_byte() { return static_cast<char>(kInterestingBytes[pick(sizeof kInterestingBytes)]); }
  template <std::size_t N>
  const char* any(const char* const (&list)[N]) {
    return list[pick(N)];
  }

  void mutate(std::string& b, std::string& what) {
    switch (pick(12)) {
      case 0:
        what += "bit_flip";
        return bit_flip(b);
      case 1:
        what += "byte_interesting";
        return replace_byte(b, interesting_byte());
      case 2:
        what += "byte_random";
        return replace_byte(b, static_cast<char>(g_.next_u32()));
      case 3:
        what += "insert";
        return insert(b);
      case 4:
        what += "delete";
        return erase(b);
      case 5:
        what += "truncate";
        b.resize(pick(b.size() + 1));
        return;
      case 6:
        what += "header_length";
        return header_length(b);
      case 7:
        what += "splice";
        return splice(b);
      case 8:
        what += "json_number";
        return json_edit(b, &Mutator::edit_number);
      case 9:
        what += "json_dtype";
        return json_edit(b, &Mutator::edit_dtype);
      case 10:
        what += "json_offsets";
        return json_edit(b, &Mutator::edit_offsets);
      default:
        what += "json_structure";
        return json_edit(b, &Mutator::edit_structure);
    }
  }

  void bit_flip(std::string& b) {
    if (b.empty()) return b.push_back(static_cast<char>(g_.next_u32()));
    const std::size_t flips = 1 + pick(4);
    for (std::size_t i = 0; i < flips; ++i) b[pick(b.size())] ^= static_cast<char>(1u << pick(8));
  }

  void replace_byte(std::string& b, char v) {
    if (b.empty()) return b.push_back(v);
    b[pick(b.size())] = v;
  }

  void insert(std::string& b) {
    const std::size_t at = pick(b.size() + 1);
    std::string ins;
    switch (pick(4)) {
      case 0:  // random bytes
        for (std::size_t i = 0, n = 1 + pick(8); i < n; ++i) ins.push_back(static_cast<char>(g_.next_u32()));
        break;
      case 1:  // interesting bytes
        for (std::size_t i = 0, n = 1 + pick(4); i < n; ++i) ins.push_back(interesting_byte());
        break;
      case 2: {  // a chunk of this file (repeats keys, brackets, numbers)
        if (b.empty()) return;
        const std::size_t from = pick(b.size());
        ins = b.substr(from, 1 + pick(std::min<std::size_t>(32, b.size() - from)));
        break;
      }
      default: {  // a chunk of another corpus file
        const std::string& o = corpus_[pick(corpus_.size())];
        if (o.empty()) return;
        const std::size_t from = pick(o.size());
        ins = o.substr(from, 1 + pick(std::min<std::size_t>(32, o.size() - from)));
      }
    }
    b.insert(at, ins);
  }

  void erase(std::string& b) {
    if (b.empty()) return;
    const std::size_t at = pick(b.size());
    b.erase(at, 1 + pick(std::min<std::size_t>(16, b.size() - at)));
  }

  // The 8-byte header length set to an extreme or nearby value.
  void header_length(std::string& b) {
    if (b.size() < 8) b.resize(8, '\0');
    const std::uint64_t n = read_u64_le(b), size = b.size(), k = pick(17);
    std::uint64_t v = 0;
    switch (pick(13)) {
      case 0:
        v = 0;
        break;
      case 1:
        v = std::uint64_t(1) << 63;
        break;
      case 2:
        v = ~std::uint64_t(0);
        break;
      case 3:
        v = (std::uint64_t(1) << 63) - 1;
        break;
      case 4:
        v = std::uint64_t(1) << 32;
        break;
      case 5:
        v = size + k;
        break;
      case 6:
        v = size - 8 + k;
        break;
      case 7:
        v = size > 8 + k ? size - 8 - k : 0;
        break;
      case 8:
        v = n + k;
        break;
      case 9:
        v = n > k ? n - k : 0;
        break;
      case 10:
        v = (std::uint64_t(100) << 20) + k - 8;
        break;  // around the 100 MB header limit
      case 11:
        v = u64();
        break;
      default:
        v = pick(size + 16);
        break;
    }
    b.replace(0, 8, u64_le(v));
  }

  void splice(std::string& b) {
    const std::string& o = corpus_[pick(corpus_.size())];
    std::string hb, db, ho, dob;
    switch (pick(3)) {
      case 0:  // a prefix of this one, a suffix of the other
        b = b.substr(0, pick(b.size() + 1)) + o.substr(pick(o.size() + 1));
        return;
      case 1:  // this header with the other's data
        if (split_file(b, hb, db) && split_file(o, ho, dob)) b = join_file(hb, dob);
        return;
      default:  // the other's header entries merged into this one's (a textual union of objects)
        if (split_file(b, hb, db) && split_file(o, ho, dob) && hb.size() > 2 && ho.size() > 2) {
          const std::size_t close = hb.find_last_of('}');
          const std::size_t open = ho.find('{');
          if (close != std::string::npos && open != std::string::npos) {
            b = join_file(hb.substr(0, close) + "," + ho.substr(open + 1), db + dob);
          }
        }
    }
  }

  // Applies a textual edit to the header, then (usually) rewrites the length so the edit gets past
  // the length check; inputs whose header cannot be located get a byte mutation instead.
  void json_edit(std::string& b, bool (Mutator::*edit)(std::string&, std::uint64_t)) {
    std::string header, data;
    if (!split_file(b, header, data) || !(this->*edit)(header, data.size())) return replace_byte(b, interesting_byte());
    if (pick(8) == 0) {
      b = b.substr(0, 8) + header + data;  // keep the stale length
    } else {
      b = join_file(header, data);
    }
  }

  bool edit_number(std::string& h, std::uint64_t data_size) {
    const auto tokens = number_tokens(h);
    if (tokens.empty()) return false;
    const auto [begin, end] = tokens[pick(tokens.size())];
    std::string v;
    switch (pick(4)) {
      case 0:
        v = std::to_string(data_size + pick(9) - 4);
        break;  // near the data size (may wrap: also interesting)
      case 1:
        v = std::to_string(u64() >> pick(64));
        break;
      default:
        v = any(kInterestingNumbers);
    }
    h.replace(begin, end - begin, v);
    return true;
  }

  bool edit_dtype(std::string& h, std::uint64_t) {
    const auto at = values_of_key(h, "dtype");
    if (at.empty()) return false;
    const std::size_t p = at[pick(at.size())];
    h.replace(p, value_end(h, p) - p, any(kDtypes));
    return true;
  }

  bool edit_offsets(std::string& h, std::uint64_t) {
    const auto at = values_of_key(h, "data_offsets");
    if (at.empty()) return false;
    const std::size_t i = pick(at.size());
    const std::size_t p = at[i], e = value_end(h, p);
    if (at.size() >= 2 && pick(2) == 0) {  // swap the offsets of two tensors
      std::size_t j = pick(at.size() - 1);
      if (j >= i) ++j;
      const std::size_t q = at[j], f = value_end(h, q);
      const std::string a = h.substr(p, e - p), c = h.substr(q, f - q);
      if (p < q) {
        h.replace(q, f - q, a);
        h.replace(p, e - p, c);
      } else {
        h.replace(p, e - p, c);
        h.replace(q, f - q, a);
      }
      return true;
    }
    const auto nums = number_tokens(h.substr(p, e - p));
    if (nums.size() == 2 && pick(2) == 0) {  // reverse begin and end
      const std::string b0 = h.substr(p + nums[0].first, nums[0].second - nums[0].first);
      const std::string b1 = h.substr(p + nums[1].first, nums[1].second - nums[1].first);
      h.replace(p, e - p, "[" + b1 + "," + b0 + "]");
      return true;
    }
    const char* const forms[] = {"[]",
                                 "[0]",
                                 "[0,0]",
                                 "[0,4,8]",
                                 "[-4,0]",
                                 "[0,18446744073709551615]",
                                 "[18446744073709551612,18446744073709551615]",
                                 "[4611686018427387904,0]",
                                 "[0.0,4.0]",
                                 "null",
                                 "[\"0\",\"4\"]"};
    h.replace(p, e - p, any(forms));
    return true;
  }

  bool edit_structure(std::string& h, std::uint64_t) {
    switch (pick(5)) {
      case 0: {  // replace a shape
        const auto at = values_of_key(h, "shape");
        if (at.empty()) return false;
        const std::size_t p = at[pick(at.size())], e = value_end(h, p);
        if (pick(3) == 0) {  // the same dimensions reversed: a valid reshape when the count matches
          auto nums = number_tokens(h.substr(p, e - p));
          std::string s = "[";
          for (std::size_t k = nums.size(); k-- > 0;)
            s += h.substr(p + nums[k].first, nums[k].second - nums[k].first) + (k ? "," : "");
          h.replace(p, e - p, s + "]");
        } else {
          h.replace(p, e - p, any(kShapes));
        }
        return true;
      }
      case 1: {  // replace any value after a ':' with another JSON value
        std::vector<std::size_t> colons;
        for (std::size_t i = 0; i < h.size(); ++i)
          if (h[i] == ':') colons.push_back(i + 1);
        if (colons.empty()) return false;
        const std::size_t p = colons[pick(colons.size())];
        h.replace(p, value_end(h, p) - p, any(kValues));
        return true;
      }
      case 2: {  // rename a key: to another key (a duplicate), to __metadata__, empty, or prefixed
        const auto tokens = values_of_key(h, "dtype");
        if (tokens.empty()) return false;
        // Tensor keys are the strings just before '{"dtype"' in the seeds: find '":{' before it.
        const std::size_t p = tokens[pick(tokens.size())];
        const std::size_t brace = h.rfind("\":{", p);
        if (brace == std::string::npos) return false;
        const std::size_t open = h.rfind('"', brace == 0 ? 0 : brace - 1);
        if (open == std::string::npos) return false;
        const char* const names[] = {"__metadata__",   "",          "w",    "a",        "b", "optimizer.w",
                                     "tok_emb.weight", "x\\u0000y", "\\\"", "w\xc3\xa9"};
        h.replace(open + 1, brace - open - 1, any(names));
        return true;
      }
      case 3: {  // drop a key-value pair (text from a '"' after '{' or ',' to the value's end)
        std::vector<std::size_t> starts;
        for (std::size_t i = 0; i + 1 < h.size(); ++i)
          if ((h[i] == '{' || h[i] == ',') && h[i + 1] == '"') starts.push_back(i);
        if (starts.empty()) return false;
        const std::size_t s = starts[pick(starts.size())];
        const std::size_t colon = h.find("\":", s + 2);
        if (colon == std::string::npos) return false;
        const std::size_t e = value_end(h, colon + 2);
        h.erase(h[s] == ',' ? s : s + 1, e - (h[s] == ',' ? s : s + 1));
        return true;
      }
      default: {  // whitespace and padding: spaces, tabs, newlines, a trailing NUL, a BOM
        const char* const ws[] = {" ", "\t", "\n", "\r\n", "\xef\xbb\xbf", "  \x0c"};
        const std::size_t at = pick(h.size() + 1);
        const std::size_t w = pick(7);
        if (w == 6)
          h.insert(at, 1, '\0');  // a NUL byte
        else
          h.insert(at, ws[w]);
        return true;
      }
    }
  }

  const std::vector<std::string>& corpus_;
  Generator& g_;
};

constexpr std::uint64_t kFuzzSeed = 20240601;

std::size_t fuzz_iterations() {
  const char* env = std::getenv("XGRAD_FUZZ_ITERATIONS");
  return env ? static_cast<std::size_t>(std::stoull(env)) : 50000;
}

// Random input `i` of the main fuzzer: its own Generator, so any input can be rebuilt alone.
std::string fuzz_input(const std::vector<std::string>& corpus, std::size_t i, std::string& what) {
  Generator g(kFuzzSeed + i);
  Mutator m(corpus, g);
  return m.input(what);
}

// The deterministic sweeps: every prefix of every seed, every prefix of every header with the
// length rewritten to fit (the JSON reader sees every truncation), and extreme header lengths.
std::vector<std::pair<std::string, std::string>> sweep_inputs(const std::vector<Seed>& seeds) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Seed& s : seeds) {
    for (std::size_t k = 0; k <= s.bytes.size(); ++k)
      out.emplace_back(s.name + " cut at " + std::to_string(k), s.bytes.substr(0, k));
    std::string header, data;
    if (split_file(s.bytes, header, data)) {
      for (std::size_t k = 0; k < header.size(); ++k) {
        out.emplace_back(s.name + " header cut at " + std::to_string(k), join_file(header.substr(0, k), data));
      }
    }
    const std::uint64_t size = s.bytes.size(), n = read_u64_le(s.bytes);
    std::vector<std::uint64_t> lengths = {0,
                                          1,
                                          2,
                                          7,
                                          8,
                                          std::uint64_t(1) << 31,
                                          std::uint64_t(1) << 32,
                                          std::uint64_t(1) << 63,
                                          (std::uint64_t(1) << 63) - 1,
                                          (std::uint64_t(1) << 63) + 1,
                                          ~std::uint64_t(0),
                                          ~std::uint64_t(0) - 7,
                                          (std::uint64_t(100) << 20),
                                          (std::uint64_t(100) << 20) + 1};
    for (std::uint64_t k = 0; k <= 9; ++k) {
      lengths.push_back(size + k);
      lengths.push_back(size - k);
      lengths.push_back(size - 8 + k);
      lengths.push_back(size - 8 - k);
      lengths.push_back(n + k);
      lengths.push_back(n - k);
    }
    for (std::uint64_t v : lengths) {
      std::string b = s.bytes;
      b.replace(0, 8, u64_le(v));
      out.emplace_back(s.name + " header length " + std::to_string(v), b);
    }
  }
  return out;
}

bool bit_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every parameter of `model` equals `snapshot` (same names, same order, same bits).
bool params_equal(const nn::Module& model, const NamedArrays& snapshot) {
  const NamedTensors params = model.named_parameters();
  if (params.size() != snapshot.size()) return false;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].first != snapshot[i].first || !bit_equal(params[i].second.value(), snapshot[i].second)) return false;
  }
  return true;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// The seed corpus
// ----------------------------------------------------------------------------------------------

TEST_CASE("the committed seed corpus equals its generator", "[checkpoint][fuzz]") {
  const std::vector<Seed> seeds = make_seed_corpus();
  REQUIRE(seeds.size() >= 4);
  REQUIRE(seeds.size() <= 8);
  std::set<std::string> names;
  std::size_t valid = 0;
  for (const Seed& s : seeds) {
    INFO("seed " << s.name);
    names.insert(s.name);
    const std::string path = corpus_dir() + "/" + s.name;
    REQUIRE(fs::is_regular_file(path));
    CHECK(read_bytes(path) == s.bytes);  // regenerate with test_checkpoint_fuzz "[regenerate_corpus]"
    // Valid seeds are what they say they are; near-valid ones are one step from valid.
    if (s.valid) {
      ++valid;
      SafetensorsContents c;
      REQUIRE_NOTHROW(c = parse_safetensors(s.bytes, s.name));
      CHECK(check_contents(s.bytes, c) == "");
    } else {
      REQUIRE_THROWS_AS(parse_safetensors(s.bytes, s.name), Error);
    }
  }
  CHECK(valid >= 4);
  CHECK(valid < seeds.size());
  // Anything else in the folder is a kept failing input, named crash-*.safetensors.
  for (const auto& e : fs::directory_iterator(corpus_dir())) {
    const std::string name = e.path().filename().string();
    INFO("corpus file " << name);
    CHECK((names.count(name) == 1 || (name.rfind("crash-", 0) == 0 && e.path().extension() == ".safetensors")));
  }
  // The seeds cover what they claim: a 0-d tensor, a zero-length axis, metadata, several tensors.
  const SafetensorsContents scalar = parse_safetensors(seeds[2].bytes);
  CHECK(scalar.tensors.at(0).second.dimension() == 0);
  const SafetensorsContents zero = parse_safetensors(seeds[3].bytes);
  CHECK(zero.tensors.at(0).second.size() == 0);
  CHECK(parse_safetensors(seeds[4].bytes).metadata.at("note") == "quote \" backslash \\ caf\xc3\xa9 \xe2\x98\x83");
  CHECK(parse_safetensors(seeds[1].bytes).tensors.size() == 3);
}

// Rewrites tests/fuzz_corpus/ from make_seed_corpus(); hidden (run it by its tag).
TEST_CASE("regenerate the fuzz seed corpus", "[.regenerate_corpus]") {
  fs::create_directories(corpus_dir());
  for (const Seed& s : make_seed_corpus()) write_bytes(corpus_dir() + "/" + s.name, s.bytes);
  SUCCEED();
}

// Writes random input XGRAD_FUZZ_INPUT of the main fuzzer to the working directory; hidden.
TEST_CASE("write one fuzz input", "[.write_fuzz_input]") {
  const char* env = std::getenv("XGRAD_FUZZ_INPUT");
  if (env == nullptr) {
    WARN("set XGRAD_FUZZ_INPUT to the index of the input to write");
    return;
  }
  const std::size_t i = static_cast<std::size_t>(std::stoull(env));
  std::string what;
  const std::string bytes = fuzz_input(seed_bytes(), i, what);
  const std::string path = "fuzz-input-" + std::to_string(i) + ".safetensors";
  write_bytes(path, bytes);
  std::cout << "fuzz input " << i << " (" << what << ", " << bytes.size() << " bytes) written to " << path << "\n";
}

// The seeds and the kept failing inputs (crash-*.safetensors), which stay as regression inputs
// once the reader is fixed.
TEST_CASE("every committed corpus file parses or throws xgrad::Error", "[checkpoint][fuzz]") {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(corpus_dir())) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 4);
  for (const std::string& path : files) {
    INFO("corpus file " << path);
    const std::string bytes = read_bytes(path);
    const CurrentInput current(bytes, path);
    const Verdict v = judge(bytes);
    if (!v.problem.empty()) FAIL(path << ": " << v.problem);
  }
}

// ----------------------------------------------------------------------------------------------
// The fuzzer
// ----------------------------------------------------------------------------------------------

TEST_CASE("parse_safetensors on mutated inputs returns consistent contents or throws xgrad::Error",
          "[checkpoint][fuzz]") {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Seed> seeds = make_seed_corpus();
  const std::vector<std::string> corpus = seed_bytes();
  std::size_t accepted = 0, rejected = 0, tried = 0;

  // Deterministic sweeps first.
  std::size_t sweep_accepted = 0;
  for (const auto& [label, bytes] : sweep_inputs(seeds)) {
    const CurrentInput current(bytes, label);
    const Verdict v = judge(bytes);
    if (!v.problem.empty()) fail_with_input(bytes, label, v.problem);
    ++tried;
    v.accepted ? (++accepted, ++sweep_accepted) : ++rejected;
  }
  const std::size_t sweeps = tried;

  // Then random stacked mutations, input i from Generator(kFuzzSeed + i).
  const std::size_t iterations = fuzz_iterations();
  std::size_t random_accepted = 0;
  std::set<std::string> accepted_kinds;
  for (std::size_t i = 0; i < iterations; ++i) {
    std::string what;
    const std::string bytes = fuzz_input(corpus, i, what);
    INFO("random input " << i << " (" << what << "); rebuild it with XGRAD_FUZZ_INPUT=" << i
                         << " test_checkpoint_fuzz \"[write_fuzz_input]\"");
    const CurrentInput current(bytes, "random " + std::to_string(i) + " (" + what + ")");
    const Verdict v = judge(bytes);
    if (!v.problem.empty()) fail_with_input(bytes, "random " + std::to_string(i) + " (" + what + ")", v.problem);
    ++tried;
    if (v.accepted) {
      ++accepted;
      ++random_accepted;
      accepted_kinds.insert(what);
    } else {
      ++rejected;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "checkpoint fuzz: " << tried << " inputs (" << sweeps << " sweep, " << iterations << " random) in "
            << seconds << " s: " << accepted << " accepted (" << sweep_accepted << " sweep, " << random_accepted
            << " random), " << rejected << " rejected with xgrad::Error\n";
  INFO(tried << " inputs, " << accepted << " accepted, " << rejected << " rejected");
  // Both sides are explored, by the sweeps and by the random mutations alike.
  CHECK(accepted > 0);
  CHECK(rejected > 0);
  CHECK(sweep_accepted > 0);
  CHECK(random_accepted > 0);
  CHECK(random_accepted < iterations);
  // Accepted inputs come from more than one kind of mutation (not only, say, data bit flips).
  CHECK(accepted_kinds.size() >= 5);
}

TEST_CASE("load_checkpoint of mutated checkpoints leaves the model unchanged whenever it throws",
          "[checkpoint][fuzz]") {
  TempDir dir("xgrad_fuzz");
  const std::string path = dir.file("lm.safetensors");
  Generator g_target(21), g_other(22);
  nn::LanguageModel target(small_lm(), g_target);
  nn::LanguageModel other(small_lm(), g_other);
  const NamedArrays original = weights::state_dict(target);
  REQUIRE(!params_equal(target, weights::state_dict(other)));

  weights::save_checkpoint(path, other, {{"step", Array(3.f)}}, {{"epoch", "1"}});
  const std::vector<std::string> corpus = {read_bytes(path)};

  std::size_t accepted = 0, rejected = 0;
  for (std::size_t i = 0; i < 300; ++i) {
    Generator g(kFuzzSeed * 7 + i);
    Mutator m(corpus, g);
    std::string what;
    const std::string bytes = m.input(what);
    INFO("checkpoint input " << i << " (" << what << ")");
    const CurrentInput current(bytes, "checkpoint " + std::to_string(i) + " (" + what + ")");
    write_bytes(path, bytes);
    const NamedArrays before = weights::state_dict(target);
    try {
      weights::load_checkpoint(path, target);
      ++accepted;
      // Accepted: the model now holds exactly the file's parameters.
      const SafetensorsContents c = parse_safetensors(bytes);
      NamedArrays expect;
      for (const auto& [name, p] : target.named_parameters()) {
        for (const auto& [fname, a] : c.tensors) {
          if (fname == name) expect.emplace_back(name, a);
        }
      }
      REQUIRE(params_equal(target, expect));
      weights::load_state_dict(target, original);
    } catch (const Error&) {
      ++rejected;
      if (!params_equal(target, before))
        fail_with_input(bytes, "checkpoint " + std::to_string(i) + " (" + what + ")",
                        "load_checkpoint threw but changed the model");
    }
    // Any other exception type escapes and fails the test.
  }
  std::cout << "load_checkpoint fuzz: 300 inputs, " << accepted << " loaded, " << rejected
            << " rejected with the model unchanged\n";
  CHECK(accepted > 0);
  CHECK(rejected > 0);
  REQUIRE(params_equal(target, original));
}

// Values nested deeper than any real header must be rejected like any other bad value, not
// exhaust the stack (a depth-first walk or dump() of the value recurses once per level).
TEST_CASE("deeply nested JSON values in the header give an xgrad::Error", "[checkpoint][fuzz]") {
  auto nest = [](std::size_t depth, const std::string& inner) {
    return std::string(depth, '[') + inner + std::string(depth, ']');
  };
  std::size_t rejected = 0;
  for (std::size_t depth : {1u, 64u, 4096u, 200000u}) {
    const std::vector<std::pair<std::string, std::string>> headers = {
        {"the whole header", nest(depth, "")},
        {"__metadata__", R"({"__metadata__":)" + nest(depth, "") + "}"},
        {"a metadata value", R"({"__metadata__":{"k":)" + nest(depth, "\"v\"") + "}}"},
        {"a tensor entry", R"({"w":)" + nest(depth, "") + "}"},
        {"a shape entry", R"({"w":{"dtype":"F32","shape":[)" + nest(depth, "1") + R"(],"data_offsets":[0,4]}})"},
        {"data_offsets", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)" + nest(depth, "[0,4]") + "}}"},
        {"dtype", R"({"w":{"dtype":)" + nest(depth, "\"F32\"") + R"(,"shape":[1],"data_offsets":[0,4]}})"},
    };
    for (const auto& [where, header] : headers) {
      INFO("depth " << depth << " in " << where);
      const std::string bytes = st_file(header, f32_le({1.f}));
      const CurrentInput current(bytes, "nested " + where + " at depth " + std::to_string(depth));
      const Verdict v = judge(bytes);
      if (!v.problem.empty()) fail_with_input(bytes, "nested " + where, v.problem);
      CHECK_FALSE(v.accepted);
      rejected += v.accepted ? 0 : 1;
    }
  }
  CHECK(rejected == 4 * 7);
}
