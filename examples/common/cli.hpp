// What every example's command line shares: strict validators for counts and reals (so "-1" is
// an error, never 2^64-1), the one rule for warm-up, and the one way main() ends (usage errors
// exit 2, runtime failures 1, always with one clear line).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/error.hpp"

namespace cli {

// A bad command line: main() exits 2 for it (1 for any other failure).
class UsageError : public xgrad::Error {
 public:
  using xgrad::Error::Error;
};

template <class... Parts>
[[noreturn]] void usage_error(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw UsageError(os.str());
}

// The longest run any example accepts; a count past it is a typo, not a plan.
inline constexpr std::uint64_t kMaxSteps = 100'000'000;

// The value of a plain decimal integer (digits only: no sign, space, prefix or exponent, at most
// 2^64-1), or nullopt.
std::optional<std::uint64_t> parse_decimal(const std::string& s);

// A plain decimal integer in [lo, hi]: no sign, exponent, hex or octal prefix. CLI11 itself would
// read "-1" into an unsigned option as 2^64-1 and "010" as 8.
CLI::Validator count(std::uint64_t lo, std::uint64_t hi);
// Any seed: a plain decimal integer in [0, 2^64-1].
CLI::Validator seed();
// The value of a real in plain decimal or decimal-exponent notation ("0.5", "-2", ".5", "1e-3",
// "3E+2"), or nullopt: no blank, sign "+", hex float, "nan" or "inf" ("inf" only with allow_inf).
std::optional<double> parse_real(const std::string& s, bool allow_inf = false);

// A finite real in [lo, hi] (or (lo, hi] with open_low), read by parse_real; "inf" is refused
// unless allow_inf and hi is infinite. A nonzero value that would become 0, a subnormal or inf
// as a float32 is refused too: every example computes in float32.
CLI::Validator real(double lo, double hi, bool open_low = false, bool allow_inf = false);

// A text value that names something (a file, a layout, a prompt): an empty one, as from an unset
// shell variable, is refused instead of meaning the flag's default or nothing at all.
CLI::Validator not_empty();

// Every program's --threads (default 1, up to 256): xgrad's kernel threads, which split the matrix
// products and the other kernels; the program passes it to xgrad::set_num_threads.
void add_threads(CLI::App& app, int& threads);

// Every training program's --precision fp32|bf16 (default fp32): the precision of the matrix
// products of forward, loss and backward (xgrad::AutocastGuard; see docs/speed.md). Any other
// value is a usage error naming the flag. `precision` holds the choice once parsed.
CLI::Option* add_precision(CLI::App& app, xgrad::Precision& precision);

// Parses argv. Returns the exit code when main should end now: 0 after --help, 2 for a usage
// error (printed with the flag's name); std::nullopt to go on. Also sets SIGXFSZ to be ignored, so
// that a write past `ulimit -f` is an error the program reports, not a kill.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

// Runs `body` and returns main's exit code: 0, or 2 after a UsageError, 1 after any other
// exception; the message goes to stderr as "<program>: error: <what>". After printing it,
// on_failure (when given) sees the exit code: a data-parallel program ends the whole job there.
int run(const std::string& program, const std::function<void()>& body, const std::function<void(int)>& on_failure = {});

// Runs `check` (a validate() of an example's config) and rethrows its xgrad::Error as a
// UsageError, since a setting that cannot work is a bad command line.
void as_usage(const std::function<void()>& check);

// The rule every example follows: warm-up steps must be fewer than the steps of the run.
void check_warmup(std::uint64_t warmup, std::uint64_t steps, const char* warmup_flag = "--warmup");

}  // namespace cli
