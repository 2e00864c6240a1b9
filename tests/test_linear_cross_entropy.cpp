// linear_cross_entropy, the head and loss fused over chunks of rows: finite differences, the
// unfused ops' values and gradients (fp32 and bf16, over several chunks), the language model's
// loss on it, the cases that need the logits on the unfused path, and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "error_of.hpp"
#include "fixture.hpp"
#include "random_tensors.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;
using testing::randn;

namespace {

using Ins = std::vector<Tensor>;

// The op that produced t (the tape's name for it).
std::string creator(const Tensor& t) { return t.node()->creator.lock()->op; }

// Targets in [0, V) with every `gap`-th one ignored.
IndexArray some_targets(std::size_t rows, std::size_t V, std::size_t gap) {
  Generator g(5);
  IndexArray t = IndexArray::from_shape({rows});
  for (std::size_t r = 0; r < rows; ++r)
    t(r) = r % gap == gap - 1 ? kIgnoreIndex : static_cast<std::int64_t>(g.below(V));
  return t;
}

// Loss and gradients of the fused op and of linear then cross_entropy on the same leaves.
struct Both {
  float fused, plain;
  std::vector<Array> fused_grads, plain_grads;
};

Both run_both(const Tensor& x, const Tensor& w, const Tensor& b, const IndexArray& targets, float seed = 1.f) {
  Both out;
  const std::vector<Tensor> leaves = b.defined() ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
  auto grads = [&](const Tensor& loss, std::vector<Array>& into) {
    for (Tensor t : leaves) t.zero_grad();  // a handle: the copy shares the gradient
    (loss * seed).backward();
    // a leaf backward did not reach (cross_entropy with every target ignored) counts as zeros
    for (const Tensor& t : leaves) into.push_back(t.has_grad() ? t.grad() : Array(xt::zeros<float>(t.shape())));
  };
  const Tensor fused = linear_cross_entropy(x, w, b, targets);
  REQUIRE(creator(fused) == "linear_cross_entropy");
  out.fused = fused.item();
  grads(fused, out.fused_grads);
  const Tensor plain = cross_entropy(linear(x, w, b), targets);
  out.plain = plain.item();
  grads(plain, out.plain_grads);
  return out;
}

}  // namespace

TEST_CASE("gradcheck: linear_cross_entropy of x, weight and bias, with ignored targets", "[gradcheck][nn][gemm]") {
  const IndexArray targets = {{1, -100, 4}, {0, 3, 6}};
  REQUIRE_GRADCHECK([targets](const Ins& in) { return linear_cross_entropy(in[0], in[1], in[2], targets); },
                    {randn({2, 3, 4}, 301), randn({7, 4}, 302, 0.7f), randn({7}, 303, 0.3f)});
  REQUIRE_GRADCHECK([targets](const Ins& in) { return linear_cross_entropy(in[0], in[1], Tensor(), targets) * 3.f; },
                    {randn({2, 3, 4}, 304), randn({7, 4}, 305, 0.7f)});
}

TEST_CASE("linear_cross_entropy gives linear then cross_entropy's loss and gradients, over several chunks",
          "[nn][gemm]") {
  // V = 2^15 gives chunks of 256 rows: 600 rows are three chunks, the last of 88.
  const std::size_t V = 1 << 15, C = 8;
  const IndexArray targets = some_targets(600, V, 7);
  const Tensor x = randn({600, C}, 311), w = randn({V, C}, 312, 0.5f), b = randn({V}, 313, 0.1f);
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    INFO(precision_name(p));
    AutocastGuard guard(p);
    const Both r = run_both(x, w, b, targets, 0.5f);
    CHECK(r.fused == Approx(r.plain).epsilon(1e-6));
    for (std::size_t i = 0; i < 3; ++i) {
      INFO("gradient " << i);
      CHECK(testing::rel_error(r.fused_grads[i], r.plain_grads[i]) < 1e-5);
    }
  }
}

TEST_CASE("linear_cross_entropy: every target ignored gives 0 and zero gradients, without a bias", "[nn][gemm]") {
  const Tensor x = randn({3, 4}, 321), w = randn({5, 4}, 322);
  const Both r = run_both(x, w, Tensor(), IndexArray{-100, -100, -100});
  CHECK(r.fused == 0.f);
  for (const Array& g : r.fused_grads) CHECK(xt::amax(xt::abs(g))() == 0.f);
}

TEST_CASE("linear_cross_entropy without recording computes no gradient and the same loss", "[nn][gemm]") {
  const Tensor x = randn({4, 3}, 331), w = randn({6, 3}, 332);
  const IndexArray targets = {0, 5, 2, -100};
  const float recorded = linear_cross_entropy(x, w, Tensor(), targets).item();
  NoGradGuard no_grad;
  const Tensor loss = linear_cross_entropy(x, w, Tensor(), targets);
  CHECK_FALSE(loss.requires_grad());
  CHECK(loss.item() == recorded);
}

TEST_CASE("LanguageModel::loss fuses the head and loss, with the logits' gradients", "[nn][gemm]") {
  using nn::LanguageModel;
  using nn::LanguageModelOptions;
  Generator gen(7);
  const IndexArray ids = {{1, 4, 2, 9}, {3, 3, 0, 8}}, targets = {{4, 2, 9, -100}, {3, 0, 8, 1}};
  const Mask padding = {{true, false, false, false}, {false, false, false, false}};
  auto compare = [&](LanguageModel& model, bool fused) {
    model.eval();  // the same forward twice: no dropout
    for (const bool padded : {false, true}) {
      INFO((padded ? "padded" : "unpadded"));
      const Tensor loss = padded ? model.loss(ids, targets, padding) : model.loss(ids, targets);
      CHECK(creator(loss) == (fused ? "linear_cross_entropy" : "cross_entropy"));
      model.zero_grad();
      loss.backward();
      std::vector<Array> got;
      for (const auto& [n, p] : model.named_parameters()) got.push_back(p.grad());
      const Tensor logits = padded ? model.forward(ids, padding).logits : model.forward(ids).logits;
      const Tensor plain = cross_entropy(logits, targets);
      CHECK(loss.item() == Approx(plain.item()).epsilon(1e-6));
      model.zero_grad();
      plain.backward();
      std::size_t i = 0;
      for (const auto& [n, p] : model.named_parameters()) {
        INFO(n);
        CHECK(testing::rel_error(got[i++], p.grad()) < 1e-5);
      }
    }
  };
  SECTION("tied and untied heads take the fused op") {
    for (const bool tied : {false, true}) {
      LanguageModel model(LanguageModelOptions(11, 8, 2, 2).tie_embeddings(tied).head_bias(!tied), gen);
      compare(model, true);
    }
  }
  SECTION("a logits hook, final_softcap and an unmerged adapter on the head take the unfused ops") {
    LanguageModel hooked(LanguageModelOptions(11, 8, 2, 2), gen);
    std::size_t seen = 0;
    const auto handle = hooked.add_forward_hook("logits", [&](const Tensor& t) {
      ++seen;
      return t;
    });
    compare(hooked, false);
    CHECK(seen > 0);
    LanguageModel capped(LanguageModelOptions(11, 8, 2, 2).final_softcap(5.f), gen);
    compare(capped, false);
    LanguageModel adapted(LanguageModelOptions(11, 8, 2, 2), gen);
    adapted.head->add_lora(nn::LoraOptions().rank(2), gen);
    compare(adapted, false);
  }
}

TEST_CASE("linear_cross_entropy refuses bad input by name", "[nn][errors]") {
  const Tensor x = randn({2, 4}, 341), w = randn({5, 4}, 342);
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, randn({5, 3}, 1), Tensor(), IndexArray{0, 1});
             }),
             Catch::Contains("linear_cross_entropy: input of shape (2, 4) does not end in the weight's C = 3"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, randn({5}, 1), Tensor(), IndexArray{0, 1});
             }),
             Catch::Contains("linear_cross_entropy: weight must be (V, C)"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, w, randn({4}, 1), IndexArray{0, 1});
             }),
             Catch::Contains("linear_cross_entropy: bias of shape (4) is not (V,) = (5,)"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, w, Tensor(), IndexArray{0, 1, 2});
             }),
             Catch::Contains("linear_cross_entropy: targets of shape (3) do not match input (2, 4)"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, w, Tensor(), IndexArray{0, 5});
             }),
             Catch::Contains("linear_cross_entropy: target 5 at flat position 1 is outside [0, 5)"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(Tensor(), w, Tensor(), IndexArray{0, 1});
             }),
             Catch::Contains("linear_cross_entropy: input is an undefined tensor"));
}

TEST_CASE("linear_cross_entropy takes cross_entropy's exact row arithmetic for infinite and NaN logits",
          "[nn][numerical][gemm]") {
  const Tensor x = randn({3, 4}, 351), w = randn({5, 4}, 352);
  const IndexArray targets = {0, 4, 2};
  SECTION("a class whose bias is -inf") {
    Array bias = xt::zeros<float>({5});
    bias(3) = -std::numeric_limits<float>::infinity();
    const Tensor b(bias, true);
    const Both r = run_both(x, w, b, targets);
    REQUIRE(std::isfinite(r.fused));
    CHECK(r.fused == Approx(r.plain).epsilon(1e-6));
    for (std::size_t i = 0; i < 3; ++i) CHECK(testing::rel_error(r.fused_grads[i], r.plain_grads[i]) < 1e-6);
    CHECK(r.fused_grads[2](3) == 0.f);
  }
  SECTION("a NaN in one row of x") {
    Array xv = x.value();
    xv(1, 2) = std::numeric_limits<float>::quiet_NaN();
    const Tensor xn(xv, true);
    const Both r = run_both(xn, w, Tensor(), targets);
    CHECK(std::isnan(r.fused));
    CHECK(std::isnan(r.plain));
  }
}

TEST_CASE("linear_cross_entropy backpropagates again through a kept graph", "[nn][gemm]") {
  const Tensor x = randn({5, 3}, 361), w = randn({7, 3}, 362), b = randn({7}, 363);
  const IndexArray targets = {6, 0, -100, 3, 3};
  const Tensor loss = linear_cross_entropy(x, w, b, targets) * 0.5f;
  loss.backward(true);
  loss.backward(true);  // the second pass adds the same gradients again
  const std::vector<Array> twice = {x.grad(), w.grad(), b.grad()};
  for (Tensor t : {x, w, b}) t.zero_grad();
  (cross_entropy(linear(x, w, b), targets) * 1.f).backward();
  const std::vector<Array> once = {x.grad(), w.grad(), b.grad()};
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    CHECK(testing::rel_error(twice[i], once[i]) < 1e-6);
  }
}
