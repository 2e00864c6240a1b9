// Token files: the header's encoding and checks, the atomic and the streaming writers, and the
// memory-mapped reader.
#include "xgrad/text/token_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace xgrad::text {

namespace {

constexpr char kMagic[8] = {'X', 'G', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr std::size_t kKindBytes = 32;
constexpr std::uint64_t kMaxVocab = std::uint64_t{1} << 32;

void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Bytes for a one-line message: printable ASCII kept, every other byte as \xNN.
std::string printable(const unsigned char* p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
      out += static_cast<char>(p[i]);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", p[i]);
      out += hex;
    }
  }
  return out;
}

bool is_hex_digest(const std::string& s) {
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
bool is_kind(const std::string& s) {
  return !s.empty() && s.size() < kKindBytes &&
         std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

// The header fields a writer is given, checked before anything is written.
void check_tokenizer_fields(const TokenizerIdentity& t, std::optional<std::int64_t> eos, const std::string& who,
                            const std::string& path) {
  if (t.vocab_size == 0 || t.vocab_size > kMaxVocab)
    fail(who, ": cannot write '", path, "': vocab_size ", t.vocab_size, " is outside [1, 2^32]");
  if (!is_kind(t.kind))
    fail(who, ": cannot write '", path, "': the tokenizer kind \"", readable_bytes(t.kind),
         "\" is not 1 to 31 printable ASCII bytes");
  if (!is_hex_digest(t.digest))
    fail(who, ": cannot write '", path, "': the tokenizer digest \"", readable_bytes(t.digest),
         "\" is not 16 lowercase hex digits");
  if (eos && (*eos < 0 || static_cast<std::uint64_t>(*eos) >= t.vocab_size))
    fail(who, ": cannot write '", path, "': eos id ", *eos, " is outside the vocabulary [0, ", t.vocab_size, ")");
}

// The first id outside [0, vocab) in ids, as an Error naming it and its position `base + i`.
void check_ids_in_vocab(const TokenIds& ids, std::uint64_t vocab, std::uint64_t base, const std::string& who,
                        const std::string& path) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<std::uint64_t>(ids[i]) >= vocab)
      fail(who, ": cannot write '", path, "': id ", ids[i], " at position ", base + i,
           " is outside the vocabulary [0, ", vocab, ")");
  }
}

std::string encode_header(const TokenFileHeader& h) {
  std::string bytes(kTokenFileHeaderBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(bytes.data());
  std::memcpy(p, kMagic, 8);
  put_u32(p + 8, h.version);
  put_u32(p + 12, h.dtype);
  put_u64(p + 16, h.tokens);
  put_u64(p + 24, h.documents);
  put_u64(p + 32, h.tokenizer.vocab_size);
  put_u64(p + 40, static_cast<std::uint64_t>(h.eos ? *h.eos : -1));
  std::memcpy(p + 48, h.tokenizer.digest.data(), 16);
  std::memcpy(p + 64, h.tokenizer.kind.data(), h.tokenizer.kind.size());
  return bytes;
}

// Appends ids as little-endian integers of `dtype` bytes.
void pack_ids(const std::int64_t* ids, std::size_t n, std::uint32_t dtype, std::vector<unsigned char>& out) {
  const std::size_t at = out.size();
  out.resize(at + n * dtype);
  unsigned char* p = out.data() + at;
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::uint32_t>(ids[i]);
    for (std::uint32_t b = 0; b < dtype; ++b) *p++ = static_cast<unsigned char>(v >> (8 * b));
  }
}

// Reads and checks the header of a file of `file_size` bytes from its first bytes.
TokenFileHeader decode_header(const unsigned char* p, std::uint64_t file_size, const std::string& path) {
  const std::string who = "TokenFile: '" + path + "'";
  if (std::memcmp(p, kMagic, 8) != 0)
    fail(who, " is not an xgrad token file: bytes 0..8 are \"", printable(p, 8), "\", not the magic \"XGTOKENS\"");
  TokenFileHeader h;
  h.version = get_u32(p + 8);
  if (h.version != kTokenFileVersion)
    fail(who, ": version ", h.version, " (byte 8) is unknown; this xgrad reads version ", kTokenFileVersion);
  h.dtype = get_u32(p + 12);
  if (h.dtype != 2 && h.dtype != 4) fail(who, ": dtype ", h.dtype, " (byte 12) is neither 2 (uint16) nor 4 (uint32)");
  h.tokens = get_u64(p + 16);
  h.documents = get_u64(p + 24);
  h.tokenizer.vocab_size = get_u64(p + 32);
  if (h.tokenizer.vocab_size == 0 || h.tokenizer.vocab_size > kMaxVocab)
    fail(who, ": vocab_size ", h.tokenizer.vocab_size, " (byte 32) is outside [1, 2^32]");
  if (h.dtype == 2 && h.tokenizer.vocab_size > 65536)
    fail(who, ": dtype 2 (uint16, byte 12) cannot hold the ids of a vocabulary of ", h.tokenizer.vocab_size,
         " (byte 32)");
  const auto eos = static_cast<std::int64_t>(get_u64(p + 40));
  if (eos != -1) {
    if (eos < 0 || static_cast<std::uint64_t>(eos) >= h.tokenizer.vocab_size)
      fail(who, ": eos ", eos, " (byte 40) is neither -1 (none) nor an id below vocab_size ", h.tokenizer.vocab_size);
    h.eos = eos;
  }
  h.tokenizer.digest.assign(reinterpret_cast<const char*>(p + 48), 16);
  if (!is_hex_digest(h.tokenizer.digest))
    fail(who, ": the digest \"", printable(p + 48, 16), "\" (bytes 48..64) is not 16 lowercase hex digits");
  const char* kind = reinterpret_cast<const char*>(p + 64);
  h.tokenizer.kind.assign(kind, strnlen(kind, kKindBytes));
  if (!is_kind(h.tokenizer.kind))
    fail(who, ": the tokenizer kind \"",
         printable(p + 64, h.tokenizer.kind.size() < kKindBytes ? h.tokenizer.kind.size() : kKindBytes),
         "\" (bytes 64..96) is not 1 to 31 printable ASCII bytes followed by zero bytes");
  for (std::size_t i = 64 + h.tokenizer.kind.size(); i < kTokenFileHeaderBytes; ++i) {
    if (p[i] != 0)
      fail(who, ": byte ", i, " is ", static_cast<int>(p[i]), ", not 0 (the ",
           i < 96 ? "bytes after the tokenizer kind" : "reserved bytes 96..128", " must be zero)");
  }
  const std::uint64_t max_tokens = (UINT64_MAX - kTokenFileHeaderBytes) / h.dtype;
  if (h.tokens > max_tokens) fail(who, ": the token count ", h.tokens, " (byte 16) passes any file size");
  const std::uint64_t expected = kTokenFileHeaderBytes + h.tokens * h.dtype;
  if (file_size < expected)
    fail(who, " is truncated: its header counts ", h.tokens, " tokens of ", h.dtype, " bytes (", expected,
         " bytes in all), but the file holds ", file_size, " bytes (it ends in the token at position ",
         (file_size - kTokenFileHeaderBytes) / h.dtype, ")");
  if (file_size > expected)
    fail(who, ": ", file_size - expected, " bytes follow the ", h.tokens, " tokens its header counts (at byte ",
         expected, "); the file holds ", file_size, " bytes, not ", expected);
  return h;
}

}  // namespace

std::uint32_t token_file_dtype(std::uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void write_token_file(const std::string& path, const TokenIds& tokens, const TokenizerIdentity& tokenizer,
                      std::uint64_t documents, std::optional<std::int64_t> eos) {
  const std::string who = "write_token_file";
  check_tokenizer_fields(tokenizer, eos, who, path);
  check_ids_in_vocab(tokens, tokenizer.vocab_size, 0, who, path);
  TokenFileHeader h;
  h.dtype = token_file_dtype(tokenizer.vocab_size);
  h.tokens = tokens.size();
  h.documents = documents;
  h.tokenizer = tokenizer;
  h.eos = eos;
  const std::string header = encode_header(h);
  std::vector<unsigned char> ids;
  pack_ids(tokens.data(), tokens.size(), h.dtype, ids);
  write_file_atomically(path, {header, std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size())}, who);
}

// ----------------------------------------------------------------------------------------------
// The streaming writer

TokenFileWriter::TokenFileWriter(const std::string& path, const TokenizerIdentity& tokenizer,
                                 std::optional<std::int64_t> eos)
    : path_(path) {
  const std::string who = "TokenFileWriter";
  check_tokenizer_fields(tokenizer, eos, who, path);
  check_writable_file(path, who);
  header_.dtype = token_file_dtype(tokenizer.vocab_size);
  header_.tokenizer = tokenizer;
  header_.eos = eos;
  fd_ = create_temporary_file(path, temporary_);
  if (fd_ < 0)
    fail(who, ": cannot write '", path_, "': creating the temporary file '", temporary_,
         "' failed: ", std::strerror(errno));
  buffer_.assign(kTokenFileHeaderBytes, 0);  // the header's place, written by finish()
  buffer_.reserve(std::size_t{1} << 20);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(temporary_.c_str());
}

void TokenFileWriter::failed(const std::string& step, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  finished_ = true;  // nothing more can be appended
  fail("TokenFileWriter: cannot write '", path_, "': ", step, " the temporary file '", temporary_,
       "' failed: ", std::strerror(err), " (anything already at that path is unchanged)");
}

void TokenFileWriter::flush() {
  const unsigned char* p = buffer_.data();
  std::size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) failed("writing", w < 0 ? errno : ENOSPC);
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  buffer_.clear();
}

void TokenFileWriter::append(const TokenIds& ids) {
  if (finished_ || fd_ < 0) fail("TokenFileWriter::append: '", path_, "' is already finished");
  check_ids_in_vocab(ids, header_.tokenizer.vocab_size, tokens_, "TokenFileWriter::append", path_);
  for (std::size_t at = 0; at < ids.size();) {
    const std::size_t n = std::min<std::size_t>(ids.size() - at, (std::size_t{1} << 18));
    pack_ids(ids.data() + at, n, header_.dtype, buffer_);
    if (buffer_.size() >= (std::size_t{1} << 20)) flush();
    at += n;
  }
  tokens_ += ids.size();
}

void TokenFileWriter::append_document(const TokenIds& ids) {
  if (documents_ > 0 && header_.eos) append(TokenIds{*header_.eos});
  append(ids);
  ++documents_;
}

void TokenFileWriter::finish(std::optional<std::uint64_t> documents) {
  if (finished_ || fd_ < 0) fail("TokenFileWriter::finish: '", path_, "' is already finished");
  flush();
  header_.tokens = tokens_;
  header_.documents = documents ? *documents : documents_;
  const std::string header = encode_header(header_);
  for (std::size_t done = 0; done < header.size();) {
    const ssize_t w = ::pwrite(fd_, header.data() + done, header.size() - done, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) failed("writing the header of", w < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd_) != 0) failed("syncing", errno);
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) failed("closing", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) failed("renaming over it", errno);
  finished_ = true;
  const std::string::size_type slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const bool synced = ::fsync(dfd) == 0 || errno == EINVAL;
    const int err = errno;
    ::close(dfd);
    if (!synced)
      fail("TokenFileWriter: '", path_, "' was written, but syncing its folder '", dir,
           "' failed: ", std::strerror(err), "; after a crash the folder may still show the earlier file");
  }
}

// ----------------------------------------------------------------------------------------------
// The reader

TokenFile::TokenFile(const std::string& path) : path_(path) {
  const std::string who = "TokenFile";
  // Refuses a missing file, a folder, a fifo, a device. The mapping is made from this descriptor,
  // which stays open so that read() can check the size of the very file mapped.
  file_ = std::make_unique<ReadableFile>(path, who);
  const std::uint64_t file_size = file_->size();
  if (file_size == 0) fail(who, ": '", path, "' is empty: a token file starts with a 128-byte header");
  if (file_size < kTokenFileHeaderBytes) {
    unsigned char start[8] = {};
    file_->read_exact_at(0, reinterpret_cast<char*>(start), std::min<std::uint64_t>(file_size, 8));
    if (file_size >= 8 && std::memcmp(start, kMagic, 8) != 0)
      fail(who, ": '", path, "' is not an xgrad token file: bytes 0..8 are \"", printable(start, 8),
           "\", not the magic \"XGTOKENS\"");
    fail(who, ": '", path, "' is truncated: it holds ", file_size, " bytes, fewer than the ", kTokenFileHeaderBytes,
         "-byte header");
  }
  unsigned char header[kTokenFileHeaderBytes];
  file_->read_exact_at(0, reinterpret_cast<char*>(header), sizeof header);
  header_ = decode_header(header, file_size, path);
  map_ = file_->map(file_size);
  ids_ = reinterpret_cast<const unsigned char*>(map_->data()) + kTokenFileHeaderBytes;
}

TokenFile::~TokenFile() = default;

void TokenFile::check_still_holds(std::uint64_t end, const std::string& who) const {
  const std::uint64_t now = file_->size_now();
  if (now < end)
    fail(who, ": '", path_, "' ends at byte ", now, ", before byte ", end, " that its header promises: the ",
         "file was truncated while open (", kTokenFileHeaderBytes + header_.tokens * header_.dtype,
         " bytes when opened)");
}

void TokenFile::read(std::size_t offset, std::size_t n, std::int64_t* out) const {
  check_range(offset, n, "TokenFile::read: '" + path_ + "'");
  const std::uint32_t dtype = header_.dtype;
  check_still_holds(kTokenFileHeaderBytes + (static_cast<std::uint64_t>(offset) + n) * dtype, "TokenFile::read");
  const std::uint64_t vocab = header_.tokenizer.vocab_size;
  const unsigned char* p = ids_ + offset * dtype;
  for (std::size_t i = 0; i < n; ++i, p += dtype) {
    const std::uint64_t id =
        dtype == 2 ? (static_cast<std::uint64_t>(p[0]) | (static_cast<std::uint64_t>(p[1]) << 8)) : get_u32(p);
    if (id >= vocab)
      fail("TokenFile::read: '", path_, "': the token at position ", offset + i, " (byte ",
           kTokenFileHeaderBytes + (offset + i) * dtype, ") is ", id, ", outside the vocabulary [0, ", vocab,
           ") of its tokenizer");
    out[i] = static_cast<std::int64_t>(id);
  }
}

void TokenFile::check_tokenizer(const TokenizerIdentity& expected) const {
  if (header_.tokenizer != expected)
    fail("TokenFile::check_tokenizer: '", path_, "' was written by the tokenizer (", describe(header_.tokenizer),
         "), not by this one (", describe(expected), ")");
}

void TokenFile::check_ids() const {
  std::vector<std::int64_t> chunk(std::size_t{1} << 16);
  for (std::size_t at = 0; at < size(); at += chunk.size()) read(at, std::min(chunk.size(), size() - at), chunk.data());
}

}  // namespace xgrad::text
