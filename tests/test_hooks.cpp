// Hook points (nn/hook.hpp): their names, reading and replacing values in forward, gradients in
// backward, handles, errors, and that an unhooked or a do-nothing-hooked model computes the same
// bits. ProbeSet and HeadImportance, built on them, are tested in test_probes.cpp.
//
// Shapes: B batch, T length, C d_model, H heads, V vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/head_importance.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "small_models.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;

namespace {

constexpr std::size_t kB = 2, kT = 5, kC = 8, kH = 2, kV = 7;

std::unique_ptr<nn::LanguageModel> make_lm(nn::Norm norm = nn::Norm::pre, std::uint64_t seed = 3) {
  return testing::eval_lm(nn::LanguageModelOptions(kV, kC, kH, 2).max_len(kT).dropout(0.f).norm(norm), seed);
}

IndexArray make_ids(std::uint64_t seed) {
  Generator gen(seed);
  IndexArray ids = IndexArray::from_shape({kB, kT});
  for (auto& v : ids) v = static_cast<std::int64_t>(gen.below(kV));
  return ids;
}

bool bitwise_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

NamedArrays grads_of(const nn::Module& m) {
  NamedArrays out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace_back(name, p.grad());
  return out;
}

}  // namespace

TEST_CASE("hook_points lists every point of the tree by full name", "[hooks]") {
  auto model = make_lm();
  const std::vector<std::string> points = model->hook_points();
  const std::vector<std::string> block0 = {"blocks.0.stream_in",
                                           "blocks.0.stream_mid",
                                           "blocks.0.stream_out",
                                           "blocks.0.attn.q",
                                           "blocks.0.attn.k",
                                           "blocks.0.attn.v",
                                           "blocks.0.attn.scores",
                                           "blocks.0.attn.pattern",
                                           "blocks.0.attn.context",
                                           "blocks.0.attn.z",
                                           "blocks.0.attn.result",
                                           "blocks.0.attn.out",
                                           "blocks.0.attn.residual.in",
                                           "blocks.0.attn.residual.skip",
                                           "blocks.0.attn.residual.branch",
                                           "blocks.0.attn.residual.out",
                                           "blocks.0.ffn.pre",
                                           "blocks.0.ffn.hidden",
                                           "blocks.0.ffn.out",
                                           "blocks.0.ffn.residual.in",
                                           "blocks.0.ffn.residual.skip",
                                           "blocks.0.ffn.residual.branch",
                                           "blocks.0.ffn.residual.out"};
  // The model's own points first, in forward order (learned positions, Pre-Norm), then its blocks'.
  const std::vector<std::string> own = {"tok_embed", "pos_embed", "embed", "normalized", "logits"};
  REQUIRE(points.size() == own.size() + 2 * block0.size());
  for (std::size_t i = 0; i < own.size(); ++i) REQUIRE(points[i] == own[i]);
  for (std::size_t i = 0; i < block0.size(); ++i) REQUIRE(points[own.size() + i] == block0[i]);
  // A sub-tree names its points from its own root.
  REQUIRE(model->blocks[1]->hook_points()[0] == "stream_in");
  REQUIRE(model->blocks[1]->attn->hook_points()[0] == "q");
}

TEST_CASE("a forward hook reads the value at its point, and the model computes the same bits", "[hooks][gemm]") {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    auto model = make_lm(norm);
    const IndexArray ids = make_ids(1);
    const Array plain = model->forward(ids).logits.value();
    std::vector<Array> seen;
    {
      nn::HookHandle h = model->add_forward_hook("blocks.1.attn.pattern", [&](const Tensor& t) {
        seen.push_back(t.value());
        return Tensor();
      });
      const nn::LanguageModelOutput out = model->forward(ids);
      REQUIRE(bitwise_equal(out.logits.value(), plain));
      REQUIRE(seen.size() == 1);
      REQUIRE(bitwise_equal(seen[0], out.attentions[1].value()));
    }
    model->forward(ids);
    REQUIRE(seen.size() == 1);  // the handle is gone, and so is the hook
    REQUIRE(model->num_hooks() == 0);
  }
}

TEST_CASE("hooking the scores forms them apart and changes no bit, forward or backward", "[hooks][gemm]") {
  for (nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    auto model = make_lm(norm);
    const IndexArray ids = make_ids(2), targets = make_ids(3);
    model->loss(ids, targets).backward();
    const NamedArrays plain = grads_of(*model);
    model->zero_grad();
    std::size_t calls = 0;
    nn::HookHandle h = model->add_forward_hook("blocks.0.attn.scores", [&](const Tensor& s) {
      ++calls;
      REQUIRE(s.shape() == Shape{kB, kH, kT, kT});
      return Tensor();
    });
    const Tensor loss = model->loss(ids, targets);
    loss.backward();
    REQUIRE(calls == 1);
    const NamedArrays hooked = grads_of(*model);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      INFO(plain[i].first);
      REQUIRE(bitwise_equal(plain[i].second, hooked[i].second));
    }
  }
}

TEST_CASE("a forward hook that returns a value replaces it: patching one head's output", "[hooks][gemm]") {
  auto model = make_lm();
  const IndexArray clean_ids = make_ids(4), corrupt_ids = make_ids(5);
  // Cache head 1's output of block 0 on the clean run.
  Array clean_context;
  {
    nn::HookHandle h = model->add_forward_hook("blocks.0.attn.context", [&](const Tensor& t) {
      clean_context = t.value();
      return Tensor();
    });
    model->forward(clean_ids);
  }
  const Array clean_logits = model->forward(clean_ids).logits.value();
  const Array corrupt_logits = model->forward(corrupt_ids).logits.value();
  REQUIRE_FALSE(bitwise_equal(clean_logits, corrupt_logits));

  // Patching the whole context of the corrupt run with the clean one changes its logits, and
  // patching a run with its own values changes nothing.
  auto patched_logits = [&](const IndexArray& ids, const Array& source, std::size_t head) {
    nn::HookHandle h = model->add_forward_hook("blocks.0.attn.context", [&](const Tensor& t) {
      Array v = t.value();
      const std::size_t D = kC / kH;
      for (std::size_t b = 0; b < kB; ++b)
        for (std::size_t s = 0; s < kT; ++s)
          for (std::size_t j = head * D; j < (head + 1) * D; ++j) v(b, s, j) = source(b, s, j);
      return Tensor(v);
    });
    return model->forward(ids).logits.value();
  };
  REQUIRE(bitwise_equal(patched_logits(clean_ids, clean_context, 1), clean_logits));
  const Array patched = patched_logits(corrupt_ids, clean_context, 1);
  REQUIRE_FALSE(bitwise_equal(patched, corrupt_logits));
  REQUIRE_FALSE(bitwise_equal(patched, clean_logits));
}

TEST_CASE("hooks at one point run in the order attached, each seeing the previous result", "[hooks][gemm]") {
  Generator gen(7);
  nn::FeedForward ffn(nn::FeedForwardOptions(4, 8).dropout(0.f), gen);
  const Tensor x(gen.normal({3, 4}, 0.f, 1.f));
  const Array plain = ffn.forward(x).value();
  std::vector<int> order;
  nn::HookHandle a = ffn.add_forward_hook("out", [&](const Tensor& t) {
    order.push_back(1);
    return t * 2.f;
  });
  nn::HookHandle b = ffn.add_forward_hook("out", [&](const Tensor& t) {
    order.push_back(2);
    return t + 1.f;
  });
  REQUIRE(ffn.num_hooks() == 2);
  REQUIRE(bitwise_equal(ffn.forward(x).value(), Array(plain * 2.f + 1.f)));
  REQUIRE(order == std::vector<int>{1, 2});
  a.remove();
  REQUIRE(bitwise_equal(ffn.forward(x).value(), Array(plain + 1.f)));
  REQUIRE(ffn.num_hooks() == 1);
}

TEST_CASE("a backward hook sees the gradient arriving at its point and may change it", "[hooks][gemm]") {
  auto model = make_lm();
  const IndexArray ids = make_ids(6), targets = make_ids(7);
  // The gradient at the residual stream leaving block 0 equals the one entering block 1.
  Array at_out, at_in;
  nn::HookHandle h1 = model->add_backward_hook("blocks.0.stream_out", [&](Array& g) { at_out = g; });
  nn::HookHandle h2 = model->add_backward_hook("blocks.1.stream_in", [&](Array& g) { at_in = g; });
  model->loss(ids, targets).backward();
  REQUIRE(at_out.size() == kB * kT * kC);
  REQUIRE(bitwise_equal(at_out, at_in));
  // Zeroing the gradient at block 1's input stops every gradient upstream of it.
  nn::HookHandle stop = model->add_backward_hook("blocks.1.stream_in", [](Array& g) { g.fill(0.f); });
  model->zero_grad();
  model->loss(ids, targets).backward();
  REQUIRE(xt::all(xt::equal(model->parameter("blocks.0.ffn.linear1.weight").grad(), 0.f)));
  REQUIRE(xt::any(xt::not_equal(model->parameter("blocks.1.ffn.linear1.weight").grad(), 0.f)));
}

TEST_CASE("hook errors name the point: unknown names, empty hooks, replacements of another shape",
          "[hooks][bad_input][gemm]") {
  auto model = make_lm();
  REQUIRE_THROWS_WITH(model->add_forward_hook("blocks.0.attn.patern", [](const Tensor&) { return Tensor(); }),
                      Contains("add_forward_hook") && Contains("blocks.0.attn.patern") && Contains("hook_points()"));
  REQUIRE_THROWS_WITH(model->add_backward_hook("blocks.7.stream_in", [](Array&) {}),
                      Contains("add_backward_hook") && Contains("blocks.7.stream_in"));
  REQUIRE_THROWS_WITH(model->add_forward_hook("", [](const Tensor&) { return Tensor(); }),
                      Contains("no hook point ''"));
  REQUIRE_THROWS_WITH(model->add_forward_hook("blocks.0.attn.q", nn::ForwardHook()), Contains("empty"));
  REQUIRE(model->num_hooks() == 0);
  nn::HookHandle h = model->add_forward_hook("blocks.0.attn.q", [](const Tensor& t) { return reshape(t, {-1}); });
  REQUIRE_THROWS_WITH(model->forward(make_ids(8)),
                      Contains("forward hook at 'blocks.0.attn.q'") && Contains("(80)") && Contains("(2, 5, 8)"));
  // An exception thrown by a hook reaches the caller, and the model still works without it.
  nn::HookHandle thrower =
      model->add_forward_hook("logits", [](const Tensor&) -> Tensor { throw std::runtime_error("mine"); });
  h.remove();
  REQUIRE_THROWS_WITH(model->forward(make_ids(8)), Contains("mine"));
  thrower.remove();
  REQUIRE(model->num_hooks() == 0);
  REQUIRE_NOTHROW(model->forward(make_ids(8)));
}

TEST_CASE("a handle may outlive its module, be moved, and be removed twice", "[hooks]") {
  nn::HookHandle kept;
  {
    auto model = make_lm();
    nn::HookHandle h = model->add_forward_hook("embed", [](const Tensor&) { return Tensor(); });
    REQUIRE(h.attached());
    REQUIRE(h.point() == "embed");
    kept = std::move(h);
    REQUIRE_FALSE(h.attached());
    REQUIRE(model->num_hooks() == 1);
  }
  REQUIRE_FALSE(kept.attached());
  kept.remove();
  kept.remove();
}

TEST_CASE("two threads run forward on one hooked module while a third attaches and removes hooks",
          "[hooks][threads][gemm]") {
  auto model = make_lm();
  const IndexArray ids = make_ids(9);
  const Array plain = model->forward(ids).logits.value();
  std::atomic<int> reads{0};
  std::atomic<bool> stop{false}, wrong{false};
  auto run = [&] {
    while (!stop) {
      if (!bitwise_equal(model->forward(ids).logits.value(), plain)) wrong = true;
    }
  };
  std::thread a(run), b(run);
  // Attach and remove until forwards have run through the hooks many times; each hook returns
  // a replacement with the same values, so the replacement path runs too.
  for (int i = 0; i < 200 || (reads < 50 && i < 200000); ++i) {
    nn::HookHandle h = model->add_forward_hook("blocks.1.ffn.hidden", [&](const Tensor& t) {
      ++reads;
      return t * 1.f;
    });
    if (i % 16 == 0) std::this_thread::yield();
  }
  stop = true;
  a.join();
  b.join();
  REQUIRE(reads >= 50);
  REQUIRE_FALSE(wrong);
  REQUIRE(model->num_hooks() == 0);
}

TEST_CASE("a hook keeps its own state across calls, and a removed backward hook stays silent", "[hooks][gemm]") {
  auto model = make_lm();
  const IndexArray ids = make_ids(10), targets = make_ids(11);
  // A mutable hook: the same object runs at every forward.
  std::vector<int> counts;
  nn::HookHandle counter = model->add_forward_hook("embed", [&counts, n = 0](const Tensor&) mutable {
    counts.push_back(++n);
    return Tensor();
  });
  for (int i = 0; i < 3; ++i) model->forward(ids);
  REQUIRE(counts == std::vector<int>{1, 2, 3});
  // A backward hook removed between forward and backward is not called by that backward.
  bool called = false;
  nn::HookHandle h = model->add_backward_hook("blocks.0.stream_out", [&](Array&) { called = true; });
  const Tensor loss = model->loss(ids, targets);
  h.remove();
  loss.backward();
  REQUIRE_FALSE(called);
  nn::HookHandle again = model->add_backward_hook("blocks.0.stream_out", [&](Array&) { called = true; });
  model->loss(ids, targets).backward();
  REQUIRE(called);
}

TEST_CASE("a residual connection without a norm has no skip path and no residual.skip point", "[hooks]") {
  Generator gen(12);
  nn::MultiHeadAttention none(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f).norm(nn::Norm::none), gen);
  const std::vector<std::string> points = none.hook_points();
  REQUIRE(std::find(points.begin(), points.end(), "residual.skip") == points.end());
  REQUIRE(std::find(points.begin(), points.end(), "residual.branch") != points.end());
  REQUIRE_THROWS_WITH(none.add_forward_hook("residual.skip", [](const Tensor&) { return Tensor(); }),
                      Contains("residual.skip"));
}
