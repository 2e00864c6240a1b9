// Memory, depth and ambiguity limits of the safetensors reader, UTF-8 checks of the writer, and
// SafetensorsReader (a file read tensor by tensor). The header's memory is measured in a child
// process (fork), from a peak reset to its resident size before the call.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "peak_memory.hpp"
#include "run_program.hpp"
#include "safetensors_bytes.hpp"
#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"

using namespace xgrad;
using namespace xgrad::testing;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

std::string st_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// A valid one-tensor header whose entry also holds "x": `value` (a key the reader ignores).
std::string with_extra(const std::string& value) {
  return R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" + value + "}}";
}

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string message_of(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "buf");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

struct ChildResult {
  std::string message;
  long peak_increase_kib = -1;  // the parse's rise of the peak resident size
};

// Parses `header` in a fork with 1 GiB of address space to spare.
ChildResult in_child(const std::function<void()>& call, rlim_t extra_address_space);

ChildResult parse_in_child(const std::string& header) {
  const std::string bytes = st_bytes(header, f32_le({1.f}));  // before the fork: not the call's memory
  return in_child([&] { parse_safetensors(bytes, "buf"); }, rlim_t{1} << 30);
}

// Runs `call` in a fork under an address-space limit of extra_address_space more than the child
// uses, and reports its Error's message ("(accepted)" when it returns) and how far it raised the
// peak resident size.
ChildResult in_child(const std::function<void()>& call, rlim_t extra_address_space) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    {
      std::ifstream statm("/proc/self/statm");
      double pages = 0;
      statm >> pages;
      const rlim_t limit =
          static_cast<rlim_t>(pages * static_cast<double>(::sysconf(_SC_PAGESIZE))) + extra_address_space;
      const rlimit rl{limit, limit};
      ::setrlimit(RLIMIT_AS, &rl);
      const bool reset = reset_peak_rss();
      const long baseline = status_kib("VmRSS");
      try {
        call();
        out = "(accepted)";
      } catch (const Error& e) {
        out = e.what();
      } catch (const std::exception& e) {
        out = std::string("not an xgrad::Error: ") + e.what();
      }
      out = std::to_string(reset ? peak_rise_kib(baseline) : -1) + "\n" + out.substr(0, 500);
    }
    const ssize_t written = ::write(fds[1], out.data(), out.size());
    ::_exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  REQUIRE(pid > 0);
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO("child output: " << got);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::size_t nl = got.find('\n');
  REQUIRE(nl != std::string::npos);
  return {got.substr(nl + 1), std::stol(got.substr(0, nl))};
}

}  // namespace

TEST_CASE("safetensors headers nest at most 64 levels", "[file_limits][bad_input]") {
  // The top object, the entry and 62 arrays: 64 levels.
  REQUIRE(parse_safetensors(st_bytes(with_extra(nested(62)), f32_le({1.f}))).tensors.size() == 1);
  REQUIRE(parse_safetensors(st_bytes(with_extra(R"({"a":{"b":[{}]}})"), f32_le({1.f}))).tensors.size() == 1);
  for (const std::size_t depth : {63u, 64u, 1000u, 200000u}) {
    INFO(depth);
    REQUIRE(message_of(st_bytes(with_extra(nested(depth)), f32_le({1.f}))) ==
            "load_safetensors: buf: the header nests values deeper than 64 levels");
  }
  const std::string deep_metadata = R"({"__metadata__":{"k":)" + nested(100) + "}}";
  REQUIRE_THAT(message_of(st_bytes(deep_metadata, "")), Contains("metadata value of 'k' is not a string"));
}

TEST_CASE("a 104 MB header of nested brackets is refused in a few MiB, not 3.8 GB",
          "[file_limits][bad_input][bug][gemm][long]") {
  const std::size_t depth = 52'000'000;  // 104 MB, under the 100 MiB header limit
  const ChildResult r = parse_in_child(with_extra(nested(depth)));
  REQUIRE(r.message == "load_safetensors: buf: the header nests values deeper than 64 levels");
  REQUIRE(r.peak_increase_kib >= 0);
  REQUIRE(r.peak_increase_kib < 16 * 1024);
  // As wide: 26 million empty arrays side by side (78 MB), skipped without being held. The JSON
  // reader keeps the text of a run of brackets for its error messages (about 1.7 bytes a byte here),
  // which no header without strings or numbers can raise past a few times its size.
  std::string wide = "[";
  for (std::size_t i = 0; i < 26'000'000; ++i) wide += "[],";
  wide.back() = ']';
  const ChildResult w = parse_in_child(with_extra(wide));
  REQUIRE(w.message == "(accepted)");
  REQUIRE(w.peak_increase_kib < static_cast<long>(3 * wide.size() / 1024));
}

TEST_CASE("a name twice in a safetensors header is refused: tensors, metadata keys, entry fields",
          "[file_limits][bad_input]") {
  const std::string w = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string w2 = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  const std::string data = f32_le({1.f, 2.f});
  REQUIRE(message_of(st_bytes("{" + w + "," + w2 + "}", data)) == "load_safetensors: buf: tensor 'w' appears twice");
  REQUIRE(message_of(st_bytes(R"({"__metadata__":{"k":"a","k":"b"},)" + w + "}", f32_le({1.f}))) ==
          "load_safetensors: buf: __metadata__ has the key 'k' twice");
  REQUIRE(message_of(st_bytes(R"({"__metadata__":{"k":"a"},"__metadata__":{"j":"b"},)" + w + "}", f32_le({1.f}))) ==
          "load_safetensors: buf: __metadata__ appears twice");
  for (const std::string field : {R"("dtype":"F32")", R"("shape":[1])", R"("data_offsets":[0,4])"}) {
    INFO(field);
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],)" + field + "}}";
    const std::string name = field.substr(1, field.find('"', 1) - 1);
    REQUIRE(message_of(st_bytes(header, f32_le({1.f}))) ==
            "load_safetensors: buf: tensor 'w' has '" + name + "' twice");
  }
  // From a file too, naming it.
  TempDir dir("xgrad_file_limits");
  const std::string path = dir.file("twice.safetensors");
  write_bytes(path, st_bytes("{" + w + "," + w2 + "}", data));
  REQUIRE_THROWS_WITH(load_safetensors(path), "load_safetensors: '" + path + "': tensor 'w' appears twice");
  REQUIRE_THROWS_WITH(SafetensorsReader(path), "load_safetensors: '" + path + "': tensor 'w' appears twice");
  // Overlapping ranges stay refused; two empty tensors at one offset hold no data and are fine.
  REQUIRE_THAT(
      message_of(st_bytes(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          data)),
      Contains("tensor 'b' starts at byte 4, expected 8 (a hole or an overlap)"));
  const SafetensorsContents empty = parse_safetensors(st_bytes(
      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})",
      ""));
  REQUIRE(empty.tensors.size() == 2);
}

TEST_CASE("safetensors shapes have at most 64 dimensions", "[file_limits][bad_input]") {
  auto ones = [](std::size_t rank) {
    std::string s = "[";
    for (std::size_t i = 0; i < rank; ++i) s += i ? ",1" : "1";
    return s + "]";
  };
  const SafetensorsContents ok = parse_safetensors(
      st_bytes(R"({"w":{"dtype":"F32","shape":)" + ones(64) + R"(,"data_offsets":[0,4]}})", f32_le({3.f})));
  REQUIRE(ok.tensors.at(0).second.dimension() == 64);
  REQUIRE(ok.tensors.at(0).second.data()[0] == 3.f);
  REQUIRE(message_of(st_bytes(R"({"w":{"dtype":"F32","shape":)" + ones(65) + R"(,"data_offsets":[0,4]}})",
                              f32_le({3.f}))) == "load_safetensors: buf: tensor 'w' has more than 64 dimensions");
}

TEST_CASE("save_safetensors refuses names and metadata that are not UTF-8 before writing anything",
          "[file_limits][bad_input]") {
  TempDir dir("xgrad_file_limits");
  const std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"w", Array{1.f, 2.f}}}, {{"k", "v"}});
  const std::string before = read_bytes(path);
  const Array one{1.f};
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"ok", one}, {"bad\xff", one}}),
                      "save_safetensors: tensor name \"bad\\xFF\" is not valid UTF-8 (byte 0xFF at offset 3)");
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", one}}, {{"k\xc0\xaf", "v"}}),
                      "save_safetensors: metadata key \"k\\xC0\\xAF\" is not valid UTF-8 (byte 0xC0 at offset 1)");
  REQUIRE_THROWS_WITH(
      save_safetensors(path, {{"w", one}}, {{"key", "\xed\xa0\x80"}}),
      "save_safetensors: metadata value of 'key' \"\\xED\\xA0\\x80\" is not valid UTF-8 (byte 0xED at offset 0)");
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", one}}, {{"\xfe", "v"}}, Dtype::f16),
                      Contains("metadata key \"\\xFE\""));
  REQUIRE(read_bytes(path) == before);
  REQUIRE(dir.entries() == std::set<std::string>{"w.safetensors"});
  // UTF-8 beyond ASCII is kept as it is.
  save_safetensors(path, {{"权重.w", one}}, {{"说明", "注意力"}});
  const SafetensorsContents back = load_safetensors(path);
  REQUIRE(back.tensors.at(0).first == "权重.w");
  REQUIRE(back.metadata.at("说明") == "注意力");
}

TEST_CASE("SafetensorsReader reads ranges of F32, F16 and BF16 tensors as load_safetensors does", "[file_limits]") {
  TempDir dir("xgrad_file_limits");
  Array big = Array::from_shape({300, 700});  // more than one 64 Ki-value block of F16
  for (std::size_t i = 0; i < big.size(); ++i) big.data()[i] = static_cast<float>(i % 1000) * 0.25f - 100.f;
  const NamedArrays tensors = {{"a", Array{1.f, -2.f, 3.5f}}, {"big", big}, {"empty", Array::from_shape({0, 4})}};
  for (const Dtype dtype : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
    INFO(dtype_name(dtype));
    const std::string path = dir.file(std::string(dtype_name(dtype)) + ".safetensors");
    save_safetensors(path, tensors, {{"k", "v"}}, dtype);
    const SafetensorsContents whole = load_safetensors(path);
    SafetensorsReader reader(path);
    REQUIRE(reader.metadata() == whole.metadata);
    REQUIRE(reader.tensors().size() == 3);
    for (std::size_t t = 0; t < 3; ++t) {
      const TensorInfo& info = reader.tensors()[t];
      REQUIRE(info.name == whole.tensors[t].first);
      REQUIRE(info.shape == whole.tensors[t].second.shape());
      REQUIRE(info.dtype == dtype);
      const Array& want = whole.tensors[t].second;
      std::vector<float> got(want.size());
      reader.read(t, 0, want.size(), got.data());
      if (want.size() > 0) REQUIRE(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
      if (want.size() > 2) {
        std::vector<float> part(want.size() - 2);
        reader.read(t, 1, part.size(), part.data());
        REQUIRE(std::memcmp(part.data(), want.data() + 1, part.size() * 4) == 0);
      }
    }
    REQUIRE(reader.find("big") == 1);
    REQUIRE(reader.find("nope") == 3);
    float x = 0;
    REQUIRE_THROWS_WITH(reader.read(0, 2, 2, &x),
                        "SafetensorsReader::read: elements [2, 4) of tensor 'a' in '" + path + "', which has 3");
    REQUIRE_THROWS_WITH(reader.read(3, 0, 1, &x), Contains("has 3 tensors, no tensor 3"));
    // The file cut after it was opened: an Error naming it, not garbage.
    ::truncate(path.c_str(), 8 + 64);
    std::vector<float> rest(big.size());
    REQUIRE_THROWS_WITH(reader.read(1, 0, big.size(), rest.data()),
                        Contains("'" + path + "' ended at byte") && Contains("changed while being read"));
  }
}

TEST_CASE("check_available_memory refuses sizes past what this process can allocate, naming who, what and both sizes",
          "[file_limits][bad_input]") {
  const MemoryAvailable m = available_memory();
  REQUIRE(m.bytes > 0);
  REQUIRE_FALSE(m.limit.empty());
  REQUIRE_NOTHROW(check_available_memory(1024, "f", "a KiB"));
  REQUIRE_THROWS_WITH(check_available_memory(1e30, "f", "holding x"),
                      Contains("f: holding x needs 827180.6 YiB, more than the ") &&
                          Contains(" this process can still allocate (" + m.limit));
  REQUIRE_THROWS_WITH(check_available_memory(std::numeric_limits<double>::quiet_NaN(), "f", "x"),
                      Contains("f: x needs an unbounded size"));
  REQUIRE(bytes_str(312) == "312 bytes");
  REQUIRE(bytes_str(1536) == "1.5 KiB");
  REQUIRE(bytes_str(3.5 * (1 << 30)) == "3.5 GiB");
}

TEST_CASE("load_safetensors refuses arrays that cannot be held before allocating them",
          "[file_limits][bad_input][gemm]") {
  TempDir dir("xgrad_file_limits");
  const std::string path = dir.file("big.safetensors");
  const std::size_t n = std::size_t{1} << 25;  // F16: 64 MiB in the file, 128 MiB as float32
  write_bytes(path, st_bytes(R"({"w":{"dtype":"F16","shape":[)" + std::to_string(n) + R"(],"data_offsets":[0,)" +
                                 std::to_string(2 * n) + "]}}",
                             std::string(2 * n, '\0')));
  const ChildResult r = in_child([&] { load_safetensors(path); }, rlim_t{64} << 20);
  REQUIRE_THAT(r.message, Contains("load_safetensors: reading '" + path +
                                   "' (33554432 float32 values in 1 tensor) needs 128.0 MiB, more than the ") &&
                              Contains("this process can still allocate (RLIMIT_AS of "));
  REQUIRE(r.peak_increase_kib < 8 * 1024);
  REQUIRE(in_child([&] { load_safetensors(path); }, rlim_t{512} << 20).message == "(accepted)");
}

TEST_CASE("a shape with a zero after other sizes holds no elements and round-trips", "[file_limits][bad_input][bug]") {
  // (3, 0) in a file with no data was "a shape larger than the file": the 3 was compared with the
  // 0 bytes before the 0 was seen.
  for (const char* shape : {"[3,0]", "[5,7,0]", "[0,3]", "[1000000,0,1000000]"}) {
    INFO(shape);
    const SafetensorsContents c = parse_safetensors(
        st_bytes(std::string(R"({"w":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,0]}})", ""));
    REQUIRE(c.tensors.size() == 1);
    REQUIRE(c.tensors[0].second.size() == 0);
  }
  REQUIRE(parse_safetensors(st_bytes(R"({"w":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]}})", ""))
              .tensors[0]
              .second.shape() == Shape{3, 0});
  TempDir dir("xgrad_file_limits");
  NamedArrays t;
  t.emplace_back("empty", Array::from_shape({3, 0}));
  t.emplace_back("w", Array{1.f, 2.f});
  save_safetensors(dir.file("e.safetensors"), t);
  const SafetensorsContents back = load_safetensors(dir.file("e.safetensors"));
  REQUIRE(back.tensors.size() == 2);
  REQUIRE(back.tensors[0].second.shape() == Shape{3, 0});
  REQUIRE(back.tensors[1].second == Array{1.f, 2.f});
  // A real size past the file is still refused, and so is a product past 2^60 beside a zero.
  REQUIRE(message_of(st_bytes(R"({"w":{"dtype":"F32","shape":[3,1],"data_offsets":[0,0]}})", "")) ==
          "load_safetensors: buf: tensor 'w' has a shape larger than the file");
  REQUIRE(message_of(st_bytes(R"({"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}})",
                              "")) == "load_safetensors: buf: tensor 'w' has a shape whose sizes multiply past 2^60");
}

TEST_CASE("a header number past any integer or double is refused in one short line without the tag of the JSON reader",
          "[file_limits][bad_input][bug]") {
  const std::string digits(10000, '7');
  for (const std::string& header : {R"({"w":{"dtype":"F32","shape":[)" + digits + R"(],"data_offsets":[0,0]}})",
                                    with_extra(digits), with_extra("1e99999"), with_extra("-" + digits)}) {
    const std::string m = message_of(st_bytes(header, f32_le({1.f})));
    INFO(m.substr(0, 300));
    REQUIRE_THAT(m, Contains("load_safetensors: buf: the header is not valid JSON (number overflow parsing '"));
    REQUIRE(m.find("json.exception") == std::string::npos);
    REQUIRE(m.size() < 300);
  }
  REQUIRE(message_of(st_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}} x)", "")) ==
          "load_safetensors: buf: the header is not valid JSON (parse error at line 1, column 56: syntax error while "
          "parsing value - "
          "invalid literal; last read: '0]}} x'; expected end of input)");
  // 20 digits past 2^64 in a shape is a number, but no non-negative integer.
  REQUIRE_THAT(message_of(st_bytes(R"({"w":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]}})", "")),
               Contains("tensor 'w' has a shape entry 1.8446744073709552e+19 that is not a non-negative integer"));
}

TEST_CASE("a header of half a million empty tensors counts what each costs beside its values",
          "[file_limits][bad_input][bug][gemm]") {
  // 500000 entries of no data: 28 MB of header, ~250 MB as named arrays. The check counted values
  // alone (none), so the arrays were allocated until the process ran out.
  // AddressSanitizer's allocator keeps red zones and a quarantine beside every allocation and ends
  // the process when a limit stops it: what this case measures holds only for the real allocator.
  if (xgrad::testing::kAddressSanitizer) return;
  std::string header = "{";
  for (int i = 0; i < 500000; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  header += "}";
  const std::string bytes = st_bytes(header, "");
  const ChildResult tight = in_child([&] { parse_safetensors(bytes, "buf"); }, rlim_t{160} << 20);
  INFO(tight.message);
  REQUIRE_THAT(tight.message, StartsWith("load_safetensors: ") && !Contains("not an xgrad::Error"));
  REQUIRE_THAT(tight.message,
               Contains("reading buf (0 float32 values in 500000 tensors) needs 244.1 MiB, more than the ") ||
                   Contains("no memory to read the " + std::to_string(header.size()) + "-byte header ("));
  const ChildResult roomy =
      in_child([&] { REQUIRE(parse_safetensors(bytes, "buf").tensors.size() == 500000); }, rlim_t{1} << 30);
  REQUIRE(roomy.message == "(accepted)");
}

TEST_CASE("a header that cannot be held in the memory left is refused before it is read",
          "[file_limits][bad_input][bug][gemm]") {
  // 48 MB of header ("{}" and spaces, valid) under 24 MiB of address space to spare: the header's
  // own buffer was allocated first and threw std::bad_alloc.
  TempDir dir("xgrad_file_limits");
  const std::string path = dir.file("wide.safetensors");
  const std::size_t n = std::size_t{48} << 20;
  write_bytes(path, st_bytes("{}" + std::string(n - 2, ' '), ""));
  for (const bool reader : {false, true}) {
    INFO((reader ? "SafetensorsReader" : "load_safetensors"));
    const ChildResult r = in_child(
        [&] {
      if (reader) {
        SafetensorsReader file(path);
      } else {
        load_safetensors(path);
      }
        },
        rlim_t{24} << 20);
    REQUIRE_THAT(r.message, StartsWith("load_safetensors: reading the " + std::to_string(n) + "-byte header of '" +
                                       path + "' needs 48.0 MiB, more than the ") &&
                                Contains("this process can still allocate (RLIMIT_AS of "));
    REQUIRE(in_child([&] { load_safetensors(path); }, rlim_t{256} << 20).message == "(accepted)");
  }
}
