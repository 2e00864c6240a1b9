// The gradient-flow finding of Xiong et al. (2020) in small, through the example's library
// (examples/gradient_flow/flow.hpp): at initialization Post-Norm's feed-forward weight
// gradients near the output are several times Pre-Norm's, and grow from the first layer to the
// last faster than Pre-Norm's. Also what measure() reports (consistent with a ProbeSet of our
// own), what it leaves behind (nothing), and make_model's initialization (Xavier, zero biases).
// The probe API itself is tested in test_probes.cpp.
//
// Shapes: B batch, T length, C d_model, H heads, V vocabulary, L layers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flow.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/probe.hpp"
#include "xgrad/nn/layers.hpp"

using namespace xgrad;
using nn::Norm;

namespace {

// L 6, C 64, H 4 (d_ff 256), V 32, T 16, 8 batches of B 8. One measure() takes ~0.1 s in Release.
gradflow::FlowConfig small_config(std::uint64_t seed) {
  gradflow::FlowConfig c;
  c.layers = 6;
  c.d_model = 64;
  c.heads = 4;
  c.vocab = 32;
  c.seq_len = 16;
  c.batches = 8;
  c.batch = 8;
  c.seed = seed;
  return c;
}

// The same batches for both placements: data from seed + 1000, weights from seed.
std::vector<gradflow::LmBatch> batches_for(const gradflow::FlowConfig& c) {
  Generator data(c.seed + 1000);
  return gradflow::shift_batches(c, c.batches, data);
}

std::unique_ptr<nn::LanguageModel> model_for(const gradflow::FlowConfig& c, Norm norm) {
  Generator weights(c.seed);
  return gradflow::make_model(c, norm, weights);
}

double norm2(const Array& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

bool bitwise_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Measured with small_config(seed), seeds 0..4, FFN W2 gradient norms |E[dL/dW2]| per layer:
//   seed  Pre-Norm first..last   Post-Norm first..last   last post/pre   last/first pre, post
//   0     0.327 .. 0.219         0.573 .. 0.662          3.02            0.670, 1.156
//   1     0.290 .. 0.183         0.429 .. 0.499          2.73            0.631, 1.165
//   2     0.284 .. 0.200         0.443 .. 0.588          2.94            0.704, 1.327
//   3     0.316 .. 0.218         0.647 .. 0.734          3.37            0.690, 1.135
//   4     0.265 .. 0.189         0.538 .. 0.629          3.33            0.713, 1.167
// (post last/first) / (pre last/first): 1.73, 1.85, 1.88, 1.64, 1.64.
// Thresholds, with margin below every seed: last post/pre >= 2 (min 2.73), and Post-Norm's
// last/first ratio >= 1.3 x Pre-Norm's (min 1.64x).
TEST_CASE("Post-Norm's feed-forward gradients near the output are several times Pre-Norm's and grow with depth faster",
          "[gemm]") {
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    const gradflow::FlowConfig c = small_config(seed);
    const auto batches = batches_for(c);
    auto pre_model = model_for(c, Norm::pre);
    auto post_model = model_for(c, Norm::post);
    const gradflow::FlowResult pre = gradflow::measure(*pre_model, batches);
    const gradflow::FlowResult post = gradflow::measure(*post_model, batches);
    REQUIRE(pre.layers.size() == c.layers);
    REQUIRE(post.layers.size() == c.layers);

    const double pre_first = pre.layers.front().ffn_weight_grad_norm, pre_last = pre.layers.back().ffn_weight_grad_norm;
    const double post_first = post.layers.front().ffn_weight_grad_norm,
                 post_last = post.layers.back().ffn_weight_grad_norm;
    INFO("seed " << seed << ": Pre-Norm first " << pre_first << " last " << pre_last << ", Post-Norm first "
                 << post_first << " last " << post_last);
    REQUIRE(pre_first > 0);
    REQUIRE(post_first > 0);
    REQUIRE(std::isfinite(pre.loss));
    REQUIRE(std::isfinite(post.loss));
    REQUIRE(post_last / pre_last >= 2.0);
    REQUIRE(post_last / post_first >= 1.3 * (pre_last / pre_first));
  }
}

TEST_CASE("measure reports residual flows consistent with a ProbeSet's gradients", "[gemm]") {
  for (Norm norm : {Norm::pre, Norm::post}) {
    INFO((norm == Norm::pre ? "Pre-Norm" : "Post-Norm"));
    gradflow::FlowConfig c = small_config(7);
    c.layers = 3;
    c.batches = 3;
    const auto batches = batches_for(c);
    auto model = model_for(c, norm);
    const gradflow::FlowResult r = gradflow::measure(*model, batches);
    REQUIRE(r.layers.size() == c.layers);
    REQUIRE(r.heads.size() == c.layers * c.heads);
    for (const inspect::HeadScore& h : r.heads) {
      REQUIRE(std::isfinite(h.importance));
      REQUIRE(h.importance > 0);
    }

    // Our own pass over the same batches: per connection, the mean over batches of |dL/d in|
    // and of the other norms ResidualFlow reports.
    struct Mean {
      double in = 0, out = 0, skip = 0, branch = 0;
    };
    std::vector<Mean> attn(c.layers), ffn(c.layers);
    double loss = 0;
    const double w = 1.0 / static_cast<double>(batches.size());
    for (const gradflow::LmBatch& b : batches) {
      model->zero_grad();
      inspect::ProbeSet probes(*model);
      const Tensor l = model->loss(b.ids, b.targets);
      l.backward();
      loss += w * l.item();
      for (std::size_t k = 0; k < c.layers; ++k) {
        const std::string blk = "blocks." + std::to_string(k);
        for (auto [mean, name] :
             {std::make_pair(&attn[k], blk + ".attn.residual"), std::make_pair(&ffn[k], blk + ".ffn.residual")}) {
          mean->in += w * norm2(probes.gradient(name + ".in"));
          mean->out += w * norm2(probes.gradient(name + ".out"));
          mean->skip += w * norm2(probes.gradient(name + ".skip"));
          mean->branch += w * norm2(probes.gradient(name + ".branch"));
        }
      }
    }
    model->zero_grad();
    REQUIRE(r.loss == Approx(loss).epsilon(1e-6));

    for (std::size_t k = 0; k < c.layers; ++k) {
      const gradflow::LayerFlow& f = r.layers[k];
      INFO("layer " << k);
      REQUIRE(f.layer == k);
      REQUIRE(f.attention.name == "blocks." + std::to_string(k) + ".attn.residual");
      REQUIRE(f.feed_forward.name == "blocks." + std::to_string(k) + ".ffn.residual");
      for (auto [flow, mean] : {std::make_pair(f.attention, attn[k]), std::make_pair(f.feed_forward, ffn[k])}) {
        INFO(flow.name);
        REQUIRE(flow.total > 0);
        REQUIRE(flow.total == Approx(mean.in).epsilon(1e-5));  // |skip part + branch part| = |dL/d in|
        REQUIRE(flow.out == Approx(mean.out).epsilon(1e-5));
        REQUIRE(flow.skip == Approx(mean.skip).epsilon(1e-5));
        REQUIRE(flow.branch == Approx(mean.branch).epsilon(1e-5));
      }
      // The stream entering the layer is the attention connection's input.
      REQUIRE(f.residual_grad_norm == Approx(f.attention.total).epsilon(1e-5));
      if (norm == Norm::pre) REQUIRE(f.attention.skip == Approx(f.attention.out).epsilon(1e-9));  // identity skip
    }
  }
}

TEST_CASE("measure leaves no gradients, gates or probes behind and changes no weight", "[gemm]") {
  gradflow::FlowConfig c = small_config(3);
  c.layers = 2;
  c.batches = 2;
  const auto batches = batches_for(c);
  for (Norm norm : {Norm::pre, Norm::post}) {
    auto model = model_for(c, norm);
    NamedArrays before;
    for (const auto& [name, p] : model->named_parameters()) before.emplace_back(name, p.value());

    const gradflow::FlowResult first = gradflow::measure(*model, batches);
    std::size_t i = 0;
    for (const auto& [name, p] : model->named_parameters()) {
      INFO(name);
      REQUIRE_FALSE(p.has_grad());
      REQUIRE(bitwise_equal(p.value(), before[i++].second));
    }
    REQUIRE(model->num_hooks() == 0);

    // Nothing carried over: a second measurement is identical.
    const gradflow::FlowResult second = gradflow::measure(*model, batches);
    REQUIRE(second.loss == first.loss);
    for (std::size_t l = 0; l < c.layers; ++l) {
      REQUIRE(second.layers[l].ffn_weight_grad_norm == first.layers[l].ffn_weight_grad_norm);
      REQUIRE(second.layers[l].residual_grad_norm == first.layers[l].residual_grad_norm);
      REQUIRE(second.layers[l].feed_forward.total == first.layers[l].feed_forward.total);
    }
    for (std::size_t h = 0; h < first.heads.size(); ++h)
      REQUIRE(second.heads[h].importance == first.heads[h].importance);
  }
  auto model = model_for(c, Norm::pre);
  REQUIRE_THROWS_AS(gradflow::measure(*model, {}), Error);
}

TEST_CASE("make_model uses Xavier-uniform linear weights, zero biases, N(0, 1) embeddings, no dropout") {
  const gradflow::FlowConfig c = small_config(5);
  for (Norm norm : {Norm::pre, Norm::post}) {
    auto model = model_for(c, norm);
    REQUIRE(model->options().dropout() == 0.f);
    REQUIRE(model->options().norm() == norm);
    REQUIRE(model->blocks.size() == c.layers);
    std::size_t linears = 0;
    for (auto& [path, m] : model->named_modules()) {
      if (auto* ln = dynamic_cast<nn::LayerNorm*>(m)) {
        for (float v : ln->weight.value()) REQUIRE(v == 1.f);
        for (float v : ln->bias.value()) REQUIRE(v == 0.f);
      }
      auto* linear = dynamic_cast<nn::Linear*>(m);
      if (!linear) continue;
      ++linears;
      INFO(path);
      const Array& wv = linear->weight.value();
      const double fan_out = static_cast<double>(wv.shape()[0]), fan_in = static_cast<double>(wv.shape()[1]);
      const double bound = std::sqrt(6.0 / (fan_in + fan_out));
      double max = 0, sq = 0;
      for (float v : wv) {
        max = std::max(max, static_cast<double>(std::abs(v)));
        sq += static_cast<double>(v) * v;
      }
      REQUIRE(max <= bound);
      // Not PyTorch's U(-1/sqrt(in), 1/sqrt(in)) (below 0.95 bound for every layer here): the
      // largest of >= 2048 draws sits at the bound, and the variance is bound^2 / 3.
      REQUIRE(max >= 0.95 * bound);
      REQUIRE(sq / static_cast<double>(wv.size()) == Approx(bound * bound / 3).epsilon(0.1));
      REQUIRE(linear->bias.defined());
      for (float v : linear->bias.value()) REQUIRE(v == 0.f);
    }
    REQUIRE(linears == 6 * c.layers + 1);  // q, k, v, o, linear1, linear2 per block, and the head
    for (const Tensor& e : {model->tok_emb->weight, model->pos_emb->weight}) {
      double s = 0, sq = 0;
      for (float v : e.value()) {
        s += v;
        sq += static_cast<double>(v) * v;
      }
      const double n = static_cast<double>(e.size()), mean = s / n;
      REQUIRE(std::abs(mean) < 0.1);
      REQUIRE(std::sqrt(sq / n - mean * mean) == Approx(1.0).margin(0.1));
    }
  }
  gradflow::FlowConfig bad = c;
  bad.heads = 5;  // 64 is not divisible by 5
  Generator gen(0);
  REQUIRE_THROWS_AS(gradflow::make_model(bad, Norm::pre, gen), Error);
}
