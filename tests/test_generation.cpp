// Generation with a key/value cache: forward_cached against forward, cached against uncached
// generate (greedy and sampled), the kept attention weights, and the context past max_len.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
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

float max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  return a.size() == 0 ? 0.f : xt::amax(xt::abs(a - b))();
}

IndexArray ids_of(const Tokens& t, std::size_t begin, std::size_t end) {
  IndexArray ids = IndexArray::from_shape({1, end - begin});
  std::copy(t.begin() + static_cast<std::ptrdiff_t>(begin), t.begin() + static_cast<std::ptrdiff_t>(end), ids.begin());
  return ids;
}

IndexArray column_ids() {  // {{1}, {2}}: two sequences of one token
  IndexArray ids = IndexArray::from_shape({2, 1});
  ids(0, 0) = 1;
  ids(1, 0) = 2;
  return ids;
}

std::int64_t argmax_last(const Array& logits) {
  const std::size_t T = logits.shape()[1], V = logits.shape()[2];
  std::size_t best = 0;
  for (std::size_t v = 1; v < V; ++v) best = logits(0, T - 1, v) > logits(0, T - 1, best) ? v : best;
  return static_cast<std::int64_t>(best);
}

// Four small models: Pre-Norm and Post-Norm, learned and sinusoidal positions (max_len 10).
std::vector<nn::LanguageModelOptions> variants() {
  std::vector<nn::LanguageModelOptions> out;
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post})
    for (nn::Positional pos : {nn::Positional::learned, nn::Positional::sinusoidal})
      out.push_back(
          nn::LanguageModelOptions(13, 16, 4, 2).d_ff(24).max_len(10).dropout(0.1f).norm(norm).positional(pos));
  return out;
}

const char* describe(const nn::LanguageModelOptions& o) {
  static const char* names[] = {"pre learned", "pre sinusoidal", "post learned", "post sinusoidal"};
  return names[(o.norm() == nn::Norm::post ? 2 : 0) + (o.positional() == nn::Positional::sinusoidal ? 1 : 0)];
}

}  // namespace

TEST_CASE("forward_cached in pieces gives forward's logits and attention", "[nn][generate][cache][gemm]") {
  for (const auto& options : variants()) {
    INFO(describe(options));
    auto lm = testing::eval_lm(options, 7);
    const IndexArray ids = {{3, 1, 4, 1, 5, 9, 2, 6}, {2, 7, 1, 8, 2, 8, 1, 8}};
    const nn::LanguageModelOutput whole = lm->forward(ids);
    nn::LanguageModelCache cache;
    std::size_t at = 0;
    for (std::size_t piece : {3, 1, 4}) {
      const IndexArray part = xt::view(ids, xt::all(), xt::range(at, at + piece));
      const nn::LanguageModelOutput out = lm->forward_cached(part, cache, nn::Attentions::keep, nn::Logits::all);
      REQUIRE(cache.length() == at + piece);
      const Array expected = xt::view(whole.logits.value(), xt::all(), xt::range(at, at + piece), xt::all());
      CHECK(max_abs_diff(out.logits.value(), expected) < 1e-5f);
      for (std::size_t l = 0; l < whole.attentions.size(); ++l) {
        const Array w = xt::view(whole.attentions[l].value(), xt::all(), xt::all(), xt::range(at, at + piece),
                                 xt::range(0, at + piece));
        CHECK(max_abs_diff(out.attentions[l].value(), w) < 1e-6f);
      }
      at += piece;
    }
    // the cache is full at max_len: one more position is an error naming both counts
    lm->forward_cached(IndexArray{{1, 1}, {2, 2}}, cache);
    REQUIRE_THROWS_WITH(
        lm->forward_cached(column_ids(), cache),
        Contains("LanguageModel") && Contains("sequence length 11 (10 cached and 1 new) exceeds max_len 10"));
    // a cache of another batch size is refused
    nn::LanguageModelCache one;
    lm->forward_cached(IndexArray{{1, 2}}, one);
    REQUIRE_THROWS_WITH(lm->forward_cached(column_ids(), one), Contains("KVCache") && Contains("(2, 1, 16)"));
  }
}

TEST_CASE("a cache with room reserved writes each step in place and gives the logits of one that copies",
          "[nn][generate][cache][gemm]") {
  const IndexArray ids = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8}};
  const auto piece = [&](std::size_t from, std::size_t to) -> IndexArray {
    return xt::view(ids, xt::all(), xt::range(from, to));
  };
  nn::LanguageModelOptions learned = variants()[0];
  learned.max_len(12);
  const std::vector<nn::LanguageModelOptions> models = {
      learned, nn::LanguageModelOptions::llama_style(13, 16, 4, 2, 2).max_len(12).dropout(0.f)};
  for (std::size_t m = 0; m < models.size(); ++m) {
    INFO((m == 0 ? "learned positions, 2 heads" : "RoPE, 4 heads on 2 key/value heads"));
    auto lm = testing::eval_lm(models[m], 5);
    NoGradGuard no_grad;
    nn::LanguageModelCache copying, room;
    room.reserve(10);
    std::size_t at = 0;
    for (std::size_t n : {3, 1, 1, 4}) {
      const Array want =
          lm->forward_cached(piece(at, at + n), copying, nn::Attentions::none, nn::Logits::all).logits.value();
      const Array got =
          lm->forward_cached(piece(at, at + n), room, nn::Attentions::none, nn::Logits::all).logits.value();
      at += n;
      CHECK(max_abs_diff(got, want) < 1e-5f);
      for (std::size_t b = 0; b < room.blocks.size(); ++b) {
        CHECK(room.blocks[b].held() == at);
        CHECK(room.blocks[b].capacity() == 10);  // one storage, written in place
        CHECK(copying.blocks[b].capacity() == at);
        CHECK(max_abs_diff(room.blocks[b].keys().value(), copying.blocks[b].keys().value()) < 1e-6f);
        CHECK(max_abs_diff(room.blocks[b].values().value(), copying.blocks[b].values().value()) < 1e-6f);
      }
    }
    // Past the room: an error naming it, and the cache as it was.
    CHECK_THROWS_WITH(lm->forward_cached(IndexArray{{1, 2}, {3, 4}}, room),
                      Contains("LanguageModel::forward_cached: 2 positions after the 9 held go past the 10 the cache "
                               "reserves (LanguageModelCache::reserve)"));
    CHECK(room.length() == 9);
    CHECK_THROWS_WITH(room.reserve(8), Contains("LanguageModelCache::reserve: 8 positions is fewer than the 9"));
    CHECK(room.reserved() == 10);
    // A copy goes on from what it shares, in storage of its own: the original's next step, written
    // where the copy would have written its own, stays.
    nn::LanguageModelCache branch = room;
    const Array a = lm->forward_cached(piece(9, 10), room).logits.value();
    IndexArray sevens = IndexArray::from_shape({2, 1});
    sevens.fill(7);
    const Array b = lm->forward_cached(sevens, branch).logits.value();
    CHECK(branch.blocks[0].capacity() == 10);
    const Array a_again = lm->forward_cached(piece(9, 10), copying).logits.value();
    CHECK(max_abs_diff(a, a_again) < 1e-5f);
    IndexArray with_seven = ids;
    xt::view(with_seven, xt::all(), 9) = 7;
    CHECK(max_abs_diff(b, xt::view(lm->forward(with_seven).logits.value(), xt::all(), xt::range(9, 10), xt::all())) <
          1e-5f);
    CHECK(max_abs_diff(room.blocks[1].keys().value(), copying.blocks[1].keys().value()) < 1e-6f);
  }
}

TEST_CASE("a cache with room copies while gradients are recorded, and backward runs through its steps",
          "[nn][generate][cache][gemm]") {
  auto lm = testing::eval_lm(nn::LanguageModelOptions::llama_style(13, 16, 4, 2, 2).max_len(12).dropout(0.f), 3);
  const IndexArray ids = {{3, 1, 4, 1, 5}};
  nn::LanguageModelCache cache;
  cache.reserve(8);
  const Tensor first = lm->forward_cached(xt::view(ids, xt::all(), xt::range(0, 3)), cache).logits;
  const Tensor second = lm->forward_cached(xt::view(ids, xt::all(), xt::range(3, 5)), cache).logits;
  CHECK(cache.blocks[0].capacity() == 5);  // recorded steps copy: the held tensors keep their history
  sum(first + second).backward();
  const Array grad = lm->parameters().front().grad();
  CHECK(xt::amax(xt::abs(grad))() > 0.f);
}

TEST_CASE("cached generation gives the uncached tokens, greedy and sampled, within and past max_len",
          "[nn][generate][cache][gemm]") {
  const std::vector<Tokens> prompts = {{0}, {5, 5}, {1, 2, 3, 4, 5, 6, 7}, {12, 0, 3, 3, 9, 1, 2, 8, 4, 4, 11, 7}};
  for (const auto& options : variants()) {
    INFO(describe(options));
    auto lm = testing::eval_lm(options, 11);
    lm->train();  // generate runs in eval mode whatever the mode
    for (const Tokens& prompt : prompts) {
      for (std::size_t count : {1, 4, 9, 30}) {  // 30 slides the window several times
        for (std::size_t keep : {0, 1, 9}) {
          INFO("prompt size " << prompt.size() << ", count " << count << ", window_keep " << keep);
          nn::GenerateOptions cached, uncached;
          cached.temperature = uncached.temperature = 0.f;
          cached.window_keep = uncached.window_keep = keep;
          uncached.use_cache = false;
          const Tokens a = lm->generate(prompt, count, cached), b = lm->generate(prompt, count, uncached);
          REQUIRE(a.size() == prompt.size() + count);
          CHECK(a == b);
          cached.temperature = uncached.temperature = 1.f;
          cached.top_k = uncached.top_k = keep == 1 ? 4 : 0;
          Generator g1(keep + count), g2(keep + count);
          CHECK(lm->generate(prompt, count, cached, g1) == lm->generate(prompt, count, uncached, g2));
        }
      }
    }
    REQUIRE(lm->is_training());
  }
}

TEST_CASE("past max_len the context keeps its last window_keep tokens, or generate refuses",
          "[nn][generate][cache][gemm]") {
  auto lm = testing::eval_lm(variants()[0], 3);
  const Tokens prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // max_len tokens
  for (std::size_t keep : {0, 1, 4, 9}) {
    INFO("window_keep " << keep);
    nn::GenerateOptions greedy;
    greedy.temperature = 0.f;
    greedy.window_keep = keep;
    const Tokens g = lm->generate(prompt, 2, greedy);
    // the first new token sees the whole prompt; the second, the prompt's last window_keep
    // tokens and the first new one
    CHECK(g[10] == argmax_last(lm->forward(ids_of(g, 0, 10)).logits.value()));
    const std::size_t kept = keep == 0 ? 5 : keep;
    CHECK(g[11] == argmax_last(lm->forward(ids_of(g, 10 - kept, 11)).logits.value()));
  }
  nn::GenerateOptions bad;
  bad.window_keep = 10;
  REQUIRE_THROWS_WITH(lm->generate({1}, 3, bad),
                      Contains("generate") && Contains("window_keep 10 must be less than max_len 10"));
  nn::GenerateOptions strict;
  strict.past_max_len = nn::PastMaxLen::error;
  strict.temperature = 0.f;
  // 4 + 7 tokens run 10 positions: allowed; one more is refused before any work
  REQUIRE(lm->generate({1, 2, 3, 4}, 7, strict).size() == 11);
  const std::size_t tape_before = tape_size();
  REQUIRE_THROWS_WITH(lm->generate({1, 2, 3, 4}, 8, strict),
                      Contains("generate") && Contains("need 11 positions, more than max_len 10"));
  REQUIRE(tape_size() == tape_before);
  REQUIRE_THROWS_WITH(lm->generate(Tokens(11, 1), 1, strict), Contains("more than max_len 10"));
}

TEST_CASE("generate_with_attention keeps every query's weights", "[nn][generate][cache][gemm]") {
  for (const auto& options : variants()) {
    INFO(describe(options));
    auto lm = testing::eval_lm(options, 5);
    nn::GenerateOptions greedy;
    greedy.temperature = 0.f;
    for (bool use_cache : {true, false}) {
      INFO("use_cache " << use_cache);
      greedy.use_cache = use_cache;
      // within max_len: the rows are forward's on every token but the last
      const nn::Generation g = lm->generate_with_attention({4, 8, 1}, 6, greedy);
      REQUIRE(g.tokens == lm->generate({4, 8, 1}, 6, greedy));
      REQUIRE(g.attention.size() == 2);
      const nn::LanguageModelOutput ref = lm->forward(ids_of(g.tokens, 0, 8));
      for (std::size_t l = 0; l < 2; ++l) {
        REQUIRE(g.attention[l].shape() == Shape{4, 8, 8});
        CHECK(max_abs_diff(g.attention[l], xt::view(ref.attentions[l].value(), 0)) < 1e-6f);
      }
      // past max_len (window_keep 5): from 11 tokens on the context is tokens 5 .. , so query 12
      // ran over keys 5 .. 12 and its row is zero before key 5
      const nn::Generation h = lm->generate_with_attention({4, 8, 1}, 14, greedy);
      REQUIRE(h.attention[0].shape() == Shape{4, 16, 16});
      const nn::LanguageModelOutput late = lm->forward(ids_of(h.tokens, 5, 13));
      for (std::size_t l = 0; l < 2; ++l) {
        const Array row = xt::view(h.attention[l], xt::all(), 12, xt::all());
        CHECK(xt::amax(xt::abs(xt::view(row, xt::all(), xt::range(0, 5))))() == 0.f);
        CHECK(max_abs_diff(xt::view(row, xt::all(), xt::range(5, 13)),
                           xt::view(late.attentions[l].value(), 0, xt::all(), 7)) < 1e-6f);
        for (std::size_t q = 0; q < 16; ++q) {  // every query's weights sum to 1 over its keys
          const Array sums = xt::sum(xt::view(h.attention[l], xt::all(), q, xt::all()), {1});
          CHECK(max_abs_diff(sums, xt::ones<float>({4})) < 1e-5f);
        }
      }
    }
  }
}

TEST_CASE("Attention with a KVCache continues the sequence it holds, and refuses another",
          "[nn][generate][cache][bad_input][gemm]") {
  Generator gen(9);
  nn::Attention attn(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
  const Tensor x(gen.normal({2, 5, 8}, 0.f, 1.f));
  nn::AttentionMask causal;
  causal.causal = true;
  const nn::AttentionOutput whole = attn.forward(x, causal);
  nn::KVCache cache;
  const nn::AttentionOutput first = attn.forward(slice(x, 1, 0, 3), causal, &cache);
  const nn::AttentionOutput rest = attn.forward(slice(x, 1, 3, 5), causal, &cache);
  REQUIRE(cache.length() == 5);
  CHECK(max_abs_diff(concat({first.output, rest.output}, 1).value(), whole.output.value()) < 1e-6f);
  CHECK(max_abs_diff(rest.weights.value(),
                     xt::view(whole.weights.value(), xt::all(), xt::all(), xt::range(3, 5), xt::all())) < 1e-6f);
  REQUIRE_THROWS_WITH(
      attn.forward(Tensor(xt::zeros<float>({3, 1, 8})), causal, &cache),
      Contains("MultiHeadAttention") && Contains("KVCache") && Contains("(2, 5, 8)") && Contains("(3, 1, 8)"));
  cache.clear();
  REQUIRE(cache.length() == 0);
  // room no process could allocate is refused at the first step, which leaves the cache empty
  NoGradGuard no_grad;  // only steps that record nothing write in place
  cache.reserve(std::numeric_limits<std::size_t>::max() / 8);
  REQUIRE_THROWS_WITH(attn.forward(x, causal, &cache),
                      Contains("KVCache: room for 2305843009213693951 positions of 2 rows of 8 key and value channels "
                               "needs") &&
                          Contains("more than the"));
  CHECK(cache.length() == 0);
  cache.reserve(7);
  attn.forward(slice(x, 1, 0, 3), causal, &cache);
  CHECK(cache.capacity() == 7);
  CHECK_THROWS_WITH(attn.forward(x, causal, &cache),
                    Contains("MultiHeadAttention: 5 positions after the 3 the KVCache holds go past the 7 it reserves "
                             "(KVCache::reserve)"));
  CHECK(cache.length() == 3);
  CHECK_THROWS_WITH(cache.reserve(2), Contains("KVCache::reserve: 2 positions is fewer than the 3 held"));
  // self-attention needs keys and values of the query's width
  nn::Attention cross(nn::MultiHeadAttentionOptions(8, 2).kdim(6).vdim(5), gen);
  REQUIRE_THROWS_WITH(cross.forward(x),
                      Contains("self-attention needs kdim and vdim equal to d_model 8 (kdim 6, vdim 5)"));
  // a count whose token vector cannot exist
  auto lm = testing::eval_lm(variants()[0], 1);
  REQUIRE_THROWS_WITH(
      lm->generate({1}, std::numeric_limits<std::size_t>::max()),
      Contains("LanguageModel::generate: holding the token ids of 1 prompt token and 18446744073709551615 new ones "
               "needs 128.0 EiB, more than the") &&
          Contains("this process can still allocate"));
}

TEST_CASE("generate and forward_cached on the edges: max_len 1, failed steps, hooks, non-finite logits, huge counts",
          "[nn][generate][cache][bad_input][gemm]") {
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  SECTION("max_len 1: every context is the newest token") {
    auto lm = testing::eval_lm(nn::LanguageModelOptions(7, 8, 2, 1).max_len(1).dropout(0.f), 1);
    const Tokens a = lm->generate({3}, 5, greedy);
    greedy.use_cache = false;
    REQUIRE(a == lm->generate({3}, 5, greedy));
    for (std::size_t n = 1; n < a.size(); ++n)
      CHECK(a[n] == argmax_last(lm->forward(ids_of(a, n - 1, n)).logits.value()));
  }
  SECTION("a failed step leaves the caches as they were") {
    Generator gen(9);
    nn::Attention attn(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
    const Tensor x(gen.normal({2, 5, 8}, 0.f, 1.f));
    nn::AttentionMask causal, bad;
    causal.causal = bad.causal = true;
    bad.key_padding_mask = Mask(xt::zeros<bool>({2, 2}));  // (B, T), not (B, S)
    nn::KVCache cache;
    attn.forward(slice(x, 1, 0, 3), causal, &cache);
    REQUIRE_THROWS_WITH(attn.forward(slice(x, 1, 3, 5), bad, &cache), Contains("key_padding_mask"));
    REQUIRE(cache.length() == 3);

    auto lm = testing::eval_lm(testing::small_lm(), 4);
    const IndexArray ids = {{1, 2, 3, 4}};
    nn::LanguageModelCache lc;
    lm->forward_cached(xt::view(ids, xt::all(), xt::range(0, 3)), lc);
    bool fail_once = true;
    {
      auto h = lm->add_forward_hook("blocks.1.stream_in", [&](const Tensor& t) {
        if (fail_once) {
          fail_once = false;
          fail("hook: refused once");
        }
        return t;
      });
      REQUIRE_THROWS_WITH(lm->forward_cached(xt::view(ids, xt::all(), xt::range(3, 4)), lc), Contains("refused once"));
      REQUIRE(lc.blocks[0].length() == 3);
      REQUIRE(lc.blocks[1].length() == 3);
    }
    const Array retry = lm->forward_cached(xt::view(ids, xt::all(), xt::range(3, 4)), lc).logits.value();
    CHECK(max_abs_diff(retry, xt::view(lm->forward(ids).logits.value(), xt::all(), xt::range(3, 4), xt::all())) <
          1e-5f);
  }
  SECTION("a model with hooks generates as without the cache, its hooks seeing whole contexts") {
    auto lm = testing::eval_lm(variants()[0], 2);
    std::size_t widths = 0;
    auto h = lm->add_forward_hook("embed", [&](const Tensor& e) {  // zero position 0
      Array v = e.value();
      xt::view(v, xt::all(), 0, xt::all()) = 0.f;
      widths += e.shape()[1];
      return Tensor(v);
    });
    const Tokens a = lm->generate({1, 2, 5}, 6, greedy);
    const std::size_t cached_widths = widths;
    greedy.use_cache = false;
    REQUIRE(a == lm->generate({1, 2, 5}, 6, greedy));
    REQUIRE(cached_widths == widths / 2);  // 3 + 4 + .. + 8 positions each time
    REQUIRE(cached_widths == 33);
  }
  SECTION("non-finite logits stop generation, naming the step and the token") {
    auto lm = testing::eval_lm(variants()[0], 2);
    lm->head->bias.mutable_value()(4) = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_THROWS_WITH(lm->generate({1}, 3, greedy),
                        Contains("generate") && Contains("logit of token 4 is nan at step 0"));
    nn::GenerateOptions sample;
    REQUIRE_THROWS_WITH(lm->generate({1}, 3, sample), Contains("logit of token 4 is nan"));
    // -inf is a token that is never picked, whatever the temperature
    lm->head->bias.mutable_value()(4) = -std::numeric_limits<float>::infinity();
    sample.temperature = std::numeric_limits<float>::infinity();
    Generator g(1);
    for (std::int64_t t : lm->generate({1}, 40, sample, g)) CHECK(t != 4);
    lm->head->bias.mutable_value()(4) = std::numeric_limits<float>::infinity();
    REQUIRE_THROWS_WITH(lm->generate({1}, 1, greedy), Contains("logit of token 4 is inf"));
  }
  SECTION("every prompt id is checked, also those before the last max_len") {
    auto lm = testing::eval_lm(variants()[0], 2);
    const std::int64_t V = static_cast<std::int64_t>(lm->options().vocab_size());
    const std::size_t max_len = lm->options().max_len();
    for (const std::size_t at : {std::size_t{0}, max_len, 3 * max_len - 1}) {
      for (const std::int64_t bad : {V, std::int64_t{-1}}) {
        Tokens prompt(3 * max_len, 1);
        prompt[at] = bad;
        INFO("id " << bad << " at " << at);
        for (const bool cache : {true, false}) {
          nn::GenerateOptions o = greedy;
          o.use_cache = cache;
          REQUIRE_THROWS_WITH(lm->generate(prompt, 2, o),
                              Contains("LanguageModel::generate: prompt token id " + std::to_string(bad) +
                                       " at position " + std::to_string(at) + " of " + std::to_string(3 * max_len) +
                                       " is outside the vocabulary [0, " + std::to_string(V) + ")"));
          // Named as the call that was made (it said LanguageModel::generate), and with a count of 0 too.
          for (const std::size_t count : {std::size_t{2}, std::size_t{0}}) {
            REQUIRE_THROWS_WITH(lm->generate_with_attention(prompt, count, o),
                                Contains("LanguageModel::generate_with_attention: prompt token id " +
                                         std::to_string(bad) + " at position " + std::to_string(at)));
            REQUIRE_THROWS_WITH(lm->generate(prompt, count, o),
                                Contains("LanguageModel::generate: prompt token id " + std::to_string(bad)));
          }
        }
      }
    }
    // A prompt longer than max_len with every id in range still generates.
    REQUIRE(lm->generate(Tokens(3 * max_len, 1), 2, greedy).size() == 3 * max_len + 2);
  }
  SECTION("weights that cannot be held are an error, not a crash") {
    auto lm = testing::eval_lm(variants()[0], 2);
    // 2^20 ids fit; L x (H, 2^20, 2^20) floats (4 TiB a head) do not, anywhere: refused before any step.
    const std::size_t L = lm->blocks.size(), H = lm->options().num_heads();
    REQUIRE_THROWS_WITH(
        lm->generate_with_attention({1}, std::size_t(1) << 20, greedy),
        Contains("LanguageModel::generate_with_attention: keeping " + std::to_string(L) + " x (" + std::to_string(H) +
                 ", 1048576, 1048576) attention weights for 1 prompt token and 1048576 new ones needs ") &&
            Contains("TiB, more than the") && Contains("this process can still allocate"));
    REQUIRE(lm->generate_with_attention({1, 2}, 0, greedy).attention.empty());
    REQUIRE_THROWS_WITH(lm->pos_emb->at(IndexArray{{0, 10}}),
                        Contains("LearnedPositionalEncoding: position 10") && Contains("max_len 10"));
  }
}
