// safetensors reading (defensive: the file may be truncated, corrupted or hostile) and
// atomic writing.
#include "xgrad/core/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"

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

}  // namespace

SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what) {
  auto bad = [&](const auto&... parts) { fail("load_safetensors: ", what, ": ", parts...); };
  if (bytes.size() < 8) bad("truncated: ", bytes.size(), " bytes, fewer than the 8-byte header length");
  const std::uint64_t n = read_u64_le(bytes.data());
  if (n > kMaxHeader) bad("header length ", n, " exceeds the 100 MB limit");
  if (n > bytes.size() - 8) bad("truncated: header length ", n, " but only ", bytes.size() - 8, " bytes follow");
  const std::uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  // The JSON reader stops at a NUL byte; a header must not hide bytes behind one.
  if (std::memchr(bytes.data() + 8, '\0', n) != nullptr) bad("the header is not valid JSON: it contains a NUL byte");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    bad("the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) bad("the header is not a JSON object");

  SafetensorsContents out;
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
    Array a = Array::from_shape(shape);
    if (count) std::memcpy(a.data(), data + b, count * 4);
    spans.push_back({b, end, out.tensors.size()});
    out.tensors.emplace_back(name, std::move(a));
  }
  // The data must be covered exactly: no holes, no overlaps.
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin || (x.begin == y.begin && x.end < y.end); });
  std::uint64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin != at) bad("tensor '", out.tensors[s.index].first, "' starts at byte ", s.begin, ", expected ", at, " (a hole or an overlap)");
    at = s.end;
  }
  if (at != data_size) bad("the data has ", data_size, " bytes but the tensors cover ", at);
  NamedArrays ordered;
  for (const Span& s : spans) ordered.push_back(std::move(out.tensors[s.index]));
  out.tensors = std::move(ordered);
  return out;
}

SafetensorsContents load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("load_safetensors: cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("load_safetensors: error reading '", path, "'");
  return parse_safetensors(ss.str(), "'" + path + "'");
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

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("save_safetensors: cannot create '", tmp, "': ", std::strerror(errno));
  auto write_all = [&](const void* p, std::size_t len) {
    const char* c = static_cast<const char*>(p);
    while (len > 0) {
      const ssize_t w = ::write(fd, c, len);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      c += w;
      len -= static_cast<std::size_t>(w);
    }
    return true;
  };
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  bool ok = write_all(len_bytes, 8) && write_all(text.data(), text.size());
  for (std::size_t i = 0; ok && i < tensors.size(); ++i) ok = write_all(tensors[i].second.data(), tensors[i].second.size() * 4);
  const int err = errno;
  ok = ok && ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    fail("save_safetensors: writing '", path, "' failed: ", std::strerror(e), " (any earlier file there is unchanged)");
  }
  // Make the rename itself durable.
  const std::string::size_type slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace xgrad
