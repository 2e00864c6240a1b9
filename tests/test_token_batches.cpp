// The batch samplers over token sources: random windows against offsets drawn here from a
// Generator directly, sharding (the ranks' rows are the one-process batch), sequential epochs
// that visit every window once (in the order of a Fisher-Yates shuffle written out here), resume
// from a state, evaluation windows, document ranges, and padded and packed document batches,
// with a language model's loss on a padded batch against its loss on each document alone.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/text/token_batches.hpp"

using Catch::Contains;
using namespace xgrad;
using namespace xgrad::text;

namespace {

// Token i is i * 7 + 3 mod 1000: windows are easy to tell apart.
TokenVector counting(std::size_t n) {
  TokenIds ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % 1000);
  return TokenVector(ids);
}
std::int64_t token_at(std::size_t i) { return static_cast<std::int64_t>((i * 7 + 3) % 1000); }

// A source of 2^33 + 5 tokens (or `size`) that holds none in memory: token i is i mod 1009.
class HugeSource : public TokenSource {
 public:
  explicit HugeSource(std::size_t size = (std::size_t{1} << 33) + 5) : size_(size) {}
  std::size_t size() const override { return size_; }
  void read(std::size_t offset, std::size_t n, std::int64_t* out) const override {
    check_range(offset, n, "HugeSource::read");
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::int64_t>((offset + i) % 1009);
  }

 private:
  std::size_t size_;
};

// The offset a row starts at, from its first id (for the counting source, whose ids repeat every
// 1000 tokens: the data here is shorter).
std::size_t row_offset(const TokenBatch& b, std::size_t row) {
  const std::int64_t first = b.ids(row, 0);
  for (std::size_t i = 0; i < 1000; ++i)
    if (token_at(i) == first) return i;
  FAIL("no offset starts with " << first);
  return 0;
}

void check_window(const TokenBatch& b, std::size_t row, std::size_t at) {
  const std::size_t T = b.ids.shape()[1];
  for (std::size_t t = 0; t < T; ++t) {
    CHECK(b.ids(row, t) == token_at(at + t));
    CHECK(b.targets(row, t) == token_at(at + t + 1));
  }
}

// Rows of the batches one after another, as one (sum of rows, T) batch.
TokenBatch concatenate(const std::vector<TokenBatch>& parts) {
  std::size_t rows = 0;
  const std::size_t T = parts.at(0).ids.shape()[1];
  for (const TokenBatch& p : parts) rows += p.ids.shape()[0];
  TokenBatch out{IndexArray::from_shape({rows, T}), IndexArray::from_shape({rows, T})};
  std::size_t at = 0;
  for (const TokenBatch& p : parts) {
    std::copy(p.ids.begin(), p.ids.end(), out.ids.data() + at);
    std::copy(p.targets.begin(), p.targets.end(), out.targets.data() + at);
    at += p.ids.size();
  }
  return out;
}

// Equal shapes and elements (xtensor's == does not go through Catch's decomposer).
template <class A, class B>
bool same(const A& a, const B& b) {
  return a.dimension() == b.dimension() && std::equal(a.shape().begin(), a.shape().end(), b.shape().begin()) &&
         std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

TEST_CASE("random_windows: offsets drawn in row order by Generator::below(size - T), windows of T + 1",
          "[text][batches]") {
  const TokenVector data = counting(500);
  Generator gen(42), reference(42);
  for (int step = 0; step < 3; ++step) {
    const TokenBatch b = random_windows(data, 16, 6, gen);
    REQUIRE(b.ids.shape() == std::vector<std::size_t>{6, 16});
    CHECK(!b.padded());
    CHECK(b.key_padding_mask.size() == 0);
    for (std::size_t r = 0; r < 6; ++r) check_window(b, r, static_cast<std::size_t>(reference.below(500 - 16)));
  }
  CHECK(gen.state() == reference.state());
  // The same seed gives the same batches.
  Generator a(7), b(7);
  CHECK(same(random_windows(data, 8, 4, a).ids, random_windows(data, 8, 4, b).ids));
  // The one window of a source of T + 1 tokens.
  Generator g(1);
  check_window(random_windows(counting(9), 8, 3, g), 2, 0);
}

TEST_CASE("random_windows: the ranks' rows concatenated are the one-process batch, and generators stay in step",
          "[text][batches]") {
  const TokenVector data = counting(700);
  for (std::size_t world : {1, 2, 3, 6}) {
    Generator one(5);
    const TokenBatch whole = random_windows(data, 10, 6, one);
    std::vector<TokenBatch> parts;
    std::vector<std::string> states;
    for (std::size_t rank = 0; rank < world; ++rank) {
      Generator g(5);
      parts.push_back(random_windows(data, 10, 6, g, rank, world));
      CHECK(parts.back().ids.shape()[0] == 6 / world);
      states.push_back(g.state());
    }
    const TokenBatch joined = concatenate(parts);
    CHECK(same(joined.ids, whole.ids));
    CHECK(same(joined.targets, whole.targets));
    for (const std::string& s : states) CHECK(s == one.state());
  }
}

TEST_CASE("bad input: random_windows refuses windows past the data and bad sharding", "[text][batches]") {
  const TokenVector data = counting(10);
  Generator gen(0);
  const std::string before = gen.state();
  REQUIRE_THROWS_WITH(random_windows(data, 10, 2, gen),
                      Contains("random_windows: windows of 10 + 1 tokens do not fit in the 10 tokens"));
  REQUIRE_THROWS_WITH(random_windows(data, 0, 2, gen), Contains("seq_len is 0"));
  REQUIRE_THROWS_WITH(random_windows(data, 4, 0, gen), Contains("batch size is 0"));
  REQUIRE_THROWS_WITH(random_windows(data, 4, 4, gen, 0, 0), Contains("world 0"));
  REQUIRE_THROWS_WITH(random_windows(data, 4, 4, gen, 2, 2), Contains("rank 2 is not below world 2"));
  REQUIRE_THROWS_WITH(random_windows(data, 4, 5, gen, 0, 2), Contains("batch of 5 rows does not divide among 2"));
  // Batches past the memory left are refused before anything is allocated or drawn.
  const HugeSource huge;
  REQUIRE_THROWS_WITH(random_windows(huge, std::size_t{1} << 20, std::size_t{1} << 30, gen),
                      Contains("random_windows: a batch of 1073741824 x 1048576 needs"));
  REQUIRE_THROWS_WITH(
      evaluation_windows(HugeSource(std::size_t{1} << 40), std::size_t{1} << 16, std::size_t{1} << 20, 1000),
      Contains("evaluation_windows: a batch of 65536 x 1048576 (15 of them) needs"));
  REQUIRE_THROWS_WITH(SequentialWindows(HugeSource(std::size_t{1} << 50), 1, 0),
                      Contains("the visiting order of 1125899906842623 windows needs"));
  CHECK(gen.state() == before);
}

TEST_CASE("random_windows: a source past 2^32 tokens draws 64-bit offsets by rejection, over the whole range",
          "[text][batches]") {
  const HugeSource data;
  const std::uint64_t range = data.size() - 4;
  Generator gen(3), reference(3);
  bool past_2_32 = false;
  for (int step = 0; step < 20; ++step) {
    const TokenBatch b = random_windows(data, 4, 2, gen);
    for (std::size_t r = 0; r < 2; ++r) {
      // Rejection sampling on next_u64, written out: values below 2^64 mod range are redrawn.
      std::uint64_t x = 0;
      do {
        x = reference.next_u64();
      } while (x < (0 - range) % range);
      const std::uint64_t at = x % range;
      past_2_32 = past_2_32 || at >= (std::uint64_t{1} << 32);
      for (std::size_t t = 0; t < 4; ++t) {
        CHECK(b.ids(r, t) == static_cast<std::int64_t>((at + t) % 1009));
        CHECK(b.targets(r, t) == static_cast<std::int64_t>((at + t + 1) % 1009));
      }
    }
  }
  CHECK(past_2_32);
  // Ranges up to 2^32 draw with below(), as before.
  Generator g(9), h(9);
  CHECK(draw_below(g, std::uint64_t{1} << 32) == h.below(std::uint64_t{1} << 32));
  REQUIRE_THROWS_WITH(draw_below(g, 0), Contains("draw_below"));
}

TEST_CASE("SequentialWindows: every window once per epoch, in a Fisher-Yates order seeded by (seed, epoch)",
          "[text][batches]") {
  const TokenVector data = counting(101);  // windows of 10 at 0, 10, ..., 90: (101 - 1) / 10 = 10
  SequentialWindows s(data, 10, 77);
  REQUIRE(s.windows() == 10);
  // The order written out: swap(order[i], order[below(i + 1)]) for i from the end.
  for (std::size_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::size_t> want(10);
    for (std::size_t k = 0; k < 10; ++k) want[k] = k * 10;
    Generator gen(mix_seed(77, epoch));
    for (std::size_t i = 9; i > 0; --i) std::swap(want[i], want[gen.below(i + 1)]);
    CHECK(s.epoch_order(epoch) == want);
  }
  CHECK(s.epoch_order(0) != s.epoch_order(1));
  // Batches of 4 run through the epochs: 10 windows, so batches cross epoch ends.
  std::map<std::size_t, std::multiset<std::size_t>> seen;  // epoch -> offsets
  std::vector<std::size_t> stream;
  for (std::size_t e = 0; e < 3; ++e)
    for (std::size_t at : s.epoch_order(e)) stream.push_back(at);
  std::size_t drawn = 0;
  for (int step = 0; step < 7; ++step) {
    CHECK(s.epoch() == drawn / 10);
    const TokenBatch b = s.next(4);
    for (std::size_t r = 0; r < 4; ++r, ++drawn) {
      check_window(b, r, stream[drawn]);
      seen[drawn / 10].insert(row_offset(b, r));
    }
  }
  CHECK(s.epoch() == 2);
  CHECK(s.position() == 8);
  for (std::size_t e = 0; e < 2; ++e)
    CHECK(seen[e] == std::multiset<std::size_t>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90});
  // The same seed gives the same batches; another seed another order.
  SequentialWindows a(data, 10, 5), b(data, 10, 5), c(data, 10, 6);
  CHECK(same(a.next(3).ids, b.next(3).ids));
  CHECK(a.epoch_order(0) != c.epoch_order(0));
}

TEST_CASE("SequentialWindows: sharded batches concatenate to the one-process batch, and a state resumes exactly",
          "[text][batches]") {
  const TokenVector data = counting(200);
  SequentialWindows one(data, 8, 11);
  std::vector<SequentialWindows> ranks(3, SequentialWindows(data, 8, 11));
  for (int step = 0; step < 12; ++step) {
    const TokenBatch whole = one.next(6);
    std::vector<TokenBatch> parts;
    for (std::size_t rank = 0; rank < 3; ++rank) parts.push_back(ranks[rank].next(6, rank, 3));
    CHECK(same(concatenate(parts).ids, whole.ids));
    CHECK(same(concatenate(parts).targets, whole.targets));
    for (const SequentialWindows& r : ranks) CHECK(r.state() == one.state());
  }
  const std::string state = one.state();
  CHECK(state.rfind("sequential_windows 1 seed 11 seq_len 8 windows 24 epoch 3 position 0", 0) == 0);
  std::vector<IndexArray> after;
  for (int step = 0; step < 5; ++step) after.push_back(one.next(5).ids);
  SequentialWindows resumed(data, 8, 11);
  resumed.set_state(state);
  for (int step = 0; step < 5; ++step) CHECK(same(resumed.next(5).ids, after[static_cast<std::size_t>(step)]));
}

TEST_CASE("bad input: SequentialWindows refuses more ranks or rows than windows, and foreign states",
          "[text][batches]") {
  const TokenVector data = counting(31);  // 3 windows of 10
  REQUIRE_THROWS_WITH(SequentialWindows(data, 31, 0), Contains("hold no window of 31 + 1 tokens"));
  REQUIRE_THROWS_WITH(SequentialWindows(data, 0, 0), Contains("seq_len is 0"));
  SequentialWindows s(data, 10, 1);
  const std::string start = s.state();
  REQUIRE_THROWS_WITH(s.next(4, 0, 4), Contains("4 processes are more than the 3 windows"));
  REQUIRE_THROWS_WITH(s.next(4), Contains("a batch of 4 windows is more than the 3 windows of an epoch"));
  REQUIRE_THROWS_WITH(s.next(3, 0, 2), Contains("does not divide among 2"));
  REQUIRE_THROWS_WITH(s.next(2, 2, 2), Contains("rank 2 is not below world 2"));
  CHECK(s.state() == start);
  REQUIRE_THROWS_WITH(s.set_state("garbage"), Contains("is not a SequentialWindows state"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 2 seq_len 10 windows 3 epoch 0 position 0"),
                      Contains("seed 2, this sampler's is 1"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 1 seq_len 9 windows 3 epoch 0 position 0"),
                      Contains("seq_len 9"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 1 seq_len 10 windows 4 epoch 0 position 0"),
                      Contains("4 windows"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 1 seq_len 10 windows 3 epoch 0 position 3"),
                      Contains("position 3 is not below the 3 windows"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 1 seq_len 10 windows 3 epoch -1 position 0"),
                      Contains("field epoch"));
  REQUIRE_THROWS_WITH(s.set_state("sequential_windows 1 seed 1 seq_len 10 windows 3 epoch 0 position 0 x"),
                      Contains("after its fields"));
  CHECK(s.state() == start);
}

TEST_CASE("evaluation_windows: consecutive windows from the start, whole batches only", "[text][batches]") {
  const TokenVector data = counting(100);
  const std::vector<TokenBatch> v = evaluation_windows(data, 3, 8, 10);
  REQUIRE(v.size() == 4);  // batch b needs (b + 1) * 24 + 1 tokens
  for (std::size_t b = 0; b < 4; ++b)
    for (std::size_t r = 0; r < 3; ++r) check_window(v[b], r, (b * 3 + r) * 8);
  CHECK(evaluation_windows(data, 3, 8, 2).size() == 2);
  CHECK(evaluation_windows(counting(24), 3, 8, 2).empty());
  CHECK(evaluation_windows(counting(25), 3, 8, 2).size() == 1);
  const std::vector<TokenBatch> r1 = evaluation_windows(data, 4, 5, 3, 1, 2);
  const std::vector<TokenBatch> all = evaluation_windows(data, 4, 5, 3);
  REQUIRE(r1.size() == all.size());
  CHECK(same(r1[1].ids, IndexArray(xt::view(all[1].ids, xt::range(2, 4), xt::all()))));
  REQUIRE_THROWS_WITH(evaluation_windows(data, 3, 8, 2, 0, 2), Contains("does not divide"));
}

TEST_CASE("document_ranges: the spans between eos separators", "[text][batches]") {
  CHECK(document_ranges(TokenVector({5, 1, 2, 0, 3, 0, 0, 4}), 0) ==
        std::vector<std::pair<std::size_t, std::size_t>>{{0, 3}, {4, 5}, {6, 6}, {7, 8}});
  CHECK(document_ranges(TokenVector({1, 2}), 0) == std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}});
  CHECK(document_ranges(TokenVector({0}), 0) == std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {1, 1}});
  CHECK(document_ranges(TokenVector({}), 0).empty());
  TokenIds big(200000, 3);
  big[70000] = 9;
  CHECK(document_ranges(TokenVector(big), 9) ==
        std::vector<std::pair<std::size_t, std::size_t>>{{0, 70000}, {70001, 200000}});
  REQUIRE_THROWS_WITH(document_ranges(TokenVector({1}), -1), Contains("eos id -1"));
}

TEST_CASE("padded_batch: right padding, targets ignored at padding and at each document's end", "[text][batches]") {
  const TokenBatch b = padded_batch({{1, 2, 3}, {4}, {5, 6, 7, 8, 9}}, 0);
  const IndexArray ids = {{1, 2, 3, 0, 0}, {4, 0, 0, 0, 0}, {5, 6, 7, 8, 9}};
  const std::int64_t I = kIgnoreIndex;
  const IndexArray targets = {{2, 3, I, I, I}, {I, I, I, I, I}, {6, 7, 8, 9, I}};
  const Mask mask = {
      {false, false, false, true, true}, {false, true, true, true, true}, {false, false, false, false, false}};
  CHECK(same(b.ids, ids));
  CHECK(same(b.targets, targets));
  CHECK(b.padded());
  CHECK(same(b.key_padding_mask, mask));
  // Cut to 3 tokens: a cut document keeps the target of its last kept token.
  const TokenBatch c = padded_batch({{1, 2, 3}, {4}, {5, 6, 7, 8, 9}}, 0, 3);
  CHECK(same(c.ids, IndexArray{{1, 2, 3}, {4, 0, 0}, {5, 6, 7}}));
  CHECK(same(c.targets, IndexArray{{2, 3, I}, {I, I, I}, {6, 7, 8}}));
  REQUIRE_THROWS_WITH(padded_batch({}, 0), Contains("no documents"));
  REQUIRE_THROWS_WITH(padded_batch({{1}, {}}, 0), Contains("document 1 is empty"));
  REQUIRE_THROWS_WITH(padded_batch({{1}}, -1), Contains("pad id -1"));
}

TEST_CASE(
    "padded_batch: a language model's loss on the padded batch is the token-weighted mean of its loss on each "
    "document alone",
    "[text][batches][gemm]") {
  Generator gen(0);
  nn::LanguageModel model(nn::LanguageModelOptions(11, 16, 2, 2).max_len(12).dropout(0.f), gen);
  model.eval();
  NoGradGuard no_grad;
  const std::vector<TokenIds> docs{{1, 2, 3, 4, 5, 6, 7}, {8, 9, 10}, {3, 3, 4, 1, 0, 2, 5, 9, 8, 7}, {4, 5}};
  double sum = 0, count = 0;
  for (const TokenIds& d : docs) {
    const TokenBatch alone = padded_batch({d}, 0);
    CHECK(alone.key_padding_mask.size() == d.size());
    const double n = static_cast<double>(d.size() - 1);
    sum += model.loss(alone.ids, alone.targets).item() * n;
    count += n;
  }
  const double want = sum / count;
  for (std::int64_t pad : {0, 10}) {
    const TokenBatch b = padded_batch(docs, pad);
    const double got = model.loss(b.ids, b.targets, b.key_padding_mask).item();
    INFO("pad " << pad);
    CHECK(got == Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("packed_batch: documents joined by eos in rows of T, the last row padded", "[text][batches]") {
  const std::int64_t I = kIgnoreIndex;
  // Stream 1 2 3 0 4 5 0 6: 7 positions with a target, rows of 3.
  const TokenBatch b = packed_batch({{1, 2, 3}, {4, 5}, {6}}, 3, 0);
  CHECK(same(b.ids, IndexArray{{1, 2, 3}, {0, 4, 5}, {0, 0, 0}}));
  CHECK(same(b.targets, IndexArray{{2, 3, 0}, {4, 5, 0}, {6, I, I}}));
  CHECK(same(b.key_padding_mask, Mask{{false, false, false}, {false, false, false}, {false, true, true}}));
  // A stream that fills its rows has no mask.
  const TokenBatch full = packed_batch({{1, 2}, {3, 4}}, 2, 9);  // 1 2 9 3 4
  CHECK(same(full.ids, IndexArray{{1, 2}, {9, 3}}));
  CHECK(same(full.targets, IndexArray{{2, 9}, {3, 4}}));
  CHECK(!full.padded());
  REQUIRE_THROWS_WITH(packed_batch({{1}}, 2, 0), Contains("fewer than the 2"));
  REQUIRE_THROWS_WITH(packed_batch({{1, 2}}, 0, 0), Contains("seq_len is 0"));
  REQUIRE_THROWS_WITH(packed_batch({{1, 2}}, 2, -1), Contains("eos id -1"));
}
