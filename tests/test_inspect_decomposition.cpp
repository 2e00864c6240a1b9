// TransformerLens parity: the hook-name table and lookup, the per-head points z and result, the
// residual-stream decomposition and direct logit attribution, on the classic, GPT-2 and Llama
// layouts, with norms and biases away from their initial values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/inspect/residual_decomposition.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;

namespace {

constexpr std::size_t kV = 13, kC = 16, kH = 4, kL = 2, kB = 2, kT = 6;

struct Layout {
  std::string name;
  nn::LanguageModelOptions options;
};

std::vector<Layout> layouts() {
  return {
      {"classic (LayerNorm, learned positions, untied)",
       nn::LanguageModelOptions(kV, kC, kH, kL).d_ff(32).max_len(8).dropout(0.f)},
      {"GPT-2 (tied embeddings, tanh GELU)",
       nn::LanguageModelOptions::gpt2_style(kV, kC, kH, kL).max_len(8).dropout(0.f)},
      {"Llama (RMSNorm, RoPE, SwiGLU, 2 key/value heads, no biases)",
       nn::LanguageModelOptions::llama_style(kV, kC, kH, kL, 2).max_len(8).dropout(0.f)},
  };
}

IndexArray random_ids(std::uint64_t seed) { return testing::uniform_ids(kB, kT, kV, seed); }

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_abs(const Array& a) {
  double m = 0;
  for (float v : a) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

// The entries of a stack (N, B, T, C) summed over N, in double.
std::vector<double> stack_sum(const Array& stack) {
  const std::size_t N = stack.shape()[0], per = stack.size() / N;
  std::vector<double> s(per, 0.);
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t i = 0; i < per; ++i) s[i] += stack.data()[n * per + i];
  }
  return s;
}

}  // namespace

TEST_CASE("TransformerLens hook names translate to xgrad's points and back") {
  REQUIRE(from_transformer_lens("hook_embed") == "tok_embed");
  REQUIRE(from_transformer_lens("hook_pos_embed") == "pos_embed");
  REQUIRE(from_transformer_lens("blocks.3.hook_resid_pre") == "blocks.3.stream_in");
  REQUIRE(from_transformer_lens("blocks.12.attn.hook_z") == "blocks.12.attn.z");
  REQUIRE(from_transformer_lens("blocks.0.attn.hook_attn_scores") == "blocks.0.attn.scores");
  REQUIRE(from_transformer_lens("blocks.1.mlp.hook_post") == "blocks.1.ffn.hidden");
  REQUIRE(from_transformer_lens("blocks.1.hook_mlp_out") == "blocks.1.ffn.out");
  REQUIRE(from_transformer_lens("ln_final.hook_normalized") == "normalized");
  // Not TransformerLens names with a point: no translation.
  REQUIRE_FALSE(from_transformer_lens("blocks.1.ln1.hook_scale"));
  REQUIRE_FALSE(from_transformer_lens("blocks.x.attn.hook_z"));
  REQUIRE_FALSE(from_transformer_lens("blocks.1.attn.z"));
  REQUIRE_FALSE(from_transformer_lens("attn.hook_z"));
  REQUIRE(to_transformer_lens("blocks.2.ffn.hidden") == "blocks.2.mlp.hook_post");
  REQUIRE(to_transformer_lens("blocks.0.attn.out") == "blocks.0.hook_attn_out");
  REQUIRE(to_transformer_lens("tok_embed") == "hook_embed");
  REQUIRE_FALSE(to_transformer_lens("blocks.0.attn.residual.in"));
  // Every row with a point translates both ways.
  for (const HookNameRow& row : transformer_lens_table()) {
    if (row.xgrad.empty()) continue;
    INFO(row.transformer_lens);
    auto numbered = [](std::string s) {
      const std::size_t at = s.find(".L.");
      return at == std::string::npos ? s : s.replace(at + 1, 1, "7");
    };
    REQUIRE(from_transformer_lens(numbered(row.transformer_lens)) == numbered(row.xgrad));
    REQUIRE(to_transformer_lens(numbered(row.xgrad)) == numbered(row.transformer_lens));
  }
}

TEST_CASE("docs/inspect.md prints the TransformerLens table as the code holds it") {
  std::ifstream in(std::string(XGRAD_SOURCE_DIR) + "/docs/inspect.md");
  REQUIRE(in);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    // a row whose first cell is a TransformerLens hook name
    if (line.rfind("| `", 0) == 0 && line.find("hook_") < line.find("` |")) rows.push_back(line);
  }
  const std::vector<HookNameRow>& table = transformer_lens_table();
  REQUIRE(rows.size() == table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const HookNameRow& row = table[i];
    const std::string expected = "| `" + row.transformer_lens + "` | " +
                                 (row.xgrad.empty() ? std::string("none") : "`" + row.xgrad + "`") + " | " + row.note +
                                 " |";
    REQUIRE(rows[i] == expected);
  }
}

TEST_CASE("resolve_point takes either spelling on every layout, and names near names for neither") {
  for (const Layout& layout : layouts()) {
    INFO(layout.name);
    auto model = testing::randomized_lm(layout.options, 3);
    std::size_t translated = 0;
    for (const std::string& point : model->hook_points()) {
      INFO(point);
      REQUIRE(resolve_point(*model, point) == point);
      if (const auto tl = to_transformer_lens(point)) {
        REQUIRE(resolve_point(*model, *tl) == point);
        ++translated;
      }
    }
    REQUIRE(translated >= 2 + 14 * kL);  // 14 points of each block, the token embedding and the final norm
  }
  auto model = testing::randomized_lm(layouts()[0].options, 3);
  REQUIRE_THROWS_WITH(resolve_point(*model, "blocks.0.attn.hook_zz"),
                      Contains("no hook point 'blocks.0.attn.hook_zz'") && Contains("blocks.0.attn.hook_z"));
  REQUIRE_THROWS_WITH(resolve_point(*model, "blocks.0.atn.pattern"), Contains("blocks.0.attn.pattern"));
  REQUIRE_THROWS_WITH(resolve_point(*model, "blocks.0.ln1.hook_scale"),
                      Contains("TransformerLens's 'blocks.0.ln1.hook_scale' has no xgrad point"));
  REQUIRE_THROWS_WITH(resolve_point(*model, "blocks.5.attn.hook_z"),
                      Contains("is xgrad's 'blocks.5.attn.z', which this model does not have"));
  REQUIRE_THROWS_WITH(resolve_point(*model, "blocks.0.attn.hook_rot_q"), Contains("rotary positions only"));
  // A Llama-layout model has no position embedding to hook.
  auto llama = testing::randomized_lm(layouts()[2].options, 3);
  REQUIRE_THROWS_WITH(resolve_point(*llama, "hook_pos_embed"), Contains("learned or sinusoidal positions only"));
}

TEST_CASE("a cache and a patch read TransformerLens names as the points they stand for", "[gemm]") {
  auto model = testing::randomized_lm(layouts()[0].options, 4);
  const IndexArray clean_ids = random_ids(1), corrupt_ids = random_ids(2);
  const ActivationCache clean = cache_activations(*model, [&] { model->forward(clean_ids); });
  REQUIRE(same_bits(clean.at("blocks.1.attn.hook_pattern"), clean.at("blocks.1.attn.pattern")));
  REQUIRE(same_bits(clean.at("blocks.0.hook_resid_post"), clean.at("blocks.0.stream_out")));
  REQUIRE(clean.has("blocks.0.attn.hook_z"));
  REQUIRE_THROWS_WITH(clean.at("blocks.0.attn.hook_paternn"), Contains("no point named 'blocks.0.attn.hook_paternn'") &&
                                                                  Contains("blocks.0.attn.hook_pattern"));

  // A filter by name, in either spelling.
  const ActivationCache some = cache_activations(
      *model, [&] { model->forward(clean_ids); }, points_named({"blocks.0.attn.hook_z", "blocks.1.attn.pattern"}));
  REQUIRE(some.names() == std::vector<std::string>{"blocks.0.attn.z", "blocks.1.attn.pattern"});

  // Patching head 2 through TransformerLens's hook_z is patching xgrad's context head 2.
  Array by_z, by_context;
  {
    const PatchSet patch(*model, clean, {{"blocks.0.attn.hook_z", 2, {}}});
    by_z = model->forward(corrupt_ids).logits.value();
  }
  {
    const PatchSet patch(*model, clean, {{"blocks.0.attn.context", 2, {}}});
    by_context = model->forward(corrupt_ids).logits.value();
  }
  REQUIRE(same_bits(by_z, by_context));
  REQUIRE_FALSE(same_bits(by_z, model->forward(corrupt_ids).logits.value()));
  REQUIRE_THROWS_WITH(PatchSet(*model, clean, {{"blocks.0.attn.hook_q", 4, {}}}), Contains("4 heads"));
  REQUIRE_THROWS_WITH(PatchSet(*model, clean, {{"blocks.0.attn.hook_zz", {}, {}}}),
                      Contains("PatchSet: no hook point 'blocks.0.attn.hook_zz'"));
}

TEST_CASE("z is the context with a head axis, and result is each head's share of the attention's output", "[gemm]") {
  for (const Layout& layout : layouts()) {
    INFO(layout.name);
    auto model = testing::randomized_lm(layout.options, 5);
    const IndexArray ids = random_ids(3);
    const Array plain = model->forward(ids).logits.value();
    Array hooked_logits;
    const ActivationCache cache = cache_activations(
        *model, [&] { hooked_logits = model->forward(ids).logits.value(); },
        points_named({"blocks.1.attn.context", "blocks.1.attn.z", "blocks.1.attn.result", "blocks.1.attn.out"}));
    const Array& context = cache.at("blocks.1.attn.context");
    const Array& z = cache.at("blocks.1.attn.z");
    const Array& result = cache.at("blocks.1.attn.result");
    const Array& out = cache.at("blocks.1.attn.out");
    const std::size_t D = kC / kH;
    REQUIRE(z.shape() == Shape{kB, kT, kH, D});
    REQUIRE(std::memcmp(z.data(), context.data(), z.size() * sizeof(float)) == 0);
    REQUIRE(result.shape() == Shape{kB, kT, kH, kC});

    // result[b, t, h] = z[b, t, h] W_o[:, hD .. (h+1)D]^T, and out = the sum over heads + W_o's bias
    const nn::Linear& w_o = *model->blocks[1]->attn->w_o;
    const Array& w = w_o.weight.value();
    double worst = 0, worst_sum = 0;
    for (std::size_t r = 0; r < kB * kT; ++r) {
      for (std::size_t j = 0; j < kC; ++j) {
        double total = w_o.bias.defined() ? w_o.bias.value()(j) : 0.;
        for (std::size_t h = 0; h < kH; ++h) {
          double expected = 0;
          for (std::size_t d = 0; d < D; ++d)
            expected += static_cast<double>(z.data()[(r * kH + h) * D + d]) * w(j, h * D + d);
          const double got = result.data()[(r * kH + h) * kC + j];
          worst = std::max(worst, std::abs(got - expected));
          total += got;
        }
        worst_sum = std::max(worst_sum, std::abs(total - out.data()[r * kC + j]));
      }
    }
    REQUIRE(worst < 1e-5 * (1 + max_abs(result)));
    REQUIRE(worst_sum < 1e-5 * (1 + max_abs(out)));
    // Forming result computes the output another way: the same within fp32 rounding.
    double diff = 0;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(plain.data()[i]) - hooked_logits.data()[i]));
    }
    REQUIRE(diff < 1e-5 * (1 + max_abs(plain)));

    // Gradients flow through result: the parameters' gradients agree with the plain path's.
    const IndexArray targets = random_ids(4);
    model->zero_grad();
    model->loss(ids, targets).backward();
    std::vector<Array> plain_grads;
    for (const auto& [name, p] : model->named_parameters()) plain_grads.push_back(p.grad());
    Array seen;
    {
      nn::HookHandle keep = model->add_forward_hook("blocks.1.attn.result", [](const Tensor&) { return Tensor(); });
      nn::HookHandle grad = model->add_backward_hook("blocks.1.attn.result", [&](Array& g) { seen = g; });
      model->zero_grad();
      model->loss(ids, targets).backward();
    }
    REQUIRE(seen.shape() == Shape{kB, kT, kH, kC});
    REQUIRE(max_abs(seen) > 0);
    std::size_t i = 0;
    for (const auto& [name, p] : model->named_parameters()) {
      INFO(name);
      const Array& g = p.grad();
      double d = 0;
      for (std::size_t k = 0; k < g.size(); ++k)
        d = std::max(d, std::abs(static_cast<double>(g.data()[k]) - plain_grads[i].data()[k]));
      REQUIRE(d < 1e-5 * (1 + max_abs(plain_grads[i])));
      ++i;
    }
  }
}

TEST_CASE("the decomposed stream sums to the last block's output, and the logit attributions to the logit", "[gemm]") {
  for (const Layout& layout : layouts()) {
    for (bool by_head : {false, true}) {
      INFO(layout.name << (by_head ? ", by head" : ", by layer"));
      auto model = testing::randomized_lm(layout.options, 7);
      const IndexArray ids = random_ids(5), answers = random_ids(6), others = random_ids(8);
      Array logits;
      const ActivationCache cache = cache_activations(
          *model, [&] { logits = model->forward(ids).logits.value(); }, residual_points());

      const ResidualStack parts = decompose_residual(*model, cache, by_head);
      const bool out_bias = model->blocks[0]->attn->w_o->bias.defined();
      const std::size_t per_block = by_head ? kH + (out_bias ? 1 : 0) + 1 : 2;
      const bool positions = layout.options.positional() != nn::Positional::rotary;
      REQUIRE(parts.labels.size() == (positions ? 2 : 1) + kL * per_block);
      REQUIRE(parts.stack.shape() == Shape{parts.labels.size(), kB, kT, kC});
      REQUIRE(parts.labels.front() == "tok_embed");
      REQUIRE(parts.labels.back() == "blocks.1.ffn");
      const Array& stream = cache.at("blocks.1.stream_out");
      const std::vector<double> sum = stack_sum(parts.stack);
      double worst = 0;
      for (std::size_t i = 0; i < sum.size(); ++i) worst = std::max(worst, std::abs(sum[i] - stream.data()[i]));
      REQUIRE(worst < 1e-5 * (1 + max_abs(stream)));

      // Scaled by the final norm, the parts sum to its output before its weight and bias.
      const Array scaled = apply_final_norm_to_stack(*model, cache, parts.stack);
      const std::vector<double> scaled_sum = stack_sum(scaled);
      const Array& normalized = cache.at("normalized");
      const nn::NormLayer& norm = *model->final_norm;
      worst = 0;
      for (std::size_t i = 0; i < scaled_sum.size(); ++i) {
        const std::size_t c = i % kC;
        const double expected =
            scaled_sum[i] * norm.weight.value()(c) + (norm.bias.defined() ? norm.bias.value()(c) : 0.);
        worst = std::max(worst, std::abs(expected - normalized.data()[i]));
      }
      REQUIRE(worst < 1e-4 * (1 + max_abs(normalized)));

      // Direct logit attribution: the entries, "bias" included, sum to the logit (difference).
      for (bool difference : {false, true}) {
        INFO((difference ? "logit difference" : "logit"));
        const LogitAttribution dla = difference ? direct_logit_attribution(*model, cache, parts, answers, others)
                                                : direct_logit_attribution(*model, cache, parts, answers);
        REQUIRE(dla.labels.size() == parts.labels.size() + 1);
        REQUIRE(dla.labels.back() == "bias");
        REQUIRE(dla.values.shape() == Shape{parts.labels.size() + 1, kB, kT});
        worst = 0;
        double largest = 0;
        for (std::size_t r = 0; r < kB * kT; ++r) {
          double total = 0, biggest_part = 0;
          for (std::size_t n = 0; n <= parts.labels.size(); ++n) {
            total += dla.values.data()[n * kB * kT + r];
            biggest_part = std::max(biggest_part, std::abs(static_cast<double>(dla.values.data()[n * kB * kT + r])));
          }
          const std::size_t v = static_cast<std::size_t>(answers.data()[r]),
                            u = static_cast<std::size_t>(others.data()[r]);
          const double logit = logits.data()[r * kV + v] - (difference ? logits.data()[r * kV + u] : 0.f);
          worst = std::max(worst, std::abs(total - logit));
          largest = std::max(largest, biggest_part);
        }
        REQUIRE(largest > 1e-3);  // the parts are not all zero
        REQUIRE(worst < 1e-4 * (1 + largest));
      }
    }
  }
}

TEST_CASE("the accumulated stream is each block's input, then the last block's output", "[gemm]") {
  auto model = testing::randomized_lm(layouts()[0].options, 9);
  const IndexArray ids = random_ids(7);
  const ActivationCache cache = cache_activations(
      *model, [&] { model->forward(ids); }, residual_points());
  const ResidualStack acc = accumulated_residual(*model, cache);
  REQUIRE(acc.labels == std::vector<std::string>{"blocks.0.stream_in", "blocks.1.stream_in", "blocks.1.stream_out"});
  const std::size_t per = kB * kT * kC;
  for (std::size_t n = 0; n < acc.labels.size(); ++n) {
    INFO(acc.labels[n]);
    REQUIRE(std::memcmp(acc.stack.data() + n * per, cache.at(acc.labels[n]).data(), per * sizeof(float)) == 0);
  }
  const ResidualStack with_mid = accumulated_residual(*model, cache, true);
  REQUIRE(with_mid.labels.size() == 5);
  REQUIRE(with_mid.labels[1] == "blocks.0.stream_mid");
}

TEST_CASE("decomposition refuses a Post-Norm model, a cache without its points and ids it cannot attribute", "[gemm]") {
  auto post = testing::randomized_lm(layouts()[0].options.norm(nn::Norm::post), 3);
  const IndexArray ids = random_ids(1);
  const ActivationCache post_cache = cache_activations(
      *post, [&] { post->forward(ids); }, residual_points());
  REQUIRE_THROWS_WITH(decompose_residual(*post, post_cache), Contains("decompose_residual: a Post-Norm model"));

  auto model = testing::randomized_lm(layouts()[0].options, 3);
  const ActivationCache thin = cache_activations(
      *model, [&] { model->forward(ids); }, points_named({"blocks.1.stream_out"}));
  REQUIRE_THROWS_WITH(decompose_residual(*model, thin), Contains("the cache holds no point 'tok_embed'"));
  const ActivationCache no_context = cache_activations(
      *model, [&] { model->forward(ids); },
      [](const std::string& n) { return residual_points()(n) && !nn::point_ends_with(n, ".context"); });
  REQUIRE_NOTHROW(decompose_residual(*model, no_context));
  REQUIRE_THROWS_WITH(decompose_residual(*model, no_context, true), Contains("no point 'blocks.0.attn.context'"));

  const ActivationCache cache = cache_activations(
      *model, [&] { model->forward(ids); }, residual_points());
  const ResidualStack parts = decompose_residual(*model, cache);
  IndexArray bad = random_ids(2);
  bad(1, 3) = static_cast<std::int64_t>(kV);
  REQUIRE_THROWS_WITH(direct_logit_attribution(*model, cache, parts, bad),
                      Contains("tokens id 13 at flat position 9 is outside the vocabulary [0, 13)"));
  bad(1, 3) = -1;
  REQUIRE_THROWS_WITH(direct_logit_attribution(*model, cache, parts, random_ids(2), bad),
                      Contains("other tokens id -1"));
  REQUIRE_THROWS_WITH(direct_logit_attribution(*model, cache, parts, IndexArray::from_shape({kB, kT + 1})),
                      Contains("do not match the stack's (B, T) = (2, 6)"));
  ResidualStack mislabeled = parts;
  mislabeled.labels.pop_back();
  REQUIRE_THROWS_WITH(direct_logit_attribution(*model, cache, mislabeled, random_ids(2)), Contains("labels"));
  REQUIRE_THROWS_WITH(apply_final_norm_to_stack(*model, cache, Array::from_shape({2, kB, kT, kC + 1})),
                      Contains("apply_final_norm_to_stack: the stack has shape (2, 2, 6, 17)"));
}
