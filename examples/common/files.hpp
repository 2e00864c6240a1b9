// What a run reads and writes, checked before the work starts: no output may be an input or
// another output of the same run (compared as files, so links and "./" count), and one writer at
// a time for a checkpoint (an advisory lock in a file beside it).
#pragma once

#include <string>
#include <vector>

#include "xgrad/core/io/file_io.hpp"

namespace cli {

// One file a run reads or writes: `role` names it for the user ("--checkpoint", "--out's log.csv").
using RunFile = xgrad::RunPath;

// xgrad::check_run_paths (the one output-path rule) as a cli::UsageError: an output that is an
// input, a file of an input folder or another output. A checkpoint that is read and written again
// (--resume) is listed once, as an output.
void check_distinct_files(const std::string& program, const std::vector<RunFile>& inputs,
                          const std::vector<RunFile>& outputs);

// Before the work: throws cli::UsageError when an output file's path is taken by something a
// write cannot replace (a folder, a device, a fifo, a socket), naming the role and the path. The
// folder's write permission is prepare_output_dir's or check_writable_file's to prove.
void check_output_files(const std::vector<RunFile>& outputs);

// An exclusive flock on lock_path_of(path) for the life of this object, with this process's pid
// written in the file. A second holder (another process, or another open of the file) is refused
// with an xgrad::Error (exit 1: the command line is right, the file is busy) naming `what`, the
// lock file and the holder's pid. A lock file left by a killed run does not block: flock ends
// with the process. The destructor removes the file and then lets go.
class FileLock {
 public:
  FileLock(const std::string& path, const std::string& what);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  const std::string& lock_path() const { return lock_path_; }
  // path + ".lock", beside the file path names: when path is a symlink, beside its target, so
  // runs that name one checkpoint through different links share one lock.
  static std::string lock_path_of(const std::string& path);

 private:
  std::string lock_path_;
  int fd_ = -1;
};

}  // namespace cli
