/// @file
/// Whole-file reads that refuse folders, devices and fifos before reading, atomic writes that
/// leave an earlier file intact on any failure, and checks that an output path can be written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xgrad {

/// Reads a whole regular file. A missing file, a folder, a device or a fifo is refused before reading,
/// as is a file over max_bytes; errors start with `who` and name the path and the OS error.
std::string read_file(const std::string& path, const std::string& who, std::uint64_t max_bytes = UINT64_MAX);

/// Writes the chunks to `path` atomically: a temporary of its own (create_temporary_file: `path.tmp.PID`,
/// PID this process's id) in the same folder, written, fsync'ed, renamed over path, then the folder
/// fsync'ed. Writes of one path at once (threads or processes) each rename a whole file over it: the
/// last rename wins. On any failure
/// the temporary is removed, an earlier file at path is unchanged, and the Error names who, the path
/// and strerror(errno).
/// A path that is a folder, a device, a fifo or a socket is refused before anything is written (a
/// rename would replace it). One exception to "unchanged": if only the final folder fsync fails, the
/// new file is already in place, and the Error says so.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& chunks,
                           const std::string& who);
/// The same with one buffer of bytes.
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& who);

/// strerror(err) for a failed write; for EFBIG under a file size limit (RLIMIT_FSIZE, `ulimit -f`)
/// also the limit, which a program that ignores SIGXFSZ meets as this error instead of being killed.
std::string write_error_text(int err);

/// Before a long run: checks that `path` can be written later. Its folder must exist and be a folder, path
/// must not be a folder, and a probe file created in the folder (then removed) proves write permission.
void check_writable_file(const std::string& path, const std::string& who);

/// Creates the folder (with parents) if missing and checks, by the same probe, that files can be created in it.
void prepare_output_dir(const std::string& dir, const std::string& who);

/// One path a program reads or writes, named for the user by `role` ("--checkpoint", "--out's log.csv").
struct RunPath {
  std::string role, path;
  /// For an input: the program reads it as a folder when it is one (a tokenizer folder), so every
  /// entry directly in it counts as read; a path read only as a file is compared as itself. For an
  /// output: a folder the program writes files into (listed as outputs of their own); two such
  /// outputs may be one folder.
  bool folder = false;
};

/// The one output-path rule, checked before a program's work: throws an Error starting with `who`
/// and naming both roles and paths when an output
/// - is the same file or folder as an input, as an entry of an input read as a folder, or as another
///   output (but for two folder outputs), or
/// - would be a new entry directly in an input read as a folder.
/// Paths are compared by what they name, not by spelling: what exists by device and inode (symlinks
/// followed, so links, hard links and "./" count); what does not exist yet by the real path of its
/// nearest existing folder plus the rest of its name (a dangling symlink by where it points).
void check_run_paths(const std::vector<RunPath>& inputs, const std::vector<RunPath>& outputs, const std::string& who);

/// True when a and b name the same file by check_run_paths's comparison.
bool same_file(const std::string& a, const std::string& b);

/// Removes `path.tmp.PID` and `path.tmp.PID.N` files left by writers (of process id PID) that no longer
/// run; returns how many.
/// Only regular files whose suffix is a pid for which kill(pid, 0) fails with ESRCH are removed: a
/// live writer's file (even another user's: EPERM), this process's own and any other name are kept.
/// Best effort: a folder that cannot be listed or a file that cannot be removed is skipped silently.
/// Pids are those of this pid namespace: a writer on another machine (a shared file system) or in
/// another container looks dead from here.
std::size_t remove_stale_temporaries(const std::string& path);

/// The first temporary name create_temporary_file tries in this process: path + ".tmp." + getpid().
std::string temporary_path(const std::string& path);

/// Creates a new temporary file for a writer that will rename it over `path` (write_file_atomically,
/// text::TokenFileWriter): temporary_path(path), or while that name is taken (by another writer of
/// this process, or anything else) the first free of temporary_path(path) + ".1", ".2", ... (up to
/// 1000). Created with O_EXCL, so that no two writers ever share a file. Returns the descriptor (write
/// only, mode 0644) and sets `name` to the file's name; on failure returns -1 with errno set, and
/// `name` is the last name tried.
int create_temporary_file(const std::string& path, std::string& name);

class FileMapping;

/// A regular file open for reading; anything else (missing, a folder, a device, a fifo, a socket) is
/// refused when opening, before any byte is read. Errors start with `who` and name the path.
class ReadableFile {
 public:
  /// Opens `path`; refuses anything but a regular file (see above). `who` starts every Error.
  ReadableFile(const std::string& path, const std::string& who);
  ~ReadableFile();  ///< closes the file
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;

  /// The size fstat reported when the file was opened.
  std::uint64_t size() const { return size_; }
  /// The size fstat reports now: the file may have been cut shorter or grown in place since.
  std::uint64_t size_now() const;
  /// Reads up to n bytes into dst from the current position; fewer only at the end of the file.
  std::size_t read_some(char* dst, std::size_t n);
  /// Reads exactly n bytes, or fails saying the file ended early (it changed while being read).
  void read_exact(char* dst, std::size_t n);
  /// True when nothing follows the current position (reads one byte to find out, which moves the
  /// position past it when there is one).
  bool at_end();
  /// Reads exactly n bytes starting at byte `offset`, leaving the current position alone; fails as
  /// read_exact does when the file ends early.
  void read_exact_at(std::uint64_t offset, char* dst, std::size_t n) const;
  /// The whole file mapped copy-on-write (FileMapping); an Error when it holds fewer than
  /// `at_least` bytes now (it changed since it was opened) or cannot be mapped.
  std::shared_ptr<const FileMapping> map(std::uint64_t at_least) const;

 private:
  std::string path_, who_;
  int fd_ = -1;
  std::uint64_t size_ = 0, position_ = 0;
};

/// A regular file's bytes mapped copy-on-write (mmap's MAP_PRIVATE), from ReadableFile::map. Reading
/// them reads the file through the page cache, which every process mapping it shares, and costs
/// no memory of this process's own; writing a page copies it first, so nothing reaches the file.
/// The mapping shows the file as it is: pages not yet written show what another program writes
/// into the file in place, and a file cut shorter while mapped ends the process with SIGBUS when
/// a page past its new end is read. Writers that replace a file by renaming a new one over it,
/// as xgrad's savers do, change nothing that is mapped.
class FileMapping {
 public:
  FileMapping(void* data, std::uint64_t size) : data_(static_cast<char*>(data)), size_(size) {}  ///< adopts a mapping
  ~FileMapping();                                                                                ///< unmaps it
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  char* data() const { return data_; }          ///< the file's first byte
  std::uint64_t size() const { return size_; }  ///< the bytes mapped: the file's size when mapped

 private:
  char* data_;
  std::uint64_t size_;
};

}  // namespace xgrad
