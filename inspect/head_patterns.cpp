// Head statistics and detectors over attention patterns (B, H, T, S).
#include "xgrad/inspect/head_patterns.hpp"

#include <algorithm>
#include <cmath>

#include "xgrad/core/error.hpp"

namespace xgrad::inspect {

namespace {

struct Dims {
  std::size_t B, H, T;
};

Dims check_pattern(const Array& p, const char* who) {
  const Shape& s = p.shape();
  if (s.size() != 4 || s[2] != s[3] || s[2] == 0) {
    fail(who, ": expected attention weights (B, H, T, T) of self-attention, got ", shape_str(s));
  }
  return {s[0], s[1], s[2]};
}

const float* row(const Array& p, const Dims& d, std::size_t b, std::size_t h, std::size_t t) {
  return p.data() + ((b * d.H + h) * d.T + t) * d.T;
}

double entropy_of(const double* p, std::size_t n) {
  double e = 0;
  for (std::size_t i = 0; i < n; ++i) e -= p[i] * std::log(p[i] + 1e-9);
  return e;
}

// Per head, the mean over (b, t in queries(t)) of value(row, t); 0 when no query counts.
template <class Queries, class Value>
std::vector<double> mean_per_head(const Array& p, const Dims& d, Queries queries, Value value) {
  std::vector<double> out(d.H, 0.0);
  for (std::size_t h = 0; h < d.H; ++h) {
    double total = 0, count = 0;
    for (std::size_t b = 0; b < d.B; ++b) {
      for (std::size_t t = 0; t < d.T; ++t) {
        if (!queries(b, t)) continue;
        total += value(row(p, d, b, h, t), b, t);
        count += 1;
      }
    }
    out[h] = count ? total / count : 0.0;
  }
  return out;
}

}  // namespace

HeadStatistics head_statistics(const std::vector<Array>& patterns, std::size_t head) {
  if (patterns.empty()) fail("head_statistics: no patterns given");
  const Dims first = check_pattern(patterns[0], "head_statistics");
  if (head >= first.H) fail("head_statistics: head ", head, " of a pattern with ", first.H, " heads");
  const std::size_t T = first.T;
  std::vector<double> mass(T, 0.0), count(T, 0.0), values(T), mean_row(T);
  double entropy = 0, query_entropy = 0, sequences = 0, queries = 0;
  for (const Array& p : patterns) {
    const Dims d = check_pattern(p, "head_statistics");
    if (d.T != T || d.H != first.H) {
      fail("head_statistics: patterns ", shape_str(patterns[0].shape()), " and ", shape_str(p.shape()),
           " differ in heads or length");
    }
    for (std::size_t b = 0; b < d.B; ++b) {
      std::fill(mean_row.begin(), mean_row.end(), 0.0);
      for (std::size_t t = 0; t < T; ++t) {
        const float* r = row(p, d, b, head, t);
        for (std::size_t s = t + 1; s < T; ++s) {
          if (!(std::abs(r[s]) <= 1e-6f)) {
            fail("head_statistics: head ", head, " puts weight ", r[s], " on key ", s, " after query ", t,
                 " (sequence ", b, "); these statistics are for causal attention");
          }
        }
        for (std::size_t s = 0; s < T; ++s) {
          values[s] = r[s];
          mean_row[s] += r[s] / static_cast<double>(T);
        }
        for (std::size_t o = 0; o <= t; ++o) {
          mass[o] += values[t - o];
          count[o] += 1;
        }
        query_entropy += entropy_of(values.data(), T);
        queries += 1;
      }
      entropy += entropy_of(mean_row.data(), T);
      sequences += 1;
    }
  }
  HeadStatistics s;
  s.offset_mass.resize(T);
  for (std::size_t o = 0; o < T; ++o) s.offset_mass[o] = count[o] ? mass[o] / count[o] : 0.0;
  s.dominant_offset =
      static_cast<std::size_t>(std::max_element(s.offset_mass.begin(), s.offset_mass.end()) - s.offset_mass.begin());
  s.dominant_mass = s.offset_mass[s.dominant_offset];
  s.entropy = sequences ? entropy / sequences : 0.0;
  s.query_entropy = queries ? query_entropy / queries : 0.0;

  double on_target = 0, confidence = 0, considered = 0;
  for (const Array& p : patterns) {
    const Dims d = check_pattern(p, "head_statistics");
    for (std::size_t b = 0; b < d.B; ++b) {
      for (std::size_t t = s.dominant_offset; t < T; ++t) {
        const float* r = row(p, d, b, head, t);
        const std::size_t best = static_cast<std::size_t>(std::max_element(r, r + t + 1) - r);
        on_target += best == t - s.dominant_offset;
        confidence += r[best];
        considered += 1;
      }
    }
  }
  s.argmax_fraction = considered ? on_target / considered : 0.0;
  s.confidence = considered ? confidence / considered : 0.0;
  return s;
}

std::vector<HeadStatistics> head_statistics(const Array& pattern) {
  const Dims d = check_pattern(pattern, "head_statistics");
  std::vector<HeadStatistics> out;
  for (std::size_t h = 0; h < d.H; ++h) out.push_back(head_statistics(std::vector<Array>{pattern}, h));
  return out;
}

namespace {
std::vector<double> offset_scores_of(const Array& pattern, std::size_t offset, const char* who) {
  const Dims d = check_pattern(pattern, who);
  if (offset >= d.T) fail(who, ": offset ", offset, " is not below the length ", d.T);
  return mean_per_head(
      pattern, d, [offset](std::size_t, std::size_t t) { return t >= offset; },
      [offset](const float* r, std::size_t, std::size_t t) { return static_cast<double>(r[t - offset]); });
}
}  // namespace

std::vector<double> offset_scores(const Array& pattern, std::size_t offset) {
  return offset_scores_of(pattern, offset, "offset_scores");
}

std::vector<double> previous_token_scores(const Array& pattern) {
  return offset_scores_of(pattern, 1, "previous_token_scores");
}

std::vector<double> first_token_scores(const Array& pattern) {
  const Dims d = check_pattern(pattern, "first_token_scores");
  if (d.T < 2) fail("first_token_scores: a length of ", d.T, " has no query past the first token");
  return mean_per_head(
      pattern, d, [](std::size_t, std::size_t t) { return t >= 1; },
      [](const float* r, std::size_t, std::size_t) { return static_cast<double>(r[0]); });
}

std::vector<double> induction_scores(const Array& pattern, const IndexArray& ids) {
  const Dims d = check_pattern(pattern, "induction_scores");
  if (ids.shape() != Shape{d.B, d.T}) {
    fail("induction_scores: ids of shape ", shape_str(ids.shape()), " do not match the pattern's (B, T) = (", d.B, ", ",
         d.T, ")");
  }
  const auto id = [&ids, &d](std::size_t b, std::size_t t) { return ids.data()[b * d.T + t]; };
  const auto eligible = [&id](std::size_t b, std::size_t t) {
    for (std::size_t j = 0; j + 1 < t; ++j) {
      if (id(b, j) == id(b, t)) return true;
    }
    return false;
  };
  return mean_per_head(pattern, d, eligible, [&id](const float* r, std::size_t b, std::size_t t) {
    double w = 0;
    for (std::size_t j = 0; j + 1 < t; ++j) {
      if (id(b, j) == id(b, t)) w += r[j + 1];
    }
    return w;
  });
}

std::vector<double> fixed_offset_scores(const Array& pattern, std::vector<std::size_t>* best_offsets) {
  const Dims d = check_pattern(pattern, "fixed_offset_scores");
  std::vector<double> best(d.H, -1.0);
  std::vector<std::size_t> offsets(d.H, 0);
  for (std::size_t o = 0; o <= d.T / 2; ++o) {
    const std::vector<double> scores = offset_scores_of(pattern, o, "fixed_offset_scores");
    for (std::size_t h = 0; h < d.H; ++h) {
      if (scores[h] > best[h]) {
        best[h] = scores[h];
        offsets[h] = o;
      }
    }
  }
  if (best_offsets) *best_offsets = offsets;
  return best;
}

}  // namespace xgrad::inspect
