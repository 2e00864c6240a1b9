// safetensors reading (defensive: the file may be truncated, corrupted or hostile; a file is
// checked against its size before its data is read) and atomic writing; F16 and BF16 conversion.
#include "xgrad/core/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
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
  Dtype dtype;
  std::uint64_t begin, end;
};

std::optional<Dtype> dtype_named(const std::string& s) {
  if (s == "F32") return Dtype::f32;
  if (s == "F16") return Dtype::f16;
  if (s == "BF16") return Dtype::bf16;
  return std::nullopt;
}

std::uint64_t element_bytes(Dtype d) { return d == Dtype::f32 ? 4 : 2; }

// `count` values of type `d` at `src` (little-endian, any alignment) into float32 at `dst`.
void decode(Dtype d, const char* src, std::size_t count, float* dst) {
  if (d == Dtype::f32) {
    std::memcpy(dst, src, count * 4);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const auto bits = static_cast<std::uint16_t>(static_cast<unsigned char>(src[2 * i]) |
                                                 static_cast<unsigned char>(src[2 * i + 1]) << 8);
    dst[i] = d == Dtype::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
  }
}

Array read_array(const Entry& e, const char* bytes) {
  Array a = Array::from_shape(e.shape);
  if (a.size() > 0) decode(e.dtype, bytes, a.size(), a.data());
  return a;
}

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
    const std::optional<Dtype> dtype = e["dtype"].is_string() ? dtype_named(e["dtype"].get<std::string>()) : std::nullopt;
    if (!dtype) bad("tensor '", name, "' has dtype ", brief(e["dtype"]), "; xgrad reads F32, F16 and BF16");
    const std::uint64_t size = element_bytes(*dtype);
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
    if (end - b != count * size) {
      bad("tensor '", name, "' of shape ", shape_str(shape), " and dtype ", dtype_name(*dtype), " needs ", count * size,
          " bytes, its offsets span ", end - b);
    }
    spans.push_back({b, end, entries.size()});
    entries.push_back({name, std::move(shape), *dtype, b, end});
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

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::f32: return "F32";
    case Dtype::f16: return "F16";
    case Dtype::bf16: return "BF16";
  }
  return "?";
}

// F16: sign, 5 exponent bits (bias 15), 10 mantissa bits; subnormals are m * 2^-24.
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13;  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | (exp + 112) << 23 | man << 13;  // 112 = 127 - 15
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: shift the leading 1 into the implicit bit, one exponent step per shift.
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | exp << 23 | (man & 0x3ffu) << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_f16(float value) {
  std::uint32_t x;
  std::memcpy(&x, &value, 4);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // a quiet NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up (and inf): a tie at 65520 rounds to even, up
  if (x <= 0x33000000u) return sign;            // at most 2^-25: a tie at 2^-25 rounds to even, 0
  const std::uint32_t exp = x >> 23, man = x & 0x7fffffu;
  std::uint32_t h, rem, half;
  if (exp < 113) {
    // Below 2^-14: a subnormal, in units of 2^-24: (1.man * 2^(exp-127)) / 2^-24 = (man | 2^23) >> (126 - exp).
    const std::uint32_t shift = 126 - exp, full = man | 0x800000u;
    h = full >> shift;
    rem = full & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {
    h = (exp - 112) << 10 | man >> 13;
    rem = man & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (h & 1u))) ++h;  // a carry moves into the exponent, as it should
  return static_cast<std::uint16_t>(sign | h);
}

std::uint16_t f32_to_bf16(float value) {
  std::uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // a quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what) {
  const Bad bad{what};
  const std::uint64_t n = header_length(bytes.data(), bytes.size(), bad);
  const std::uint64_t data_size = bytes.size() - 8 - n;
  Header header = parse_header(bytes.data() + 8, n, data_size, bad);
  const char* data = bytes.data() + 8 + n;
  SafetensorsContents out;
  out.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) {
    Array a = read_array(e, data + e.begin);
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
  std::vector<char> narrow;
  for (Entry& e : header.entries) {
    Array a = Array::from_shape(e.shape);
    const auto bytes = static_cast<std::size_t>(e.end - e.begin);
    if (e.dtype == Dtype::f32) {
      file.read_exact(reinterpret_cast<char*>(a.data()), bytes);
    } else {
      narrow.resize(bytes);
      file.read_exact(narrow.data(), bytes);
      if (a.size() > 0) decode(e.dtype, narrow.data(), a.size(), a.data());
    }
    out.tensors.emplace_back(std::move(e.name), std::move(a));
  }
  if (!file.at_end()) bad("the file grew while being read (it held ", total, " bytes when opened)");
  return out;
}

void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata, Dtype dtype) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  std::uint64_t offset = 0;
  const std::uint64_t size = element_bytes(dtype);
  for (const auto& [name, a] : tensors) {
    if (name.empty() || name == "__metadata__") fail("save_safetensors: invalid tensor name '", name, "'");
    if (!names.insert(name).second) fail("save_safetensors: tensor name '", name, "' appears twice");
    std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
    header[name] = {{"dtype", dtype_name(dtype)}, {"shape", shape}, {"data_offsets", {offset, offset + a.size() * size}}};
    offset += a.size() * size;
  }
  // F16 and BF16 values, converted (and checked) before anything is written.
  std::vector<std::string> narrowed;
  if (dtype != Dtype::f32) {
    for (const auto& [name, a] : tensors) {
      std::string& bytes = narrowed.emplace_back(a.size() * 2, '\0');
      for (std::size_t i = 0; i < a.size(); ++i) {
        const float v = a.data()[i];
        const std::uint16_t bits = dtype == Dtype::f16 ? f32_to_f16(v) : f32_to_bf16(v);
        const bool to_inf = (bits & 0x7fff) == (dtype == Dtype::f16 ? 0x7c00 : 0x7f80);
        if (to_inf && std::isfinite(v)) {
          fail("save_safetensors: tensor '", name, "' holds ", v, " at flat position ", i, ", outside the range of ",
               dtype_name(dtype), " (largest finite value ", dtype == Dtype::f16 ? 65504.0 : 3.3895313892515355e38, ")");
        }
        bytes[2 * i] = static_cast<char>(bits & 0xff);
        bytes[2 * i + 1] = static_cast<char>(bits >> 8);
      }
    }
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned

  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  // The arrays' own bytes, not a copy: a checkpoint may be most of the memory in use.
  std::vector<std::string_view> chunks = {{len_bytes, 8}, text};
  if (dtype == Dtype::f32) {
    for (const auto& [name, a] : tensors) chunks.emplace_back(reinterpret_cast<const char*>(a.data()), a.size() * 4);
  } else {
    for (const std::string& bytes : narrowed) chunks.emplace_back(bytes);
  }
  // First, so a disk filled by killed saves' leftovers has room again.
  remove_stale_temporaries(path);
  write_file_atomically(path, chunks, "save_safetensors");
}

}  // namespace xgrad
