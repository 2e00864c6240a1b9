// Evaluation only (nn::evaluate): the summed next-token loss over windows of a run of tokens,
// against the per-token log-probabilities of each window's forward, whatever the batch.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "error_of.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/nn/evaluate.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using testing::error_of;

namespace {

std::vector<std::int64_t> tokens(std::size_t n) {
  Generator g(4);
  std::vector<std::int64_t> out(n);
  for (auto& t : out) t = static_cast<std::int64_t>(g.below(19));
  return out;
}

}  // namespace

TEST_CASE("evaluate: windows without overlap predict every token but the first once, whatever the batch", "[gemm]") {
  Generator gen(2);
  nn::LanguageModel model(nn::LanguageModelOptions::llama_style(19, 16, 4, 2, 2).max_len(8).dropout(0.3f), gen);
  const std::vector<std::int64_t> t = tokens(23);
  auto read = [&](std::size_t offset, std::size_t n, std::int64_t* out) {
    REQUIRE(offset + n <= t.size());
    std::copy_n(t.begin() + static_cast<std::ptrdiff_t>(offset), n, out);
  };
  // By hand: windows of 5 at 0, 5, 10, 15 and one of 2 at 20; -log softmax(logits)[target].
  double want = 0;
  {
    NoGradGuard no_grad;
    model.eval();
    for (std::size_t start = 0; start < 22; start += 5) {
      const std::size_t T = std::min<std::size_t>(5, 22 - start);
      IndexArray ids = IndexArray::from_shape({1, T});
      for (std::size_t i = 0; i < T; ++i) ids(0, i) = t[start + i];
      const Array lp = log_softmax(model.forward(ids).logits, -1).value();
      for (std::size_t i = 0; i < T; ++i) want -= lp(0, i, static_cast<std::size_t>(t[start + i + 1]));
    }
    model.train();
  }
  for (std::size_t batch : {1, 3, 8}) {
    INFO("batch " << batch);
    const nn::Evaluation e = nn::evaluate(model, t.size(), read, {5, batch});
    CHECK(e.tokens == 22);
    CHECK(e.nats == Approx(want).epsilon(1e-5));
    CHECK(e.nats_per_token() == Approx(want / 22).epsilon(1e-5));
    CHECK(e.perplexity() == Approx(std::exp(want / 22)).epsilon(1e-5));
    CHECK(e.bits_per_byte(44) == Approx(want / std::log(2.0) / 44).epsilon(1e-5));
  }
  CHECK(model.is_training());  // restored
  // seq_len 0 is max_len: windows of 8.
  CHECK(nn::evaluate(model, t.size(), read).tokens == 22);
}

TEST_CASE("evaluate: too few tokens, a window past max_len, a batch of 0 and 0 bytes are refused", "[gemm]") {
  nn::LanguageModel model(nn::LanguageModelOptions::llama_style(19, 16, 4, 2, 2).max_len(8));
  auto read = [](std::size_t, std::size_t n, std::int64_t* out) { std::fill_n(out, n, 1); };
  CHECK_THAT(error_of([&] { nn::evaluate(model, 1, read); }), Contains("evaluate: 1 tokens: at least 2"));
  CHECK_THAT(error_of([&] {
               nn::evaluate(model, 10, read, {9, 1});
             }),
             Contains("evaluate: seq_len 9 is more than the model's max_len 8"));
  CHECK_THAT(error_of([&] { nn::evaluate(model, 10, read, {4, 0}); }), Contains("evaluate: batch must be at least 1"));
  CHECK_THAT(error_of([&] { nn::Evaluation{1.0, 1}.bits_per_byte(0); }), Contains("bytes 0 must be positive"));
  auto bad = [](std::size_t, std::size_t n, std::int64_t* out) { std::fill_n(out, n, 19); };
  CHECK_THAT(error_of([&] { nn::evaluate(model, 10, bad); }), Contains("outside the vocabulary"));
}
