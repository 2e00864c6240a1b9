// Gradient accumulation: N micro-batches give the gradients (and the AdamW update) of one batch N
// times larger, to rounding.
#include <vector>

#include <catch2/catch.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "error_of.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/accumulate.hpp"
#include "xgrad/optim/adam.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using testing::error_of;

namespace {

IndexArray rows(const IndexArray& a, std::size_t from, std::size_t n) {
  return IndexArray(xt::view(a, xt::range(from, from + n), xt::all()));
}

}  // namespace

TEST_CASE("grad accumulation: 4 micro-batches of 2 rows give one batch of 8's gradients and AdamW update", "[gemm]") {
  const auto options = nn::LanguageModelOptions::llama_style(23, 16, 4, 2, 2).max_len(16).dropout(0.f);
  nn::LanguageModel whole(options, *std::make_unique<Generator>(1)), parts(options, *std::make_unique<Generator>(1));
  Generator g(9);
  IndexArray ids = IndexArray::from_shape({8, 6}), targets = IndexArray::from_shape({8, 6});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = static_cast<std::int64_t>(g.uniform() * 23) % 23;
    targets.data()[i] = static_cast<std::int64_t>(g.uniform() * 23) % 23;
  }
  optim::AdamW a(whole.named_trainable_parameters(), optim::AdamOptions(1e-2f));
  optim::AdamW b(parts.named_trainable_parameters(), optim::AdamOptions(1e-2f));
  const float full = whole.loss(ids, targets).item();
  whole.loss(ids, targets).backward();
  const double mean = optim::accumulate_gradients(
      {12, 12, 12, 12}, [&](std::size_t k) { return parts.loss(rows(ids, 2 * k, 2), rows(targets, 2 * k, 2)); });
  CHECK(mean == Approx(full).epsilon(1e-6));
  const auto pw = whole.named_parameters(), pp = parts.named_parameters();
  for (std::size_t i = 0; i < pw.size(); ++i) {
    INFO(pw[i].first);
    const double scale = xt::amax(xt::abs(pw[i].second.grad()))();
    CHECK(xt::amax(xt::abs(pw[i].second.grad() - pp[i].second.grad()))() <= 1e-5 * scale + 1e-8);
  }
  a.step();
  b.step();
  for (std::size_t i = 0; i < pw.size(); ++i) {
    INFO(pw[i].first);
    CHECK(xt::amax(xt::abs(pw[i].second.value() - pp[i].second.value()))() <= 1e-5);
  }
  // Unequal micro-batches are weighted by their targets: 6 rows and 2 rows.
  parts.zero_grad();
  whole.zero_grad();
  whole.loss(ids, targets).backward();
  optim::accumulate_gradients({36, 12}, [&](std::size_t k) {
    return k == 0 ? parts.loss(rows(ids, 0, 6), rows(targets, 0, 6)) : parts.loss(rows(ids, 6, 2), rows(targets, 6, 2));
  });
  for (std::size_t i = 0; i < pw.size(); ++i) {
    const double scale = xt::amax(xt::abs(pw[i].second.grad()))();
    CHECK(xt::amax(xt::abs(pw[i].second.grad() - pp[i].second.grad()))() <= 1e-5 * scale + 1e-8);
  }
}

TEST_CASE("grad accumulation: no micro-batch, no target and a loss of several values are refused", "[gemm]") {
  auto never = [](std::size_t) -> Tensor {
    FAIL("ran");
    return Tensor();
  };
  CHECK_THAT(error_of([&] { optim::accumulate_gradients({}, never); }),
             Contains("accumulate_gradients: no micro-batch"));
  CHECK_THAT(error_of([&] { optim::accumulate_gradients({0, 0}, never); }), Contains("hold no target"));
  const Tensor x(Array(xt::ones<float>({2})), true);
  CHECK_THAT(error_of([&] { optim::accumulate_gradients({1}, [&](std::size_t) { return x * 2.f; }); }),
             Contains("loss has shape (2), not one value"));
}
