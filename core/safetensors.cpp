// safetensors reading (defensive: the file may be truncated, corrupted or hostile; a file is
// checked against its size before its data is read) and atomic writing.
#include "xgrad/core/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/file_io.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian data; this host is not");

namespace xgrad {

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // as the reference implementation: 100 MB
constexpr std::uint64_t kMaxExtent = std::uint64_t{1} << 60;

std::uint64_t read_u64_le(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// A JSON value for an error message: scalars as they are, containers by kind and size (dumping
// a hostile, deeply nested value would recurse once per level).
std::string brief(const nlohmann::json& j) {
  if (j.is_array()) return "an array of " + std::to_string(j.size());
  if (j.is_object()) return "an object of " + std::to_string(j.size());
  const std::string text = j.dump();
  return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}

struct Span {
  std::uint64_t begin, end;
  std::size_t index;
};

// Errors of one input: "load_safetensors: <what>: ...".
struct Bad {
  const std::string& what;
  template <class... Parts>
  [[noreturn]] void operator()(const Parts&... parts) const {
    fail("load_safetensors: ", what, ": ", parts...);
  }
};

// The header length from the first 8 of `total` bytes, checked against the limit and the total.
std::uint64_t header_length(const char* first8, std::uint64_t total, const Bad& bad) {
  if (total < 8) bad("truncated: ", total, " bytes, fewer than the 8-byte header length");
  const std::uint64_t n = read_u64_le(first8);
  if (n > kMaxHeader) bad("header length ", n, " exceeds the 100 MB limit");
  if (n > total - 8) bad("truncated: header length ", n, " but only ", total - 8, " bytes follow");
  return n;
}

struct Entry {
  std::string name;
  Shape shape;
  std::uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // by data offset, covering the data exactly
  Metadata metadata;
};

// Parses and checks the JSON header against a data section of data_size bytes, before any of
// the data is read.
Header parse_header(const char* text, std::uint64_t n, std::uint64_t data_size, const Bad& bad) {
  // The JSON reader stops at a NUL byte; a header must not hide bytes behind one.
  if (std::memchr(text, '\0', n) != nullptr) bad("the header is not valid JSON: it contains a NUL byte");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    bad("the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) bad("the header is not a JSON object");

  Header out;
  std::vector<Entry> entries;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) bad("__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) bad("metadata value of '", m.key(), "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets")) {
      bad("entry '", name, "' needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string() || e["dtype"].get<std::string>() != "F32") {
      bad("tensor '", name, "' has dtype ", brief(e["dtype"]), "; xgrad reads F32 only");
    }
    const nlohmann::json& js = e["shape"];
    const nlohmann::json& jo = e["data_offsets"];
    if (!js.is_array()) bad("tensor '", name, "' has a shape that is not an array");
    Shape shape;
    std::uint64_t count = 1, extent = 1;
    for (const auto& d : js) {
      if (!d.is_number_unsigned()) bad("tensor '", name, "' has a shape entry ", brief(d), " that is not a non-negative integer");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v != 0 && count > data_size / v) bad("tensor '", name, "' has a shape larger than the file");
      // Even with a zero elsewhere, the strides (products of trailing sizes) must stay representable.
      if (v > 1 && extent > kMaxExtent / v) bad("tensor '", name, "' has a shape whose sizes multiply past 2^60");
      extent *= std::max<std::uint64_t>(v, 1);
      count *= v;
      shape.push_back(static_cast<std::size_t>(v));
    }
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned()) {
      bad("tensor '", name, "' has data_offsets ", brief(jo), " that are not two non-negative integers");
    }
    const std::uint64_t b = jo[0].get<std::uint64_t>(), end = jo[1].get<std::uint64_t>();
    if (b > end) bad("tensor '", name, "' has reversed data_offsets [", b, ", ", end, "]");
    if (end > data_size) bad("tensor '", name, "' has data_offsets [", b, ", ", end, "] outside the ", data_size, "-byte data");
    if (end - b != count * 4) bad("tensor '", name, "' of shape ", shape_str(shape), " needs ", count * 4, " bytes, its offsets span ", end - b);
    spans.push_back({b, end, entries.size()});
    entries.push_back({name, std::move(shape), b, end});
  }
  // The data must be covered exactly: no holes, no overlaps.
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin || (x.begin == y.begin && x.end < y.end); });
  std::uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin != at) bad("tensor '", entries[s.index].name, "' starts at byte ", s.begin, ", expected ", at, " (a hole or an overlap)");
    at = s.end;
  }
  if (at != data_size) bad("the data has ", data_size, " bytes but the tensors cover ", at);
  for (const Span& s : spans) out.entries.push_back(std::move(entries[s.index]));
  return out;
}

}  // namespace

SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what) {
  const Bad bad{what};
  const std::uint64_t n = header_length(bytes.data(), bytes.size(), bad);
  const std::uint64_t data_size = bytes.size() - 8 - n;
  Header header = parse_header(bytes.data() + 8, n, data_size, bad);
  const char* data = bytes.data() + 8 + n;
  SafetensorsContents out;
  out.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) {
    Array a = Array::from_shape(e.shape);
    if (e.end > e.begin) std::memcpy(a.data(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(std::move(e.name), std::move(a));
  }
  return out;
}

SafetensorsContents load_safetensors(const std::string& path) {
  remove_stale_temporaries(path);
  const std::string what = "'" + path + "'";
  const Bad bad{what};
  // Everything is checked against the file's size before the data is read: a folder, a device or a
  // fifo is refused when opened, a header that promises more than the file holds right after.
  ReadableFile file(path, "load_safetensors");
  const std::uint64_t total = file.size();
  char first8[8] = {};
  file.read_exact(first8, static_cast<std::size_t>(std::min<std::uint64_t>(total, 8)));
  const std::uint64_t n = header_length(first8, total, bad);
  std::string text(static_cast<std::size_t>(n), '\0');
  file.read_exact(text.data(), text.size());
  Header header = parse_header(text.data(), n, total - 8 - n, bad);

  // The arrays are read in place, in file order (the entries cover the data without gaps).
  SafetensorsContents out;
  out.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) {
    Array a = Array::from_shape(e.shape);
    file.read_exact(reinterpret_cast<char*>(a.data()), static_cast<std::size_t>(e.end - e.begin));
    out.tensors.emplace_back(std::move(e.name), std::move(a));
  }
  if (!file.at_end()) bad("the file grew while being read (it held ", total, " bytes when opened)");
  return out;
}

void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& [name, a] : tensors) {
    if (name.empty() || name == "__metadata__") fail("save_safetensors: invalid tensor name '", name, "'");
    if (!names.insert(name).second) fail("save_safetensors: tensor name '", name, "' appears twice");
    std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + a.size() * 4}}};
    offset += a.size() * 4;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned

  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  // The arrays' own bytes, not a copy: a checkpoint may be most of the memory in use.
  std::vector<std::string_view> chunks = {{len_bytes, 8}, text};
  for (const auto& [name, a] : tensors) chunks.emplace_back(reinterpret_cast<const char*>(a.data()), a.size() * 4);
  // First, so a disk filled by killed saves' leftovers has room again.
  remove_stale_temporaries(path);
  write_file_atomically(path, chunks, "save_safetensors");
}

}  // namespace xgrad
