// LanguageModel's generation: the next-token logits through Hugging Face's processors, the draw,
// stop tokens and strings, the streamed pieces, and the context past max_len. Shapes: V vocabulary.
#include "xgrad/nn/generate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <numeric>
#include <optional>
#include <string>

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::nn {

namespace {

// The sampling options' ranges (NaN fails every test), checked before any work.
void check_sampling(const GenerateOptions& o, const std::string& who) {
  if (!(o.temperature >= 0.f)) {  // +inf is allowed: uniform over the tokens the filters keep
    fail(who, ": temperature ", o.temperature, " must be a number >= 0");
  }
  if (!(o.top_p > 0.f && o.top_p <= 1.f)) fail(who, ": top_p ", o.top_p, " must be in (0, 1] (1: every token)");
  if (!(o.min_p >= 0.f && o.min_p <= 1.f)) fail(who, ": min_p ", o.min_p, " must be in [0, 1] (0: every token)");
  if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.f)) {
    fail(who, ": repetition_penalty ", o.repetition_penalty, " must be a finite number > 0 (1: none)");
  }
}

// The tokens the next one is drawn from: order[i] has the unnormalized probability weight[i];
// order runs by decreasing processed logit (equal logits: the lower id first), total = sum weight.
struct Candidates {
  std::vector<std::size_t> order;
  std::vector<double> weight;
  double total = 0;
};

// logits (V) through Hugging Face's processors, in its order (generation/logits_process.py):
// RepetitionPenalty over `seen` (each id of the sequence so far, once), then Temperature, TopK,
// TopP and MinP. Errors name `who` and the step, if given.
Candidates candidates(const float* logits, std::size_t V, const std::vector<std::int64_t>& seen,
                      const GenerateOptions& o, const std::string& who, std::optional<std::size_t> step) {
  const auto where = [&] { return step ? " at step " + std::to_string(*step) : std::string(); };
  for (std::size_t i = 0; i < V; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      fail(who, ": the logit of token ", i, " is ", logits[i], where());
    }
  }
  // In double: a positive logit divided by a tiny penalty stays finite.
  std::vector<double> l(logits, logits + V);
  if (o.repetition_penalty != 1.f) {
    const double penalty = o.repetition_penalty;
    for (const std::int64_t id : seen) {
      double& x = l[static_cast<std::size_t>(id)];
      x = x < 0 ? x * penalty : x / penalty;
    }
  }
  Candidates c;
  if (o.temperature == 0.f) {  // greedy: the first of equal maxima
    c.order = {static_cast<std::size_t>(std::max_element(l.begin(), l.end()) - l.begin())};
    c.weight = {1.0};
    c.total = 1.0;
    return c;
  }
  c.order.resize(V);
  std::iota(c.order.begin(), c.order.end(), 0);
  std::stable_sort(c.order.begin(), c.order.end(), [&](std::size_t a, std::size_t b) { return l[a] > l[b]; });
  const double top = l[c.order[0]];
  if (std::isinf(top)) fail(who, ": every logit is -inf", where());
  const std::size_t k = o.top_k == 0 ? V : std::min(o.top_k, V);
  // weight_i = exp((l_i - l_max) / temperature) = p_i / p_max, over the k most likely tokens; -inf
  // gets 0 (also at temperature +inf, where every other weight is 1)
  c.weight.resize(k);
  double total = 0;
  for (std::size_t i = 0; i < k; ++i) {
    const double x = l[c.order[i]];
    total += c.weight[i] = std::isinf(x) ? 0.0 : std::exp((x - top) / static_cast<double>(o.temperature));
  }
  std::size_t m = k;  // the kept prefix of order; weight[0] = 1, so it is never empty
  if (o.top_p < 1.f) {
    // TopP: a token stays while the tokens before it hold less than top_p of the probability
    double before = 0;
    for (m = 0; m < k && before < static_cast<double>(o.top_p) * total;) before += c.weight[m++];
  }
  if (o.min_p > 0.f) {
    // MinP: p_i >= min_p p_max, i.e. weight_i >= min_p; weights fall along order
    std::size_t n = 0;
    while (n < m && c.weight[n] >= static_cast<double>(o.min_p)) ++n;
    m = n;
  }
  c.order.resize(m);
  c.weight.resize(m);
  c.total = std::accumulate(c.weight.begin(), c.weight.end(), 0.0);
  return c;
}

// One draw from the candidates: the first token whose cumulative weight passes u * total.
std::int64_t draw(const Candidates& c, Generator& gen) {
  double u = static_cast<double>(gen.uniform()) * c.total;
  std::size_t last = 0;  // the last token of positive weight, should rounding run past the end
  for (std::size_t i = 0; i < c.order.size(); ++i) {
    if (u < c.weight[i]) return static_cast<std::int64_t>(c.order[i]);
    u -= c.weight[i];
    if (c.weight[i] > 0) last = i;
  }
  return static_cast<std::int64_t>(c.order[last]);
}

// Where `text`'s bytes from `from` on may be cut so that every character before the cut is whole:
// before a trailing lead byte whose sequence runs past the end, and before trailing U+FFFD (how
// Hugging Face's and SentencePiece's decoders show a character cut short), repeatedly.
std::size_t whole_end(const std::string& text, std::size_t from) {
  static const std::string replacement = "\xEF\xBF\xBD";  // U+FFFD
  std::size_t end = text.size();
  for (;;) {
    std::size_t i = end;  // back over at most 3 continuation bytes 10xxxxxx to their lead
    while (i > from && end - i < 3 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i;
    if (i > from) {
      const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
      const std::size_t length = lead >= 0xF0 && lead <= 0xF4   ? 4
                                 : lead >= 0xE0 && lead <= 0xEF ? 3
                                 : lead >= 0xC2 && lead <= 0xDF ? 2
                                                                : 1;
      if (length > end - (i - 1)) {
        end = i - 1;
        continue;
      }
    }
    if (end - from >= 3 && text.compare(end - 3, 3, replacement) == 0) {
      end -= 3;
      continue;
    }
    return end;
  }
}

// The length of the longest common prefix of a and b.
std::size_t common_prefix(const std::string& a, const std::string& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

IndexArray row_of(const std::vector<std::int64_t>& tokens, std::size_t begin, std::size_t end) {
  IndexArray ids = IndexArray::from_shape({1, end - begin});
  std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.begin() + static_cast<std::ptrdiff_t>(end),
            ids.begin());
  return ids;
}

}  // namespace

std::vector<double> next_token_probabilities(const std::vector<float>& logits, const std::vector<std::int64_t>& context,
                                             const GenerateOptions& options) {
  const std::string who = "next_token_probabilities";
  check_sampling(options, who);
  const std::size_t V = logits.size();
  if (V == 0) fail(who, ": the logits are empty");
  std::vector<char> is_seen(V, 0);
  std::vector<std::int64_t> seen;
  for (std::size_t i = 0; i < context.size(); ++i) {
    const std::int64_t id = context[i];
    if (id < 0 || id >= static_cast<std::int64_t>(V)) {
      fail(who, ": context id ", id, " at position ", i, " is outside the vocabulary [0, ", V, ")");
    }
    if (!is_seen[static_cast<std::size_t>(id)]) {
      is_seen[static_cast<std::size_t>(id)] = 1;
      seen.push_back(id);
    }
  }
  const Candidates c = candidates(logits.data(), V, seen, options, who, std::nullopt);
  std::vector<double> p(V, 0.0);
  for (std::size_t i = 0; i < c.order.size(); ++i) p[c.order[i]] = c.weight[i] / c.total;
  return p;
}

std::vector<std::int64_t> LanguageModel::generate(std::vector<std::int64_t> prompt, std::size_t count,
                                                  const GenerateOptions& opt, Generator& gen) {
  return generate_impl(std::move(prompt), count, opt, gen, false, "LanguageModel::generate").tokens;
}

Generation LanguageModel::generate_with_details(std::vector<std::int64_t> prompt, std::size_t count,
                                                const GenerateOptions& opt, Generator& gen) {
  return generate_impl(std::move(prompt), count, opt, gen, false, "LanguageModel::generate_with_details");
}

Generation LanguageModel::generate_with_attention(std::vector<std::int64_t> prompt, std::size_t count,
                                                  const GenerateOptions& opt, Generator& gen) {
  return generate_impl(std::move(prompt), count, opt, gen, true, "LanguageModel::generate_with_attention");
}

Generation LanguageModel::generate_impl(std::vector<std::int64_t> prompt, std::size_t count, const GenerateOptions& opt,
                                        Generator& given_gen, bool keep_attention, const char* who) {
  const std::size_t max_len = options_.max_len(), V = options_.vocab_size();
  if (prompt.empty()) fail(who, ": the prompt is empty");
  check_sampling(opt, who);
  if (opt.window_keep >= max_len) {
    fail(who, ": window_keep ", opt.window_keep, " must be less than max_len ", max_len);
  }
  for (std::size_t i = 0; i < opt.stop_tokens.size(); ++i) {
    if (opt.stop_tokens[i] < 0 || opt.stop_tokens[i] >= static_cast<std::int64_t>(V)) {
      fail(who, ": stop_tokens[", i, "] = ", opt.stop_tokens[i], " is outside the vocabulary [0, ", V, ")");
    }
  }
  for (std::size_t i = 0; i < opt.stop_strings.size(); ++i) {
    if (opt.stop_strings[i].empty()) fail(who, ": stop_strings[", i, "] is empty (it would match before any token)");
  }
  if (!opt.stop_strings.empty() && !opt.decode) {
    fail(who, ": stop_strings needs decode, the function that gives the text of the generated ids");
  }
  // Every id of the prompt, whatever max_len is: a bad id past the context would otherwise stay unnoticed.
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= static_cast<std::int64_t>(V)) {
      fail(who, ": prompt token id ", prompt[i], " at position ", i, " of ", prompt.size(),
           " is outside the vocabulary [0, ", V, ")");
    }
  }
  // The ids (and the weights generate_with_attention keeps) are refused before the first step when they
  // cannot be held; in double, so no size wraps around.
  const double total = static_cast<double>(prompt.size()) + static_cast<double>(count);
  const std::string sizes = std::to_string(prompt.size()) +
                            (prompt.size() == 1 ? " prompt token and " : " prompt tokens and ") +
                            std::to_string(count) + (count == 1 ? " new one" : " new ones");
  check_available_memory(total * sizeof(std::int64_t), who, "holding the token ids of " + sizes);
  // Positions that run as queries: every token but the last.
  const std::size_t queries = prompt.size() + count - 1;
  if (opt.past_max_len == PastMaxLen::error && count > 0 && queries > max_len) {
    fail(who, ": ", prompt.size(), " prompt tokens and ", count, " new ones need ", queries,
         " positions, more than max_len ", max_len, " (past_max_len is error)");
  }
  const std::size_t keep = opt.window_keep ? opt.window_keep : max_len / 2;
  // Hook points other than k and v see only the new positions of a cached step, so a model with
  // hooks runs every context whole, as its hooks expect.
  const bool use_cache = opt.use_cache && num_hooks() == 0;

  const std::size_t prompt_size = prompt.size();
  Generation out;
  out.prompt_size = prompt_size;
  out.tokens = std::move(prompt);
  std::vector<std::int64_t>& tokens = out.tokens;
  if (keep_attention && count > 0) {
    const std::size_t H = options_.num_heads(), L = blocks.size();
    const std::string shape = std::to_string(L) + " x (" + std::to_string(H) + ", " + std::to_string(queries) + ", " +
                              std::to_string(queries) + ") attention weights";
    check_available_memory(
        static_cast<double>(L) * H * static_cast<double>(queries) * static_cast<double>(queries) * sizeof(float) +
            total * sizeof(std::int64_t),
        who, "keeping " + shape + " for " + sizes);
    try {
      for (std::size_t l = 0; l < L; ++l) out.attention.push_back(xt::zeros<float>({H, queries, queries}));
    } catch (const std::bad_alloc&) {
      fail(who, ": no memory for ", shape);
    }
  }
  try {
    tokens.reserve(prompt_size + count);
  } catch (const std::bad_alloc&) {
    fail(who, ": no memory for the token ids of ", sizes);
  }
  std::size_t recorded = 0;  // positions whose attention rows are kept
  // Keeps the rows of the positions that have not run before: block l's weights (1, H, n, S) of
  // the queries end - n .. end - 1 over the keys end - S .. end - 1 (S is less than the context
  // where a sliding window has dropped keys from the cache).
  auto keep_rows = [&](const std::vector<Tensor>& attentions, std::size_t end) {
    if (out.attention.empty()) return;
    const std::size_t H = options_.num_heads(), n = attentions[0].shape()[2];
    for (std::size_t l = 0; l < attentions.size(); ++l) {
      const float* w = attentions[l].value().data();
      const std::size_t S = attentions[l].shape()[3];
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t query = end - n + i;
          if (query < recorded) continue;
          std::copy_n(w + (h * n + i) * S, S, &out.attention[l](h, query, end - S));
        }
    }
    recorded = end;
  };

  // A seeded call draws from its own stream and leaves the caller's as it was.
  std::optional<Generator> own;
  Generator& gen = opt.seed ? own.emplace(*opt.seed) : given_gen;
  // The repetition penalty's ids: each id of the sequence once.
  std::vector<char> is_seen;
  std::vector<std::int64_t> seen;
  auto see = [&](std::int64_t id) {
    if (is_seen[static_cast<std::size_t>(id)]) return;
    is_seen[static_cast<std::size_t>(id)] = 1;
    seen.push_back(id);
  };
  if (opt.repetition_penalty != 1.f) {
    is_seen.assign(V, 0);
    for (const std::int64_t id : tokens) see(id);
  }
  // Decoding after every token: for the stop strings and the pieces.
  const bool decode_each = opt.decode && (!opt.stop_strings.empty() || opt.on_token);
  std::vector<std::int64_t> fresh;  // the generated ids, decode's input
  std::string text, previous;       // decode(fresh) now and after the token before
  std::string emitted;              // the pieces given to on_token so far

  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  try {
    LanguageModelCache cache;
    std::size_t begin = tokens.size() - std::min(tokens.size(), max_len);  // the context: tokens begin .. end
    recorded = begin;
    for (std::size_t step = 0; step < count; ++step) {
      if (tokens.size() - begin > max_len) {
        begin = tokens.size() - 1 - keep;  // the context's last `keep` tokens and the new one
        cache.clear();
      }
      const Attentions kept = out.attention.empty() ? Attentions::none : Attentions::keep;
      LanguageModelOutput run = use_cache
                                    ? forward_cached(row_of(tokens, begin + cache.length(), tokens.size()), cache, kept)
                                    : forward(row_of(tokens, begin, tokens.size()), kept);
      keep_rows(run.attentions, tokens.size());
      const std::size_t n = run.logits.shape()[1];
      const Candidates c = candidates(run.logits.value().data() + (n - 1) * V, V, seen, opt, who, step);
      const std::int64_t id = opt.temperature == 0.f ? static_cast<std::int64_t>(c.order[0]) : draw(c, gen);
      tokens.push_back(id);
      if (!is_seen.empty()) see(id);

      std::optional<StopReason> stop;
      if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) != opt.stop_tokens.end()) {
        stop = StopReason::stop_token;
      }
      if (decode_each) {
        fresh.push_back(id);
        text = opt.decode(fresh);
        // `previous` held no stop string, so a match ends at or past the first byte that differs.
        const std::size_t same = common_prefix(text, previous);
        for (std::size_t i = 0; i < opt.stop_strings.size() && !out.stop_string; ++i) {
          const std::string& s = opt.stop_strings[i];
          if (text.find(s, same >= s.size() ? same - s.size() + 1 : 0) != std::string::npos) out.stop_string = i;
        }
        if (out.stop_string && !stop) stop = StopReason::stop_string;
      }
      if (opt.on_token) {
        // The new bytes, whole characters only but on the last token; none while decode's text
        // does not begin with what was given (it changed bytes it gave before).
        std::string piece;
        if (text.size() >= emitted.size() && text.compare(0, emitted.size(), emitted) == 0) {
          const bool last = stop || step + 1 == count;
          const std::size_t end = last ? text.size() : whole_end(text, emitted.size());
          piece = text.substr(emitted.size(), end - emitted.size());
          emitted += piece;
        }
        if (!opt.on_token(id, piece) && !stop) stop = StopReason::callback;
      }
      std::swap(previous, text);
      if (stop) {
        out.stop = *stop;
        break;
      }
    }
    if (opt.decode)
      out.text = decode_each ? previous
                             : opt.decode(std::vector<std::int64_t>(
                                   tokens.begin() + static_cast<std::ptrdiff_t>(prompt_size), tokens.end()));
  } catch (...) {
    train(was_training);
    throw;
  }
  train(was_training);
  // Stopped early: the weights of the queries that ran.
  const std::size_t ran = tokens.size() - 1;
  if (!out.attention.empty() && ran < queries) {
    for (Array& a : out.attention) a = Array(xt::view(a, xt::all(), xt::range(0, ran), xt::range(0, ran)));
  }
  return out;
}

}  // namespace xgrad::nn
