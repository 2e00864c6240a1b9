// GenerateOptions past temperature and top-k: the logit processors against Hugging Face's written
// out and against hand-computed distributions, sampling frequencies, seeds per call, stop tokens and
// strings, the streamed pieces, cached against uncached, and the options' bad values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/generate.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using Tokens = std::vector<std::int64_t>;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

std::vector<double> softmax(const std::vector<double>& s) {
  const double top = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double total = 0;
  for (std::size_t i = 0; i < s.size(); ++i) total += p[i] = s[i] == -kInf ? 0.0 : std::exp(s[i] - top);
  for (double& x : p) x /= total;
  return p;
}

// Hugging Face's processors as its Python writes them (transformers, generation/logits_process.py:
// RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
// MinPLogitsWarper, min_tokens_to_keep 1), on one row in double, then softmax.
std::vector<double> hf_reference(const std::vector<float>& logits, const Tokens& input_ids, double penalty,
                                 double temperature, std::size_t top_k, double top_p, double min_p) {
  std::vector<double> scores(logits.begin(), logits.end());
  const std::size_t V = scores.size();
  // score = gather(scores, input_ids); where(score < 0, score * penalty, score / penalty); scatter
  std::vector<double> score;
  for (std::int64_t id : input_ids) score.push_back(scores[static_cast<std::size_t>(id)]);
  for (std::size_t i = 0; i < input_ids.size(); ++i)
    scores[static_cast<std::size_t>(input_ids[i])] = score[i] < 0 ? score[i] * penalty : score[i] / penalty;
  for (double& s : scores) s /= temperature;
  if (top_k > 0) {  // remove scores < the k-th largest
    std::vector<double> sorted = scores;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double kth = sorted[std::min(top_k, V) - 1];
    for (double& s : scores) s = s < kth ? -kInf : s;
  }
  if (top_p < 1) {  // ascending sort; remove where the cumulative probability <= 1 - top_p; keep the last
    std::vector<std::size_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
    std::vector<double> sorted;
    for (std::size_t i : idx) sorted.push_back(scores[i]);
    const std::vector<double> probs = softmax(sorted);
    double cumulative = 0;
    std::vector<bool> remove(V);
    for (std::size_t j = 0; j < V; ++j) remove[j] = (cumulative += probs[j]) <= 1 - top_p;
    remove[V - 1] = false;
    for (std::size_t j = 0; j < V; ++j)
      if (remove[j]) scores[idx[j]] = -kInf;
  }
  if (min_p > 0) {  // remove probs < min_p * max(probs); the top is kept
    const std::vector<double> probs = softmax(scores);
    const double top = *std::max_element(probs.begin(), probs.end());
    for (std::size_t i = 0; i < V; ++i)
      if (probs[i] < min_p * top) scores[i] = -kInf;
  }
  return softmax(scores);
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

nn::GenerateOptions sampling(float temperature, std::size_t top_k, float top_p, float min_p, float penalty) {
  nn::GenerateOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.min_p = min_p;
  o.repetition_penalty = penalty;
  return o;
}

// A model whose next-token logits are `logits` whatever the input: a zero head weight and the
// logits as its bias (vocabulary logits.size(), max_len 64).
std::unique_ptr<nn::LanguageModel> fixed_logits_lm(const std::vector<float>& logits) {
  auto lm = testing::eval_lm(nn::LanguageModelOptions(logits.size(), 8, 2, 1).max_len(64).dropout(0.f), 3);
  lm->head->weight.mutable_value().fill(0.f);
  std::copy(logits.begin(), logits.end(), lm->head->bias.mutable_value().begin());
  return lm;
}

// A decode function of a byte-level tokenizer: id i is the bytes table[i].
std::function<std::string(const Tokens&)> bytes_decode(const std::vector<std::string>& table) {
  return [table](const Tokens& ids) {
    std::string text;
    for (std::int64_t id : ids) text += table.at(static_cast<std::size_t>(id));
    return text;
  };
}

// The same, showing a trailing character cut short as U+FFFD, as Hugging Face's byte-level and
// byte-fallback decoders do (a maximal ill-formed subpart at the end becomes one U+FFFD).
std::function<std::string(const Tokens&)> replacing_decode(const std::vector<std::string>& table) {
  return [table](const Tokens& ids) {
    std::string text;
    for (std::int64_t id : ids) text += table.at(static_cast<std::size_t>(id));
    std::size_t i = text.size();
    while (i > 0 && text.size() - i < 3 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i;
    if (i > 0) {
      const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
      const std::size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
      if (length > text.size() - (i - 1)) text = text.substr(0, i - 1) + "\xEF\xBF\xBD";
    }
    return text;
  };
}

// Whether `s` is whole UTF-8 (every sequence complete; no check of overlongs or surrogates).
bool whole_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char lead = static_cast<unsigned char>(s[i]);
    const std::size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
    if (length == 0 || i + length > s.size()) return false;
    for (std::size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += length;
  }
  return true;
}

// What on_token saw.
struct Stream {
  Tokens ids;
  std::vector<std::string> pieces;
  std::string joined() const {
    std::string s;
    for (const std::string& p : pieces) s += p;
    return s;
  }
};

// Records into `s`; returns false (stop) once `stop_after` tokens were seen (0: never).
std::function<bool(std::int64_t, const std::string&)> record(Stream& s, std::size_t stop_after = 0) {
  return [&s, stop_after](std::int64_t id, const std::string& piece) {
    s.ids.push_back(id);
    s.pieces.push_back(piece);
    return stop_after == 0 || s.ids.size() < stop_after;
  };
}

// The cycle model: logits 13 - i for id i (V 13), so with the prompt {12} and a large repetition
// penalty, greedy generation emits 0, 1, ..., 11: each id once, in order, then 0 again.
std::unique_ptr<nn::LanguageModel> cycle_lm() {
  std::vector<float> logits(13);
  for (std::size_t i = 0; i < 13; ++i) logits[i] = 13.f - static_cast<float>(i);
  return fixed_logits_lm(logits);
}

// Greedy with the cycle's penalty.
nn::GenerateOptions cycle_options() { return sampling(0.f, 0, 1.f, 0.f, 1000.f); }

const Tokens kCyclePrompt = {12};

// The bytes of ids 0 .. 11 in the cycle: 你 (E4 BD A0), 😀 (F0 9F 98 80), é (C3 A9) and € (E2 82 AC)
// cut across tokens.
const std::vector<std::string> kSplitTable = {
    "a", "\xE4",     "\xBD\xA0", "b", "\xF0\x9F", "\x98", std::string("\x80") + "c", "\xC3", std::string("\xA9") + "d",
    "e", "\xE2\x82", "\xAC",     "z"};

}  // namespace

TEST_CASE("next_token_probabilities is Hugging Face's processors in their order on fixed logits", "[nn][generate]") {
  const std::vector<float> logits = {1.5f, -0.5f, 2.5f, 0.2f, -2.0f, 3.1f, 0.9f, -1.2f};
  const Tokens context = {1, 1, 5, 0, 4};  // ids 1 and 4 negative, 0 and 5 positive; 1 twice
  struct Case {
    float penalty, temperature;
    std::size_t top_k;
    float top_p, min_p;
  };
  const std::vector<Case> cases = {
      {1.f, 1.f, 0, 1.f, 0.f},     {1.3f, 1.f, 0, 1.f, 0.f},  {0.7f, 1.f, 0, 1.f, 0.f},    {1.f, 0.7f, 0, 0.8f, 0.f},
      {1.f, 1.4f, 0, 0.5f, 0.f},   {1.f, 1.f, 0, 1.f, 0.1f},  {1.f, 0.6f, 0, 1.f, 0.3f},   {1.5f, 0.8f, 5, 0.9f, 0.05f},
      {2.f, 1.2f, 3, 0.95f, 0.2f}, {1.f, 1.f, 0, 1e-6f, 0.f}, {1.2f, 2.f, 6, 0.7f, 0.15f}, {1.f, 3.f, 0, 0.99f, 0.02f},
  };
  for (const Case& c : cases) {
    INFO("penalty " << c.penalty << ", temperature " << c.temperature << ", top_k " << c.top_k << ", top_p " << c.top_p
                    << ", min_p " << c.min_p);
    const std::vector<double> p =
        nn::next_token_probabilities(logits, context, sampling(c.temperature, c.top_k, c.top_p, c.min_p, c.penalty));
    const std::vector<double> ref = hf_reference(logits, context, c.penalty, c.temperature, c.top_k, c.top_p, c.min_p);
    CHECK(max_abs_diff(p, ref) < 1e-12);
    CHECK(std::accumulate(p.begin(), p.end(), 0.0) == Approx(1.0).epsilon(1e-12));
    for (std::size_t i = 0; i < p.size(); ++i) CHECK((p[i] == 0) == (ref[i] == 0));  // the same tokens removed
  }
  // the cases remove tokens: not all of them are plain softmax
  CHECK(nn::next_token_probabilities(logits, context, sampling(1.f, 0, 0.5f, 0.f, 1.f))[1] == 0);
}

TEST_CASE("top_p, min_p, temperature and the repetition penalty give the hand-computed distributions",
          "[nn][generate]") {
  // probabilities 0.5, 0.3, 0.15, 0.05 at ids 2, 0, 3, 1
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  auto probs = [&](const nn::GenerateOptions& o, const Tokens& context = {}) {
    return nn::next_token_probabilities(logits, context, o);
  };
  const double tol = 1e-6;  // float logits
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 1.f, 0.f, 1.f)), {0.3, 0.05, 0.5, 0.15}) < tol);
  // top_p: the smallest set of most likely tokens whose probability reaches p
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 0.75f, 0.f, 1.f)), {0.375, 0, 0.625, 0}) < tol);
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 0.85f, 0.f, 1.f)), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}) < tol);
  CHECK(probs(sampling(1.f, 0, 1e-6f, 0.f, 1.f)) == std::vector<double>{0, 0, 1, 0});  // at least one token
  CHECK(probs(sampling(1.f, 0, 0.4f, 0.f, 1.f)) == std::vector<double>{0, 0, 1, 0});
  // min_p: p >= min_p * 0.5
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 1.f, 0.35f, 1.f)), {0.375, 0, 0.625, 0}) < tol);
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 1.f, 0.25f, 1.f)), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}) < tol);
  CHECK(probs(sampling(1.f, 0, 1.f, 1.f, 1.f)) == std::vector<double>{0, 0, 1, 0});
  // temperature 2: p^(1/2), normalized; min_p after it: sqrt(0.05 / 0.5) = 0.316 < 0.4 removes id 1
  const double s = std::sqrt(0.3) + std::sqrt(0.05) + std::sqrt(0.5) + std::sqrt(0.15);
  CHECK(max_abs_diff(probs(sampling(2.f, 0, 1.f, 0.f, 1.f)),
                     {std::sqrt(0.3) / s, std::sqrt(0.05) / s, std::sqrt(0.5) / s, std::sqrt(0.15) / s}) < tol);
  const double s3 = s - std::sqrt(0.05);
  CHECK(max_abs_diff(probs(sampling(2.f, 0, 1.f, 0.4f, 1.f)),
                     {std::sqrt(0.3) / s3, 0, std::sqrt(0.5) / s3, std::sqrt(0.15) / s3}) < tol);
  // top_k then top_p on what top_k kept: {0.5, 0.3} -> {0.625, 0.375}; top_p 0.6 keeps 0.625 alone
  CHECK(probs(sampling(1.f, 2, 0.6f, 0.f, 1.f)) == std::vector<double>{0, 0, 1, 0});
  CHECK(max_abs_diff(probs(sampling(1.f, 2, 0.7f, 0.f, 1.f)), {0.375, 0, 0.625, 0}) < tol);
  // repetition penalty 2 on id 2 (log 0.5 < 0: multiplied): exp(2 log 0.5) = 0.25
  CHECK(max_abs_diff(probs(sampling(1.f, 0, 1.f, 0.f, 2.f), {2, 2}),
                     {0.3 / 0.75, 0.05 / 0.75, 0.25 / 0.75, 0.15 / 0.75}) < tol);
  // a positive logit is divided: logits {2, 1}, id 0 seen, penalty 4 -> {0.5, 1}
  CHECK(max_abs_diff(nn::next_token_probabilities({2.f, 1.f}, {0}, sampling(1.f, 0, 1.f, 0.f, 4.f)),
                     {std::exp(0.5) / (std::exp(0.5) + std::exp(1.0)),
                      std::exp(1.0) / (std::exp(0.5) + std::exp(1.0))}) < 1e-12);
  // greedy: the argmax after the penalty, whatever the sampling filters
  CHECK(probs(sampling(0.f, 0, 1.f, 0.f, 1.f)) == std::vector<double>{0, 0, 1, 0});
  CHECK(probs(sampling(0.f, 0, 1.f, 0.f, 2.f), {2}) == std::vector<double>{1, 0, 0, 0});  // 0.25 < 0.3
  CHECK(probs(sampling(0.f, 1, 0.1f, 0.9f, 1.f)) == std::vector<double>{0, 0, 1, 0});
  CHECK(nn::next_token_probabilities({-0.5f, -0.6f}, {0}, sampling(0.f, 0, 1.f, 0.f, 1.5f)) ==
        std::vector<double>{0, 1});  // -0.75 < -0.6
  // equal logits: the lower id counts as the more likely one
  CHECK(nn::next_token_probabilities({1.f, 1.f, 1.f}, {}, sampling(1.f, 1, 1.f, 0.f, 1.f)) ==
        std::vector<double>{1, 0, 0});
  CHECK(nn::next_token_probabilities({1.f, 1.f, 1.f}, {}, sampling(1.f, 2, 1.f, 0.f, 1.f)) ==
        std::vector<double>{0.5, 0.5, 0});
  CHECK(nn::next_token_probabilities({1.f, 1.f, 1.f}, {}, sampling(0.f, 0, 1.f, 0.f, 1.f)) ==
        std::vector<double>{1, 0, 0});
  // temperature +inf: uniform over what top_k keeps; min_p keeps them all (each is the top's equal)
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(probs(sampling(inf, 2, 1.f, 0.9f, 1.f)) == std::vector<double>{0.5, 0, 0.5, 0});
  CHECK(probs(sampling(inf, 0, 0.5f, 0.f, 1.f)) == std::vector<double>{0.5, 0, 0.5, 0});
  // -inf: never kept, at any temperature
  CHECK(nn::next_token_probabilities({-inf, 0.f, 0.f}, {}, sampling(inf, 0, 1.f, 0.f, 3.f)) ==
        std::vector<double>{0, 0.5, 0.5});
  CHECK(nn::next_token_probabilities({-inf, 0.f, 0.f}, {0}, sampling(1.f, 0, 1.f, 0.f, 3.f)) ==
        std::vector<double>{0, 0.5, 0.5});
}

TEST_CASE("generate's draws follow the processed distribution (counted, with each call's seed)",
          "[nn][generate][gemm]") {
  const std::vector<float> logits = {1.5f, -0.5f, 2.5f, 0.2f, -2.0f, 3.1f, 0.9f, -1.2f};
  auto check_counts = [](const std::vector<double>& p, const std::vector<std::size_t>& counts, std::size_t n) {
    std::size_t removed = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      INFO("token " << i << ": p " << p[i] << ", count " << counts[i] << " of " << n);
      if (p[i] == 0) {
        ++removed;
        CHECK(counts[i] == 0);
      } else {
        const double expected = static_cast<double>(n) * p[i];
        CHECK(std::abs(static_cast<double>(counts[i]) - expected) <= 5 * std::sqrt(expected * (1 - p[i])) + 1);
      }
    }
    CHECK(removed > 0);  // the filters removed some tokens, and kept several
    CHECK(removed + 2 <= p.size());
  };
  auto lm = fixed_logits_lm(logits);
  SECTION("one long generation: the logits do not depend on the context") {
    nn::GenerateOptions o = sampling(0.8f, 6, 0.95f, 0.04f, 1.f);
    o.seed = 11;
    const std::size_t n = 6000;
    const Tokens g = lm->generate({0}, n, o);
    std::vector<std::size_t> counts(logits.size());
    for (std::size_t i = 1; i < g.size(); ++i) ++counts[static_cast<std::size_t>(g[i])];
    check_counts(nn::next_token_probabilities(logits, {}, o), counts, n);
  }
  SECTION("one token per call, one seed per call, after a prompt the repetition penalty reads") {
    nn::GenerateOptions o = sampling(1.1f, 0, 0.9f, 0.02f, 1.8f);
    const Tokens prompt = {5, 2, 1};
    const std::size_t n = 3000;
    std::vector<std::size_t> counts(logits.size());
    for (std::size_t s = 0; s < n; ++s) {
      o.seed = s;
      ++counts[static_cast<std::size_t>(lm->generate(prompt, 1, o).back())];
    }
    const std::vector<double> p = nn::next_token_probabilities(logits, prompt, o);
    check_counts(p, counts, n);
    // the penalty moved probability: id 2 (logit 2.5, seen) falls below id 0 (1.5, not seen)
    CHECK(p[0] > p[2]);
  }
}

TEST_CASE("a seed per call gives the same tokens whatever ran before, and leaves the generator alone",
          "[nn][generate][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 4);
  nn::GenerateOptions o = sampling(1.f, 0, 0.95f, 0.f, 1.1f);
  o.seed = 42;
  Generator g1(1), g2(2);
  const std::string state = g1.state();
  const Tokens a = lm->generate({3, 1}, 20, o, g1);
  CHECK(g1.state() == state);
  g1.uniform();
  g1.uniform();
  CHECK(lm->generate({3, 1}, 20, o, g1) == a);
  CHECK(lm->generate({3, 1}, 20, o, g2) == a);
  CHECK(lm->generate({3, 1}, 20, o) == a);
  // the seed's stream is Generator(seed)'s
  nn::GenerateOptions unseeded = o;
  unseeded.seed.reset();
  Generator g42(42);
  CHECK(lm->generate({3, 1}, 20, unseeded, g42) == a);
  CHECK(g42.state() != Generator(42).state());
  // another seed, other tokens
  o.seed = 43;
  CHECK(lm->generate({3, 1}, 20, o, g1) != a);
}

TEST_CASE("greedy with a repetition penalty is the argmax of the penalized logits, token by token",
          "[nn][generate][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 6);
  for (const float penalty : {1.f, 1.5f, 4.f, 0.5f}) {
    for (const bool cache : {true, false}) {
      INFO("penalty " << penalty << ", use_cache " << cache);
      nn::GenerateOptions o = sampling(0.f, 0, 1.f, 0.f, penalty);
      o.use_cache = cache;
      const Tokens prompt = {4, 4, 9};
      const Tokens g = lm->generate(prompt, 7, o);  // 10 tokens, 9 positions: within max_len
      REQUIRE(g.size() == 10);
      for (std::size_t n = prompt.size(); n < g.size(); ++n) {
        IndexArray ids = IndexArray::from_shape({1, n});
        std::copy(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(n), ids.begin());
        const Array logits = lm->forward(ids).logits.value();
        std::vector<double> l(13);
        for (std::size_t v = 0; v < 13; ++v) l[v] = logits(0, n - 1, v);
        std::vector<bool> seen(13);
        for (std::size_t i = 0; i < n; ++i) seen[static_cast<std::size_t>(g[i])] = true;
        for (std::size_t v = 0; v < 13; ++v)
          if (seen[v]) l[v] = l[v] < 0 ? l[v] * penalty : l[v] / penalty;
        CHECK(g[n] == std::max_element(l.begin(), l.end()) - l.begin());
      }
    }
  }
  // the penalty changes what greedy picks (this model repeats without it)
  const Tokens plain = lm->generate({4, 4, 9}, 7, sampling(0.f, 0, 1.f, 0.f, 1.f));
  const Tokens penalized = lm->generate({4, 4, 9}, 7, sampling(0.f, 0, 1.f, 0.f, 4.f));
  CHECK(plain != penalized);
}

TEST_CASE("stop tokens end generation after the token, which the output keeps", "[nn][generate][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 8);
  for (const float temperature : {0.f, 1.f}) {
    INFO("temperature " << temperature);
    nn::GenerateOptions o = sampling(temperature, 0, 1.f, 0.f, 1.2f);
    o.seed = 3;
    const Tokens prompt = {1, 2};
    const nn::Generation all = lm->generate_with_details(prompt, 14, o);
    REQUIRE(all.tokens.size() == 16);
    CHECK(all.stop == nn::StopReason::length);
    CHECK(all.prompt_size == 2);
    // the fifth new token's first appearance ends the run; an id never generated changes nothing
    const Tokens fresh(all.tokens.begin() + 2, all.tokens.end());
    const std::int64_t stop = fresh[4];
    const auto until = [&](std::int64_t id) {  // the tokens up to the first new `id`, or all of them
      const auto at = std::find(fresh.begin(), fresh.end(), id);
      return Tokens(all.tokens.begin(),
                    at == fresh.end() ? all.tokens.end() : all.tokens.begin() + 2 + (at - fresh.begin()) + 1);
    };
    o.stop_tokens = {stop};
    for (std::int64_t v = 0; v < 13; ++v) {
      if (std::find(fresh.begin(), fresh.end(), v) == fresh.end()) o.stop_tokens.insert(o.stop_tokens.begin(), v);
    }
    const nn::Generation stopped = lm->generate_with_details(prompt, 14, o);
    CHECK(stopped.stop == nn::StopReason::stop_token);
    CHECK(stopped.tokens == until(stop));
    CHECK(stopped.tokens.size() <= 2 + 5);
    CHECK(lm->generate(prompt, 14, o) == stopped.tokens);
    // the prompt's ids do not count: only a generated one stops
    o.stop_tokens = {prompt[0]};
    const nn::Generation p = lm->generate_with_details(prompt, 14, o);
    CHECK(p.tokens == until(prompt[0]));
    CHECK(p.stop == (p.tokens.size() < all.tokens.size() ? nn::StopReason::stop_token : nn::StopReason::length));
  }
}

TEST_CASE("stop strings match the decoded new text across token boundaries", "[nn][generate][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 9);
  std::vector<std::string> letters;
  for (char c = 'a'; c < 'a' + 13; ++c) letters.push_back(std::string(1, c));
  const auto decode = bytes_decode(letters);
  for (const bool cache : {true, false}) {
    INFO("use_cache " << cache);
    nn::GenerateOptions o = sampling(1.f, 0, 1.f, 0.f, 1.3f);
    o.seed = 5;
    o.use_cache = cache;
    o.decode = decode;
    const Tokens prompt = {0, 7};
    const nn::Generation all = lm->generate_with_details(prompt, 20, o);  // past max_len
    REQUIRE(all.tokens.size() == 22);
    const Tokens fresh(all.tokens.begin() + 2, all.tokens.end());
    REQUIRE(all.text == decode(fresh));
    // the text of new tokens 5 and 6: two tokens, so the match crosses a boundary
    const std::string stop = all.text.substr(5, 2);
    std::size_t last = 1;  // the new token that completes the first match
    while (decode(Tokens(fresh.begin(), fresh.begin() + static_cast<std::ptrdiff_t>(last + 1))).find(stop) ==
           std::string::npos)
      ++last;
    REQUIRE(last <= 6);
    o.stop_strings = {"zzz", stop};  // 'z' is no token's text
    Stream stream;
    o.on_token = record(stream);
    const nn::Generation g = lm->generate_with_details(prompt, 20, o);
    CHECK(g.stop == nn::StopReason::stop_string);
    CHECK(g.stop_string == std::optional<std::size_t>(1));
    CHECK(g.tokens == Tokens(all.tokens.begin(), all.tokens.begin() + static_cast<std::ptrdiff_t>(2 + last + 1)));
    CHECK(g.text == all.text.substr(0, last + 1));
    CHECK(g.text.find(stop) + stop.size() == g.text.size());  // the match ends at the last token
    CHECK(stream.joined() == g.text);
    CHECK(stream.ids == Tokens(g.tokens.begin() + 2, g.tokens.end()));
    // a stop token on the same token is the reason given
    o.stop_tokens = {g.tokens.back()};
    CHECK(lm->generate_with_details(prompt, 20, o).stop == nn::StopReason::stop_token);
  }
}

TEST_CASE("streamed pieces hold back a character cut across tokens and concatenate to the decoded text",
          "[nn][generate][gemm]") {
  auto lm = cycle_lm();
  const std::vector<std::string> expected = {"a", "", "你", "b", "", "", "😀c", "", "éd", "e", "", "€"};
  for (const bool replacing : {false, true}) {
    for (const bool cache : {true, false}) {
      INFO((replacing ? "U+FFFD for a cut character" : "raw bytes") << ", use_cache " << cache);
      nn::GenerateOptions o = cycle_options();
      o.use_cache = cache;
      o.decode = replacing ? replacing_decode(kSplitTable) : bytes_decode(kSplitTable);
      Stream stream;
      o.on_token = record(stream);
      const nn::Generation g = lm->generate_with_details(kCyclePrompt, 12, o);
      REQUIRE(g.tokens == Tokens({12, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
      CHECK(stream.pieces == expected);
      CHECK(stream.joined() == "a你b😀céde€");
      CHECK(stream.joined() == g.text);
      for (const std::string& piece : stream.pieces) CHECK(whole_utf8(piece));
      // the last token flushes what is held back: € cut short stays in the text
      Stream short_stream;
      o.on_token = record(short_stream);
      const nn::Generation cut = lm->generate_with_details(kCyclePrompt, 11, o);
      CHECK(cut.stop == nn::StopReason::length);
      CHECK(short_stream.pieces.back() == (replacing ? "\xEF\xBF\xBD" : "\xE2\x82"));
      CHECK(short_stream.joined() == cut.text);
      // a stop string completed by the last byte of a cut character
      o.stop_strings = {"😀"};
      Stream until;
      o.on_token = record(until);
      const nn::Generation smile = lm->generate_with_details(kCyclePrompt, 12, o);
      CHECK(smile.stop == nn::StopReason::stop_string);
      CHECK(smile.tokens.size() == 1 + 7);
      CHECK(until.joined() == "a你b😀c");
      o.stop_strings = {"你b"};
      CHECK(lm->generate_with_details(kCyclePrompt, 12, o).tokens.size() == 1 + 4);
    }
  }
}

TEST_CASE("on_token returning false stops after that token, held-back bytes staying in the text",
          "[nn][generate][gemm]") {
  auto lm = cycle_lm();
  nn::GenerateOptions o = cycle_options();
  o.decode = bytes_decode(kSplitTable);
  Stream stream;
  o.on_token = record(stream, 5);  // false on the fifth token, id 4 (the first bytes of 😀)
  const nn::Generation g = lm->generate_with_details(kCyclePrompt, 12, o);
  CHECK(g.stop == nn::StopReason::callback);
  CHECK(g.tokens == Tokens({12, 0, 1, 2, 3, 4}));
  CHECK(stream.pieces == std::vector<std::string>{"a", "", "你", "b", ""});
  CHECK(g.text == "a你b\xF0\x9F");
  // without decode the pieces are empty, and the callback still stops
  o.decode = nullptr;
  Stream bare;
  o.on_token = record(bare, 2);
  const nn::Generation h = lm->generate_with_details(kCyclePrompt, 12, o);
  CHECK(h.tokens == Tokens({12, 0, 1}));
  CHECK(bare.pieces == std::vector<std::string>{"", ""});
  CHECK(h.text.empty());
  // a callback that throws ends generate with its error, the training flag restored
  lm->train();
  o.on_token = [](std::int64_t, const std::string&) -> bool { fail("on_token: refused"); };
  REQUIRE_THROWS_WITH(lm->generate(kCyclePrompt, 3, o), Contains("on_token: refused"));
  CHECK(lm->is_training());
}

TEST_CASE("a decode that rewrites bytes it gave gets no piece until its text continues what was given",
          "[nn][generate][gemm]") {
  auto lm = cycle_lm();
  SECTION("a clean-up that removes the space before '.': the space was given, the rest waits") {
    nn::GenerateOptions o = cycle_options();
    const auto plain = bytes_decode({"a", " ", ".", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"});
    o.decode = [plain](const Tokens& ids) {
      std::string t = plain(ids);
      for (std::size_t at; (at = t.find(" .")) != std::string::npos;) t.erase(at, 1);
      return t;
    };
    Stream stream;
    o.on_token = record(stream);
    const nn::Generation g = lm->generate_with_details(kCyclePrompt, 5, o);
    CHECK(g.text == "a.bc");
    CHECK(stream.pieces == std::vector<std::string>{"a", " ", "", "", ""});
  }
  SECTION("a text that shrinks for a token, then grows again past what was given") {
    nn::GenerateOptions o = cycle_options();
    const auto plain = bytes_decode({"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"});
    o.decode = [plain](const Tokens& ids) {
      const std::string t = plain(ids);
      return ids.size() == 3 ? t.substr(0, 1) : t;  // "a" where "abc" was due
    };
    Stream stream;
    o.on_token = record(stream);
    const nn::Generation g = lm->generate_with_details(kCyclePrompt, 5, o);
    CHECK(stream.pieces == std::vector<std::string>{"a", "b", "", "cd", "e"});
    CHECK(stream.joined() == g.text);
  }
}

TEST_CASE("cached and uncached generation agree with every option, past max_len too", "[nn][generate][cache][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 10);
  std::vector<std::string> table;
  for (std::size_t i = 0; i < 13; ++i)
    table.push_back(i % 4 == 0 ? "\xC3" : i % 4 == 1 ? "\xA9" : std::string(1, static_cast<char>('f' + i)));
  for (const Tokens& prompt : std::vector<Tokens>{{0}, {5, 5, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}) {
    for (const std::size_t count : {1, 6, 25}) {
      for (const float penalty : {1.f, 1.4f}) {
        INFO("prompt size " << prompt.size() << ", count " << count << ", penalty " << penalty);
        nn::GenerateOptions cached = sampling(0.9f, 10, 0.92f, 0.03f, penalty), uncached;
        cached.seed = count;
        cached.decode = bytes_decode(table);
        cached.stop_strings = {"hi", "\xC3\xA9\xC3\xA9"};
        cached.stop_tokens = {12};
        uncached = cached;
        uncached.use_cache = false;
        Stream a, b;
        cached.on_token = record(a);
        uncached.on_token = record(b);
        const nn::Generation x = lm->generate_with_details(prompt, count, cached);
        const nn::Generation y = lm->generate_with_details(prompt, count, uncached);
        CHECK(x.tokens == y.tokens);
        CHECK(x.stop == y.stop);
        CHECK(a.pieces == b.pieces);
        CHECK(a.joined() == x.text);
      }
    }
  }
}

TEST_CASE("generate_with_attention that stops early keeps the weights of the queries that ran",
          "[nn][generate][gemm]") {
  auto lm = testing::randomized_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 12);
  nn::GenerateOptions o = sampling(0.f, 0, 1.f, 0.f, 2.f);
  const nn::Generation all = lm->generate_with_attention({3, 3}, 12, o);
  REQUIRE(all.attention[0].shape() == Shape{4, 13, 13});
  o.stop_tokens = {all.tokens[6]};
  const std::size_t first =
      static_cast<std::size_t>(std::find(all.tokens.begin() + 2, all.tokens.end(), all.tokens[6]) - all.tokens.begin());
  const nn::Generation early = lm->generate_with_attention({3, 3}, 12, o);
  REQUIRE(early.tokens.size() == first + 1);
  CHECK(early.stop == nn::StopReason::stop_token);
  const nn::Generation same = lm->generate_with_attention({3, 3}, first - 1, sampling(0.f, 0, 1.f, 0.f, 2.f));
  REQUIRE(same.tokens == early.tokens);
  for (std::size_t l = 0; l < 2; ++l) {
    REQUIRE(early.attention[l].shape() == Shape{4, first, first});
    CHECK(early.attention[l] == same.attention[l]);
  }
}

TEST_CASE("vocab_limit keeps draws and greedy picks among the first ids", "[nn][generate][gemm]") {
  auto lm = testing::eval_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(64).dropout(0.f), 21);
  nn::GenerateOptions o;
  o.temperature = 5.f;  // nearly uniform: without the limit most draws would be past it
  o.vocab_limit = 4;
  o.seed = 3;
  const Tokens sampled = lm->generate({1, 2}, 40, o);
  CHECK(std::all_of(sampled.begin() + 2, sampled.end(), [](std::int64_t id) { return id < 4; }));
  o.vocab_limit = 0;
  const Tokens free = lm->generate({1, 2}, 40, o);
  CHECK(std::any_of(free.begin() + 2, free.end(), [](std::int64_t id) { return id >= 4; }));
  // The distribution is the truncated logits' (a penalized id past the limit is skipped).
  const std::vector<float> logits = {0.5f, 2.f, -1.f, 3.f, 9.f};
  nn::GenerateOptions limited;
  limited.vocab_limit = 3;
  limited.repetition_penalty = 2.f;
  const std::vector<double> p = nn::next_token_probabilities(logits, {1, 4}, limited);
  const std::vector<double> q = softmax({0.5, 1.0, -1.0});
  REQUIRE(p.size() == 5);
  for (std::size_t i = 0; i < 3; ++i) CHECK(p[i] == Approx(q[i]).epsilon(1e-12));
  CHECK(p[3] == 0.0);
  CHECK(p[4] == 0.0);
  limited.temperature = 0.f;
  CHECK(nn::next_token_probabilities(logits, {}, limited)[1] == 1.0);
}

TEST_CASE("generate refuses sampling and stopping options out of range, by name, before any work",
          "[nn][generate][bad_input][gemm]") {
  auto lm = testing::eval_lm(nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.f), 13);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(nn::GenerateOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases =
      {
          {[](auto& o) { o.top_p = 0.f; }, "top_p 0 must be in (0, 1] (1: every token)"},
          {[](auto& o) { o.top_p = -0.5f; }, "top_p -0.5 must be in (0, 1]"},
          {[](auto& o) { o.top_p = 1.5f; }, "top_p 1.5 must be in (0, 1]"},
          {[&](auto& o) { o.top_p = nan; }, "top_p nan must be in (0, 1]"},
          {[](auto& o) { o.min_p = -0.1f; }, "min_p -0.1 must be in [0, 1] (0: every token)"},
          {[](auto& o) { o.min_p = 2.f; }, "min_p 2 must be in [0, 1]"},
          {[&](auto& o) { o.min_p = nan; }, "min_p nan must be in [0, 1]"},
          {[](auto& o) { o.repetition_penalty = 0.f; }, "repetition_penalty 0 must be a finite number > 0 (1: none)"},
          {[](auto& o) { o.repetition_penalty = -1.f; }, "repetition_penalty -1 must be a finite number > 0"},
          {[&](auto& o) { o.repetition_penalty = nan; }, "repetition_penalty nan must be a finite number > 0"},
          {[&](auto& o) { o.repetition_penalty = inf; }, "repetition_penalty inf must be a finite number > 0"},
          {[](auto& o) {
    o.decode = [](const Tokens&) { return std::string(); };
    o.stop_strings = {"ok", ""};
           },
           "stop_strings[1] is empty (it would match before any token)"},
          {[](auto& o) { o.stop_strings = {"ok"}; },
           "stop_strings needs decode, the function that gives the text of the generated ids"},
          {[](auto& o) {
    o.stop_tokens = {3, 13};
           },
           "stop_tokens[1] = 13 is outside the vocabulary [0, 13)"},
                          {[](auto& o) { o.stop_tokens = {-1}; },
                           "stop_tokens[0] = -1 is outside the vocabulary [0, 13)"},
                          {[](auto& o) { o.vocab_limit = 14; }, "vocab_limit 14 is more than the vocabulary "},
                          };
  for (const Case& c : cases) {
    INFO(c.message);
    nn::GenerateOptions o;
    bool called = false;
    o.on_token = [&](std::int64_t, const std::string&) { return called = true; };
    c.set(o);
    lm->train();
    Generator gen(7);
    const std::string state = gen.state();
    const std::size_t tape = tape_size();
    REQUIRE_THROWS_WITH(lm->generate({1, 2}, 5, o, gen), Contains("LanguageModel::generate: " + c.message));
    REQUIRE_THROWS_WITH(lm->generate_with_details({1, 2}, 5, o, gen),
                        Contains("LanguageModel::generate_with_details: " + c.message));
    REQUIRE_THROWS_WITH(lm->generate_with_attention({1, 2}, 0, o, gen),
                        Contains("LanguageModel::generate_with_attention: " + c.message));
    CHECK(gen.state() == state);
    CHECK(tape_size() == tape);
    CHECK(lm->is_training());
    CHECK_FALSE(called);
    if (c.message.rfind("stop", 0) != 0) {  // the sampling options, also in the free function
      REQUIRE_THROWS_WITH(nn::next_token_probabilities({0.f, 1.f}, {}, o),
                          Contains("next_token_probabilities: " + c.message));
    }
  }
  // the free function's own inputs
  REQUIRE_THROWS_WITH(nn::next_token_probabilities({}, {}, {}),
                      Contains("next_token_probabilities: the logits are empty"));
  REQUIRE_THROWS_WITH(
      nn::next_token_probabilities({0.f, 1.f}, {1, 2}, {}),
      Contains("next_token_probabilities: context id 2 at position 1 is outside the vocabulary [0, 2)"));
  REQUIRE_THROWS_WITH(nn::next_token_probabilities({0.f, nan}, {}, {}),
                      Contains("next_token_probabilities: the logit of token 1 is nan"));
  REQUIRE_THROWS_WITH(nn::next_token_probabilities({-inf, -inf}, {}, {}),
                      Contains("next_token_probabilities: every logit is -inf"));
}
