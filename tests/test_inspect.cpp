// The inspection library (inspect/): activation caches, activation patching, the logit lens
// and the head statistics and detectors, on small models and on hand-made attention patterns.
//
// Shapes: B batch, T length, C d_model, H heads, V vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <xtensor/xsort.hpp>
#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/head_patterns.hpp"
#include "xgrad/inspect/logit_lens.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/inspect/svg.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;

namespace {

IndexArray random_ids(std::size_t B, std::size_t T, std::size_t V, std::uint64_t seed) {
  Generator gen(seed);
  IndexArray ids = IndexArray::from_shape({B, T});
  for (auto& id : ids) id = static_cast<std::int64_t>(gen.next_u64() % V);
  return ids;
}

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("an activation cache keeps every default point of one forward and changes nothing", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 3);
  const IndexArray ids = random_ids(2, 8, 11, 4);
  const Array plain = model->forward(ids).logits.value();
  Array logits;
  const ActivationCache cache = cache_activations(*model, [&] { logits = model->forward(ids).logits.value(); });
  REQUIRE(same_bits(logits, plain));
  REQUIRE(same_bits(cache.at("logits"), plain));
  REQUIRE(model->num_hooks() == 0);

  const std::vector<std::string> names = cache.names();
  REQUIRE(names.front() == "tok_embed");
  REQUIRE(names.back() == "logits");
  for (const char* expected : {"blocks.0.stream_in", "blocks.0.attn.pattern", "blocks.1.attn.context",
                               "blocks.1.ffn.hidden", "blocks.1.ffn.residual.out", "blocks.1.stream_out"}) {
    INFO(expected);
    REQUIRE(cache.has(expected));
  }
  for (const std::string& name : names) {
    INFO(name);
    REQUIRE(default_points(name));
  }
  REQUIRE_FALSE(cache.has("blocks.0.attn.scores"));
  REQUIRE_FALSE(cache.has("blocks.0.attn.result"));  // formed on request only
  REQUIRE(cache.has("blocks.0.attn.z"));
  REQUIRE_FALSE(cache.has("blocks.0.attn.residual.skip"));
  REQUIRE(cache.at("blocks.0.attn.pattern").shape() == Shape{2, 2, 8, 8});
  REQUIRE(cache.bytes() > plain.size() * sizeof(float));

  SECTION("a filter chooses the points, scores included when asked") {
    const ActivationCache some = cache_activations(
        *model, [&] { model->forward(ids); }, points_ending_with({"scores", "pattern"}));
    REQUIRE(some.names() == std::vector<std::string>{"blocks.0.attn.scores", "blocks.0.attn.pattern",
                                                     "blocks.1.attn.scores", "blocks.1.attn.pattern"});
    REQUIRE(same_bits(some.at("blocks.1.attn.pattern"), cache.at("blocks.1.attn.pattern")));
    // softmax of the cached scores under the causal mask is the cached pattern
    const Array& scores = some.at("blocks.0.attn.scores");
    const Array& pattern = some.at("blocks.0.attn.pattern");
    for (std::size_t t = 0; t < 8; ++t) {
      double z = 0;
      for (std::size_t s = 0; s <= t; ++s) z += std::exp(scores(1, 1, t, s) - scores(1, 1, t, 0));
      REQUIRE(pattern(1, 1, t, 0) == Approx(1.0 / z).epsilon(1e-5));
    }
  }
  SECTION("bad uses are refused with the point named") {
    REQUIRE_THROWS_WITH(cache.at("blocks.9.attn.pattern"),
                        Contains("ActivationCache: no point named 'blocks.9.attn.pattern'"));
    REQUIRE_THROWS_WITH(cache_activations(
                            *model, [&] { model->forward(ids); }, [](const std::string&) { return false; }),
                        Contains("cache_activations: the filter accepts none"));
    REQUIRE_THROWS_WITH(cache_activations(
                            *model,
                            [&] {
      model->forward(ids);
      model->forward(ids);
                            }),
                        Contains("cache_activations: point 'tok_embed' was reached more than once"));
    REQUIRE_THROWS_WITH(cache_activations(*model, {}), Contains("cache_activations: no function"));
    ActivationCache mine;
    mine.insert("x", Array{1.f});
    REQUIRE_THROWS_WITH(mine.insert("x", Array{2.f}), Contains("'x' is already held"));
    REQUIRE(model->num_hooks() == 0);  // a failed run leaves no hook behind
  }
}

TEST_CASE("a cache that stops after its last point holds the same values, and the rest of the run never happens",
          "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 21);
  const IndexArray ids = random_ids(2, 8, 11, 22);
  const ActivationCache full = cache_activations(*model, [&] { model->forward(ids); });
  std::size_t logits_reached = 0;
  nn::HookHandle count = model->add_forward_hook("logits", [&](const Tensor&) {
    ++logits_reached;
    return Tensor();
  });
  bool after_forward = false;
  const ActivationCache some = cache_activations(
      *model,
      [&] {
    model->forward(ids);
    after_forward = true;
      },
      points_named({"blocks.0.attn.pattern", "blocks.0.stream_mid"}), true);
  REQUIRE(some.names() == std::vector<std::string>{"blocks.0.attn.pattern", "blocks.0.stream_mid"});
  for (const std::string& n : some.names()) REQUIRE(same_bits(some.at(n), full.at(n)));
  REQUIRE(logits_reached == 0);
  REQUIRE_FALSE(after_forward);
  REQUIRE(model->num_hooks() == 1);  // only the counter: the cache's hooks are gone
  // The model runs as before; a cached generation step that was cut short appended nothing.
  model->forward(ids);
  REQUIRE(logits_reached == 1);
  nn::LanguageModelCache kv;
  cache_activations(
      *model, [&] { model->forward_cached(ids, kv); }, points_named({"blocks.0.stream_in"}), true);
  REQUIRE(kv.length() == 0);
  model->forward_cached(ids, kv);
  REQUIRE(kv.length() == 8);
}

TEST_CASE("cache_generation records every step of generate, and generate chooses what the cached logits say",
          "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm().max_len(16), 23);
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  Generator g1(0), g2(0);
  const std::vector<std::int64_t> prompt = {1, 2, 3, 4};
  const std::vector<std::int64_t> plain = model->generate(prompt, 5, greedy, g1);
  const GenerationCache run =
      cache_generation(*model, prompt, 5, greedy, g2, points_named({"blocks.0.attn.k", "logits"}));
  REQUIRE(run.tokens == plain);
  REQUIRE(run.steps.size() == 5);
  REQUIRE(model->num_hooks() == 0);
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    INFO("step " << i);
    const Array& logits = run.steps[i].at("logits");
    // generate runs without its KV cache while hooks are attached: each step sees the whole context
    const std::size_t n = prompt.size() + i;
    REQUIRE(logits.shape() == Shape{1, n, 11});
    REQUIRE(run.steps[i].at("blocks.0.attn.k").shape()[1] == n);
    const float* last = &logits(0, n - 1, 0);
    REQUIRE(static_cast<std::int64_t>(std::max_element(last, last + 11) - last) == plain[prompt.size() + i]);
  }
  REQUIRE_THROWS_WITH(cache_generation(*model, prompt, 2, greedy, g2, [](const std::string&) { return false; }),
                      Contains("cache_generation: the filter accepts none"));
}

TEST_CASE("patching a run with its own cache is bit-exact, whole points, heads and positions alike", "[gemm]") {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    auto model = testing::randomized_lm(testing::small_lm().norm(norm), 5);
    const IndexArray ids = random_ids(3, 8, 11, 6);
    const Array plain = model->forward(ids).logits.value();
    const ActivationCache cache = cache_activations(*model, [&] { model->forward(ids); });
    std::vector<Patch> everything;
    for (const std::string& name : cache.names()) everything.push_back({name, {}, {}});
    std::vector<Patch> parts = {{"blocks.0.attn.context", 1, {}}, {"blocks.0.attn.pattern", 0, 3},
                                {"blocks.1.attn.q", 1, 2},        {"blocks.1.stream_mid", {}, 7},
                                {"blocks.1.attn.v", 0, {}},       {"blocks.0.attn.pattern", {}, 0}};
    for (const auto& patches : {everything, parts}) {
      const PatchSet patched(*model, cache, patches);
      REQUIRE(same_bits(model->forward(ids).logits.value(), plain));
    }
    REQUIRE(model->num_hooks() == 0);
  }
}

TEST_CASE("patching copies exactly the chosen region from the other run", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 7);
  const IndexArray clean = random_ids(2, 8, 11, 8);
  IndexArray corrupt = clean;
  corrupt(0, 2) = (corrupt(0, 2) + 1) % 11;
  corrupt(1, 5) = (corrupt(1, 5) + 3) % 11;
  const ActivationCache source = cache_activations(*model, [&] { model->forward(clean); });
  const ActivationCache target = cache_activations(*model, [&] { model->forward(corrupt); });

  SECTION("the last stream restores the clean logits") {
    const PatchSet patched(*model, source, {{"blocks.1.stream_out", {}, {}}});
    REQUIRE(same_bits(model->forward(corrupt).logits.value(), source.at("logits")));
  }
  SECTION("one head at one position") {
    const std::string point = "blocks.1.attn.context";  // (B, T, C), head h is columns 4h..4h+3
    const PatchSet patched(*model, source, {{point, 1, 6}});
    const ActivationCache seen = cache_activations(
        *model, [&] { model->forward(corrupt); }, points_ending_with({"1.attn.context"}));
    const Array& got = seen.at(point);
    const Array& from = source.at(point);
    const Array& own = target.at(point);
    std::size_t copied = 0;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t t = 0; t < 8; ++t)
        for (std::size_t c = 0; c < 8; ++c) {
          const bool in = t == 6 && c >= 4;
          INFO("(" << b << ", " << t << ", " << c << ")");
          REQUIRE(got(b, t, c) == (in ? from(b, t, c) : own(b, t, c)));
          copied += in && from(b, t, c) != own(b, t, c);
        }
    REQUIRE(copied > 0);  // the two runs differ there, so the test can see the copy
  }
  SECTION("one query of the pattern, every head") {
    const std::string point = "blocks.0.attn.pattern";  // (B, H, T, S): the position is the query axis
    const PatchSet patched(*model, source, {{point, {}, 2}});
    const ActivationCache seen = cache_activations(
        *model, [&] { model->forward(corrupt); }, points_ending_with({"0.attn.pattern"}));
    const Array& got = seen.at(point);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t t = 0; t < 8; ++t)
          for (std::size_t k = 0; k < 8; ++k) {
            INFO("(" << b << ", " << h << ", " << t << ", " << k << ")");
            REQUIRE(got(b, h, t, k) == (t == 2 ? source.at(point) : target.at(point))(b, h, t, k));
          }
    const bool differs = xt::view(source.at(point), 0, xt::all(), 2) != xt::view(target.at(point), 0, xt::all(), 2);
    REQUIRE(differs);  // the corrupted token changes query 2's row in sequence 0, so the copy is visible
  }
  SECTION("a head of the pattern, all queries") {
    const PatchSet patched(*model, source, {{"blocks.0.attn.pattern", 0, {}}});
    const ActivationCache seen = cache_activations(
        *model, [&] { model->forward(corrupt); }, points_ending_with({"0.attn.pattern"}));
    const Array& got = seen.at("blocks.0.attn.pattern");
    const bool head0_from_source =
        xt::view(got, xt::all(), 0) == xt::view(source.at("blocks.0.attn.pattern"), xt::all(), 0);
    const bool head1_own = xt::view(got, xt::all(), 1) == xt::view(target.at("blocks.0.attn.pattern"), xt::all(), 1);
    REQUIRE(head0_from_source);
    REQUIRE(head1_own);
  }
  SECTION("unpatched parts keep their gradient, patched parts get none") {
    model->zero_grad();
    const PatchSet patched(*model, source, {{"blocks.0.attn.pattern", {}, {}}});
    Tensor loss = model->loss(corrupt, clean);
    loss.backward();
    // the whole pattern of layer 0 is a constant now: no gradient reaches its queries and keys
    const Tensor w_q = model->parameter("blocks.0.attn.w_q.weight");
    const bool no_query_gradient = !w_q.has_grad() || xt::all(xt::equal(w_q.grad(), 0.f));
    const bool value_gradient = xt::any(xt::not_equal(model->parameter("blocks.0.attn.w_v.weight").grad(), 0.f));
    REQUIRE(no_query_gradient);
    REQUIRE(value_gradient);
  }
}

TEST_CASE("patching refuses what it cannot do, naming the point", "[gemm]") {
  auto model = testing::randomized_lm(testing::small_lm(), 9);
  const IndexArray ids = random_ids(2, 8, 11, 10);
  const ActivationCache cache = cache_activations(*model, [&] { model->forward(ids); });
  REQUIRE_THROWS_WITH(PatchSet(*model, cache, {}), Contains("PatchSet: no patches"));
  REQUIRE_THROWS_WITH(PatchSet(*model, cache, {{"blocks.2.attn.q", {}, {}}}),
                      Contains("no hook point 'blocks.2.attn.q'"));
  REQUIRE_THROWS_WITH(PatchSet(*model, cache, {{"blocks.0.attn.scores", {}, {}}}),
                      Contains("source cache holds no point 'blocks.0.attn.scores'"));
  REQUIRE_THROWS_WITH(PatchSet(*model, cache, {{"blocks.0.stream_mid", 0, {}}}),
                      Contains("point 'blocks.0.stream_mid' has no heads"));
  REQUIRE_THROWS_WITH(PatchSet(*model, cache, {{"blocks.0.attn.k", 2, {}}}),
                      Contains("head 2 at point 'blocks.0.attn.k', whose attention has 2 key/value heads"));
  {
    const PatchSet far(*model, cache, {{"blocks.0.attn.k", {}, 8}});
    REQUIRE_THROWS_WITH(model->forward(ids),
                        Contains("position 8 is outside point 'blocks.0.attn.k' of shape (2, 8, 8)"));
  }
  {
    const PatchSet other_batch(*model, cache, {{"blocks.0.attn.k", {}, {}}});
    REQUIRE_THROWS_WITH(
        model->forward(random_ids(3, 8, 11, 11)),
        Contains("point 'blocks.0.attn.k' has shape (3, 8, 8) in this run but (2, 8, 8) in the source cache"));
  }
  REQUIRE(model->num_hooks() == 0);
}

TEST_CASE("the logit lens reads the stream after each block, and its last entry is the model's own output", "[gemm]") {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    auto model = testing::randomized_lm(testing::small_lm().norm(norm), 12);
    model->train();
    const IndexArray ids = random_ids(2, 8, 11, 13), targets = random_ids(2, 8, 11, 14);
    const std::vector<LensLayer> lens = logit_lens(*model, ids, targets, 3);
    REQUIRE(model->is_training());  // the mode is restored
    REQUIRE(lens.size() == 3);
    REQUIRE(lens[0].point == "embed");
    REQUIRE(lens[2].point == "blocks.1.stream_out");
    model->eval();
    REQUIRE(lens[2].loss == static_cast<double>(model->loss(ids, targets).value()()));
    REQUIRE(lens[0].loss != lens[2].loss);
    const Array logits = model->forward(ids).logits.value();
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t t = 0; t < 8; ++t) {
        const auto row = xt::view(logits, b, t, xt::all());
        REQUIRE(lens[2].top(b, t, 0) == static_cast<std::int64_t>(xt::argmax(row)()));
        REQUIRE(lens[2].top_prob(b, t, 0) >= lens[2].top_prob(b, t, 1));
        REQUIRE(lens[2].top_prob(b, t, 1) >= lens[2].top_prob(b, t, 2));
        const float top = xt::amax(row)();
        double z = 0;
        for (float x : row) z += std::exp(static_cast<double>(x) - top);
        REQUIRE(lens[2].top_prob(b, t, 0) == Approx(1.0 / z).epsilon(1e-5));
      }
  }
  auto model = testing::randomized_lm(testing::small_lm(), 12);
  const IndexArray ids = random_ids(2, 8, 11, 13);
  REQUIRE_THROWS_WITH(logit_lens(*model, ids, ids, 0), Contains("logit_lens: top_k 0 is outside [1, 11]"));
  REQUIRE_THROWS_WITH(logit_lens(*model, ids, ids, 12), Contains("logit_lens: top_k 12"));
  REQUIRE_THROWS_WITH(logit_lens(*model, ids, random_ids(2, 7, 11, 1)),
                      Contains("logit_lens: targets of shape (2, 7)"));
  IndexArray outside = ids;
  outside(1, 3) = 11;
  REQUIRE_THROWS_WITH(logit_lens(*model, ids, outside),
                      Contains("logit_lens: target 11 at flat position 11 is outside the vocabulary [0, 11)"));
}

namespace {

// Hand-made patterns (1, 4, T, T): head 0 previous token (query 0 on itself), head 1 first
// token, head 2 three back (the first three queries on key 0), head 3 uniform over the keys
// 0..t.
Array hand_patterns(std::size_t T) {
  Array p = xt::zeros<float>({std::size_t{1}, std::size_t{4}, T, T});
  for (std::size_t t = 0; t < T; ++t) {
    p(0, 0, t, t == 0 ? 0 : t - 1) = 1.f;
    p(0, 1, t, 0) = 1.f;
    p(0, 2, t, t < 3 ? 0 : t - 3) = 1.f;
    for (std::size_t s = 0; s <= t; ++s) p(0, 3, t, s) = 1.f / static_cast<float>(t + 1);
  }
  return p;
}

}  // namespace

TEST_CASE("head detectors score hand-made heads as their definitions say") {
  const std::size_t T = 8;
  const Array p = hand_patterns(T);
  const std::vector<double> prev = previous_token_scores(p), first = first_token_scores(p);
  REQUIRE(prev[0] == 1.0);
  REQUIRE(prev[1] == Approx(1.0 / 7));  // query 1's key 0 is also its previous token
  REQUIRE(first[1] == 1.0);
  REQUIRE(first[0] == Approx(1.0 / 7));  // query 1 again
  REQUIRE(first[2] == Approx(3.0 / 7));  // queries 1, 2 (on key 0) and 3 (three back is key 0)
  double uniform_prev = 0;
  for (std::size_t t = 1; t < T; ++t) uniform_prev += 1.0 / static_cast<double>(t + 1);
  REQUIRE(prev[3] == Approx(uniform_prev / 7));
  std::vector<std::size_t> offsets;
  const std::vector<double> fixed = fixed_offset_scores(p, &offsets);
  REQUIRE(offsets[0] == 1);
  REQUIRE(fixed[0] == 1.0);
  REQUIRE(offsets[2] == 3);
  REQUIRE(fixed[2] == 1.0);
  REQUIRE(offset_scores(p, 3)[2] == 1.0);
  for (const auto& scores : {prev, first, fixed}) {
    for (double s : scores) REQUIRE((s >= 0.0 && s <= 1.0));
  }

  SECTION("statistics: offsets, argmax fraction and both entropies") {
    const std::vector<HeadStatistics> stats = head_statistics(p);
    REQUIRE(stats[2].dominant_offset == 3);
    REQUIRE(stats[2].argmax_fraction == 1.0);
    REQUIRE(stats[2].confidence == 1.0);
    REQUIRE(stats[2].query_entropy == Approx(0.0).margin(1e-6));
    // a first-token head has its largest offset mass at T-1, from the last query alone: the
    // fixed-offset detector, which only weighs offsets most queries have, does not score it 1
    REQUIRE(stats[1].dominant_offset == T - 1);
    REQUIRE(stats[1].dominant_mass == 1.0);
    REQUIRE(offsets[1] <= T / 2);
    REQUIRE(fixed[1] < 0.5);
    // uniform rows: each row's entropy is log(t + 1)
    double query_entropy = 0;
    for (std::size_t t = 0; t < T; ++t) query_entropy += std::log(static_cast<double>(t + 1));
    REQUIRE(stats[3].query_entropy == Approx(query_entropy / T).epsilon(1e-6));
    // the previous-token head averaged over queries: key 0 gets 2/T, keys 1..T-2 get 1/T
    const double averaged = -(2.0 / T) * std::log(2.0 / T + 1e-9) - (T - 2) * (1.0 / T) * std::log(1.0 / T + 1e-9);
    REQUIRE(stats[0].entropy == Approx(averaged).epsilon(1e-6));
  }
  SECTION("induction: the weight on the token after the earlier occurrence") {
    // ids a b c d a b c d: queries 4..7 have occurrences at t - 4, followed by t - 3
    IndexArray ids = {{1, 2, 3, 4, 1, 2, 3, 4}};
    Array induction = p;
    for (std::size_t t = 4; t < T; ++t) {
      xt::view(induction, 0, 0, t) = xt::zeros<float>({T});
      induction(0, 0, t, t - 3) = 1.f;
    }
    const std::vector<double> scores = induction_scores(induction, ids);
    REQUIRE(scores[0] == 1.0);
    REQUIRE(scores[1] == 0.0);  // key 0 is never a token after an earlier occurrence
    REQUIRE(scores[2] == 1.0);  // on a period-4 sequence three back is that token
    REQUIRE(scores[3] == Approx((1.0 / 5 + 1.0 / 6 + 1.0 / 7 + 1.0 / 8) / 4));
    REQUIRE(induction_scores(p, IndexArray{{1, 2, 3, 4, 5, 6, 7, 8}}) == std::vector<double>(4, 0.0));
  }
  SECTION("bad patterns and arguments are refused by name") {
    REQUIRE_THROWS_WITH(previous_token_scores(xt::zeros<float>({1, 2, 3, 4})),
                        Contains("expected attention weights (B, H, T, T) of self-attention, got (1, 2, 3, 4)"));
    REQUIRE_THROWS_WITH(first_token_scores(xt::zeros<float>({2, 3})), Contains("first_token_scores"));
    REQUIRE_THROWS_WITH(offset_scores(p, T), Contains("offset_scores: offset 8 is not below the length 8"));
    REQUIRE_THROWS_WITH(induction_scores(p, IndexArray{{1, 2}}), Contains("induction_scores: ids of shape (1, 2)"));
    REQUIRE_THROWS_WITH(head_statistics(std::vector<Array>{p}, 4),
                        Contains("head_statistics: head 4 of a pattern with 4 heads"));
    REQUIRE_THROWS_WITH(head_statistics(std::vector<Array>{}, 0), Contains("head_statistics: no patterns"));
    REQUIRE_THROWS_WITH(previous_token_scores(xt::zeros<float>({1, 1, 1, 1})),
                        Contains("previous_token_scores: offset 1 is not below the length 1"));
    Array looks_ahead = p;
    looks_ahead(0, 2, 3, 5) = 0.5f;
    REQUIRE_THROWS_WITH(head_statistics(std::vector<Array>{looks_ahead}, 2),
                        Contains("head_statistics: head 2 puts weight 0.5 on key 5 after query 3"));
    REQUIRE_NOTHROW(head_statistics(std::vector<Array>{looks_ahead}, 1));
  }
}

TEST_CASE("patching a root attention module: its points have no dotted path, and still have heads", "[gemm]") {
  Generator gen(31);
  nn::Attention attention(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
  const Tensor a(Generator(32).normal({1, 5, 8}, 0.f, 1.f)), b(Generator(33).normal({1, 5, 8}, 0.f, 1.f));
  nn::AttentionMask causal;
  causal.causal = true;
  const ActivationCache source = cache_activations(attention, [&] { attention.forward(a, causal); });
  const ActivationCache own = cache_activations(attention, [&] { attention.forward(b, causal); });
  REQUIRE(source.has("pattern"));
  {
    const PatchSet patched(attention, source, {{"pattern", {}, 3}, {"context", 1, {}}});
    const ActivationCache seen = cache_activations(
        attention, [&] { attention.forward(b, causal); }, points_ending_with({"pattern", "context"}));
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t t = 0; t < 5; ++t)
        for (std::size_t k = 0; k < 5; ++k) {
          INFO("pattern (" << h << ", " << t << ", " << k << ")");
          REQUIRE(seen.at("pattern")(0, h, t, k) == (t == 3 ? source : own).at("pattern")(0, h, t, k));
        }
    // the context follows the patched pattern, except head 1's channels, which come from the source
    const Array& context = seen.at("context");
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t c = 4; c < 8; ++c) REQUIRE(context(0, t, c) == source.at("context")(0, t, c));
  }
  REQUIRE_THROWS_WITH(PatchSet(attention, source, {{"out", 0, {}}}), Contains("point 'out' has no heads"));
}

TEST_CASE("heatmap SVGs: NaN cells are grey, a vmax that is no positive number is 1, ragged rows are refused") {
  Heatmap m;
  m.title = "t";
  m.values = {{0.0, std::nan("")}, {1.0, 0.5}};
  for (const double vmax : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    const std::string svg = heatmap_svg(m, vmax);
    CHECK(svg.find("#999999'><title>query 0, key 1: nan") != std::string::npos);
    // Value 1 at the top of a 0..1 scale: the last viridis stop; 0.5 the middle one.
    CHECK(svg.find("fill='#fde725'><title>query 1, key 0: 1<") != std::string::npos);
    CHECK(svg.find("fill='#21918c'><title>query 1, key 1: 0.5<") != std::string::npos);
  }
  m.values = {{0.0, 1.0}, {1.0}};
  CHECK_THROWS_WITH(
      heatmap_svg(m),
      Contains("heatmap_svg: map 0 ('t') has rows of different lengths: row 0 has 2 values and row 1 has 1"));
  Heatmap ok;
  ok.values = {{1.0}};
  CHECK_THROWS_WITH(heatmap_grid_svg({ok, m}, 2),
                    Contains("heatmap_grid_svg: map 1 ('t') has rows of different lengths"));
}
