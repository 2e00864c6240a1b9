// Cross-attention (kdim, vdim), additive attention masks and padded LanguageModel batches: agreement
// with PyTorch on tests/fixtures/attention_cases.json (make_attention_fixtures.py writes it), gradient
// checks, padded rows against the row run alone, and the bad inputs of these calls. KV caches and
// generation are tested elsewhere. Set XGRAD_PRINT_REL_ERRORS=1 to print each case's worst error.
// Shapes: B batch, T query length, S key length, C d_model, H heads, V vocabulary.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agreement.hpp"
#include "fixture.hpp"
#include "module_gradcheck.hpp"
#include "small_models.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

using namespace testing;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Reading the fixture

const json& cases() {
  static const json j = testing::load_fixture("attention_cases.json");
  return j.at("cases");
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// An additive mask: numbers, and the string "-inf" for blocked entries.
Array to_additive(const json& j) {
  Shape shape;
  for (const auto& d : j.at("shape")) shape.push_back(d.get<std::size_t>());
  Array a = Array::from_shape(shape);
  const json& data = j.at("data");
  REQUIRE(data.size() == a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (data[i].is_string()) {
      REQUIRE(data[i].get<std::string>() == "-inf");
      a.data()[i] = -kInf;
    } else {
      a.data()[i] = static_cast<float>(data[i].get<double>());
    }
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Comparing

bool all_finite(const Array& a) {
  return std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); });
}

// Queries (b, h, t) whose every key is blocked by the mask (key padding or -inf) of a layer case.
std::vector<std::array<std::size_t, 3>> empty_rows(const nn::AttentionMask& mask, const Shape& w) {
  const std::optional<Mask> blocked = nn::combine_masks(mask, w[0], w[1], w[2], w[3]);
  std::vector<std::array<std::size_t, 3>> rows;
  if (!blocked) return rows;
  for (std::size_t b = 0; b < w[0]; ++b)
    for (std::size_t h = 0; h < w[1]; ++h)
      for (std::size_t t = 0; t < w[2]; ++t) {
        bool all = true;
        for (std::size_t s = 0; s < w[3]; ++s) all = all && (*blocked)(b, h, t, s);
        if (all) rows.push_back({b, h, t});
      }
  return rows;
}

// torch_mha_* (Norm::none) and mirror_* cases: MultiHeadAttention::forward(query, key, value, mask).
void run_layer_case(const std::string& name, const json& c) {
  nn::MultiHeadAttention m(
      nn::MultiHeadAttentionOptions(c.at("d_model").get<std::size_t>(), c.at("num_heads").get<std::size_t>())
          .kdim(c.at("kdim").get<std::size_t>())
          .vdim(c.at("vdim").get<std::size_t>())
          .dropout(0.f)
          .norm(norm_of(c)));
  load_params(name, m, c);
  nn::AttentionMask mask;
  mask.key_padding_mask = to_mask(c.at("key_padding_mask"));
  if (!c.at("additive_mask").is_null()) mask.additive_mask = to_additive(c.at("additive_mask"));
  const Tensor query(testing::to_array(c.at("query")), true), key(testing::to_array(c.at("key")), true),
      value(testing::to_array(c.at("value")), true);
  Worst worst;
  const nn::AttentionOutput out = m.forward(query, key, value, mask);
  compare(name, "output", out.output.value(), testing::to_array(c.at("output")), worst);
  compare(name, "attention weights", out.weights.value(), testing::to_array(c.at("attention")), worst);
  for (const auto& [b, h, t] : empty_rows(mask, out.weights.shape())) {
    for (std::size_t s = 0; s < out.weights.shape()[3]; ++s) {
      INFO("case " << name << ": query " << t << " of batch " << b << ", head " << h << " has no key");
      CHECK(out.weights.value()(b, h, t, s) == 0.f);
    }
  }
  const Array grad_out = testing::to_array(c.at("grad_out"));
  REQUIRE(out.output.shape() == grad_out.shape());
  out.output.backward(grad_out);
  const std::pair<const Tensor*, const char*> inputs[] = {
      {&query, "grad_query"}, {&key, "grad_key"}, {&value, "grad_value"}};
  for (const auto& [input, field] : inputs) {
    INFO("case " << name << ": " << field);
    REQUIRE(input->has_grad());
    compare(name, field, input->grad(), testing::to_array(c.at(field)), worst);
  }
  check_param_grads(name, m, c, worst);
  report(name, worst);
}

// `got` with the rows of padding queries (axis `query_axis`, which indexes T) taken from `want`:
// their values mean nothing and are not compared.
Array real_rows(const Array& got, const Array& want, const Mask& padding, std::size_t query_axis) {
  if (got.shape() != want.shape()) return got;  // the comparison reports the shapes
  Array out = got;
  const Shape& sh = got.shape();
  std::size_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < query_axis; ++k) outer *= sh[k];
  for (std::size_t k = query_axis + 1; k < sh.size(); ++k) inner *= sh[k];
  const std::size_t T = sh[query_axis], per_batch = outer / sh[0];
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t t = 0; t < T; ++t) {
      if (!padding(o / per_batch, t)) continue;
      const std::size_t at = (o * T + t) * inner;
      std::copy(want.data() + at, want.data() + at + inner, out.data() + at);
    }
  return out;
}

void run_lm_case(const std::string& name, const json& c) {
  nn::LanguageModel m(lm_options_of(c));
  load_params(name, m, c);
  const IndexArray ids = testing::to_index_array(c.at("ids")), targets = testing::to_index_array(c.at("targets"));
  const Mask padding = to_mask(c.at("key_padding_mask"));
  Worst worst;
  {
    NoGradGuard no_grad;
    const nn::LanguageModelOutput out = m.forward(ids, padding);
    const Array want = testing::to_array(c.at("logits"));
    compare(name, "logits of non-padding tokens", real_rows(out.logits.value(), want, padding, 1), want, worst);
    const json& attentions = c.at("attentions");
    REQUIRE(out.attentions.size() == attentions.size());
    for (std::size_t i = 0; i < attentions.size(); ++i) {
      const Array w = testing::to_array(attentions[i]);
      compare(name, "attention of block " + std::to_string(i) + " (non-padding queries)",
              real_rows(out.attentions[i].value(), w, padding, 2), w, worst);
    }
  }
  const Tensor loss = m.loss(ids, targets, padding);
  compare(name, "loss", loss.value(), testing::to_array(c.at("loss")), worst);
  loss.backward();
  check_param_grads(name, m, c, worst);
  report(name, worst);
}

// ---------------------------------------------------------------------------------------------
// Gradient checks

using Ins = std::vector<Tensor>;

const char* norm_name(nn::Norm n) { return n == nn::Norm::pre ? "pre" : n == nn::Norm::post ? "post" : "none"; }

// Cross-attention for the gradchecks and the bad inputs: B 2, T 3, S 4, C 8, H 2, kdim 5, vdim 6.
constexpr std::size_t kB = 2, kT = 3, kS = 4, kC = 8, kH = 2, kKdim = 5, kVdim = 6;

nn::MultiHeadAttentionOptions cross_options(nn::Norm norm) {
  return nn::MultiHeadAttentionOptions(kC, kH).kdim(kKdim).vdim(kVdim).dropout(0.f).norm(norm);
}

const Mask& cross_padding() {
  static const Mask m = {{false, false, false, true}, {true, false, true, false}};  // (B, S)
  return m;
}

// query, key, value of the small cross-attention, from `seed`.
Ins cross_inputs(std::uint64_t seed) {
  return {randn({kB, kT, kC}, seed), randn({kB, kS, kKdim}, seed + 1), randn({kB, kS, kVdim}, seed + 2)};
}

void check_cross_attention(nn::Norm norm, const nn::AttentionMask& mask, std::uint64_t seed) {
  INFO("norm " << norm_name(norm));
  Generator gen(seed);
  nn::MultiHeadAttention mha(cross_options(norm), gen);
  randomize_norms(mha, seed + 1);
  REQUIRE(mha.w_k->weight.shape() == Shape{kC, kKdim});
  REQUIRE(mha.w_v->weight.shape() == Shape{kC, kVdim});
  const Ins in = cross_inputs(seed + 2);
  const GradcheckResult res = check_module_grads(
      mha, [&](const Ins& x) { return mha.forward(x[0], x[1], x[2], mask).output; }, in);
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.tensors == 3 + 8 + (norm == nn::Norm::none ? 0u : 2u));
  REQUIRE(res.checked == mha.num_parameters() + kB * (kT * kC + kS * kKdim + kS * kVdim));
  // and of the weights, which the residual and the norm do not touch
  REQUIRE_GRADS_OK(check_module_grads(
      mha, [&](const Ins& x) { return mha.forward(x[0], x[1], x[2], mask).weights; }, in));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Agreement with PyTorch

TEST_CASE("attention agreement: the fixture loads and every case has a test", "[torch][attention]") {
  const std::set<std::string> expected = {"torch_mha_padding", "torch_mha_additive_2d", "torch_mha_additive_3d",
                                          "mirror_pre_cross",  "mirror_post_cross",     "mirror_pre_blocked_row",
                                          "lm_padded_pre",     "lm_padded_post"};
  for (const auto& name : expected) {
    INFO("missing fixture case " << name);
    CHECK(cases().contains(name));
  }
  for (const auto& [name, c] : cases().items()) {
    INFO("fixture case " << name << " has no test family");
    CHECK((starts_with(name, "torch_mha_") || starts_with(name, "mirror_") || starts_with(name, "lm_padded_")));
  }
}

TEST_CASE("attention agreement: nn.MultiheadAttention cross-attention with kdim, vdim, key padding and additive masks",
          "[torch][attention][gemm]") {
  run_family(cases(), "torch_mha_", run_layer_case);
}

TEST_CASE("attention agreement: Pre-Norm and Post-Norm cross-attention (norm on the query only)",
          "[torch][attention][gemm]") {
  run_family(cases(), "mirror_", run_layer_case);
}

TEST_CASE("attention agreement: LanguageModel with a key_padding_mask (left, right, no padding)",
          "[torch][attention][transformer][gemm]") {
  run_family(cases(), "lm_padded_", run_lm_case);
}

// ---------------------------------------------------------------------------------------------
// Gradient checks

TEST_CASE("cross-attention gradients with kdim, vdim and a key_padding_mask", "[attention][gradcheck][gemm]") {
  nn::AttentionMask mask;
  mask.key_padding_mask = cross_padding();
  check_cross_attention(nn::Norm::none, mask, 60);
}

TEST_CASE("Pre-Norm and Post-Norm cross-attention gradients, and the residual and the norm take the query only",
          "[attention][gradcheck][gemm]") {
  nn::AttentionMask mask;
  mask.key_padding_mask = cross_padding();
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    check_cross_attention(norm, mask, 70);
    INFO("norm " << norm_name(norm));
    Generator gen(71);
    nn::MultiHeadAttention mha(cross_options(norm), gen);
    randomize_norms(mha, 72);
    const Ins in = cross_inputs(73);
    NoGradGuard no_grad;
    const Array y = mha.forward(in[0], in[1], in[2], mask).output.value();
    // the formulas of nn/attention.hpp, with the sublayer alone
    const nn::Attention& f = mha.sublayer();
    const Array want = norm == nn::Norm::pre
                           ? (in[0] + f.forward(mha.norm->forward(in[0]), in[1], in[2], mask).output).value()
                           : mha.norm->forward(in[0] + f.forward(in[0], in[1], in[2], mask).output).value();
    CHECK(testing::rel_error(y, want) <= 1e-6);
  }
}

TEST_CASE("cross-attention of x over itself is self-attention, except Pre-Norm's keys and values skip the norm",
          "[attention][gemm]") {
  nn::AttentionMask mask;
  mask.causal = true;
  mask.key_padding_mask = Mask{{false, false, true}, {false, false, false}};
  const Tensor x = randn({kB, kT, kC}, 160);
  for (nn::Norm norm : {nn::Norm::none, nn::Norm::post, nn::Norm::pre}) {
    INFO("norm " << norm_name(norm));
    Generator gen(161);
    nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(kC, kH).dropout(0.f).norm(norm), gen);
    randomize_norms(mha, 162);
    NoGradGuard no_grad;
    const Array self = mha.forward(x, mask).output.value();
    const Array cross = mha.forward(x, x, x, mask).output.value();
    if (norm == nn::Norm::pre) {
      const Tensor n = mha.norm->forward(x);
      CHECK(testing::rel_error(self, mha.forward(x, n, n, mask).output.value()) <= 1e-6);
      CHECK(testing::rel_error(cross, self) > 1e-3);
    } else {
      CHECK(testing::rel_error(cross, self) <= 1e-6);
    }
  }
}

TEST_CASE("additive mask gradients with -inf entries and a query with every key blocked",
          "[attention][gradcheck][gemm]") {
  // (T, S): query 1 has no key; the others mix finite offsets and -inf
  const Array additive = {{0.5f, -kInf, 1.25f, -0.75f}, {-kInf, -kInf, -kInf, -kInf}, {-kInf, 2.f, 0.f, -kInf}};
  for (nn::Norm norm : {nn::Norm::none, nn::Norm::pre, nn::Norm::post}) {
    INFO("norm " << norm_name(norm));
    nn::AttentionMask mask;
    mask.additive_mask = additive;
    Generator gen(80);
    nn::MultiHeadAttention mha(cross_options(norm), gen);
    randomize_norms(mha, 81);
    const Ins in = cross_inputs(82);
    const nn::AttentionOutput out = mha.forward(in[0], in[1], in[2], mask);
    const Array& w = out.weights.value();
    REQUIRE(w.shape() == Shape{kB, kH, kT, kS});
    std::size_t nonzero_blocked = 0, rows_off = 0;
    for (std::size_t b = 0; b < kB; ++b)
      for (std::size_t h = 0; h < kH; ++h)
        for (std::size_t t = 0; t < kT; ++t) {
          double sum = 0;
          for (std::size_t s = 0; s < kS; ++s) {
            sum += w(b, h, t, s);
            if (std::isinf(additive(t, s))) nonzero_blocked += w(b, h, t, s) != 0.f;
          }
          if (t != 1 && std::abs(sum - 1.0) > 1e-5) ++rows_off;
        }
    CHECK(nonzero_blocked == 0);  // includes every weight of query 1
    CHECK(rows_off == 0);
    REQUIRE(all_finite(out.output.value()));
    out.output.backward(randn(out.output.shape(), 83).value());
    for (std::size_t i = 0; i < in.size(); ++i) {
      INFO("input " << i);
      REQUIRE(in[i].has_grad());
      CHECK(all_finite(in[i].grad()));
    }
    for (const auto& [name, p] : mha.named_parameters()) {
      INFO("parameter " << name);
      CHECK((p.has_grad() && all_finite(p.grad())));
    }
    mha.zero_grad();
    const GradcheckResult res = check_module_grads(
        mha, [&](const Ins& x) { return mha.forward(x[0], x[1], x[2], mask).output; }, cross_inputs(82));
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE_GRADS_OK(check_module_grads(
        mha, [&](const Ins& x) { return mha.forward(x[0], x[1], x[2], mask).weights; }, cross_inputs(82)));
  }
}

TEST_CASE("LanguageModel loss gradients with a key_padding_mask", "[attention][gradcheck][transformer][gemm]") {
  // vocab 7, d_model 8, 2 heads, 2 layers, max_len 6: rows padded on the left, the right, in the middle
  const IndexArray ids = {{0, 0, 3, 6, 1, 5}, {2, 4, 4, 0, 0, 0}, {5, 1, 0, 0, 2, 3}};
  const Mask padding = {{true, true, false, false, false, false},
                        {false, false, false, true, true, true},
                        {false, false, true, true, false, false}};
  const IndexArray targets = {{-100, -100, 6, 1, 5, 2}, {4, 4, 1, -100, -100, -100}, {1, 2, -100, -100, 3, 6}};
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    INFO("norm " << norm_name(norm));
    Generator gen(90);
    nn::LanguageModel lm(nn::LanguageModelOptions(7, 8, 2, 2).max_len(6).dropout(0.f).norm(norm), gen);
    randomize_norms(lm, 91);
    const GradcheckResult res = check_module_grads(lm, [&](const Ins&) { return lm.loss(ids, targets, padding); }, {});
    INFO(res.report);
    REQUIRE(res.ok);
    REQUIRE(res.checked == lm.num_parameters());
  }
}

// ---------------------------------------------------------------------------------------------
// Padded rows against the row alone

TEST_CASE("LanguageModel: a left- or right-padded row gives the logits it gives alone",
          "[attention][transformer][gemm]") {
  // max_len 8; pad ids are arbitrary tokens, which must not matter
  const std::vector<std::vector<std::int64_t>> rows = {{3, 9, 1, 4, 7}, {2, 2, 8, 5}, {6, 1, 0, 10, 3, 3, 4}};
  const std::size_t T = 7;
  const bool left[] = {true, false, false};
  for (nn::Positional positional : {nn::Positional::learned, nn::Positional::sinusoidal}) {
    for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
      INFO("norm " << norm_name(norm) << ", positional "
                   << (positional == nn::Positional::learned ? "learned" : "sinusoidal"));
      const auto lm = testing::eval_lm(testing::small_lm().norm(norm).positional(positional), 100);
      IndexArray ids = IndexArray::from_shape({rows.size(), T});
      Mask padding = Mask::from_shape({rows.size(), T});
      std::vector<std::size_t> start(rows.size());
      for (std::size_t r = 0; r < rows.size(); ++r) {
        start[r] = left[r] ? T - rows[r].size() : 0;
        for (std::size_t t = 0; t < T; ++t) {
          padding(r, t) = t < start[r] || t >= start[r] + rows[r].size();
          ids(r, t) = padding(r, t) ? static_cast<std::int64_t>((5 * t + r) % 11) : rows[r][t - start[r]];
        }
      }
      NoGradGuard no_grad;
      const nn::LanguageModelOutput batch = lm->forward(ids, padding);
      const Array& logits = batch.logits.value();
      REQUIRE(logits.shape() == Shape{rows.size(), T, 11});
      for (std::size_t r = 0; r < rows.size(); ++r) {
        INFO("row " << r << (left[r] ? " (left-padded)" : " (right-padded or full)"));
        IndexArray alone = IndexArray::from_shape({1, rows[r].size()});
        std::copy(rows[r].begin(), rows[r].end(), alone.begin());
        const Array want = lm->forward(alone).logits.value();
        double diff = 0;
        for (std::size_t t = 0; t < rows[r].size(); ++t)
          for (std::size_t v = 0; v < 11; ++v) {
            diff = std::max(diff, static_cast<double>(std::abs(logits(r, start[r] + t, v) - want(0, t, v))));
          }
        CAPTURE(diff);
        CHECK(diff <= 1e-5);
        // no query attends to a padding key, in any block
        std::size_t leaks = 0;
        for (const Tensor& a : batch.attentions)
          for (std::size_t h = 0; h < a.shape()[1]; ++h)
            for (std::size_t t = 0; t < T; ++t)
              for (std::size_t s = 0; s < T; ++s) leaks += padding(r, s) && a.value()(r, h, t, s) != 0.f;
        CHECK(leaks == 0);
      }
    }
  }
}

TEST_CASE("LanguageModel: a mask without padding changes nothing, and a row of only padding stays finite",
          "[attention][transformer][gemm]") {
  const IndexArray ids = {{1, 5, 9, 2, 7, 3}, {4, 4, 0, 8, 6, 10}};
  const IndexArray targets = {{5, 9, 2, 7, 3, 1}, {-100, -100, -100, -100, -100, -100}};
  Mask padding = xt::zeros<bool>(Shape{2, 6});
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    INFO("norm " << norm_name(norm));
    const auto lm = testing::eval_lm(testing::small_lm().norm(norm), 150);
    {
      NoGradGuard no_grad;
      CHECK(testing::rel_error(lm->forward(ids, padding).logits.value(), lm->forward(ids).logits.value()) <= 1e-6);
    }
    Mask row_padded = padding;
    for (std::size_t t = 0; t < 6; ++t) row_padded(1, t) = true;
    const nn::LanguageModelOutput out = lm->forward(ids, row_padded);
    CHECK(all_finite(out.logits.value()));
    for (const Tensor& a : out.attentions) {
      const Array& w = a.value();
      CHECK(std::all_of(w.begin() + static_cast<std::ptrdiff_t>(w.size() / 2), w.end(),
                        [](float v) { return v == 0.f; }));
    }
    const Tensor loss = lm->loss(ids, targets, row_padded);
    REQUIRE(std::isfinite(loss.value()()));
    loss.backward();
    for (const auto& [name, p] : lm->named_parameters()) {
      INFO("parameter " << name);
      CHECK((p.has_grad() && all_finite(p.grad())));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input

namespace {

// A message that names +inf: "inf" not as part of "-inf", or "+inf", or "infinity".
struct NamesPlusInf : Catch::MatcherBase<std::string> {
  bool match(const std::string& s) const override {
    for (std::size_t at = s.find("inf"); at != std::string::npos; at = s.find("inf", at + 1)) {
      if (at == 0 || s[at - 1] != '-') return true;
    }
    return false;
  }
  std::string describe() const override { return "names +inf (not only -inf)"; }
};

}  // namespace

TEST_CASE("cross-attention refuses key and value of different lengths or batches, and a key not kdim wide",
          "[attention][bad][gemm]") {
  Generator gen(110);
  nn::MultiHeadAttention mha(cross_options(nn::Norm::pre), gen);
  const Tensor q = randn({kB, kT, kC}, 111), k = randn({kB, kS, kKdim}, 112), v = randn({kB, kS, kVdim}, 113);
  // the valid call, so each failure below is the shape's
  REQUIRE(mha.forward(q, k, v).output.shape() == Shape{kB, kT, kC});
  SECTION("value of another length S than the key") {
    REQUIRE_THROWS_AS(mha.forward(q, k, randn({kB, kS + 1, kVdim}, 114)), Error);
    REQUIRE_THROWS_WITH(mha.forward(q, k, randn({kB, kS + 1, kVdim}, 114)),
                        Contains("MultiHeadAttention") && Contains("value") && Contains("(2, 5, 6)"));
    REQUIRE_THROWS_WITH(mha.forward(q, randn({kB, kS - 1, kKdim}, 115), v),
                        Contains("MultiHeadAttention") && (Contains("(2, 3, 5)") || Contains("(2, 4, 6)")));
  }
  SECTION("key or value of another batch than the query") {
    REQUIRE_THROWS_WITH(mha.forward(q, randn({3, kS, kKdim}, 116), randn({3, kS, kVdim}, 117)),
                        Contains("MultiHeadAttention") && Contains("key") && Contains("(3, 4, 5)"));
    REQUIRE_THROWS_WITH(mha.forward(q, k, randn({1, kS, kVdim}, 118)),
                        Contains("MultiHeadAttention") && Contains("value") && Contains("(1, 4, 6)"));
  }
  SECTION("key width other than kdim, value width other than vdim") {
    REQUIRE_THROWS_WITH(mha.forward(q, randn({kB, kS, kC}, 119), v),
                        Contains("MultiHeadAttention") && Contains("kdim") && Contains("(2, 4, 8)"));
    REQUIRE_THROWS_WITH(mha.forward(q, k, randn({kB, kS, kKdim}, 120)),
                        Contains("MultiHeadAttention") && Contains("vdim") && Contains("(2, 4, 5)"));
    REQUIRE_THROWS_WITH(mha.forward(q, randn({kB, kS}, 121), v),
                        Contains("MultiHeadAttention") && Contains("key") && Contains("(2, 4)"));
  }
}

TEST_CASE("an additive mask with NaN or +inf, or of a shape that does not broadcast, is refused",
          "[attention][bad][gemm]") {
  Generator gen(130);
  nn::MultiHeadAttention cross(cross_options(nn::Norm::none), gen);
  nn::MultiHeadAttention self(nn::MultiHeadAttentionOptions(kC, kH).dropout(0.f).norm(nn::Norm::pre), gen);
  const Tensor q = randn({kB, kT, kC}, 131), k = randn({kB, kS, kKdim}, 132), v = randn({kB, kS, kVdim}, 133);
  Array good = xt::zeros<float>(Shape{kT, kS});
  good(0, 1) = -kInf;
  nn::AttentionMask mask;
  mask.additive_mask = good;
  REQUIRE(cross.forward(q, k, v, mask).weights.value()(0, 0, 0, 1) == 0.f);  // -inf is allowed
  SECTION("NaN") {
    Array bad = good;
    bad(2, 3) = std::numeric_limits<float>::quiet_NaN();
    mask.additive_mask = bad;
    REQUIRE_THROWS_WITH(cross.forward(q, k, v, mask), Contains("MultiHeadAttention") && Contains("additive_mask") &&
                                                          Contains("nan", Catch::CaseSensitive::No));
    Array bad_self = xt::zeros<float>(Shape{kT, kT});
    bad_self(1, 0) = std::numeric_limits<float>::quiet_NaN();
    mask.additive_mask = bad_self;
    REQUIRE_THROWS_WITH(self.forward(q, mask), Contains("MultiHeadAttention") && Contains("additive_mask") &&
                                                   Contains("nan", Catch::CaseSensitive::No));
  }
  SECTION("+inf") {
    Array bad = good;
    bad(1, 2) = kInf;
    mask.additive_mask = bad;
    REQUIRE_THROWS_WITH(cross.forward(q, k, v, mask),
                        Contains("MultiHeadAttention") && Contains("additive_mask") && NamesPlusInf());
    Array bad_self = xt::zeros<float>(Shape{1, kH, 1, kT});
    bad_self(0, 1, 0, 2) = kInf;
    mask.additive_mask = bad_self;
    REQUIRE_THROWS_WITH(self.forward(q, mask),
                        Contains("MultiHeadAttention") && Contains("additive_mask") && NamesPlusInf());
  }
  SECTION("a shape that does not broadcast to (B, H, T, S)") {
    for (const Shape& shape :
         {Shape{kS, kT}, Shape{kT, kS + 1}, Shape{3, kH, kT, kS}, Shape{kB, kH + 1, 1, kS}, Shape{1, kB, kH, kT, kS}}) {
      mask.additive_mask = Array(xt::zeros<float>(shape));
      const std::string s = shape_str(shape);
      INFO("additive_mask of shape " << s);
      REQUIRE_THROWS_WITH(cross.forward(q, k, v, mask),
                          Contains("MultiHeadAttention") && Contains("additive_mask") && Contains(s));
    }
  }
}

TEST_CASE("LanguageModel refuses a key_padding_mask whose shape is not the ids'",
          "[attention][bad][transformer][gemm]") {
  const auto lm = testing::eval_lm(testing::small_lm(), 140);
  const IndexArray ids = {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}};  // (2, 5)
  const IndexArray targets = {{2, 3, 4, 5, -100}, {7, 8, 9, 10, -100}};
  REQUIRE(lm->forward(ids, Mask(xt::zeros<bool>({2, 5}))).logits.shape() == Shape{2, 5, 11});
  for (const Shape& shape : {Shape{2, 4}, Shape{5, 2}, Shape{1, 5}, Shape{5}, Shape{2, 1, 5}}) {
    const Mask bad = xt::zeros<bool>(shape);
    const std::string s = shape_str(shape);
    INFO("key_padding_mask of shape " << s);
    REQUIRE_THROWS_WITH(lm->forward(ids, bad),
                        Contains("LanguageModel") && Contains("key_padding_mask") && Contains(s));
    REQUIRE_THROWS_WITH(lm->loss(ids, targets, bad),
                        Contains("LanguageModel") && Contains("key_padding_mask") && Contains(s));
  }
}
