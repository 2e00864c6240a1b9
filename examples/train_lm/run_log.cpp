// The log file of a training run.
#include "run_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/cli.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace lm {

namespace {

std::optional<LogEntry> parse_row(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string f;
  while (std::getline(in, f, ',')) fields.push_back(f);
  if (!line.empty() && line.back() == ',') fields.push_back("");
  if (fields.size() != 5) return std::nullopt;
  LogEntry e;
  const auto step = cli::parse_decimal(fields[0]);
  const auto train = cli::parse_real(fields[1], true), lr = cli::parse_real(fields[3]),
             seconds = cli::parse_real(fields[4]);
  if (!step || !train || !lr || !seconds) return std::nullopt;
  e.step = static_cast<std::size_t>(*step);
  e.train_loss = static_cast<float>(*train);
  e.lr = static_cast<float>(*lr);
  e.seconds = *seconds;
  if (!fields[2].empty()) {
    const auto valid = cli::parse_real(fields[2], true);
    if (!valid) return std::nullopt;
    e.valid_loss = static_cast<float>(*valid);
  }
  return e;
}

}  // namespace

std::string log_row(const LogEntry& e) {
  // Every real with 6 significant digits, the validation loss as the training loss (std::to_string
  // wrote 1.5e-07 as 0.000000 and 9.5e12 with 19 digits).
  std::ostringstream row;
  row << e.step << ',' << e.train_loss << ',';
  if (e.valid_loss) row << *e.valid_loss;
  row << ',' << e.lr << ',' << e.seconds << '\n';
  return row.str();
}

RunLog::RunLog(const std::string& folder, std::optional<std::size_t> resumed_step) : path_(folder + "/log.csv") {
  std::string kept = kHeader + "\n";
  struct stat st {};
  if (resumed_step && ::stat(path_.c_str(), &st) == 0) {
    const std::string old = xgrad::read_file(path_, "train_lm: the log to resume", std::uint64_t{1} << 32);
    std::istringstream in(old);
    std::string line;
    std::size_t number = 0, last_step = 0;
    while (std::getline(in, line)) {
      ++number;
      if (in.eof() && old.back() != '\n') break;  // cut short by a kill
      if (number == 1) {
        if (line != kHeader)
          xgrad::fail("train_lm: '", path_, "' is not a train_lm log (its first line is not \"", kHeader,
                      "\"); choose another --out");
        continue;
      }
      const std::optional<LogEntry> e = parse_row(line);
      if (!e || e->step <= last_step) {
        xgrad::fail("train_lm: '", path_, "' line ", number, " is not a row of a train_lm log (\"", line.substr(0, 80),
                    "\"); choose another --out");
      }
      last_step = e->step;
      if (e->step > *resumed_step) break;
      entries_.push_back(*e);
      kept += line + "\n";
    }
    if (!entries_.empty()) seconds_before_ = entries_.back().seconds;
  }
  xgrad::write_file_atomically(path_, kept, "train_lm: the log");
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) xgrad::fail("train_lm: cannot open the log '", path_, "': ", std::strerror(errno));
}

RunLog::~RunLog() {
  if (fd_ >= 0) ::close(fd_);
}

void RunLog::append(LogEntry e) {
  e.seconds += seconds_before_;
  const std::string row = log_row(e);
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  std::size_t done = 0;
  while (done < row.size()) {
    const ssize_t n = ::write(fd_, row.data() + done, row.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      // Back to whole rows; should that fail too, the cut row is the last line, which a resume drops.
      if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      }
      xgrad::fail("train_lm: the log: cannot write '", path_, "': ", xgrad::write_error_text(err));
    }
    done += static_cast<std::size_t>(n);
  }
  entries_.push_back(e);
}

}  // namespace lm
