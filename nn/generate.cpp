// LanguageModel's generation: the next-token logits through Hugging Face's processors, the draw,
// stop tokens and strings, the streamed pieces, and the context past max_len. Shapes: V vocabulary.
#include "xgrad/nn/generate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// The ids a draw may give: [0, vocab_limit), or all V.
std::size_t drawable(const GenerateOptions& o, std::size_t V) { return o.vocab_limit ? o.vocab_limit : V; }

// The sampling options' ranges (NaN fails every test), checked before any work.
void check_sampling(const GenerateOptions& o, std::size_t V, const std::string& who) {
  if (o.vocab_limit > V) fail(who, ": vocab_limit ", o.vocab_limit, " is more than the vocabulary ", V);
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
  std::size_t first_max = 0;
  for (std::size_t i = 0; i < V; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      fail(who, ": the logit of token ", i, " is ", logits[i], where());
    }
    if (logits[i] > logits[first_max]) first_max = i;
  }
  // Greedy without a penalty: the first of equal maxima, from the pass above. The copy to double
  // below had been 2.4% of a profile of the llama.cpp comparison's model decoding at two threads;
  // this function is now 1.0% of it.
  if (o.temperature == 0.f && o.repetition_penalty == 1.f) return {{first_max}, {1.0}, 1.0};
  // In double: a positive logit divided by a tiny penalty stays finite.
  std::vector<double> l(logits, logits + V);
  if (o.repetition_penalty != 1.f) {
    const double penalty = o.repetition_penalty;
    for (const std::int64_t id : seen) {
      if (static_cast<std::size_t>(id) >= V) continue;  // past vocab_limit
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

// One sequence past its prompt: the repetition penalty's ids (each id of the sequence once), the
// stop tokens and strings, and the pieces given to on_token. out outlives it.
class Continuation {
 public:
  Continuation(const GenerateOptions& o, std::size_t V, Generation& out)
      : o_(o), out_(out), decode_each_(o.decode && (!o.stop_strings.empty() || o.on_token)) {
    if (o.repetition_penalty == 1.f) return;
    is_seen_.assign(V, 0);
    for (const std::int64_t id : out.tokens) see(id);
  }
  const std::vector<std::int64_t>& seen() const { return seen_; }

  // Appends `id` (the count-th token when `last`); true when generation stops after it, out.stop
  // saying why.
  bool take(std::int64_t id, bool last) {
    out_.tokens.push_back(id);
    if (!is_seen_.empty()) see(id);
    std::optional<StopReason> stop;
    if (std::find(o_.stop_tokens.begin(), o_.stop_tokens.end(), id) != o_.stop_tokens.end()) {
      stop = StopReason::stop_token;
    }
    if (decode_each_) {
      fresh_.push_back(id);
      text_ = o_.decode(fresh_);
      // `previous_` held no stop string, so a match ends at or past the first byte that differs.
      const std::size_t same = common_prefix(text_, previous_);
      for (std::size_t i = 0; i < o_.stop_strings.size() && !out_.stop_string; ++i) {
        const std::string& s = o_.stop_strings[i];
        if (text_.find(s, same >= s.size() ? same - s.size() + 1 : 0) != std::string::npos) out_.stop_string = i;
      }
      if (out_.stop_string && !stop) stop = StopReason::stop_string;
    }
    if (o_.on_token) {
      // The new bytes, whole characters only but on the last token; none while decode's text
      // does not begin with what was given (it changed bytes it gave before).
      std::string piece;
      if (text_.size() >= emitted_.size() && text_.compare(0, emitted_.size(), emitted_) == 0) {
        const std::size_t end = stop || last ? text_.size() : whole_end(text_, emitted_.size());
        piece = text_.substr(emitted_.size(), end - emitted_.size());
        emitted_ += piece;
      }
      if (!o_.on_token(id, piece) && !stop) stop = StopReason::callback;
    }
    std::swap(previous_, text_);
    if (stop) out_.stop = *stop;
    return stop.has_value();
  }

  // Sets out.text, decode of the new tokens.
  void finish() {
    if (!o_.decode) return;
    const auto from = out_.tokens.begin() + static_cast<std::ptrdiff_t>(out_.prompt_size);
    out_.text = decode_each_ ? previous_ : o_.decode(std::vector<std::int64_t>(from, out_.tokens.end()));
  }

 private:
  void see(std::int64_t id) {
    if (is_seen_[static_cast<std::size_t>(id)]) return;
    is_seen_[static_cast<std::size_t>(id)] = 1;
    seen_.push_back(id);
  }
  const GenerateOptions& o_;
  Generation& out_;
  const bool decode_each_;  // decoding after every token: for the stop strings and the pieces
  std::vector<char> is_seen_;
  std::vector<std::int64_t> seen_;
  std::vector<std::int64_t> fresh_;  // the generated ids, decode's input
  std::string text_, previous_;      // decode(fresh_) now and after the token before
  std::string emitted_;              // the pieces given to on_token so far
};

// The options every generate call checks before any work: sampling, stop tokens and strings.
void check_options(const GenerateOptions& opt, std::size_t V, const char* who) {
  check_sampling(opt, V, who);
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
}

// Every id of a prompt ("prompt" or "prompt 3" in errors), whatever max_len is: a bad id past the
// context would otherwise stay unnoticed.
void check_prompt(const std::vector<std::int64_t>& prompt, std::size_t V, const char* who, const std::string& name) {
  if (prompt.empty()) fail(who, ": the ", name, " is empty");
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= static_cast<std::int64_t>(V)) {
      fail(who, ": ", name, " token id ", prompt[i], " at position ", i, " of ", prompt.size(),
           " is outside the vocabulary [0, ", V, ")");
    }
  }
}

// The next token from logits (V): the most likely (greedy) or a draw.
std::int64_t pick(const float* logits, std::size_t V, const Continuation& row, const GenerateOptions& opt,
                  Generator& gen, const char* who, std::size_t step) {
  const Candidates c = candidates(logits, drawable(opt, V), row.seen(), opt, who, step);
  return opt.temperature == 0.f ? static_cast<std::int64_t>(c.order[0]) : draw(c, gen);
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
  const std::size_t V = logits.size();
  if (V == 0) fail(who, ": the logits are empty");
  check_sampling(options, V, who);
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
  const Candidates c = candidates(logits.data(), drawable(options, V), seen, options, who, std::nullopt);
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
  check_prompt(prompt, V, who, "prompt");
  check_options(opt, V, who);
  if (opt.window_keep >= max_len) {
    fail(who, ": window_keep ", opt.window_keep, " must be less than max_len ", max_len);
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
  Continuation row(opt, V, out);

  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  try {
    LanguageModelCache cache;
    // What the cache will hold at most: the tokens before the last, up to max_len.
    cache.reserve(count - 1 >= max_len ? max_len : std::min(max_len, tokens.size() + count - 1));
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
      const std::int64_t id = pick(run.logits.value().data() + (n - 1) * V, V, row, opt, gen, who, step);
      if (row.take(id, step + 1 == count)) break;
    }
    row.finish();
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

std::vector<Generation> LanguageModel::generate_batch(const std::vector<std::vector<std::int64_t>>& prompts,
                                                      std::size_t count, const GenerateOptions& opt,
                                                      Generator& given_gen) {
  const char* who = "LanguageModel::generate_batch";
  const std::size_t max_len = options_.max_len(), V = options_.vocab_size(), B = prompts.size();
  if (B == 0) fail(who, ": the batch has no prompts");
  std::size_t longest = 0;  // the row of the longest prompt
  for (std::size_t b = 0; b < B; ++b) {
    check_prompt(prompts[b], V, who, "prompt " + std::to_string(b));
    if (prompts[b].size() > prompts[longest].size()) longest = b;
  }
  check_options(opt, V, who);
  if (opt.on_token) {
    fail(who, ": on_token streams one sequence; generate each prompt alone to stream it");
  }
  const std::size_t L = prompts[longest].size();
  // Compared without L + count, which a count near SIZE_MAX would wrap.
  if (count > 0 && (L > max_len || count - 1 > max_len - L)) {
    char need[32];
    std::snprintf(need, sizeof need, "%.0f", static_cast<double>(L) + static_cast<double>(count) - 1);
    fail(who, ": prompt ", longest, " (", L, " tokens) and ", count, " new ones need ", need,
         " positions, more than max_len ", max_len, " (a batch does not slide its context)");
  }
  check_available_memory(
      static_cast<double>(B) * (static_cast<double>(L) + static_cast<double>(count)) * sizeof(std::int64_t), who,
      "holding the token ids of " + std::to_string(B) + " rows of up to " + std::to_string(L) + " prompt tokens and " +
          std::to_string(count) + " new ones");
  std::vector<Generation> outs(B);
  std::vector<Generator> streams;  // row b draws from streams[b]
  std::vector<Continuation> rows;
  for (std::size_t b = 0; b < B; ++b) {
    outs[b].prompt_size = prompts[b].size();
    outs[b].tokens.reserve(prompts[b].size() + count);
    outs[b].tokens = prompts[b];
    streams.push_back(opt.seed ? Generator(*opt.seed + b) : given_gen.spawn());
  }
  for (std::size_t b = 0; b < B; ++b) rows.emplace_back(opt, V, outs[b]);
  if (count == 0) return outs;

  // The prompts left-padded to L (padding id 0, which no query sees).
  IndexArray ids = xt::zeros<std::int64_t>({B, L});
  Mask padding = xt::ones<bool>({B, L});
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t pad = L - prompts[b].size();
    std::copy(prompts[b].begin(), prompts[b].end(), &ids(b, pad));
    std::fill_n(&padding(b, pad), prompts[b].size(), false);
  }
  // Hook points see whole contexts, as in generate.
  const bool use_cache = opt.use_cache && num_hooks() == 0;
  std::vector<std::size_t> live(B);  // the rows still generating, in batch order
  std::iota(live.begin(), live.end(), 0);

  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  try {
    LanguageModelCache cache;
    cache.reserve(L + count - 1);  // checked above: at most max_len
    for (std::size_t step = 0; step < count; ++step) {
      // Cached: the live rows' new tokens (the prompts at the first step); else their whole rows.
      const LanguageModelOutput run =
          use_cache ? forward_cached(ids, padding, cache, Attentions::none) : forward(ids, padding, Attentions::none);
      const std::size_t n = run.logits.shape()[1];
      std::vector<std::size_t> kept;  // indices into live of the rows that go on
      for (std::size_t i = 0; i < live.size(); ++i) {
        const std::size_t b = live[i];
        const float* logits = run.logits.value().data() + (i * n + n - 1) * V;
        const std::int64_t id = pick(logits, V, rows[b], opt, streams[b], who, step);
        if (!rows[b].take(id, step + 1 == count)) kept.push_back(i);
      }
      if (kept.empty() || step + 1 == count) break;
      // The next input: each live row's new token (cached) or its row grown by it.
      const std::size_t width = use_cache ? 1 : ids.shape()[1] + 1;
      IndexArray next = IndexArray::from_shape({kept.size(), width});
      Mask next_padding = Mask::from_shape({kept.size(), width});
      for (std::size_t j = 0; j < kept.size(); ++j) {
        const std::size_t i = kept[j];
        if (!use_cache) {
          std::copy_n(&ids(i, 0), width - 1, &next(j, 0));
          std::copy_n(&padding(i, 0), width - 1, &next_padding(j, 0));
        }
        next(j, width - 1) = outs[live[i]].tokens.back();
        next_padding(j, width - 1) = false;
      }
      if (use_cache && kept.size() < live.size()) cache.keep_rows(kept);
      std::vector<std::size_t> still(kept.size());
      for (std::size_t j = 0; j < kept.size(); ++j) still[j] = live[kept[j]];
      live = std::move(still);
      ids = std::move(next);
      padding = std::move(next_padding);
    }
    for (Continuation& row : rows) row.finish();
  } catch (...) {
    train(was_training);
    throw;
  }
  train(was_training);
  return outs;
}

}  // namespace xgrad::nn
