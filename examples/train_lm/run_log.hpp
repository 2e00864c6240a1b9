// train_lm's log.csv, written as the run goes: each row is appended and flushed when its step
// ends (a crash or a kill keeps the steps trained), and a resumed run appends to the log of the
// run it continues, so one file holds the whole run with its header once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace lm {

class RunLog {
 public:
  inline static const std::string kHeader = "step,train_loss,valid_loss,lr,seconds";

  // Starts `folder`/log.csv. A new run (resumed_step empty) replaces any log there with the
  // header. A run resumed from a checkpoint at step K keeps the rows of steps 1 .. K of the log
  // there (rows past K were trained after that checkpoint was written, and are trained again) and
  // appends after them; without a log there it starts one. An existing log that is not
  // train_lm's (another header, a row that does not parse, steps out of order) is refused
  // with an Error naming the file and the line, and left as it is. A last line cut short by a
  // kill is dropped.
  RunLog(const std::string& folder, std::optional<std::size_t> resumed_step);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // Appends the row and hands it to the OS before returning. A resumed run's seconds continue
  // from the last kept row. A failed write (a full disk) leaves the file holding whole rows only
  // and throws an Error naming the file and the OS error.
  void append(LogEntry e);

  // Every row of the run: the kept ones and those appended.
  const std::vector<LogEntry>& entries() const { return entries_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<LogEntry> entries_;
  double seconds_before_ = 0;
};

// One CSV row of the log (with its newline).
std::string log_row(const LogEntry& e);

}  // namespace lm
