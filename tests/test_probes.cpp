// The gradient-inspection API: ProbeSet points (names, shapes, values, no effect on the loss or
// the gradients), the gradient through a residual connection as the sum of its two paths, probe
// gradients against finite differences of the model's own parts, per-parameter gradient norms,
// and head importance (Michel et al. 2019) against finite differences of the head gates.
// The Pre-Norm / Post-Norm gradient-flow finding itself is tested in test_gradient_flow.cpp.
//
// Shapes: B batch, T length, C d_model, H heads, V vocabulary, L layers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/head_importance.hpp"
#include "xgrad/inspect/probe.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"

#include "small_models.hpp"

using namespace xgrad;
using nn::Norm;

namespace {

constexpr std::size_t kB = 2, kT = 6, kC = 8, kH = 2, kL = 2, kV = 7;

std::string norm_name(Norm n) { return n == Norm::pre ? "Pre-Norm" : "Post-Norm"; }

// V 7, C 8, H 2, L 2, max_len 6, no dropout, in eval mode.
std::unique_ptr<nn::LanguageModel> make_lm(Norm norm, std::uint64_t seed = 11) {
  return testing::eval_lm(nn::LanguageModelOptions(kV, kC, kH, kL).max_len(kT).dropout(0.f).norm(norm), seed);
}

struct Batch {
  IndexArray ids, targets;  // (B, T)
};

// Uniform ids; random targets with one ignored position (so ignore_index takes part).
Batch make_batch(std::uint64_t seed) {
  Generator gen(seed);
  Batch b{IndexArray::from_shape({kB, kT}), IndexArray::from_shape({kB, kT})};
  for (std::size_t i = 0; i < b.ids.size(); ++i) b.ids.data()[i] = static_cast<std::int64_t>(gen.below(kV));
  for (std::size_t i = 0; i < b.targets.size(); ++i) b.targets.data()[i] = static_cast<std::int64_t>(gen.below(kV));
  b.targets(0, 0) = -100;
  return b;
}

bool bitwise_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_abs(const Array& a) {
  double m = 0;
  for (float v : a) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

double max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a.data()[i]) - static_cast<double>(b.data()[i])));
  }
  return m;
}

double norm2(const Array& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

NamedArrays gradients_of(const nn::Module& m) {
  NamedArrays out;
  for (const auto& [name, p] : m.named_parameters()) {
    REQUIRE(p.has_grad());
    out.emplace_back(name, p.grad());
  }
  return out;
}

// The points on an L-layer LanguageModel that hold the residual stream's shape (B, T, C), in
// the order forward reaches them.
std::vector<std::string> stream_points(std::size_t layers) {
  std::vector<std::string> v = {"tok_embed", "embed"};
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string b = "blocks." + std::to_string(l);
    v.push_back(b + ".stream_in");
    for (const char* p : {".residual.in", ".residual.skip", ".residual.branch", ".q", ".k", ".v", ".context", ".out",
                          ".residual.out"}) {
      v.push_back(b + ".attn" + p);
    }
    v.push_back(b + ".stream_mid");
    for (const char* p : {".residual.in", ".residual.skip", ".residual.branch", ".out", ".residual.out"})
      v.push_back(b + ".ffn" + p);
    v.push_back(b + ".stream_out");
  }
  return v;
}

// Every point a ProbeSet records by default, with its shape, in forward order.
std::vector<std::pair<std::string, Shape>> expected_points(std::size_t layers, Norm norm) {
  std::vector<std::pair<std::string, Shape>> v;
  for (const std::string& n : stream_points(layers)) {
    auto ends_with = [&](const std::string& suffix) {
      return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".attn.out")) v.emplace_back(n.substr(0, n.size() - 3) + "z", Shape{kB, kT, kH, kC / kH});
    if (n == "embed") v.emplace_back("pos_embed", Shape{kT, kC});  // learned positions, one row per position
    v.emplace_back(n, Shape{kB, kT, kC});
    if (ends_with(".attn.v")) v.emplace_back(n.substr(0, n.size() - 1) + "pattern", Shape{kB, kH, kT, kT});
    if (ends_with(".ffn.residual.branch")) {
      const std::string ffn = n.substr(0, n.size() - std::string("residual.branch").size());
      v.emplace_back(ffn + "pre", Shape{kB, kT, 4 * kC});
      v.emplace_back(ffn + "hidden", Shape{kB, kT, 4 * kC});
    }
  }
  if (norm == Norm::pre) v.emplace_back("normalized", Shape{kB, kT, kC});  // the final norm's output
  v.emplace_back("logits", Shape{kB, kT, kV});
  return v;
}

// The rest of the model from the residual stream entering block `first`: blocks first..L-1
// with the causal mask, final_norm (Pre-Norm), head, cross-entropy. Built from public parts.
Tensor loss_from_block(const nn::LanguageModel& m, std::size_t first, const Tensor& h_in, const IndexArray& targets) {
  nn::AttentionMask mask;
  mask.causal = true;
  Tensor h = h_in;
  for (std::size_t l = first; l < m.blocks.size(); ++l) h = m.blocks[l]->forward(h, mask).output;
  if (m.final_norm) h = m.final_norm->forward(h);
  return cross_entropy(m.head->forward(h), targets);
}

// The loss as a function of the two copies of x entering block l's feed-forward residual
// connection: y = skip + FFN(LN2(branch)) (Pre-Norm) or LN2(skip + FFN(branch)) (Post-Norm),
// then blocks l+1.. and the head.
Tensor loss_from_ffn_paths(const nn::LanguageModel& m, std::size_t l, const Tensor& skip, const Tensor& branch,
                           const IndexArray& targets) {
  const nn::TransformerBlock& blk = *m.blocks[l];
  const nn::FeedForward& ffn = blk.ffn->sublayer();
  const Tensor y = m.options().norm() == Norm::pre ? skip + ffn.forward(blk.ffn->norm->forward(branch))
                                                   : blk.ffn->norm->forward(skip + ffn.forward(branch));
  return loss_from_block(m, l + 1, y, targets);
}

// Central differences of f at every element of x, Richardson-extrapolated from steps h and h/2
// (as xgrad::gradcheck does), with the float32 step actually taken.
Array finite_differences(const std::function<double(const Array&)>& f, Array x, double h = 5e-2) {
  Array g = xt::zeros<float>(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float x0 = x.data()[i];
    auto at = [&](double dx) {
      x.data()[i] = static_cast<float>(x0 + dx);
      const double y = f(x);
      x.data()[i] = x0;
      return y;
    };
    const double hr = static_cast<double>(static_cast<float>(x0 + h)) - x0;
    const double hr2 = static_cast<double>(static_cast<float>(x0 + h / 2)) - x0;
    const double d1 = (at(h) - at(-h)) / (2 * hr), d2 = (at(h / 2) - at(-h / 2)) / (2 * hr2);
    g.data()[i] = static_cast<float>((4 * d2 - d1) / 3);
  }
  return g;
}

// Compares a gradient with finite differences: |g - fd| <= atol + rtol |fd| everywhere. The
// gradient must be far above atol somewhere, or the comparison could not fail. With the step
// 5e-2 the finite differences of these losses are within 8e-6 of backward's gradients.
void require_matches_fd(const Array& g, const Array& fd, double atol = 3e-5, double rtol = 1e-2) {
  REQUIRE(max_abs(g) > 50 * atol);
  std::size_t bad = 0, first = g.size();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = g.data()[i], n = fd.data()[i];
    if (!(std::abs(a - n) <= atol + rtol * std::abs(n))) {
      if (bad++ == 0) first = i;
    }
  }
  INFO("max |gradient| " << max_abs(g) << ", max |gradient - finite difference| " << max_abs_diff(g, fd));
  if (bad) INFO("first mismatch at flat " << first << ": gradient " << g.data()[first] << ", fd " << fd.data()[first]);
  REQUIRE(bad == 0);
}

// Runs xgrad::gradcheck on fn(x) and checks that its analytic gradient (of <fn, r>, r a fixed
// random scalar) is r times `expected`: the leaf gradcheck differentiated is captured.
void require_gradcheck_agrees(const std::function<Tensor(const Tensor&)>& fn, const Array& x, const Array& expected) {
  Tensor seen;
  GradcheckOptions opt;
  const GradcheckResult res = gradcheck(
      [&](const std::vector<Tensor>& in) {
    seen = in[0];
    return fn(in[0]);
      },
      {Tensor(x, true)}, opt);
  INFO(res.report);
  REQUIRE(res.ok);
  REQUIRE(res.checked == x.size());
  REQUIRE(seen.has_grad());
  const Array& a = seen.grad();  // r * dL/dx
  double ap = 0, pp = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ap += static_cast<double>(a.data()[i]) * expected.data()[i];
    pp += static_cast<double>(expected.data()[i]) * expected.data()[i];
  }
  const double r = ap / pp;
  INFO("projection r " << r);
  REQUIRE(std::abs(r) > 1e-3);
  REQUIRE(std::abs(r) <= 1.0);
  REQUIRE(max_abs_diff(a, Array(r * expected)) <= 1e-5 * max_abs(a));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ProbeSet points

TEST_CASE("a ProbeSet records every hook point but the scores, in forward order, with its shape and values", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    INFO(norm_name(norm));
    auto model = make_lm(norm);
    const Batch b = make_batch(1);
    inspect::ProbeSet probes(*model);
    REQUIRE(probes.names().empty());
    model->loss(b.ids, b.targets);

    const auto expected = expected_points(kL, norm);
    const std::vector<std::string> names = probes.names();
    REQUIRE(names.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const auto& [n, shape] = expected[i];
      INFO(n);
      REQUIRE(names[i] == n);
      REQUIRE(probes.activation(n).shape() == shape);
      REQUIRE(probes.tensor(n).requires_grad());
    }
    REQUIRE_FALSE(probes.has("blocks.0.attn.scores"));
    REQUIRE_FALSE(probes.has("blocks.0.attn.residual"));
    REQUIRE_THROWS_AS(probes.tensor("blocks.9.stream_in"), Error);
    REQUIRE_THROWS_AS(probes.gradient("blocks.0.stream_in"), Error);  // no backward yet

    // The points hold the values the names promise.
    REQUIRE(bitwise_equal(probes.activation("blocks.1.stream_in"), probes.activation("blocks.0.stream_out")));
    for (std::size_t l = 0; l < kL; ++l) {
      const std::string blk = "blocks." + std::to_string(l), att = blk + ".attn.residual", ffn = blk + ".ffn.residual";
      auto act = [&](const std::string& n) { return probes.activation(n); };
      REQUIRE(bitwise_equal(act(att + ".in"), act(blk + ".stream_in")));
      REQUIRE(bitwise_equal(act(att + ".skip"), act(att + ".in")));
      REQUIRE(bitwise_equal(act(att + ".branch"), act(att + ".in")));
      REQUIRE(bitwise_equal(act(att + ".out"), act(blk + ".stream_mid")));
      REQUIRE(bitwise_equal(act(ffn + ".in"), act(blk + ".stream_mid")));
      REQUIRE(bitwise_equal(act(ffn + ".skip"), act(ffn + ".in")));
      REQUIRE(bitwise_equal(act(ffn + ".branch"), act(ffn + ".in")));
      REQUIRE(bitwise_equal(act(ffn + ".out"), act(blk + ".stream_out")));

      NoGradGuard no_grad;
      const nn::TransformerBlock& tb = *model->blocks[l];
      // The attention sublayer's output is W_o applied to the context; the FFN's is linear2
      // applied to its hidden activations, which are GELU of its pre-activations (no dropout).
      const std::string att_out = blk + ".attn.out", ffn_out = blk + ".ffn.out";
      REQUIRE(bitwise_equal(tb.attn->w_o->forward(Tensor(act(blk + ".attn.context"))).value(), act(att_out)));
      REQUIRE(bitwise_equal(tb.ffn->linear2->forward(Tensor(act(blk + ".ffn.hidden"))).value(), act(ffn_out)));
      REQUIRE(bitwise_equal(gelu(Tensor(act(blk + ".ffn.pre"))).value(), act(blk + ".ffn.hidden")));
      const Tensor ffn_in(act(ffn + ".in"));
      const nn::FeedForward& f = tb.ffn->sublayer();
      if (norm == Norm::pre) {
        REQUIRE(bitwise_equal(f.forward(tb.ffn->norm->forward(ffn_in)).value(), act(ffn_out)));
        REQUIRE(bitwise_equal(Array(act(att + ".in") + act(att_out)), act(att + ".out")));
        REQUIRE(bitwise_equal(Array(act(ffn + ".in") + act(ffn_out)), act(ffn + ".out")));
      } else {
        REQUIRE(bitwise_equal(f.forward(ffn_in).value(), act(ffn_out)));
        REQUIRE(bitwise_equal(tb.attn->norm->forward(Tensor(Array(act(att + ".in") + act(att_out)))).value(),
                              act(att + ".out")));
        REQUIRE(bitwise_equal(tb.ffn->norm->forward(Tensor(Array(act(ffn + ".in") + act(ffn_out)))).value(),
                              act(ffn + ".out")));
      }
    }
  }
}

// Runs the same batch without and with a ProbeSet and requires the logits and the loss to be
// bitwise equal, and every parameter gradient equal up to rounding, or bitwise when `bitwise`.
void require_probes_change_nothing(Norm norm, bool bitwise) {
  auto model = make_lm(norm);
  const Batch b = make_batch(2);

  const Tensor plain_logits = model->forward(b.ids).logits;
  const Tensor plain = cross_entropy(plain_logits, b.targets);
  plain.backward();
  const NamedArrays plain_grads = gradients_of(*model);
  model->zero_grad();

  inspect::ProbeSet probes(*model);
  const Tensor probed_logits = model->forward(b.ids).logits;
  const Tensor probed = cross_entropy(probed_logits, b.targets);
  probed.backward();
  const NamedArrays probed_grads = gradients_of(*model);

  REQUIRE(bitwise_equal(plain_logits.value(), probed_logits.value()));
  REQUIRE(std::memcmp(plain.value().data(), probed.value().data(), sizeof(float)) == 0);
  REQUIRE(plain_grads.size() == probed_grads.size());
  std::string differing;  // every parameter whose gradient is not bitwise equal
  for (std::size_t i = 0; i < plain_grads.size(); ++i) {
    const Array &a = plain_grads[i].second, &p = probed_grads[i].second;
    INFO(plain_grads[i].first << ": max |difference| " << max_abs_diff(a, p) << ", max |gradient| " << max_abs(a));
    REQUIRE(plain_grads[i].first == probed_grads[i].first);
    // At worst rounding (the key bias's gradient is 0 up to rounding: softmax ignores it).
    REQUIRE(max_abs_diff(a, p) <= 1e-7 + 1e-6 * max_abs(a));
    if (!bitwise_equal(a, p)) differing += " " + plain_grads[i].first;
  }
  INFO("gradients that differ in their last bits:" << differing);
  if (bitwise) REQUIRE(differing.empty());
}

TEST_CASE("Pre-Norm probes change nothing: loss and every parameter gradient are bitwise equal", "[gemm]") {
  require_probes_change_nothing(Norm::pre, true);
}

// Post-Norm: equal up to rounding only. In a Post-Norm attention connection x has four consumers
// (the skip add and the q, k, v projections). Without probes backward sums them into dL/dx one
// at a time, ((skip + v) + k) + q; with probes the branch copy first gathers (v + k) + q and the
// identity then adds it to the skip part, so the float sum is associated differently (measured:
// |difference| up to about 7e-9, for the parameters upstream of block 1's attention input).
// Pre-Norm's x has two consumers, and a two-term sum is the same in either order.
TEST_CASE("Post-Norm probes change no value and no gradient beyond rounding", "[gemm]") {
  require_probes_change_nothing(Norm::post, false);
}

TEST_CASE("a destroyed ProbeSet leaves no hook behind, and two at once record the same values", "[gemm]") {
  auto model = make_lm(Norm::pre);
  const Batch b = make_batch(3);
  const std::size_t points = expected_points(kL, Norm::pre).size();
  {
    inspect::ProbeSet probes(*model);
    REQUIRE(model->num_hooks() == points);
    model->loss(b.ids, b.targets);
    REQUIRE(probes.names().size() == points);
    {
      // A second ProbeSet, on the whole tree or a sub-tree, records alongside the first.
      inspect::ProbeSet other(*model), on_block(*model->blocks[1]);
      model->loss(b.ids, b.targets);
      REQUIRE(other.names() == probes.names());
      for (const std::string& n : probes.names()) {
        INFO(n);
        REQUIRE(bitwise_equal(other.activation(n), probes.activation(n)));
      }
      REQUIRE(bitwise_equal(on_block.activation("stream_out"), probes.activation("blocks.1.stream_out")));
      REQUIRE_FALSE(on_block.has("blocks.1.stream_out"));
    }
    REQUIRE(model->num_hooks() == points);
    probes.clear();
    REQUIRE(probes.names().empty());
    REQUIRE_FALSE(probes.has("blocks.0.stream_in"));
    model->loss(b.ids, b.targets);  // the first one still records
    REQUIRE(probes.names().size() == points);
  }
  REQUIRE(model->num_hooks() == 0);
  // Forward and backward run without a ProbeSet (nothing dangles).
  const Tensor loss = model->loss(b.ids, b.targets);
  loss.backward();
  REQUIRE(std::isfinite(loss.item()));

  // A sub-tree can be probed on its own, with paths from its root.
  {
    inspect::ProbeSet block_probes(*model->blocks[0]);
    REQUIRE(model->blocks[1]->num_hooks() == 0);
    model->loss(b.ids, b.targets);
    REQUIRE(block_probes.has("stream_in"));
    REQUIRE(block_probes.has("attn.residual.branch"));
    REQUIRE_FALSE(block_probes.has("blocks.0.stream_in"));
    REQUIRE_FALSE(block_probes.has("blocks.1.stream_in"));
  }
  inspect::ProbeSet again(*model);
  REQUIRE(again.names().empty());
  model->loss(b.ids, b.targets);
  REQUIRE(again.names().size() == points);
}

// ---------------------------------------------------------------------------------------------
// The gradient through a residual connection is the sum of its two paths

TEST_CASE("at every residual connection the skip and branch gradients add up to the input's", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    INFO(norm_name(norm));
    auto model = make_lm(norm);
    const Batch b = make_batch(4);
    inspect::ProbeSet probes(*model);
    model->loss(b.ids, b.targets).backward();

    const std::vector<inspect::ResidualFlow> flows = probes.residual_flows();
    REQUIRE(flows.size() == 2 * kL);
    for (std::size_t l = 0; l < kL; ++l) {
      REQUIRE(flows[2 * l].name == "blocks." + std::to_string(l) + ".attn.residual");
      REQUIRE(flows[2 * l + 1].name == "blocks." + std::to_string(l) + ".ffn.residual");
    }
    for (const inspect::ResidualFlow& f : flows) {
      INFO(f.name);
      const Array &g_in = probes.gradient(f.name + ".in"), &g_skip = probes.gradient(f.name + ".skip"),
                  &g_branch = probes.gradient(f.name + ".branch"), &g_out = probes.gradient(f.name + ".out");
      const Array sum = g_skip + g_branch;
      REQUIRE(max_abs(g_skip) > 1e-4);
      REQUIRE(max_abs(g_branch) > 1e-6);
      REQUIRE(max_abs_diff(sum, g_in) <= 1e-6 * max_abs(g_in));

      REQUIRE(f.total == Approx(norm2(sum)).epsilon(1e-6));
      REQUIRE(f.total == Approx(norm2(g_in)).epsilon(1e-5));
      REQUIRE(f.skip == Approx(norm2(g_skip)).epsilon(1e-6));
      REQUIRE(f.branch == Approx(norm2(g_branch)).epsilon(1e-6));
      REQUIRE(f.out == Approx(norm2(g_out)).epsilon(1e-6));
      if (norm == Norm::pre) {
        // y = skip + f(LN(branch)): the skip path is the identity.
        REQUIRE(bitwise_equal(g_skip, g_out));
        REQUIRE(f.skip == f.out);
      } else {
        // y = LN(skip + f(branch)): the skip path goes through the LayerNorm's Jacobian.
        REQUIRE_FALSE(bitwise_equal(g_skip, g_out));
      }
    }
    // The stream probes are the same tensors as the connections' inputs and outputs.
    for (std::size_t l = 0; l < kL; ++l) {
      const std::string blk = "blocks." + std::to_string(l);
      REQUIRE(bitwise_equal(probes.gradient(blk + ".stream_in"), probes.gradient(blk + ".attn.residual.in")));
      REQUIRE(bitwise_equal(probes.gradient(blk + ".stream_mid"), probes.gradient(blk + ".ffn.residual.in")));
      REQUIRE(bitwise_equal(probes.gradient(blk + ".stream_out"), probes.gradient(blk + ".ffn.residual.out")));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Probe gradients against finite differences

TEST_CASE("the gradient of the stream entering each block equals finite differences", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    auto model = make_lm(norm);
    const Batch b = make_batch(5);
    for (std::size_t l = 0; l < kL; ++l) {
      const std::string name = "blocks." + std::to_string(l) + ".stream_in";
      INFO(norm_name(norm) << ", " << name);
      Array act, probe_grad;
      float model_loss = 0;
      {
        inspect::ProbeSet probes(*model);
        const Tensor loss = model->loss(b.ids, b.targets);
        loss.backward();
        model_loss = loss.item();
        act = probes.activation(name);
        probe_grad = probes.gradient(name);
      }
      model->zero_grad();
      auto fn = [&](const Tensor& h) { return loss_from_block(*model, l, h, b.targets); };

      // The composition reproduces the model's loss exactly.
      {
        NoGradGuard no_grad;
        REQUIRE(fn(Tensor(act)).item() == model_loss);
      }
      // Its backward gives the probe's gradient (up to the order of float additions).
      const Tensor x(act, true);
      fn(x).backward();
      REQUIRE(max_abs_diff(x.grad(), probe_grad) <= 1e-6 * max_abs(probe_grad));
      model->zero_grad();

      // Finite differences of the loss in the activation, against the probe gradient directly.
      const Array fd = finite_differences(
          [&](const Array& a) {
        NoGradGuard no_grad;
        return static_cast<double>(fn(Tensor(a)).item());
          },
          act);
      require_matches_fd(probe_grad, fd);
      // And xgrad::gradcheck on the same function.
      require_gradcheck_agrees(fn, act, probe_grad);
      model->zero_grad();
    }
  }
}

TEST_CASE("the gradients through the feed-forward branch and skip paths equal finite differences", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    auto model = make_lm(norm);
    const Batch b = make_batch(6);
    for (std::size_t l = 0; l < kL; ++l) {
      const std::string base = "blocks." + std::to_string(l) + ".ffn.residual";
      INFO(norm_name(norm) << ", " << base);
      Array x, g_branch, g_skip;
      float model_loss = 0;
      {
        inspect::ProbeSet probes(*model);
        const Tensor loss = model->loss(b.ids, b.targets);
        loss.backward();
        model_loss = loss.item();
        x = probes.activation(base + ".in");
        g_branch = probes.gradient(base + ".branch");
        g_skip = probes.gradient(base + ".skip");
      }
      model->zero_grad();
      {
        NoGradGuard no_grad;
        REQUIRE(loss_from_ffn_paths(*model, l, Tensor(x), Tensor(x), b.targets).item() == model_loss);
      }

      // The branch: x enters only the sublayer path; the skip path holds x fixed.
      auto through_branch = [&](const Tensor& in) { return loss_from_ffn_paths(*model, l, Tensor(x), in, b.targets); };
      // The skip: x enters only the skip path; the sublayer sees x fixed.
      auto through_skip = [&](const Tensor& in) { return loss_from_ffn_paths(*model, l, in, Tensor(x), b.targets); };

      for (auto [what, fn, probe_grad] :
           {std::make_tuple("branch", std::function<Tensor(const Tensor&)>(through_branch), g_branch),
            std::make_tuple("skip", std::function<Tensor(const Tensor&)>(through_skip), g_skip)}) {
        INFO(what);
        const Tensor leaf(x, true);
        fn(leaf).backward();
        REQUIRE(max_abs_diff(leaf.grad(), probe_grad) <= 1e-6 * max_abs(probe_grad));
        model->zero_grad();
        const Array fd = finite_differences(
            [&](const Array& a) {
          NoGradGuard no_grad;
          return static_cast<double>(fn(Tensor(a)).item());
            },
            x);
        require_matches_fd(probe_grad, fd);
        require_gradcheck_agrees(fn, x, probe_grad);
        model->zero_grad();
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Per-parameter gradient norms

TEST_CASE("gradient_norms gives every parameter's gradient norm, 0 without a gradient", "[gemm]") {
  auto model = make_lm(Norm::pre);
  const Batch b = make_batch(7);
  const NamedTensors params = model->named_parameters();

  // Before any backward every norm is 0.
  {
    const auto norms = inspect::gradient_norms(*model);
    REQUIRE(norms.size() == params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      REQUIRE(norms[i].first == params[i].first);
      REQUIRE(norms[i].second == 0.0);
    }
  }

  model->loss(b.ids, b.targets).backward();
  Tensor forgotten = model->parameter("blocks.1.ffn.linear2.weight");
  forgotten.zero_grad();
  REQUIRE_FALSE(forgotten.has_grad());

  const auto norms = inspect::gradient_norms(*model);
  REQUIRE(norms.size() == params.size());
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    REQUIRE(norms[i].first == params[i].first);
    if (params[i].first == "blocks.1.ffn.linear2.weight") {
      REQUIRE(norms[i].second == 0.0);
      continue;
    }
    REQUIRE(params[i].second.has_grad());
    REQUIRE(norms[i].second == Approx(norm2(params[i].second.grad())).epsilon(1e-9));
    if (norms[i].second > 0) ++nonzero;
  }
  REQUIRE(nonzero == params.size() - 1);

  const std::string table = inspect::gradient_norm_table(*model);
  REQUIRE(table.find("grad norm") != std::string::npos);
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    REQUIRE(table.find(params[i].first) != std::string::npos);
  }
  // The head weight's row shows its norm.
  const std::size_t row = table.find("head.weight");
  REQUIRE(row != std::string::npos);
  const std::string line = table.substr(row, table.find('\n', row) - row);
  char expect[64];
  std::snprintf(expect, sizeof expect, "%.6g", norm2(model->head->weight.grad()));
  INFO(line);
  REQUIRE(line.find(expect) != std::string::npos);
  REQUIRE(line.find("(7, 8)") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Head importance

TEST_CASE("head gates change nothing and each head's score is |dL/dgate|, as finite differences give", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    INFO(norm_name(norm));
    auto model = make_lm(norm);
    const Batch b = make_batch(8);

    const Tensor plain = model->loss(b.ids, b.targets);
    plain.backward();
    const NamedArrays plain_grads = gradients_of(*model);
    model->zero_grad();

    inspect::HeadImportance importance(*model);
    REQUIRE(importance.size() == kL);
    for (std::size_t l = 0; l < kL; ++l) REQUIRE(bitwise_equal(importance.gates(l).value(), xt::ones<float>({kH})));
    // Gates are not parameters.
    REQUIRE(model->named_parameters().size() == plain_grads.size());

    const Tensor gated = model->loss(b.ids, b.targets);
    REQUIRE(gated.item() == plain.item());
    gated.backward();
    const NamedArrays gated_grads = gradients_of(*model);
    for (std::size_t i = 0; i < plain_grads.size(); ++i) {
      INFO(plain_grads[i].first);
      REQUIRE(bitwise_equal(plain_grads[i].second, gated_grads[i].second));
    }

    std::vector<Array> dgate;
    for (std::size_t l = 0; l < kL; ++l) dgate.push_back(importance.gates(l).grad());
    importance.accumulate();
    REQUIRE(importance.batches() == 1);
    for (std::size_t l = 0; l < kL; ++l) REQUIRE_FALSE(importance.gates(l).has_grad());

    const std::vector<inspect::HeadScore> scores = importance.scores();
    REQUIRE(scores.size() == kL * kH);
    double largest = 0;  // the largest |dL/dgate|: far above the tolerance somewhere
    for (std::size_t l = 0; l < kL; ++l) {
      for (std::size_t h = 0; h < kH; ++h) {
        const inspect::HeadScore& s = scores[l * kH + h];
        INFO(s.module << " head " << s.head);
        REQUIRE(s.module == "blocks." + std::to_string(l) + ".attn");
        REQUIRE(s.head == h);
        REQUIRE(s.importance == Approx(std::abs(dgate[l](h))).epsilon(1e-12));

        // dL/dgate_h by finite differences of the gate's value.
        Tensor gate = importance.gates(l);
        auto loss_at = [&](double g) {
          gate.mutable_value()(h) = static_cast<float>(g);
          NoGradGuard no_grad;
          const double v = model->loss(b.ids, b.targets).item();
          gate.mutable_value()(h) = 1.f;
          return v;
        };
        const double e = 5e-2;  // Richardson: truncation O(e^4); a large step keeps float32 noise small
        const double d1 = (loss_at(1 + e) - loss_at(1 - e)) / (2 * e);
        const double d2 = (loss_at(1 + e / 2) - loss_at(1 - e / 2)) / e;
        const double fd = (4 * d2 - d1) / 3;
        INFO("dL/dgate " << dgate[l](h) << ", finite difference " << fd);
        REQUIRE(std::abs(fd) > 5e-4);
        REQUIRE(dgate[l](h) == Approx(fd).margin(2e-5).epsilon(1e-2));
        REQUIRE(s.importance == Approx(std::abs(fd)).margin(2e-5).epsilon(1e-2));
        largest = std::max(largest, std::abs(fd));
      }
    }
    REQUIRE(largest > 1e-2);
  }
}

TEST_CASE("head importance averages absolute gate gradients over batches", "[gemm]") {
  auto model = make_lm(Norm::pre);
  inspect::HeadImportance importance(*model);
  REQUIRE(importance.batches() == 0);
  for (const inspect::HeadScore& s : importance.scores()) REQUIRE(s.importance == 0.0);

  constexpr std::size_t kBatches = 4;
  std::vector<std::vector<double>> g(kL * kH);  // per head, dL/dgate of each batch
  for (std::size_t k = 0; k < kBatches; ++k) {
    const Batch b = make_batch(20 + k);
    model->zero_grad();
    model->loss(b.ids, b.targets).backward();
    for (std::size_t l = 0; l < kL; ++l) {
      for (std::size_t h = 0; h < kH; ++h) g[l * kH + h].push_back(importance.gates(l).grad()(h));
    }
    importance.accumulate();
  }
  REQUIRE(importance.batches() == kBatches);
  // accumulate() without a fresh backward: no gradient reached the gates.
  REQUIRE_THROWS_AS(importance.accumulate(), Error);

  const std::vector<inspect::HeadScore> scores = importance.scores();
  REQUIRE(scores.size() == kL * kH);
  bool some_sign_differs = false;  // so that mean |g| and |mean g| differ and the test can tell
  for (std::size_t i = 0; i < scores.size(); ++i) {
    double mean_abs = 0, mean = 0;
    for (double v : g[i]) {
      mean_abs += std::abs(v) / kBatches;
      mean += v / kBatches;
    }
    INFO(scores[i].module << " head " << scores[i].head << ": mean |g| " << mean_abs << ", |mean g| "
                          << std::abs(mean));
    REQUIRE(scores[i].importance == Approx(mean_abs).epsilon(1e-9));
    if (std::abs(mean_abs - std::abs(mean)) > 1e-3 * mean_abs) {
      some_sign_differs = true;
      REQUIRE(scores[i].importance != Approx(std::abs(mean)).epsilon(1e-4));
    }
  }
  REQUIRE(some_sign_differs);
}

TEST_CASE(
    "the HeadImportance destructor removes the gates, two at once each see their gradient, and a tree without "
    "attention throws",
    "[gemm]") {
  auto model = make_lm(Norm::post);
  const Batch b = make_batch(9);
  {
    inspect::HeadImportance importance(*model);
    REQUIRE(model->num_hooks() == kL);
    // accumulate() before any backward: nothing reached the gates.
    REQUIRE_THROWS_AS(importance.accumulate(), Error);
    // A second tool at once: both gates are 1, so each receives the same dL/dgate.
    inspect::HeadImportance other(*model);
    model->loss(b.ids, b.targets).backward();
    for (std::size_t l = 0; l < kL; ++l) REQUIRE(bitwise_equal(importance.gates(l).grad(), other.gates(l).grad()));
    REQUIRE_THROWS_AS(importance.gates(kL), Error);
  }
  REQUIRE(model->num_hooks() == 0);
  const Tensor loss = model->loss(b.ids, b.targets);  // runs ungated
  REQUIRE(std::isfinite(loss.item()));
  { inspect::HeadImportance again(*model); }  // can be installed again

  Generator gen(0);
  nn::Linear linear(4, 4, true, gen);
  auto no_attention = [&] { inspect::HeadImportance imp(linear); };
  REQUIRE_THROWS_AS(no_attention(), Error);
  nn::FeedForward ffn(nn::FeedForwardOptions(4, 8).dropout(0.f), gen);
  auto ffn_only = [&] { inspect::HeadImportance imp(ffn); };
  REQUIRE_THROWS_AS(ffn_only(), Error);
}
