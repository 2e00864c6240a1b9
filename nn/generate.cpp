// LanguageModel's generation: the next token from the logits (temperature, top-k), and the
// context past max_len. Shapes: V vocabulary.
#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <numeric>
#include <string>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::nn {

namespace {

// The next token from the next-token logits `last` (V values).
std::int64_t pick_token(const float* last, std::size_t V, const GenerateOptions& opt, Generator& gen,
                        std::size_t step) {
  for (std::size_t i = 0; i < V; ++i) {
    if (std::isnan(last[i]) || last[i] == std::numeric_limits<float>::infinity()) {
      fail("LanguageModel::generate: the logit of token ", i, " is ", last[i], " at step ", step);
    }
  }
  if (opt.temperature == 0.f) return std::max_element(last, last + V) - last;  // the first of equal maxima
  std::vector<std::size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return last[a] > last[b]; });
  const std::size_t k = opt.top_k == 0 ? V : std::min(opt.top_k, V);
  // p_i = exp((l_i - l_max) / temperature) over the k most likely tokens
  std::vector<double> p(k);
  double total = 0;
  for (std::size_t i = 0; i < k; ++i) {
    const float l = last[order[i]];
    total += p[i] = std::isinf(l) ? 0.0 : std::exp((l - last[order[0]]) / opt.temperature);  // -inf: never picked
  }
  if (!(total > 0)) fail("LanguageModel::generate: every logit is -inf at step ", step);
  double u = static_cast<double>(gen.uniform()) * total;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < p[i]) return static_cast<std::int64_t>(order[i]);
    u -= p[i];
  }
  return static_cast<std::int64_t>(order[k - 1]);
}

IndexArray row_of(const std::vector<std::int64_t>& tokens, std::size_t begin, std::size_t end) {
  IndexArray ids = IndexArray::from_shape({1, end - begin});
  std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.begin() + static_cast<std::ptrdiff_t>(end),
            ids.begin());
  return ids;
}

}  // namespace

std::vector<std::int64_t> LanguageModel::generate(std::vector<std::int64_t> prompt, std::size_t count,
                                                  const GenerateOptions& opt, Generator& gen) {
  return generate_impl(std::move(prompt), count, opt, gen, false).tokens;
}

Generation LanguageModel::generate_with_attention(std::vector<std::int64_t> prompt, std::size_t count,
                                                  const GenerateOptions& opt, Generator& gen) {
  return generate_impl(std::move(prompt), count, opt, gen, true);
}

Generation LanguageModel::generate_impl(std::vector<std::int64_t> prompt, std::size_t count, const GenerateOptions& opt,
                                        Generator& gen, bool keep_attention) {
  const std::size_t max_len = options_.max_len(), V = options_.vocab_size();
  const char* who = keep_attention ? "LanguageModel::generate_with_attention" : "LanguageModel::generate";
  if (prompt.empty()) fail(who, ": the prompt is empty");
  if (!(opt.temperature >= 0.f)) {  // +inf is allowed: uniform over the top-k tokens
    fail(who, ": temperature ", opt.temperature, " must be a number >= 0");
  }
  if (opt.window_keep >= max_len) {
    fail(who, ": window_keep ", opt.window_keep, " must be less than max_len ", max_len);
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
      fail("LanguageModel::generate_with_attention: no memory for ", shape);
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
      tokens.push_back(pick_token(run.logits.value().data() + (n - 1) * V, V, opt, gen, step));
    }
  } catch (...) {
    train(was_training);
    throw;
  }
  train(was_training);
  return out;
}

}  // namespace xgrad::nn
