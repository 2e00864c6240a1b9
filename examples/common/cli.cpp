// Validators, parsing and main's error handling for the examples.
#include "cli.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace cli {

std::optional<std::uint64_t> parse_decimal(const std::string& s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

CLI::Validator count(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const auto v = parse_decimal(s);
        if (!v) return "'" + s + "' is not a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
        if (*v < lo || *v > hi) return s + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        s = std::to_string(*v);  // CLI11 converts with base 0 next: "010" would become 8
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator seed() { return count(0, std::numeric_limits<std::uint64_t>::max()); }

CLI::Validator not_empty() {
  return CLI::Validator(
      [](const std::string& s) -> std::string {
        return s.empty() ? "the value is empty: give one, or leave the flag out" : "";
      },
      "");
}

void add_threads(CLI::App& app, int& threads) {
  app.add_option("--threads", threads, "xgrad's kernel threads: they split the matrix products and the other kernels")
      ->transform(count(1, 256))
      ->capture_default_str();
}

CLI::Option* add_precision(CLI::App& app, xgrad::Precision& precision) {
  return app
      .add_option_function<std::string>(
          "--precision", [&precision](const std::string& name) { precision = xgrad::parse_precision(name); },
          "matrix products of forward and backward: fp32, or bf16 operands with fp32 accumulation (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

std::optional<double> parse_real(const std::string& s, bool allow_inf) {
  if (allow_inf && s == "inf") return std::numeric_limits<double>::infinity();
  // [-] digits [. digits] [e [+-] digits], or [-] . digits [...]: no blank, hex, nan or inf.
  std::size_t i = 0, digits = 0;
  if (i < s.size() && s[i] == '-') ++i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    std::size_t exponent = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++exponent;
    if (exponent == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);  // 1e999 gives inf: refused by the caller as not finite
}

CLI::Validator real(double lo, double hi, bool open_low, bool allow_inf) {
  std::ostringstream os;
  os << (open_low ? "(" : "[") << lo << ", " << hi << "]";
  const std::string range = os.str();
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::optional<double> v = parse_real(s, allow_inf && std::isinf(hi));
        if (!v) {
          std::string lower;
          for (char ch : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          if (lower.find("inf") != std::string::npos || lower.find("nan") != std::string::npos)
            return "'" + s + "' is not a finite number";
          return "'" + s + "' is not a number (write it in decimal, as 0.001 or 1e-3)";
        }
        if (std::isinf(*v) && !(allow_inf && *v > 0 && std::isinf(hi))) return "'" + s + "' is not a finite number";
        if (*v < lo || *v > hi || (open_low && *v == lo)) return s + " is outside " + range;
        // Every real lands in a float32 somewhere: one that would round to 0, to a subnormal or
        // to inf there is not the value the user asked for.
        const float f = static_cast<float>(*v);
        if (!std::isinf(*v) && *v != 0 && !std::isnormal(f)) {
          return s + (std::fabs(*v) < 1 ? " is too small" : " is too large") +
                 " for a 32-bit float (normal floats lie between 1.17549e-38 and 3.40282e+38)";
        }
        return {};
      },
      "REAL in " + range);
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  // Every program starts here. Past a file size limit (ulimit -f) a write then fails with EFBIG,
  // which the writers report (naming the file and the limit) and clean up after, instead of the
  // signal killing the run and leaving a temporary behind.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\nRun with --help for the options.\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

int run(const std::string& program, const std::function<void()>& body, const std::function<void(int)>& on_failure) {
  // Messages of the example's own code often start with the program's name already.
  auto fail_with = [&](int code, const char* what) {
    const std::string name = program.substr(0, program.find(' '));
    if (std::string(what).compare(0, name.size() + 2, name + ": ") == 0) what += name.size() + 2;
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), what);
    std::fflush(stderr);
    if (on_failure) on_failure(code);
    return code;
  };
  try {
    body();
    return 0;
  } catch (const UsageError& e) {
    return fail_with(2, e.what());
  } catch (const std::exception& e) {
    return fail_with(1, e.what());
  } catch (...) {
    return fail_with(1, "an unknown exception");
  }
}

void as_usage(const std::function<void()>& check) {
  try {
    check();
  } catch (const UsageError&) {
    throw;
  } catch (const xgrad::Error& e) {
    throw UsageError(e.what());
  }
}

void check_warmup(std::uint64_t warmup, std::uint64_t steps, const char* warmup_flag) {
  if (warmup >= steps) usage_error(warmup_flag, " ", warmup, " must be fewer than the ", steps, " steps of the run");
}

}  // namespace cli
