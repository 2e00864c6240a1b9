// safetensors reading (defensive: the file may be truncated, corrupted or hostile; a file is
// checked against its size before its data is read) and atomic writing; F16 and BF16 conversion.
#include "xgrad/core/io/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/utf8.hpp"

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

// The text of an n-byte header read from a file, once it is known to fit.
std::string header_text(ReadableFile& file, std::uint64_t n, const std::string& what) {
  check_available_memory(static_cast<double>(n), "load_safetensors",
                         "reading the " + std::to_string(n) + "-byte header of " + what);
  std::string text(static_cast<std::size_t>(n), '\0');
  file.read_exact(text.data(), text.size());
  return text;
}

using Entry = TensorInfo;

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

// A name in an error message: a hostile header may hold a name of megabytes.
std::string named(const std::string& name) {
  return "'" + (name.size() > 200 ? name.substr(0, 200) + "..." : name) + "'";
}

// The header, read through nlohmann::json's SAX interface straight into entries and metadata: no
// JSON tree is built (a tree of a 100 MB header of brackets took 3.8 GB), so the memory stays a
// small multiple of the header's size. Values nest at most kMaxDepth levels (a valid header needs
// three), and every key appears at most once in its object.
class HeaderReader {
 public:
  using json = nlohmann::json;
  explicit HeaderReader(std::uint64_t data_size) : data_size_(data_size) {}

  std::string problem;  // what is wrong with the content; empty when only the JSON is bad
  std::string syntax;   // the JSON reader's message
  Header header;

  bool null() { return value({Kind::scalar, json(nullptr)}); }
  bool boolean(bool v) { return value({Kind::scalar, json(v)}); }
  bool number_integer(std::int64_t v) { return value({Kind::scalar, json(v)}); }
  bool number_unsigned(std::uint64_t v) { return value({Kind::scalar, json(v)}); }
  bool number_float(double v, const std::string&) { return value({Kind::scalar, json(v)}); }
  bool string(std::string& v) { return value({Kind::scalar, json(), &v}); }
  bool binary(json::binary_t&) { return stop("the header holds a binary value"); }
  bool start_object(std::size_t) { return value({Kind::object, json()}); }
  bool start_array(std::size_t) { return value({Kind::array, json()}); }
  bool key(std::string& k) {
    if (frames_.back() == In::entry) {
      bool* seen = k == "dtype"          ? &has_dtype_
                   : k == "shape"        ? &has_shape_
                   : k == "data_offsets" ? &has_offsets_
                                         : nullptr;
      if (seen && *seen) return stop("tensor ", named(name_), " has '", k, "' twice");
      if (seen) *seen = true;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    syntax = xgrad::detail::json_error_text(e);
    return false;
  }

 private:
  enum class Kind { scalar, object, array };
  enum class In { top, metadata, entry, shape, offsets, skipped };
  struct Value {
    Kind kind;
    json scalar;                  // a scalar other than a string
    std::string* text = nullptr;  // a string
    bool is_unsigned() const { return kind == Kind::scalar && scalar.is_number_unsigned(); }
  };

  template <class... Parts>
  bool stop(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    problem = os.str();
    return false;
  }

  // A value for an error message: scalars as they are, containers by kind.
  static std::string brief(const Value& v) {
    if (v.kind != Kind::scalar) return v.kind == Kind::array ? "an array" : "an object";
    // A cut may split a character: replaced, not thrown.
    const std::string text =
        v.text ? json(v.text->substr(0, 41)).dump(-1, ' ', false, json::error_handler_t::replace) : v.scalar.dump();
    return text.size() > 40 ? text.substr(0, 40) + "..." : text;
  }

  bool open(In in) {
    if (frames_.size() >= kMaxDepth) return stop("the header nests values deeper than ", kMaxDepth, " levels");
    frames_.push_back(in);
    return true;
  }

  // A scalar, or the start of an object or array, inside the innermost open value.
  bool value(const Value& v) {
    const bool container = v.kind != Kind::scalar;
    if (frames_.empty()) return v.kind == Kind::object ? open(In::top) : stop("the header is not a JSON object");
    switch (frames_.back()) {
      case In::top:
        if (key_ == "__metadata__") {
          if (v.kind != Kind::object) return stop("__metadata__ is not an object");
          if (has_metadata_) return stop("__metadata__ appears twice");
          has_metadata_ = true;
          return open(In::metadata);
        }
        if (v.kind != Kind::object) return stop("entry ", named(key_), " needs dtype, shape and data_offsets");
        name_ = std::move(key_);
        has_dtype_ = has_shape_ = has_offsets_ = false;
        shape_.clear();
        offsets_.clear();
        return open(In::entry);
      case In::metadata:
        if (!v.text) return stop("metadata value of ", named(key_), " is not a string");
        if (!header.metadata.emplace(key_, std::move(*v.text)).second)
          return stop("__metadata__ has the key ", named(key_), " twice");
        return true;
      case In::entry:
        if (key_ == "dtype") {
          const std::optional<Dtype> d = v.text ? dtype_named(*v.text) : std::nullopt;
          if (!d) return stop("tensor ", named(name_), " has dtype ", brief(v), "; xgrad reads F32, F16 and BF16");
          dtype_ = *d;
          return true;
        }
        if (key_ == "shape") {
          return v.kind == Kind::array ? open(In::shape)
                                       : stop("tensor ", named(name_), " has a shape that is not an array");
        }
        if (key_ == "data_offsets") {
          return v.kind == Kind::array ? open(In::offsets)
                                       : stop("tensor ", named(name_), " has data_offsets ", brief(v),
                                              " that are not two non-negative integers");
        }
        return container ? open(In::skipped) : true;  // other keys are ignored, as the reference reader does
      case In::shape:
        if (!v.is_unsigned()) {
          return stop("tensor ", named(name_), " has a shape entry ", brief(v), " that is not a non-negative integer");
        }
        if (shape_.size() == kMaxRank) return stop("tensor ", named(name_), " has more than ", kMaxRank, " dimensions");
        shape_.push_back(v.scalar.get<std::uint64_t>());
        return true;
      case In::offsets:
        if (!v.is_unsigned() || offsets_.size() == 2) {
          return stop("tensor ", named(name_), " has data_offsets that are not two non-negative integers (",
                      offsets_.size() == 2 ? "a third entry " : "an entry ", brief(v), ")");
        }
        offsets_.push_back(v.scalar.get<std::uint64_t>());
        return true;
      case In::skipped:
        return container ? open(In::skipped) : true;
    }
    return true;
  }

  bool close() {
    const In in = frames_.back();
    frames_.pop_back();
    if (in == In::offsets && offsets_.size() != 2) {
      return stop("tensor ", named(name_), " has data_offsets of ", offsets_.size(),
                  " entries, not two non-negative integers");
    }
    return in == In::entry ? finish_entry() : true;
  }

  bool finish_entry() {
    if (!has_dtype_ || !has_shape_ || !has_offsets_)
      return stop("entry ", named(name_), " needs dtype, shape and data_offsets");
    const std::uint64_t size = element_bytes(dtype_);
    // A zero anywhere holds no elements, whatever the other sizes ((3, 0) as well as (0, 3)).
    const bool empty = std::find(shape_.begin(), shape_.end(), 0) != shape_.end();
    std::uint64_t count = empty ? 0 : 1, extent = 1;
    for (const std::uint64_t v : shape_) {
      if (!empty && count > data_size_ / v) return stop("tensor ", named(name_), " has a shape larger than the file");
      // Even with a zero elsewhere, the strides (products of trailing sizes) must stay representable.
      if (v > 1 && extent > kMaxExtent / v)
        return stop("tensor ", named(name_), " has a shape whose sizes multiply past 2^60");
      extent *= std::max<std::uint64_t>(v, 1);
      count *= v;
    }
    const Shape shape(shape_.begin(), shape_.end());
    const std::uint64_t b = offsets_[0], end = offsets_[1];
    if (b > end) return stop("tensor ", named(name_), " has reversed data_offsets [", b, ", ", end, "]");
    if (end > data_size_) {
      return stop("tensor ", named(name_), " has data_offsets [", b, ", ", end, "] outside the ", data_size_,
                  "-byte data");
    }
    if (end - b != count * size) {
      return stop("tensor ", named(name_), " of shape ", shape_str(shape), " and dtype ", dtype_name(dtype_), " needs ",
                  count * size, " bytes, its offsets span ", end - b);
    }
    header.entries.push_back({std::move(name_), shape, dtype_, b, end});
    return true;
  }

  static constexpr std::size_t kMaxDepth = 64;
  static constexpr std::size_t kMaxRank = 64;  // numpy's limit
  std::uint64_t data_size_;
  std::vector<In> frames_;
  std::string key_, name_;  // the last key read; the tensor whose entry is open
  bool has_metadata_ = false, has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  Dtype dtype_ = Dtype::f32;
  std::vector<std::uint64_t> shape_, offsets_;
};

// Parses and checks the JSON header against a data section of data_size bytes, before any of
// the data is read.
Header parse_header(const char* text, std::uint64_t n, std::uint64_t data_size, const Bad& bad) {
  // The JSON reader stops at a NUL byte; a header must not hide bytes behind one.
  if (std::memchr(text, '\0', n) != nullptr) bad("the header is not valid JSON: it contains a NUL byte");
  HeaderReader reader(data_size);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(text, text + n, &reader);
  } catch (const std::bad_alloc&) {
    // The entries of a header of millions of tiny tensors take a few times its size.
    bad("no memory to read the ", n, "-byte header (", reader.header.entries.size(), " tensors read; ",
        bytes_str(available_memory().bytes), " left: ", available_memory().limit, ")");
  }
  if (!parsed) {
    if (!reader.problem.empty()) bad(reader.problem);
    bad("the header is not valid JSON (", reader.syntax, ")");
  }
  std::vector<Entry>& entries = reader.header.entries;
  // A name twice is ambiguous (JSON readers keep either value): refused, as save_safetensors refuses it.
  std::vector<std::size_t> by_name(entries.size());
  std::iota(by_name.begin(), by_name.end(), 0);
  std::sort(by_name.begin(), by_name.end(),
            [&](std::size_t x, std::size_t y) { return entries[x].name < entries[y].name; });
  for (std::size_t i = 1; i < by_name.size(); ++i) {
    if (entries[by_name[i]].name == entries[by_name[i - 1]].name)
      bad("tensor ", named(entries[by_name[i]].name), " appears twice");
  }
  // The data must be covered exactly: no holes, no overlaps.
  std::vector<Span> spans;
  spans.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) spans.push_back({entries[i].begin, entries[i].end, i});
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.begin < y.begin || (x.begin == y.begin && x.end < y.end); });
  std::uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin != at)
      bad("tensor ", named(entries[s.index].name), " starts at byte ", s.begin, ", expected ", at,
          " (a hole or an overlap)");
    at = s.end;
  }
  if (at != data_size) bad("the data has ", data_size, " bytes but the tensors cover ", at);
  Header out;
  out.metadata = std::move(reader.header.metadata);
  out.entries.reserve(entries.size());
  for (const Span& s : spans) out.entries.push_back(std::move(entries[s.index]));
  return out;
}

// The float32 arrays of `header` must fit before any is allocated (F16 and BF16 double in size),
// with what each named array costs beside its values (about 500 bytes, measured with 1.5 million
// empty tensors: their 84 MB header took 750 MB).
void check_arrays_fit(const Header& header, const std::string& what) {
  constexpr double kPerTensor = 512;
  double values = 0;
  for (const Entry& e : header.entries) values += static_cast<double>((e.end - e.begin) / element_bytes(e.dtype));
  check_available_memory(
      values * sizeof(float) + kPerTensor * static_cast<double>(header.entries.size()), "load_safetensors",
      "reading " + what + " (" + std::to_string(static_cast<std::uint64_t>(values)) + " float32 values in " +
          std::to_string(header.entries.size()) + (header.entries.size() == 1 ? " tensor)" : " tensors)"));
}

}  // namespace

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::f32:
      return "F32";
    case Dtype::f16:
      return "F16";
    case Dtype::bf16:
      return "BF16";
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
  check_arrays_fit(header, what);
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
  const std::string text = header_text(file, n, what);
  Header header = parse_header(text.data(), n, total - 8 - n, bad);
  check_arrays_fit(header, what);

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

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), file_(path, "load_safetensors") {
  remove_stale_temporaries(path);
  const std::string what = "'" + path + "'";
  const Bad bad{what};
  const std::uint64_t total = file_.size();
  char first8[8] = {};
  file_.read_exact(first8, static_cast<std::size_t>(std::min<std::uint64_t>(total, 8)));
  const std::uint64_t n = header_length(first8, total, bad);
  const std::string text = header_text(file_, n, what);
  Header header = parse_header(text.data(), n, total - 8 - n, bad);
  tensors_ = std::move(header.entries);
  metadata_ = std::move(header.metadata);
  data_start_ = 8 + n;
}

std::size_t SafetensorsReader::find(const std::string& name) const {
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return i;
  }
  return tensors_.size();
}

void SafetensorsReader::read(std::size_t index, std::size_t first, std::size_t count, float* dst) {
  if (index >= tensors_.size())
    fail("SafetensorsReader::read: '", path_, "' has ", tensors_.size(), " tensors, no tensor ", index);
  const TensorInfo& t = tensors_[index];
  const std::uint64_t size = element_bytes(t.dtype), elements = (t.end - t.begin) / size;
  if (first > elements || count > elements - first) {
    fail("SafetensorsReader::read: elements [", first, ", ", static_cast<std::uint64_t>(first) + count, ") of tensor '",
         t.name, "' in '", path_, "', which has ", elements);
  }
  const std::uint64_t at = data_start_ + t.begin + first * size;
  if (t.dtype == Dtype::f32) return file_.read_exact_at(at, reinterpret_cast<char*>(dst), count * 4);
  // F16 and BF16 through a small buffer, so a large tensor is never held twice.
  constexpr std::size_t kChunk = 1 << 16;
  char narrow[2 * kChunk];
  for (std::size_t done = 0; done < count;) {
    const std::size_t k = std::min(kChunk, count - done);
    file_.read_exact_at(at + 2 * done, narrow, 2 * k);
    decode(t.dtype, narrow, k, dst + done);
    done += k;
  }
}

std::optional<Array> SafetensorsReader::map_f32(std::size_t index) {
  if (index >= tensors_.size())
    fail("SafetensorsReader::map_f32: '", path_, "' has ", tensors_.size(), " tensors, no tensor ", index);
  const TensorInfo& t = tensors_[index];
  if (t.dtype != Dtype::f32 || (data_start_ + t.begin) % alignof(float) != 0) return std::nullopt;
  if (!mapping_) mapping_ = file_.map(data_start_ + tensors_.back().end);  // the entries cover the data
  float* data = reinterpret_cast<float*>(mapping_->data() + data_start_ + t.begin);
  return array_over(data, t.shape, mapping_);
}

void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata, Dtype dtype) {
  // JSON holds UTF-8 only; checked here, before the header is built, so nothing is written.
  for (const auto& [name, a] : tensors) check_utf8(name, "save_safetensors", "tensor name");
  for (const auto& [key, value] : metadata) {
    check_utf8(key, "save_safetensors", "metadata key");
    check_utf8(value, "save_safetensors", ("metadata value of '" + escape_bytes(key) + "'").c_str());
  }
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  std::uint64_t offset = 0;
  const std::uint64_t size = element_bytes(dtype);
  for (const auto& [name, a] : tensors) {
    if (name.empty() || name == "__metadata__") fail("save_safetensors: invalid tensor name '", name, "'");
    if (!names.insert(name).second) fail("save_safetensors: tensor name '", name, "' appears twice");
    std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
    header[name] = {
        {"dtype", dtype_name(dtype)}, {"shape", shape}, {"data_offsets", {offset, offset + a.size() * size}}};
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
               dtype_name(dtype), " (largest finite value ", dtype == Dtype::f16 ? 65504.0 : 3.3895313892515355e38,
               ")");
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
