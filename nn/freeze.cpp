// Name patterns (glob, regular expression, PEFT's suffix rule) and freezing by them.
#include "xgrad/nn/freeze.hpp"

#include <regex>
#include <set>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::nn {

namespace {

// '*' any run, '?' one character; iterative with one backtrack point, so no pattern is exponential.
bool glob(const std::string& p, const std::string& s) {
  std::size_t i = 0, j = 0, star = std::string::npos, from = 0;
  while (j < s.size()) {
    if (i < p.size() && (p[i] == '?' || p[i] == s[j])) {
      ++i, ++j;
    } else if (i < p.size() && p[i] == '*') {
      star = i++, from = j;
    } else if (star != std::string::npos) {
      i = star + 1, j = ++from;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

}  // namespace

bool matches_name_pattern(const std::string& pattern, const std::string& name) {
  if (pattern.empty()) fail("matches_name_pattern: the pattern is empty");
  if (pattern.rfind("re:", 0) == 0) {
    try {
      return std::regex_match(name, std::regex(pattern.substr(3), std::regex::ECMAScript));
    } catch (const std::regex_error& e) {
      fail("matches_name_pattern: '", pattern, "' is not a regular expression (", e.what(), ")");
    }
  }
  if (pattern.find_first_of("*?") != std::string::npos) return glob(pattern, name);
  return name == pattern ||
         (name.size() > pattern.size() && name.compare(name.size() - pattern.size(), pattern.size(), pattern) == 0 &&
          name[name.size() - pattern.size() - 1] == '.');
}

std::vector<std::string> select_names(const std::vector<std::string>& names, const std::string& pattern,
                                      const NameAliases& aliases, const char* who) {
  check_utf8(pattern, who, "pattern");
  if (pattern.empty()) fail(who, ": a pattern is empty");
  std::vector<std::string> out;
  for (const std::string& n : names) {
    const auto alias = aliases.find(n);
    try {
      if (matches_name_pattern(pattern, n) || (alias != aliases.end() && matches_name_pattern(pattern, alias->second)))
        out.push_back(n);
    } catch (const Error& e) {
      fail(who, ": ", e.what());
    }
  }
  return out;
}

namespace {

std::vector<std::string> set_training(Module& model, const std::vector<std::string>& patterns,
                                      const NameAliases& aliases, bool on, const char* who) {
  const NamedTensors params = model.named_parameters();
  std::vector<std::string> names;
  for (const auto& [n, p] : params) names.push_back(n);
  std::set<std::string> chosen;
  for (const std::string& pattern : patterns) {  // every pattern checked before anything changes
    const std::vector<std::string> hit = select_names(names, pattern, aliases, who);
    if (hit.empty()) {
      fail(who, ": pattern '", pattern, "' matches no parameter (", names.size(), " parameters, such as '",
           names.empty() ? std::string() : names.front(), "'", aliases.empty() ? "" : ", or their aliases", ")");
    }
    chosen.insert(hit.begin(), hit.end());
  }
  std::vector<std::string> out;
  for (const auto& [n, p] : params) {
    if (!chosen.count(n)) continue;
    Tensor t = p;
    if (!on) t.zero_grad();
    t.set_requires_grad(on);
    out.push_back(n);
  }
  return out;
}

}  // namespace

std::vector<std::string> freeze(Module& model, const std::vector<std::string>& patterns, const NameAliases& aliases) {
  return set_training(model, patterns, aliases, false, "freeze");
}

std::vector<std::string> unfreeze(Module& model, const std::vector<std::string>& patterns, const NameAliases& aliases) {
  return set_training(model, patterns, aliases, true, "unfreeze");
}

}  // namespace xgrad::nn
