// File identities and the checkpoint lock.
#include "files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "cli.hpp"
#include "xgrad/core/error.hpp"

namespace cli {

namespace fs = std::filesystem;

namespace {

// The path with its last component's symlinks followed (up to 40), the file a write would reach.
fs::path follow_links(fs::path p) {
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    const fs::file_status link = fs::symlink_status(p, ec);
    if (ec || link.type() != fs::file_type::symlink) break;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return p;
}

// A path not there yet: its nearest existing folder resolved (symlinks followed), the rest
// appended lexically. A dangling symlink is followed to where a write would create the file.
std::string resolved_missing(fs::path p) {
  p = follow_links(p);
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return (ec ? fs::absolute(p).lexically_normal() : resolved).string();
}

}  // namespace

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  return "path " + resolved_missing(path);
}

void check_distinct_files(const std::vector<RunFile>& inputs, const std::vector<RunFile>& outputs) {
  std::vector<std::string> in_ids, out_ids;
  for (const RunFile& f : inputs) in_ids.push_back(file_identity(f.path));
  for (const RunFile& f : outputs) out_ids.push_back(file_identity(f.path));
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (out_ids[o] == in_ids[i]) {
        usage_error(outputs[o].role, " '", outputs[o].path, "' is the same file as ", inputs[i].role, " '",
                    inputs[i].path, "': writing it would destroy what the run reads; choose another path");
      }
    }
    for (std::size_t p = 0; p < o; ++p) {
      if (out_ids[o] == out_ids[p]) {
        usage_error(outputs[o].role, " '", outputs[o].path, "' is the same file as ", outputs[p].role, " '",
                    outputs[p].path, "': one would overwrite the other; choose another path");
      }
    }
  }
}

void check_output_files(const std::vector<RunFile>& outputs) {
  for (const RunFile& f : outputs) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) continue;
    usage_error(f.role, " '", f.path, "' is ", S_ISDIR(st.st_mode) ? "a folder" : "not a regular file",
                ": the run could not write it at its end; move it or choose another path");
  }
}

std::string FileLock::lock_path_of(const std::string& path) { return follow_links(path).string() + ".lock"; }

FileLock::FileLock(const std::string& path, const std::string& what) : lock_path_(lock_path_of(path)) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) xgrad::fail(what, ": cannot create the lock file '", lock_path_, "': ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      ::close(fd);
      if (err != EWOULDBLOCK) xgrad::fail(what, ": cannot lock '", lock_path_, "': ", std::strerror(err));
      std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      xgrad::fail(what, " '", path, "' is being written by another run (pid ", pid.empty() ? "unknown" : pid,
                  ", holding '", lock_path_, "'); wait for it to end or choose another path");
    }
    // A holder that was ending may have removed the file between our open and our flock: then we
    // hold a lock on a file no one else can find, and start again.
    struct stat mine {
    }, named{};
    if (::fstat(fd, &mine) == 0 && ::stat(lock_path_.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
        mine.st_ino == named.st_ino) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        ::close(fd);
        xgrad::fail(what, ": cannot write the lock file '", lock_path_, "': ", std::strerror(err));
      }
      fd_ = fd;
      return;
    }
    ::close(fd);
  }
  xgrad::fail(what, ": the lock file '", lock_path_, "' keeps being replaced by other runs");
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // before letting go, so the next writer never locks a removed file
  ::close(fd_);
}

}  // namespace cli
