// The attention kernels inside the models: tiled against full in a training step (dropout, GQA and
// rotary included), when the weights are formed (need_weights, Attentions::keep, hooks), the
// automatic choice, cached steps, the memory of a long step, and tiles out of range.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "peak_memory.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"

using namespace xgrad;
using nn::AttentionKernel;

namespace {

nn::LanguageModelOptions small(AttentionKernel kernel, std::size_t T = 40) {
  return nn::LanguageModelOptions(50, 16, 4, 2).max_len(T).dropout(0.1f).attention_kernel(kernel).attention_tile(8);
}

IndexArray make_ids(std::size_t B, std::size_t T, std::size_t salt) {
  IndexArray ids = IndexArray::from_shape({B, T});
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>((i * 7 + salt * 13) % 50);
  return ids;
}

double max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - b.data()[i]));
  return m;
}

bool bitwise_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::equal(a.begin(), a.end(), b.begin());
}

// Loss and every parameter's gradient after one training-mode step.
struct StepResult {
  float loss;
  std::vector<Array> grads;
};
StepResult train_step(const nn::LanguageModelOptions& o) {
  Generator gen(3);
  nn::LanguageModel model(o, gen);
  model.train();
  const std::size_t T = o.max_len();
  const Tensor loss = model.loss(make_ids(2, T, 1), make_ids(2, T, 2));
  loss.backward();
  StepResult r{loss.item(), {}};
  for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad());
  return r;
}

void require_steps_agree(const nn::LanguageModelOptions& tiled, const nn::LanguageModelOptions& full) {
  const StepResult a = train_step(tiled), b = train_step(full);
  CHECK(std::abs(a.loss - b.loss) < 1e-5);
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK(max_abs_diff(a.grads[i], b.grads[i]) < 2e-5);
  }
}

}  // namespace

TEST_CASE("a training step with the tiled kernel agrees with the full one, dropout included",
          "[attention_kernels][gemm]") {
  require_steps_agree(small(AttentionKernel::tiled), small(AttentionKernel::full));
  SECTION("grouped-query attention with rotary positions, Post-Norm, ragged tiles") {
    const auto llama = [](AttentionKernel k) {
      return nn::LanguageModelOptions::llama_style(50, 16, 4, 2, 2).max_len(37).dropout(0.2f).attention_kernel(k);
    };
    require_steps_agree(llama(AttentionKernel::tiled).attention_tile(5),
                        llama(AttentionKernel::full).norm(nn::Norm::pre));
    require_steps_agree(llama(AttentionKernel::tiled).norm(nn::Norm::post).attention_tile(64),
                        llama(AttentionKernel::full).norm(nn::Norm::post));
  }
}

TEST_CASE("the weights are formed when asked for, and the tiled kernel forms none otherwise",
          "[attention_kernels][gemm]") {
  Generator gen(4);
  nn::LanguageModel model(small(AttentionKernel::tiled), gen);
  model.eval();
  const IndexArray ids = make_ids(2, 40, 5);
  const nn::LanguageModelOutput none = model.forward(ids, nn::Attentions::none);
  CHECK(none.attentions.empty());
  const nn::LanguageModelOutput keep = model.forward(ids);  // Attentions::keep: the full kernel
  REQUIRE(keep.attentions.size() == 2);
  CHECK(keep.attentions[0].shape() == Shape{2, 4, 40, 40});
  CHECK(max_abs_diff(none.logits.value(), keep.logits.value()) < 1e-5);

  SECTION("Attention::forward without need_weights returns no weights") {
    nn::Attention attn(nn::MultiHeadAttentionOptions(16, 4).kernel(AttentionKernel::tiled).dropout(0.f), gen);
    const Tensor x(gen.normal({2, 9, 16}, 0.f, 1.f));
    nn::AttentionMask m;
    m.causal = true;
    const nn::AttentionOutput with = attn.forward(x, m);
    m.need_weights = false;
    const nn::AttentionOutput without = attn.forward(x, m);
    CHECK(with.weights.defined());
    CHECK_FALSE(without.weights.defined());
    CHECK(max_abs_diff(with.output.value(), without.output.value()) < 1e-5);
    SECTION("a mask other than causal needs the full kernel, which forms the weights") {
      m.key_padding_mask = Mask(xt::zeros<bool>(Shape{2, 9}));
      CHECK(attn.forward(x, m).weights.defined());
    }
  }

  SECTION("a hook on pattern gets the weights, and the logits stay within rounding of the tiled run") {
    std::vector<Array> seen;
    nn::HookHandle h = model.add_forward_hook("blocks.1.attn.pattern", [&](const Tensor& t) {
      seen.push_back(t.value());
      return Tensor();
    });
    const nn::LanguageModelOutput hooked = model.forward(ids, nn::Attentions::none);
    REQUIRE(seen.size() == 1);
    CHECK(max_abs_diff(seen[0], keep.attentions[1].value()) < 1e-5);  // block 0 ran tiled here
    CHECK(max_abs_diff(hooked.logits.value(), none.logits.value()) < 1e-5);
  }
}

TEST_CASE("automatic takes the full kernel below kTiledFromKeys keys and the tiled one from there",
          "[attention_kernels][gemm]") {
  const std::size_t short_T = 40, long_T = nn::kTiledFromKeys;
  for (std::size_t T : {short_T, long_T}) {
    INFO("T " << T);
    Generator g1(6), g2(6), g3(6);
    const auto o = nn::LanguageModelOptions(50, 16, 2, 1).max_len(T).dropout(0.f);
    nn::LanguageModel automatic(nn::LanguageModelOptions(o).attention_kernel(AttentionKernel::automatic), g1);
    nn::LanguageModel full(nn::LanguageModelOptions(o).attention_kernel(AttentionKernel::full), g2);
    nn::LanguageModel tiled(nn::LanguageModelOptions(o).attention_kernel(AttentionKernel::tiled), g3);
    const IndexArray ids = make_ids(1, T, 7);
    const Array a = automatic.forward(ids, nn::Attentions::none).logits.value();
    const Array f = full.forward(ids, nn::Attentions::none).logits.value();
    const Array t = tiled.forward(ids, nn::Attentions::none).logits.value();
    CHECK(bitwise_equal(a, T < nn::kTiledFromKeys ? f : t));
    CHECK_FALSE(bitwise_equal(f, t));  // the kernels round differently, so the test can tell them apart
    CHECK(max_abs_diff(f, t) < 1e-4);
  }
}

TEST_CASE("cached steps with the tiled kernel give the logits of one full forward", "[attention_kernels][gemm]") {
  Generator gen(8);
  nn::LanguageModel model(small(AttentionKernel::tiled, 30), gen);
  model.eval();
  NoGradGuard no_grad;
  const IndexArray ids = make_ids(1, 30, 9);
  const Array whole = model.forward(ids, nn::Attentions::none).logits.value();
  nn::LanguageModelCache cache;
  std::size_t done = 0;
  for (std::size_t n : {11, 1, 7, 11}) {  // chunks of several positions take the tiled kernel's offset mask
    IndexArray chunk = IndexArray::from_shape({1, n});
    for (std::size_t t = 0; t < n; ++t) chunk(0, t) = ids(0, done + t);
    const Array logits = model.forward_cached(chunk, cache, nn::Attentions::none, nn::Logits::all).logits.value();
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t v = 0; v < 50; ++v) REQUIRE(std::abs(logits(0, t, v) - whole(0, done + t, v)) < 1e-4);
    done += n;
  }
}

TEST_CASE(
    "a sliding window: both kernels agree in a training step, and cached steps keep only the window and give the "
    "logits of one full forward",
    "[attention_kernels][gemm]") {
  const auto windowed = [](AttentionKernel kernel) {
    return small(kernel, 30).sliding_window(5).positional(nn::Positional::rotary).num_kv_heads(2);
  };
  require_steps_agree(windowed(AttentionKernel::tiled), windowed(AttentionKernel::full));
  for (const AttentionKernel kernel : {AttentionKernel::tiled, AttentionKernel::full}) {
    INFO("kernel " << (kernel == AttentionKernel::tiled ? "tiled" : "full"));
    Generator gen(8);
    nn::LanguageModel model(windowed(kernel), gen);
    model.eval();
    NoGradGuard no_grad;
    const IndexArray ids = make_ids(1, 30, 9);
    const Array whole = model.forward(ids, nn::Attentions::none).logits.value();
    Generator same(8);  // the same draws: the window adds no parameter
    nn::LanguageModel plain(small(kernel, 30).positional(nn::Positional::rotary).num_kv_heads(2), same);
    plain.eval();
    CHECK(max_abs_diff(plain.forward(ids, nn::Attentions::none).logits.value(), whole) > 1e-3);  // it matters
    nn::LanguageModelCache cache;
    std::size_t done = 0;
    for (std::size_t n : {11, 1, 7, 2, 9}) {
      IndexArray chunk = IndexArray::from_shape({1, n});
      for (std::size_t t = 0; t < n; ++t) chunk(0, t) = ids(0, done + t);
      const nn::LanguageModelOutput out = model.forward_cached(chunk, cache, nn::Attentions::keep, nn::Logits::all);
      const Array& logits = out.logits.value();
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t v = 0; v < 50; ++v) REQUIRE(std::abs(logits(0, t, v) - whole(0, done + t, v)) < 1e-4);
      done += n;
      CHECK(cache.length() == done);
      for (const nn::KVCache& block : cache.blocks) CHECK(block.held() == std::min<std::size_t>(done, 5));
      // the weights span the keys attended to: those held before the step and the new ones
      CHECK(out.attentions[0].shape()[3] == std::min<std::size_t>(done - n, 5) + n);
    }
    // A row padded on the left gets the logits it gets alone; padding between real tokens is refused.
    const std::size_t pad = 4, real = 20;
    IndexArray alone = IndexArray::from_shape({1, real}), padded = IndexArray::from_shape({1, pad + real});
    Mask mask = xt::zeros<bool>(Shape{1, pad + real});
    for (std::size_t t = 0; t < pad; ++t) padded(0, t) = 0, mask(0, t) = true;
    for (std::size_t t = 0; t < real; ++t) alone(0, t) = padded(0, pad + t) = ids(0, t);
    const Array a = model.forward(alone, nn::Attentions::none).logits.value();
    const Array p = model.forward(padded, mask, nn::Attentions::none).logits.value();
    double worst = 0;
    for (std::size_t t = 0; t < real; ++t)
      for (std::size_t v = 0; v < 50; ++v) worst = std::max(worst, double(std::abs(a(0, t, v) - p(0, pad + t, v))));
    CHECK(worst < 1e-4);
    mask(0, 0) = false;
    mask(0, 10) = true;
    CHECK_THROWS_WITH(model.forward(padded, mask, nn::Attentions::none),
                      Catch::Contains("row 0 of key_padding_mask has padding at position 1 between real tokens; with "
                                      "sliding_window 5 padding must sit at a row's start or end"));
  }
}

TEST_CASE("a long step with the tiled kernel keeps memory linear in T", "[attention_kernels][memory][gemm]") {
  if (testing::kAddressSanitizer) return;  // its quarantine holds freed memory back
  // One layer, T 4096, 4 heads: the full kernel keeps (1, 4, 4096, 4096) floats, 256 MiB, for the
  // weights, and as much again for dropout's output and the gradients.
  const std::size_t T = 4096;
  auto peak_mib = [&](AttentionKernel k) {
    Generator gen(10);
    nn::LanguageModel model(nn::LanguageModelOptions(64, 32, 4, 1).max_len(T).dropout(0.1f).attention_kernel(k), gen);
    const IndexArray ids = make_ids(1, T, 11), targets = make_ids(1, T, 12);
    REQUIRE(testing::reset_peak_rss());
    const long base = testing::status_kib("VmRSS");
    model.loss(ids, targets).backward();
    return testing::peak_rise_kib(base) / 1024.0;
  };
  const double tiled = peak_mib(AttentionKernel::tiled), full = peak_mib(AttentionKernel::full);
  INFO("tiled " << tiled << " MiB, full " << full << " MiB");
  CHECK(full > 256);
  CHECK(tiled < 40);
}

TEST_CASE("attention_tile out of range is refused, naming it", "[attention_kernels][bad_input]") {
  using Catch::Matchers::Contains;
  for (std::size_t tile : {std::size_t{0}, std::size_t{1025}}) {
    CHECK_THROWS_WITH(nn::Attention(nn::MultiHeadAttentionOptions(16, 4).attention_tile(tile)),
                      Contains("MultiHeadAttention: attention_tile " + std::to_string(tile)) && Contains("[1, 1024]"));
    CHECK_THROWS_WITH(nn::LanguageModel::check(nn::LanguageModelOptions(50, 16, 4, 1).attention_tile(tile)),
                      Contains("attention_tile"));
  }
}
