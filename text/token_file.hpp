/// @file
/// Token files: a corpus tokenized once (nanoGPT's train.bin and val.bin), read back a window at a
/// time (pread) so that a file of any size costs no memory until its windows are read.
///
/// The format, version 1. Every integer is little-endian; the header is 128 bytes, so the tokens
/// start 8-byte aligned (at byte 128):
///
/// | bytes    | field      | value |
/// |----------|------------|-------|
/// | 0..8     | magic      | the ASCII bytes `XGTOKENS` |
/// | 8..12    | version    | uint32, 1 |
/// | 12..16   | dtype      | uint32, bytes per token: 2 (uint16, written when vocab_size <= 65536) or 4 (uint32) |
/// | 16..24   | tokens     | uint64, the number of tokens |
/// | 24..32   | documents  | uint64, the number of documents (0: not counted) |
/// | 32..40   | vocab_size | uint64, in [1, 2^32] (at most 65536 with dtype 2); every id is below it |
/// | 40..48   | eos        | int64, the end-of-text id separating documents, in [0, vocab_size), or -1: none |
/// | 48..64   | digest     | 16 ASCII lowercase hex digits: TokenizerIdentity::digest |
/// | 64..96   | kind       | TokenizerIdentity::kind, 1 to 31 printable ASCII bytes, then zero bytes |
/// | 96..128  | reserved   | zero |
/// | 128..    | ids        | `tokens` ids of `dtype` bytes each; the file ends with the last one |
///
/// Documents are separated by the eos id (one between two documents, none after the last); a
/// tokenizer without an end-of-text token writes them one after another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/text/token_source.hpp"
#include "xgrad/text/tokenizer.hpp"

namespace xgrad {
class ReadableFile;
class FileMapping;
}  // namespace xgrad

namespace xgrad::text {

/// The bytes before the first token of a token file.
constexpr std::size_t kTokenFileHeaderBytes = 128;
/// The format version this xgrad reads and writes.
constexpr std::uint32_t kTokenFileVersion = 1;

/// The fields of a token file's header (see the file comment for the layout).
struct TokenFileHeader {
  std::uint32_t version = kTokenFileVersion;  ///< the format's version (1)
  std::uint32_t dtype = 2;                    ///< bytes per token: 2 (uint16) or 4 (uint32)
  std::uint64_t tokens = 0;                   ///< how many ids follow the header
  std::uint64_t documents = 0;                ///< how many documents they hold (0: not counted)
  TokenizerIdentity tokenizer;                ///< the tokenizer that made the ids
  std::optional<std::int64_t> eos;            ///< the id separating documents, if the tokenizer has one
};

/// The dtype a token file of this vocabulary is written with: 2 up to 65536 ids, else 4.
std::uint32_t token_file_dtype(std::uint64_t vocab_size);

/// Writes `tokens` as a token file at `path`, atomically (write_file_atomically: an earlier file
/// at path is unchanged on any failure). An id outside [0, tokenizer.vocab_size) is an Error
/// naming the first such id and its position, as are a vocab_size outside [1, 2^32], a kind or
/// digest the header cannot hold, an eos outside the vocabulary and a path that is a folder, a
/// device or in a missing folder; nothing is written then.
void write_token_file(const std::string& path, const TokenIds& tokens, const TokenizerIdentity& tokenizer,
                      std::uint64_t documents = 0, std::optional<std::int64_t> eos = std::nullopt);

/// Writes a token file piece by piece, so that a large corpus is never held in memory as ids:
/// the ids go to a temporary of this writer's own as they come (create_temporary_file:
/// `path.tmp.PID`, or `path.tmp.PID.N` while another writer holds that name), and finish() writes
/// the header, syncs and renames it over path. Writers of one path at once each finish a whole
/// file; the last finish() wins, as for atomic writes. A writer destroyed before finish() removes
/// its temporary and leaves path unchanged, as does every Error.
class TokenFileWriter {
 public:
  /// Checks that path can be written (check_writable_file) and the tokenizer fields (as
  /// write_token_file does), then creates the temporary.
  TokenFileWriter(const std::string& path, const TokenizerIdentity& tokenizer,
                  std::optional<std::int64_t> eos = std::nullopt);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  /// Appends ids; an id outside the vocabulary is an Error naming it and its position in the
  /// file, and nothing of this call is appended.
  void append(const TokenIds& ids);
  /// Appends one document: the eos id first when this is not the first document and the
  /// tokenizer has one, then the ids. Counts the document.
  void append_document(const TokenIds& ids);
  /// Tokens appended so far.
  std::uint64_t tokens() const { return tokens_; }
  /// Documents appended so far by append_document.
  std::uint64_t documents() const { return documents_; }
  /// Writes the header (with documents(), or `documents` when given), syncs, and renames the
  /// temporary over path. Appending after finish() is an Error.
  void finish(std::optional<std::uint64_t> documents = std::nullopt);

 private:
  void flush();
  [[noreturn]] void failed(const std::string& step, int err);

  std::string path_, temporary_;
  TokenFileHeader header_;
  int fd_ = -1;
  bool finished_ = false;
  std::uint64_t tokens_ = 0, documents_ = 0;
  std::vector<unsigned char> buffer_;
};

/// A token file open for reading, memory-mapped: opening it reads and checks the header and the
/// file's size and maps the file (ReadableFile::map) without reading the ids, so a file of
/// gigabytes costs no memory until windows of it are read. Ids are checked against vocab_size as
/// read() reads them, not when opening (a full scan of a large file would read all of it):
/// check_ids() scans the whole file on request. A file replaced by an atomic write (rename) while
/// open is harmless: the mapping keeps the old file. A file truncated in place while open: read()
/// checks the file's size (ReadableFile::size_now) before it touches the mapping, so tokens past
/// the new end are an Error naming the file and both sizes, not SIGBUS; only a truncation in the
/// microseconds between that check and the copy could still end the process with SIGBUS, as for
/// any mapped file.
class TokenFile : public TokenSource {
 public:
  /// Opens `path`. A missing file, a folder or other non-regular file, an empty file, a
  /// file shorter than the header, a wrong magic, an unknown version, a bad dtype, vocab_size,
  /// eos, kind, digest or reserved byte, and a size other than 128 + tokens * dtype are each an
  /// Error naming the file and the field or the byte offset.
  explicit TokenFile(const std::string& path);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::size_t size() const override { return static_cast<std::size_t>(header_.tokens); }
  /// Copies tokens [offset, offset + n); an id >= vocab_size among them is an Error naming the
  /// file, the token's position and byte offset, and the id.
  void read(std::size_t offset, std::size_t n, std::int64_t* out) const override;
  const TokenFileHeader& header() const { return header_; }  ///< the header, as checked when opening
  const std::string& path() const { return path_; }          ///< the path it was opened by
  /// Throws an Error naming the file and both identities when the file's tokenizer is not `expected`.
  void check_tokenizer(const TokenizerIdentity& expected) const;
  /// Reads every id once, throwing read()'s Error at the first one outside the vocabulary.
  void check_ids() const;

 private:
  // Throws when the file now holds fewer than `end` bytes (it was truncated while open).
  void check_still_holds(std::uint64_t end, const std::string& who) const;

  std::string path_;
  TokenFileHeader header_;
  std::unique_ptr<ReadableFile> file_;  // kept open for the size checks: the file mapped
  std::shared_ptr<const FileMapping> map_;
  const unsigned char* ids_ = nullptr;  // the mapping's first byte after the header
};

}  // namespace xgrad::text
