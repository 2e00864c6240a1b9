// File reading and atomic writing on POSIX calls, so that every failure can name the OS error
// (errno) and a fifo or device is refused without ever blocking or reading forever.
#include "xgrad/core/io/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <utility>

#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

// The folder holding `path` ("." for a bare name) and the name within it.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const std::string::size_type slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Decimal digits without a leading zero naming a pid > 0 (kill(0) and kill(-1) signal groups).
bool parse_pid(std::string_view s, pid_t& pid) {
  if (s.empty() || s.size() > 10 || s[0] == '0') return false;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > INT_MAX) return false;
  pid = static_cast<pid_t>(v);
  return true;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and returns close's result (0, or -1 with errno set).
  int close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

// Creates and removes a file in a folder; returns 0 or the errno of the failure. O_EXCL never
// opens someone else's file; an existing name of ours (`name` holds our pid) already proves that
// files can be created there.
int probe_folder(const std::string& dir, const std::string& name) {
  const std::string probe = (dir == "/" ? "" : dir) + "/" + name;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno == EEXIST ? 0 : errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Reading

ReadableFile::ReadableFile(const std::string& path, const std::string& who) : path_(path), who_(who) {
  // O_NONBLOCK: opening a fifo for reading would otherwise wait for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd_ < 0) fail(who_, ": cannot open '", path_, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(who_, ": cannot read '", path_, "': ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail(who_, ": cannot read '", path_, "': it is ", kind_of(st.st_mode), ", not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

ReadableFile::~ReadableFile() { ::close(fd_); }

std::uint64_t ReadableFile::size_now() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) fail(who_, ": cannot stat '", path_, "': ", std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

std::shared_ptr<const FileMapping> ReadableFile::map(std::uint64_t at_least) const {
  const std::uint64_t size = size_now();
  if (size < at_least) {
    fail(who_, ": '", path_, "' holds ", size, " bytes now, fewer than the ", at_least,
         " its header promised (it changed since it was opened)");
  }
  if (size == 0 || size > SIZE_MAX) fail(who_, ": cannot map '", path_, "' (", size, " bytes)");
  // Copy-on-write, so a parameter over the mapping may be trained: its written pages become this
  // process's own.
  void* data = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
  if (data == MAP_FAILED) fail(who_, ": cannot map '", path_, "' (", size, " bytes): ", std::strerror(errno));
  return std::make_shared<const FileMapping>(data, size);
}

FileMapping::~FileMapping() { ::munmap(data_, static_cast<std::size_t>(size_)); }

std::size_t ReadableFile::read_some(char* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, dst + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(who_, ": error reading '", path_, "' at byte ", position_ + got, ": ", std::strerror(errno));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  position_ += got;
  return got;
}

void ReadableFile::read_exact(char* dst, std::size_t n) {
  const std::size_t got = read_some(dst, n);
  if (got < n) {
    fail(who_, ": '", path_, "' ended at byte ", position_, " although it held ", size_,
         " bytes when opened (it changed while being read)");
  }
}

bool ReadableFile::at_end() {
  char c;
  return read_some(&c, 1) == 0;
}

void ReadableFile::read_exact_at(std::uint64_t offset, char* dst, std::size_t n) const {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, dst + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(who_, ": error reading '", path_, "' at byte ", offset + got, ": ", std::strerror(errno));
    if (r == 0) {
      fail(who_, ": '", path_, "' ended at byte ", offset + got, " although it held ", size_,
           " bytes when opened (it changed while being read)");
    }
    got += static_cast<std::size_t>(r);
  }
}

std::string read_file(const std::string& path, const std::string& who, std::uint64_t max_bytes) {
  ReadableFile file(path, who);
  auto too_large = [&](std::uint64_t n) {
    fail(who, ": cannot read '", path, "': it holds ", n, " bytes, more than the limit of ", max_bytes);
  };
  if (file.size() > max_bytes) too_large(file.size());
  std::string bytes(static_cast<std::size_t>(file.size()), '\0');
  bytes.resize(file.read_some(bytes.data(), bytes.size()));
  // A file that grew after fstat: read on to its end, within the limit.
  char buf[65536];
  while (std::size_t got = file.read_some(buf, sizeof buf)) {
    if (bytes.size() + got > max_bytes) too_large(bytes.size() + got);
    bytes.append(buf, got);
  }
  return bytes;
}

// ----------------------------------------------------------------------------------------------
// Writing

std::string temporary_path(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

int create_temporary_file(const std::string& path, std::string& name) {
  name = temporary_path(path);
  const std::string first = name;
  // O_EXCL: a name another writer (of this process or of a dead one with the same pid) holds is
  // never opened, so that no two writers ever write into one file.
  for (int n = 1;; ++n) {
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0 || errno != EEXIST || n > 1000) return fd;
    name = first + "." + std::to_string(n);
  }
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& chunks,
                           const std::string& who) {
  std::string tmp;
  auto failed = [&](const auto&... detail) {
    fail(who, ": cannot write '", path, "': ", detail..., " (anything already at that path is unchanged)");
  };
  if (path.empty()) fail(who, ": cannot write a file: the path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) failed(std::strerror(EISDIR));
    if (!S_ISREG(st.st_mode)) failed("it is ", kind_of(st.st_mode), ", not a regular file");
  }

  Fd fd(create_temporary_file(path, tmp));
  if (fd.get() < 0) failed("creating the temporary file '", tmp, "' failed: ", std::strerror(errno));
  // From here on every failure removes the temporary file first.
  auto failed_after_create = [&](const char* step, int err, const auto&... detail) {
    if (fd.get() >= 0) fd.close();
    ::unlink(tmp.c_str());
    failed(step, " the temporary file '", tmp, "' failed", detail..., ": ", write_error_text(err));
  };

  std::uint64_t total = 0, written = 0;
  for (std::string_view c : chunks) total += c.size();
  for (std::string_view c : chunks) {
    const char* p = c.data();
    std::size_t left = c.size();
    while (left > 0) {
      const ssize_t w = ::write(fd.get(), p, left);
      if (w < 0 && errno == EINTR) continue;
      // write returns 0 only if nothing could be written (on a regular file: no space).
      if (w <= 0) failed_after_create("writing", w < 0 ? errno : ENOSPC, " after ", written, " of ", total, " bytes");
      p += w;
      left -= static_cast<std::size_t>(w);
      written += static_cast<std::uint64_t>(w);
    }
  }
  if (::fsync(fd.get()) != 0) failed_after_create("syncing", errno);
  if (fd.close() != 0) failed_after_create("closing", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) failed_after_create("renaming", errno, " over it");

  // Make the rename itself durable. A folder that cannot be opened for reading cannot be synced:
  // the file is written, as before this step existed. EINVAL: the file system cannot sync folders.
  const std::string dir = split_path(path).first;
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0 && ::fsync(dfd.get()) != 0 && errno != EINVAL) {
    fail(who, ": '", path, "' was written, but syncing its folder '", dir, "' failed: ", std::strerror(errno),
         "; after a crash the folder may still show the earlier file");
  }
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& who) {
  write_file_atomically(path, std::vector<std::string_view>{bytes}, who);
}

std::string write_error_text(int err) {
  std::string text = std::strerror(err);
  rlimit limit{};
  if (err == EFBIG && ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    text += "; the file size limit (ulimit -f) is " + std::to_string(limit.rlim_cur) + " bytes";
  return text;
}

void check_writable_file(const std::string& path, const std::string& who) {
  if (path.empty()) fail(who, ": cannot write a file: the path is empty");
  const auto [dir, name] = split_path(path);
  if (name.empty()) fail(who, ": cannot write '", path, "': the path names a folder, not a file");
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    fail(who, ": cannot write '", path, "': folder '", dir, "': ", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail(who, ": cannot write '", path, "': folder '", dir, "': ", std::strerror(ENOTDIR));
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(who, ": cannot write '", path, "': ", std::strerror(EISDIR));
    if (!S_ISREG(st.st_mode))
      fail(who, ": cannot write '", path, "': it is ", kind_of(st.st_mode), ", not a regular file");
  } else if (errno != ENOENT) {
    fail(who, ": cannot write '", path, "': ", std::strerror(errno));
  }
  // The probe has the name a killed writer's temporary would have, so remove_stale_temporaries
  // also cleans up after a run killed right here.
  if (const int err = probe_folder(dir, split_path(temporary_path(path)).second)) {
    fail(who, ": cannot write '", path, "': creating a file in '", dir, "' failed: ", std::strerror(err));
  }
}

void prepare_output_dir(const std::string& dir, const std::string& who) {
  if (dir.empty()) fail(who, ": the output folder name is empty");
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      fail(who, ": cannot use '", dir, "' as a folder: it is ", kind_of(st.st_mode), " (", std::strerror(ENOTDIR), ")");
  } else {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    // A concurrent creator may win the race; what matters is that the folder exists now.
    if (ec && !(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
      fail(who, ": cannot create the folder '", dir, "': ", ec.message());
    }
  }
  if (const int err = probe_folder(dir, ".xgrad_probe.tmp." + std::to_string(::getpid()))) {
    fail(who, ": cannot create files in the folder '", dir, "': ", std::strerror(err));
  }
}

// ----------------------------------------------------------------------------------------------
// The output-path rule

namespace {

namespace fs = std::filesystem;

// The path with its last component's symlinks followed (up to 40), the file a write would reach.
fs::path follow_links(fs::path p) {
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (fs::symlink_status(p, ec).type() != fs::file_type::symlink || ec) break;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return p;
}

// What a path names: the device and inode of what is there, else the resolved path where a write
// would create it.
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string path;

  bool operator==(const Identity& o) const {
    return exists == o.exists && (exists ? dev == o.dev && ino == o.ino : path == o.path);
  }
};

Identity identity_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return {true, st.st_dev, st.st_ino, {}};
  std::error_code ec;
  const fs::path absolute = fs::absolute(follow_links(path), ec);
  const fs::path canonical = fs::weakly_canonical(absolute, ec);
  const std::string resolved = (ec ? absolute.lexically_normal() : canonical).string();
  // "dir/missing/../in.txt" cannot be opened, but names in.txt once resolved: counted as it.
  if (::stat(resolved.c_str(), &st) == 0) return {true, st.st_dev, st.st_ino, {}};
  return {false, 0, 0, resolved};
}

// The folder an entry at `path` sits in, as spelled: a symlink at path is itself in that folder.
std::string folder_holding(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return split_path(path).first;
}

struct InputFolder {
  const RunPath* input;
  Identity id;
  std::vector<std::pair<std::string, Identity>> entries;  // name, identity (links followed)
};

}  // namespace

bool same_file(const std::string& a, const std::string& b) { return identity_of(a) == identity_of(b); }

void check_run_paths(const std::vector<RunPath>& inputs, const std::vector<RunPath>& outputs, const std::string& who) {
  std::vector<Identity> in_ids, out_ids;
  std::vector<InputFolder> folders;
  for (const RunPath& in : inputs) {
    in_ids.push_back(identity_of(in.path));
    struct stat st;
    if (!in.folder || ::stat(in.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    InputFolder f{&in, in_ids.back(), {}};
    std::error_code ec;
    for (fs::directory_iterator it(in.path, ec), end; !ec && it != end; it.increment(ec))
      f.entries.emplace_back(it->path().filename().string(), identity_of(it->path().string()));
    folders.push_back(std::move(f));
  }
  for (const RunPath& out : outputs) out_ids.push_back(identity_of(out.path));
  auto named = [](const RunPath& p) { return p.role + " '" + p.path + "'"; };
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const std::string output = named(outputs[o]);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (out_ids[o] == in_ids[i])
        fail(who, ": ", output, " is the same file as ", named(inputs[i]),
             ": writing it would destroy what the run reads; choose another path");
    }
    const Identity holder = identity_of(folder_holding(outputs[o].path));
    for (const InputFolder& f : folders) {
      for (const auto& [name, id] : f.entries) {
        if (out_ids[o] == id)
          fail(who, ": ", output, " is the same file as '", name, "' in ", named(*f.input),
               ": writing it would destroy what the run reads; choose another path");
      }
      if (holder.exists && holder == f.id)
        fail(who, ": ", output, " would be written in ", named(*f.input),
             ", a folder the run reads; choose a path outside it");
    }
    for (std::size_t p = 0; p < o; ++p) {
      if (out_ids[o] == out_ids[p] && !(outputs[o].folder && outputs[p].folder))
        fail(who, ": ", output, " is the same file as ", named(outputs[p]),
             ": one would overwrite the other; choose another path");
    }
  }
}

std::size_t remove_stale_temporaries(const std::string& path) {
  const auto [dir, name] = split_path(path);
  if (name.empty()) return 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const std::string prefix = name + ".tmp.";
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view entry(e->d_name);
    pid_t pid = 0;
    if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) continue;
    // "PID", or "PID.N" (create_temporary_file's later names)
    std::string_view suffix = entry.substr(prefix.size());
    const std::size_t dot = suffix.find('.');
    if (dot != std::string_view::npos) {
      pid_t n = 0;
      if (!parse_pid(suffix.substr(dot + 1), n)) continue;
      suffix = suffix.substr(0, dot);
    }
    if (!parse_pid(suffix, pid) || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    stale.emplace_back(entry);
  }
  std::size_t removed = 0;
  for (const std::string& f : stale) {
    struct stat st;
    if (::fstatat(::dirfd(d), f.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    removed += ::unlinkat(::dirfd(d), f.c_str(), 0) == 0;
  }
  ::closedir(d);
  return removed;
}

}  // namespace xgrad
