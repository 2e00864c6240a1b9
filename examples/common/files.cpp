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

}  // namespace

void check_distinct_files(const std::string& program, const std::vector<RunFile>& inputs,
                          const std::vector<RunFile>& outputs) {
  as_usage([&] { xgrad::check_run_paths(inputs, outputs, program); });
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
