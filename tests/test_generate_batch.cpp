// Batched generation: forward_cached with a key-padding mask against each row alone, rows that
// leave the cache, generate_batch's rows against generate's (greedy, sampled, stopping on their
// own, cached and uncached), and its refusals; the KVCache's turned keys and positions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using Tokens = std::vector<std::int64_t>;

namespace {

// Families whose positions reach the cache differently: learned (absolute), RoPE with grouped-query
// attention, and RoPE with a sliding window that drops keys from the cache.
std::vector<std::pair<std::string, nn::LanguageModelOptions>> families() {
  return {
      {"gpt2", nn::LanguageModelOptions::gpt2_style(23, 16, 4, 2).max_len(16).dropout(0.f)},
      {"llama", nn::LanguageModelOptions::llama_style(23, 16, 4, 2, 2).max_len(16).dropout(0.f)},
      {"mistral", nn::LanguageModelOptions::llama_style(23, 16, 4, 2, 2).max_len(16).dropout(0.f).sliding_window(3)},
  };
}

const std::vector<Tokens> kPrompts = {{3, 1, 4, 1, 5}, {9}, {2, 6, 5}, {3, 5, 8, 9, 7, 9, 3}};

IndexArray row(const Tokens& t) {
  IndexArray ids = IndexArray::from_shape({1, t.size()});
  std::copy(t.begin(), t.end(), ids.begin());
  return ids;
}

// (B, 1): one id per row.
IndexArray column(const Tokens& t) {
  IndexArray ids = IndexArray::from_shape({t.size(), 1});
  std::copy(t.begin(), t.end(), ids.begin());
  return ids;
}

// (rows.size(), n) from rows of n ids.
IndexArray rows_of(const std::vector<Tokens>& rows) {
  IndexArray ids = IndexArray::from_shape({rows.size(), rows[0].size()});
  for (std::size_t b = 0; b < rows.size(); ++b) std::copy(rows[b].begin(), rows[b].end(), &ids(b, 0));
  return ids;
}

// A copy to change option by option (the setters change the options they are called on).
nn::MultiHeadAttentionOptions copy(const nn::MultiHeadAttentionOptions& o) { return o; }

float max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  return xt::amax(xt::abs(a - b))();
}

// The prompts left-padded to the longest, and their padding marks.
std::pair<IndexArray, Mask> left_padded(const std::vector<Tokens>& prompts) {
  std::size_t L = 0;
  for (const Tokens& p : prompts) L = std::max(L, p.size());
  IndexArray ids = xt::zeros<std::int64_t>({prompts.size(), L});
  Mask pad = xt::ones<bool>({prompts.size(), L});
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const std::size_t first = L - prompts[b].size();
    for (std::size_t t = 0; t < prompts[b].size(); ++t) ids(b, first + t) = prompts[b][t], pad(b, first + t) = false;
  }
  return {ids, pad};
}

}  // namespace

TEST_CASE("forward_cached with a key-padding mask gives each left-padded row its logits alone",
          "[nn][generate][batch][cache][gemm]") {
  for (const auto& [name, options] : families()) {
    SECTION(name) {
      const auto lm = testing::randomized_lm(options, 11);
      NoGradGuard no_grad;
      const auto [ids, pad] = left_padded(kPrompts);
      const std::size_t L = ids.shape()[1];
      nn::LanguageModelCache cache;
      const Array prompt_logits =
          lm->forward_cached(ids, pad, cache, nn::Attentions::none, nn::Logits::all).logits.value();
      // Three more tokens, one per step, the same for every row; each row alone runs whole.
      const Tokens extra = {7, 2, 11};
      std::vector<Array> step_logits;
      for (const std::int64_t id : extra) {
        IndexArray next = IndexArray::from_shape({kPrompts.size(), 1});
        next.fill(id);
        step_logits.push_back(lm->forward_cached(next, cache, nn::Attentions::none).logits.value());
      }
      CHECK(cache.length() == L + extra.size());
      for (std::size_t b = 0; b < kPrompts.size(); ++b) {
        Tokens all = kPrompts[b];
        all.insert(all.end(), extra.begin(), extra.end());
        const Array alone = lm->forward(row(all), nn::Attentions::none).logits.value();
        const std::size_t n = kPrompts[b].size();
        const Array batched = xt::view(prompt_logits, xt::range(b, b + 1), xt::range(L - n, L), xt::all());
        CHECK(max_abs_diff(batched, xt::view(alone, xt::all(), xt::range(0, n), xt::all())) < 1e-5f);
        for (std::size_t s = 0; s < extra.size(); ++s) {
          const Array got = xt::view(step_logits[s], xt::range(b, b + 1), xt::all(), xt::all());
          CHECK(max_abs_diff(got, xt::view(alone, xt::all(), xt::range(n + s, n + s + 1), xt::all())) < 1e-5f);
        }
      }
    }
  }
}

TEST_CASE("forward_cached gives each row's last logits unless asked for all", "[nn][generate][cache][gemm]") {
  const auto lm = testing::randomized_lm(families()[1].second, 17);
  NoGradGuard no_grad;
  const auto [ids, pad] = left_padded(kPrompts);
  nn::LanguageModelCache last_only, all, unpadded;
  const Array last = lm->forward_cached(ids, pad, last_only, nn::Attentions::none).logits.value();
  const Array every = lm->forward_cached(ids, pad, all, nn::Attentions::none, nn::Logits::all).logits.value();
  REQUIRE(last.shape() == Shape{4, 1, 23});
  REQUIRE(every.shape() == Shape{4, 7, 23});
  CHECK(max_abs_diff(last, xt::view(every, xt::all(), xt::range(6, 7), xt::all())) < 1e-6f);
  const Array one = lm->forward_cached(row(kPrompts[3]), unpadded).logits.value();
  REQUIRE(one.shape() == Shape{1, 1, 23});
  CHECK(max_abs_diff(one, xt::view(every, xt::range(3, 4), xt::range(6, 7), xt::all())) < 1e-5f);
}

TEST_CASE("keep_rows continues the rows it keeps, in its order", "[nn][generate][batch][cache][gemm]") {
  const auto lm = testing::randomized_lm(families()[1].second, 12);
  NoGradGuard no_grad;
  const auto [ids, pad] = left_padded(kPrompts);
  nn::LanguageModelCache all, some;
  lm->forward_cached(ids, pad, all, nn::Attentions::none);
  lm->forward_cached(ids, pad, some, nn::Attentions::none);
  some.keep_rows({3, 0});
  const IndexArray next = column({4, 4, 4, 4});
  const Array full = lm->forward_cached(next, all, nn::Attentions::none).logits.value();
  const Array kept = lm->forward_cached(column({4, 4}), some, nn::Attentions::none).logits.value();
  CHECK(max_abs_diff(xt::view(kept, 0), xt::view(full, 3)) < 1e-6f);
  CHECK(max_abs_diff(xt::view(kept, 1), xt::view(full, 0)) < 1e-6f);
  REQUIRE_THROWS_WITH(some.keep_rows({2}), Contains("LanguageModelCache::keep_rows: row 2 is outside the batch of 2"));
  CHECK(some.blocks[0].keys().shape()[0] == 2);
}

TEST_CASE("generate_batch: every row is what generate gives it alone, stopping on its own",
          "[nn][generate][batch][gemm]") {
  for (const auto& [name, options] : families()) {
    SECTION(name) {
      const auto lm = testing::randomized_lm(options, 13);
      const std::size_t count = 8;
      nn::GenerateOptions greedy;
      greedy.temperature = 0.f;
      std::vector<Tokens> alone;
      for (const Tokens& p : kPrompts) alone.push_back(lm->generate(p, count, greedy));
      // Row 2 stops at its third new token or earlier (and any row meeting that id stops there too).
      nn::GenerateOptions stopping = greedy;
      stopping.stop_tokens = {alone[2][kPrompts[2].size() + 2]};
      for (const bool cached : {true, false}) {
        stopping.use_cache = greedy.use_cache = cached;
        const std::vector<nn::Generation> plain = lm->generate_batch(kPrompts, count, greedy);
        const std::vector<nn::Generation> stopped = lm->generate_batch(kPrompts, count, stopping);
        REQUIRE(plain.size() == kPrompts.size());
        for (std::size_t b = 0; b < kPrompts.size(); ++b) {
          INFO(name << (cached ? " cached" : " uncached") << ", row " << b);
          CHECK(plain[b].tokens == alone[b]);
          CHECK(plain[b].prompt_size == kPrompts[b].size());
          CHECK(plain[b].stop == nn::StopReason::length);
          CHECK(stopped[b].tokens == lm->generate(kPrompts[b], count, stopping));
        }
        // Row 2 ends at the first of its new tokens that is the stop token, at the third at the latest.
        const auto first_stop =
            std::find(alone[2].begin() + kPrompts[2].size(), alone[2].end(), stopping.stop_tokens[0]);
        CHECK(stopped[2].stop == nn::StopReason::stop_token);
        CHECK(stopped[2].tokens.size() == static_cast<std::size_t>(first_stop - alone[2].begin()) + 1);
        CHECK(stopped[2].tokens.size() <= kPrompts[2].size() + 3);
      }
    }
  }
}

TEST_CASE("generate_batch samples row b as generate does with seed + b", "[nn][generate][batch][gemm]") {
  const auto lm = testing::randomized_lm(families()[1].second, 14);
  nn::GenerateOptions sampled;
  sampled.temperature = 1.5f;
  sampled.top_p = 0.9f;
  sampled.repetition_penalty = 1.3f;
  sampled.seed = 40;
  const std::vector<nn::Generation> batch = lm->generate_batch(kPrompts, 9, sampled);
  for (std::size_t b = 0; b < kPrompts.size(); ++b) {
    nn::GenerateOptions one = sampled;
    one.seed = 40 + b;
    CHECK(batch[b].tokens == lm->generate(kPrompts[b], 9, one));
  }
  CHECK(batch[0].tokens != batch[3].tokens);
  // Without a seed: one stream spawned per row from the generator given, so the same generator
  // state gives the same batch.
  sampled.seed.reset();
  Generator a(5), b(5);
  const auto first = lm->generate_batch(kPrompts, 6, sampled, a), second = lm->generate_batch(kPrompts, 6, sampled, b);
  for (std::size_t r = 0; r < kPrompts.size(); ++r) CHECK(first[r].tokens == second[r].tokens);
}

TEST_CASE("generate_batch stops each row on its stop string and decodes its text", "[nn][generate][batch][gemm]") {
  const auto lm = testing::randomized_lm(families()[0].second, 15);
  nn::GenerateOptions o;
  o.temperature = 0.f;
  // Each id as a letter: the text is the ids spelled a, b, c, ...
  o.decode = [](const Tokens& ids) {
    std::string s;
    for (const std::int64_t id : ids) s += static_cast<char>('a' + id);
    return s;
  };
  const std::vector<nn::Generation> plain = lm->generate_batch(kPrompts, 6, o);
  // Row 1's second and third letters as the stop string: row 1 stops at its third token at the latest.
  o.stop_strings = {plain[1].text.substr(1, 2)};
  const std::vector<nn::Generation> stopped = lm->generate_batch(kPrompts, 6, o);
  for (std::size_t b = 0; b < kPrompts.size(); ++b) {
    INFO("row " << b);
    CHECK(stopped[b].tokens == lm->generate(kPrompts[b], 6, o));
    CHECK(stopped[b].text == o.decode(Tokens(stopped[b].tokens.begin() + kPrompts[b].size(), stopped[b].tokens.end())));
  }
  CHECK(stopped[1].stop == nn::StopReason::stop_string);
  CHECK(stopped[1].stop_string == std::size_t{0});
  CHECK(stopped[1].tokens.size() <= kPrompts[1].size() + 3);
}

TEST_CASE("bad input: generate_batch and padded forward_cached name what they refuse, and change nothing",
          "[nn][generate][batch][bad_input][gemm]") {
  const auto lm = testing::randomized_lm(families()[2].second, 16);
  const std::string who = "LanguageModel::generate_batch: ";
  CHECK_THROWS_WITH(lm->generate_batch({}, 3), Contains(who + "the batch has no prompts"));
  CHECK_THROWS_WITH(lm->generate_batch({{1}, {}}, 3), Contains(who + "the prompt 1 is empty"));
  CHECK_THROWS_WITH(lm->generate_batch({{1}, {2, 23}}, 3),
                    Contains(who + "prompt 1 token id 23 at position 1 of 2 is outside the vocabulary [0, 23)"));
  // The longest prompt and the new tokens must fit in max_len 16: 7 + 10 - 1 = 16 fits, 11 does not.
  CHECK_NOTHROW(lm->generate_batch(kPrompts, 10));
  CHECK_THROWS_WITH(lm->generate_batch(kPrompts, 11),
                    Contains(who + "prompt 3 (7 tokens) and 11 new ones need 17 positions, more than max_len 16"));
  // A count near SIZE_MAX does not wrap the sum into a small one.
  CHECK_THROWS_WITH(lm->generate_batch(kPrompts, SIZE_MAX),
                    Contains(who + "prompt 3 (7 tokens) and 18446744073709551615 new ones need ") &&
                        Contains("positions, more than max_len 16"));
  nn::GenerateOptions o;
  o.on_token = [](std::int64_t, const std::string&) { return true; };
  CHECK_THROWS_WITH(lm->generate_batch(kPrompts, 2, o), Contains(who + "on_token streams one sequence"));
  o = {};
  o.top_p = 0.f;
  CHECK_THROWS_WITH(lm->generate_batch(kPrompts, 2, o), Contains(who + "top_p 0 must be in (0, 1]"));
  o = {};
  o.stop_strings = {"x"};
  CHECK_THROWS_WITH(lm->generate_batch(kPrompts, 2, o), Contains(who + "stop_strings needs decode"));

  NoGradGuard no_grad;
  const std::string fc = "LanguageModel::forward_cached: ";
  nn::LanguageModelCache cache;
  const auto [ids, pad] = left_padded(kPrompts);
  CHECK_THROWS_WITH(lm->forward_cached(ids, Mask(xt::zeros<bool>({4, 2})), cache),
                    Contains(fc + "key_padding_mask of shape (4, 2) does not match ids of shape (4, 7)"));
  CHECK(cache.length() == 0);
  CHECK_FALSE(cache.padding.has_value());
  CHECK_THROWS_WITH(lm->forward_cached(ids, pad, cache, nn::Attentions::none, static_cast<nn::Logits>(7)),
                    Contains("LanguageModel: unknown Logits 7 (all or last)"));
  CHECK(cache.length() == 0);
  CHECK_FALSE(cache.padding.has_value());
  // With a sliding window, padding after a real token is refused (the window counts keys by index).
  Mask gap = pad;
  gap(0, 5) = true;
  CHECK_THROWS_WITH(lm->forward_cached(ids, gap, cache),
                    Contains(fc + "row 0 has padding at position 5 after a real token; with sliding_window 3"));
  CHECK(cache.length() == 0);
  lm->forward_cached(ids, pad, cache);
  const Array held = cache.blocks[0].keys().value();
  CHECK_THROWS_WITH(lm->forward_cached(column({1, 2}), Mask(xt::zeros<bool>({2, 1})), cache),
                    Contains(fc + "the cache holds 4 rows, ids have 2"));
  CHECK_THROWS_WITH(lm->forward_cached(column({1, 1, 1, 1}), Mask(xt::ones<bool>({4, 1})), cache),
                    Contains(fc + "row 0 has padding at position 7 after a real token"));
  CHECK(cache.length() == 7);
  CHECK(cache.padding->shape()[1] == 7);
  const bool same = cache.blocks[0].keys().value() == held;
  CHECK(same);
  // A cache filled without a mask continues only without one.
  nn::LanguageModelCache plain;
  lm->forward_cached(row({1, 2}), plain);
  CHECK_THROWS_WITH(lm->forward_cached(row({3}), Mask(xt::zeros<bool>({1, 1})), plain),
                    Contains(fc + "the cache was filled without a key_padding_mask (2 positions held)"));
  CHECK(plain.length() == 2);
}

// Two rows of three positions and a fourth, at positions given per row, and a rotary attention's
// options of width 8: the inputs of the KVCache tests below.
struct RotaryCase {
  Generator gen{4};
  Tensor x{gen.normal({2, 3, 8}, 0.f, 1.f)}, y{gen.normal({2, 1, 8}, 0.f, 1.f)};
  IndexArray positions = rows_of({{5, 6, 7}, {0, 1, 2}}), next = column({8, 3});
  nn::MultiHeadAttentionOptions plain = nn::MultiHeadAttentionOptions(8, 2).rotary(true).dropout(0.f);
};

// A cached step of `attn` at positions `next` after x at `positions` (both (2, n)) against one
// forward over both at those positions: the step's output is the whole's last position.
float step_against_whole(const nn::MultiHeadAttention& attn, const Tensor& x, const Tensor& y,
                         const IndexArray& positions, const IndexArray& next, nn::KVCache& cache) {
  attn.forward(x, nn::AttentionMask{}, &cache, &positions);
  const Array stepped = attn.forward(y, nn::AttentionMask{}, &cache, &next).output.value();
  const IndexArray all = IndexArray(xt::concatenate(xt::xtuple(positions, next), 1));
  nn::AttentionMask causal;
  causal.causal = true;
  const Array whole = attn.forward(concat({x, y}, 1), causal, nullptr, &all).output.value();
  return max_abs_diff(stepped, xt::view(whole, xt::all(), xt::range(3, 4), xt::all()));
}

TEST_CASE("a KVCache holds keys turned once at the positions given, or with dynamic scaling turns them again",
          "[nn][arch][rotary][cache][gemm]") {
  RotaryCase c;
  auto& [gen, x, y, positions, next, plain] = c;
  NoGradGuard no_grad;
  const nn::MultiHeadAttention turning(plain, gen);
  nn::KVCache turned;
  CHECK(step_against_whole(turning, x, y, positions, next, turned) < 1e-5f);
  CHECK(turned.turned);
  CHECK_FALSE(turned.positions.has_value());
  // Dynamic scaling past its trained context (4): the keys are turned again by the longer length.
  const nn::MultiHeadAttention dynamic(
      copy(plain).rope_scaling(RopeScaling{RopeScaling::Type::dynamic, 2.f, 1.f, 4.f, 4}), gen);
  nn::KVCache unturned;
  CHECK(step_against_whole(dynamic, x, y, positions, next, unturned) < 1e-5f);
  CHECK_FALSE(unturned.turned);
  const bool stored = *unturned.positions == IndexArray(xt::concatenate(xt::xtuple(positions, next), 1));
  CHECK(stored);
}

TEST_CASE("bad input: a KVCache continues only in an attention that holds keys alike, and with positions alike",
          "[nn][arch][rotary][cache][bad_input][gemm]") {
  RotaryCase c;
  auto& [gen, x, y, positions, next, plain] = c;
  NoGradGuard no_grad;
  const nn::MultiHeadAttention turning(plain, gen), unrotated(copy(plain).rotary(false), gen);
  nn::KVCache turned;
  turning.forward(x, nn::AttentionMask{}, &turned);
  CHECK_THROWS_WITH(unrotated.forward(y, nn::AttentionMask{}, &turned),
                    Contains("MultiHeadAttention: the KVCache holds keys turned by RoPE, and this attention caches "
                             "them unturned"));
  CHECK(turned.length() == 3);
  const nn::MultiHeadAttention dynamic(
      copy(plain).rope_scaling(RopeScaling{RopeScaling::Type::dynamic, 2.f, 1.f, 4.f, 4}), gen);
  nn::KVCache given, counted;
  dynamic.forward(x, nn::AttentionMask{}, &given, &positions);
  dynamic.forward(x, nn::AttentionMask{}, &counted);
  CHECK_THROWS_WITH(
      dynamic.forward(y, nn::AttentionMask{}, &given),
      Contains("MultiHeadAttention: a KVCache filled with positions needs them at every step (3 positions "
               "held; dynamic rope scaling"));
  CHECK_THROWS_WITH(dynamic.forward(y, nn::AttentionMask{}, &counted, &next),
                    Contains("MultiHeadAttention: positions are given with a KVCache filled without them"));
  CHECK(given.length() == 3);
  CHECK(counted.length() == 3);
}
