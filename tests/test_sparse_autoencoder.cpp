// Sparse autoencoders: SAELens's files against a PyTorch mirror of its forward and backward
// (committed fixture), the file round trip, gradients, splicing and caching features, recovering planted
// sparse directions (ReLU + L1 and TopK), and the refusals. The trained-LM report is in
// tests/test_inspect_trained.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/sae_training.hpp"
#include "xgrad/inspect/sparse_autoencoder.hpp"
#include "xgrad/nn/transformer.hpp"

#include "fixture.hpp"
#include "module_gradcheck.hpp"
#include "small_models.hpp"
#include "test_files.hpp"

using namespace xgrad;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;

namespace {

double max_abs_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - b.data()[i]));
  return m;
}

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && std::equal(a.begin(), a.end(), b.begin());
}

// Rows x = sum_i a_i d_i of `truth` (n, d) unit directions, each active with probability p at a
// magnitude in [0.5, 1.5).
Array sparse_mixture(const Array& truth, std::size_t rows, float p, Generator& gen) {
  const std::size_t n = truth.shape()[0], d = truth.shape()[1];
  Array x = xt::zeros<float>({rows, d});
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      if (gen.uniform() >= p) continue;
      const float a = gen.uniform(0.5f, 1.5f);
      for (std::size_t j = 0; j < d; ++j) x(r, j) += a * truth(i, j);
    }
  }
  return x;
}

Array unit_directions(std::size_t n, std::size_t d, Generator& gen) {
  Array w = gen.normal({n, d}, 0.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) {
    double sq = 0;
    for (std::size_t j = 0; j < d; ++j) sq += double(w(i, j)) * w(i, j);
    for (std::size_t j = 0; j < d; ++j) w(i, j) /= static_cast<float>(std::sqrt(sq));
  }
  return w;
}

// For each true direction, the largest cosine with a decoder row.
std::vector<double> best_cosines(const SparseAutoencoder& sae, const Array& truth) {
  const Array& w = sae.W_dec().value();
  std::vector<double> best(truth.shape()[0], -1);
  for (std::size_t i = 0; i < truth.shape()[0]; ++i) {
    for (std::size_t f = 0; f < w.shape()[0]; ++f) {
      double dot = 0, norm = 0;
      for (std::size_t j = 0; j < w.shape()[1]; ++j) {
        dot += double(w(f, j)) * truth(i, j);
        norm += double(w(f, j)) * w(f, j);
      }
      if (norm > 0) best[i] = std::max(best[i], dot / std::sqrt(norm));
    }
  }
  return best;
}

// 1 - sum |x - recons|^2 / sum |x - mean x|^2 over the rows of x (N, d).
double explained_variance(const SparseAutoencoder& sae, const Array& x) {
  const Array y = sae.forward(Tensor(x)).value();
  const std::size_t n = x.shape()[0], d = x.shape()[1];
  double err = 0, total = 0;
  for (std::size_t j = 0; j < d; ++j) {
    double mean = 0;
    for (std::size_t r = 0; r < n; ++r) mean += x(r, j) / double(n);
    for (std::size_t r = 0; r < n; ++r) {
      err += (double(y(r, j)) - x(r, j)) * (double(y(r, j)) - x(r, j));
      total += (x(r, j) - mean) * (x(r, j) - mean);
    }
  }
  return 1 - err / total;
}

std::size_t count_above(const std::vector<double>& v, double threshold) {
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [&](double c) { return c > threshold; }));
}

}  // namespace

TEST_CASE("SAELens files give the numbers a PyTorch mirror of SAELens's forward and backward gives", "[gemm]") {
  struct Case {
    const char* folder;
    SaeArchitecture architecture;
    std::size_t k;
    bool apply_b_dec;
    SaeNormalization normalization;
    const char* hook_name;
  };
  const Case cases[] = {
      {"standard_v6", SaeArchitecture::standard, 0, true, SaeNormalization::none, "blocks.1.hook_resid_pre"},
      {"topk_v6", SaeArchitecture::topk, 3, false, SaeNormalization::none, "blocks.0.hook_resid_post"},
      {"standard_legacy", SaeArchitecture::standard, 0, true, SaeNormalization::none, "blocks.0.hook_mlp_out"},
      {"layer_norm_v6", SaeArchitecture::standard, 0, true, SaeNormalization::layer_norm, "blocks.1.hook_resid_pre"},
  };
  for (const Case& c : cases) {
    SECTION(c.folder) {
      const std::string dir = testing::fixture_path(std::string("sae/") + c.folder);
      const auto sae = load_sae(dir);
      const SaeConfig& cfg = sae->config();
      CHECK(cfg.d_in == 8);
      CHECK(cfg.d_sae == 24);
      CHECK(cfg.architecture == c.architecture);
      CHECK(cfg.k == c.k);
      CHECK(cfg.apply_b_dec_to_input == c.apply_b_dec);
      CHECK(cfg.normalization == c.normalization);
      CHECK(cfg.hook_name == c.hook_name);
      CHECK(cfg.model_name == "xgrad-test");

      const SafetensorsContents io = load_safetensors(dir + "/io.safetensors");
      const auto tensor = [&](const std::string& name) -> const Array& {
        for (const auto& [n, a] : io.tensors) {
          if (n == name) return a;
        }
        FAIL("io.safetensors has no " << name);
        return io.tensors[0].second;
      };
      const Array& x = tensor("input");
      const Array& want_f = tensor("feature_acts");
      const Array& want_y = tensor("reconstruction");
      const Array f = sae->encode(Tensor(x)).value();
      const Array y = sae->forward(Tensor(x)).value();
      CHECK(max_abs_diff(f, want_f) < 1e-5);
      CHECK(max_abs_diff(y, want_y) < 1e-5);
      // The same features switch on (the fixture keeps every pre-activation 0.01 from a tie).
      for (std::size_t i = 0; i < f.size(); ++i) CHECK((f.data()[i] > 0) == (want_f.data()[i] > 0));
      if (c.normalization == SaeNormalization::none) {
        CHECK(max_abs_diff(sae->decode(Tensor(f)).value(), want_y) < 1e-5);
      }
      // With the error term the output is x up to rounding.
      CHECK(max_abs_diff(sae->forward(Tensor(x), true).value(), x) < 1e-5);

      // Backward: the gradients of sum(reconstruction * probe) by the input and every weight.
      Tensor leaf(x, true);
      sum(sae->forward(leaf) * Tensor(tensor("probe"))).backward();
      CHECK(max_abs_diff(leaf.grad(), tensor("grad_input")) < 1e-5);
      for (const char* name : {"W_enc", "b_enc", "W_dec", "b_dec"}) {
        INFO(name);
        CHECK(max_abs_diff(sae->parameter(name).grad(), tensor(std::string("grad_") + name)) < 1e-5);
      }
    }
  }
}

TEST_CASE("an SAE saved and loaded again is the same, and SAELens's cfg.json fields are written") {
  testing::TempDir tmp("xgrad_sae");
  SaeConfig c;
  c.d_in = 6;
  c.d_sae = 10;
  c.architecture = SaeArchitecture::topk;
  c.k = 2;
  c.apply_b_dec_to_input = false;
  c.hook_name = "blocks.0.stream_out";
  c.model_name = "tiny";
  Generator gen(3);
  SparseAutoencoder sae(c, gen);
  sae.b_enc().mutable_value() = gen.normal({10}, 0.f, 0.3f);
  sae.b_dec().mutable_value() = gen.normal({6}, 0.f, 0.3f);
  const std::string dir = tmp.file("sae");
  save_sae(dir, sae);
  const auto back = load_sae(dir);
  for (const char* name : {"W_enc", "b_enc", "W_dec", "b_dec"}) {
    CHECK(same_bits(back->parameter(name).value(), sae.parameter(name).value()));
  }
  CHECK(back->config().k == 2);
  CHECK(back->config().architecture == SaeArchitecture::topk);
  CHECK_FALSE(back->config().apply_b_dec_to_input);
  CHECK(back->config().hook_name == "blocks.0.stream_out");
  const std::string cfg = testing::read_bytes(dir + "/cfg.json");
  CHECK_THAT(cfg, Contains("\"architecture\": \"topk\""));
  CHECK_THAT(cfg, Contains("\"sae_lens_version\""));

  SECTION("a name that is not UTF-8 is refused before anything is written") {
    SaeConfig bad = c;
    bad.hook_name = "blocks.0.\xff";
    SparseAutoencoder other(bad, gen);
    const std::string weights_before = testing::read_bytes(dir + "/sae_weights.safetensors");
    REQUIRE_THROWS_WITH(save_sae(dir, other), Contains("save_sae") && Contains("hook name"));
    CHECK(testing::read_bytes(dir + "/sae_weights.safetensors") == weights_before);
    REQUIRE_THROWS_WITH(save_sae(tmp.file("other"), other), Contains("hook name"));
    CHECK_FALSE(std::filesystem::exists(tmp.file("other")));
  }
  SECTION("a refused save leaves both earlier files") {
    const std::string weights_before = testing::read_bytes(dir + "/sae_weights.safetensors");
    std::filesystem::remove(dir + "/cfg.json");
    std::filesystem::create_directory(dir + "/cfg.json");  // cfg.json cannot be written
    SparseAutoencoder other(c, gen);
    REQUIRE_THROWS_WITH(save_sae(dir, other), Contains("save_sae"));
    CHECK(testing::read_bytes(dir + "/sae_weights.safetensors") == weights_before);
  }
}

TEST_CASE("the SAE's gradients match finite differences (ReLU, TopK, layer norm, constant-norm rescale)", "[gemm]") {
  for (int variant = 0; variant < 4; ++variant) {
    SaeConfig c;
    c.d_in = 5;
    c.d_sae = 7;
    if (variant == 1) {
      c.architecture = SaeArchitecture::topk;
      c.k = 3;
    }
    if (variant == 2) c.normalization = SaeNormalization::layer_norm;
    if (variant == 3) c.normalization = SaeNormalization::constant_norm_rescale;
    Generator gen(40 + variant);
    SparseAutoencoder sae(c, gen);
    // Away from their starting values: W_enc not W_dec^T, biases that move the kinks.
    sae.W_enc().mutable_value() = gen.normal({5, 7}, 0.f, 0.5f);
    sae.b_enc().mutable_value() = gen.normal({7}, 0.f, 0.3f);
    sae.b_dec().mutable_value() = gen.normal({5}, 0.f, 0.3f);
    const Tensor x = testing::randn({3, 5}, 50 + variant);
    const Tensor r(gen.normal({3, 5}, 0.f, 1.f));
    INFO("variant " << variant);
    // With constant_norm_rescale every input element moves every pre-activation: steps of 1e-2 and
    // 3e-3 cross a ReLU corner of these draws (too shallow to be seen as one), 1e-3 and 3e-4 do not.
    GradcheckOptions options;
    if (variant == 3) options.eps = 1e-3;
    REQUIRE_GRADS_OK(testing::check_module_grads(
        sae, [&](const testing::Ins& in) { return sum(sae.forward(in[0]) * r); }, {x}, options));
  }
}

TEST_CASE("constant_norm_rescale reads x at norm sqrt(d_in) and gives the output x's norm back", "[gemm]") {
  SaeConfig c;
  c.d_in = 6;
  c.d_sae = 9;
  c.normalization = SaeNormalization::constant_norm_rescale;
  Generator gen(60);
  SparseAutoencoder sae(c, gen);
  sae.b_enc().mutable_value() = gen.normal({9}, 0.f, 0.3f);
  sae.b_dec().mutable_value() = gen.normal({6}, 0.f, 0.3f);
  const Array x = gen.normal({4, 6}, 0.f, 2.f);
  // By hand: x' = x sqrt(6) / |x| per row, f = relu((x' - b_dec) W_enc + b_enc), out = (f W_dec + b_dec) |x| / sqrt(6).
  Array want = Array::from_shape({4, 6});
  const Array& we = sae.W_enc().value();
  const Array& wd = sae.W_dec().value();
  for (std::size_t r = 0; r < 4; ++r) {
    double norm = 0;
    for (std::size_t j = 0; j < 6; ++j) norm += double(x(r, j)) * x(r, j);
    norm = std::sqrt(norm);
    std::vector<double> f(9, 0.);
    for (std::size_t i = 0; i < 9; ++i) {
      double pre = sae.b_enc().value()(i);
      for (std::size_t j = 0; j < 6; ++j) pre += (x(r, j) * std::sqrt(6.) / norm - sae.b_dec().value()(j)) * we(j, i);
      f[i] = std::max(pre, 0.);
    }
    for (std::size_t j = 0; j < 6; ++j) {
      double y = sae.b_dec().value()(j);
      for (std::size_t i = 0; i < 9; ++i) y += f[i] * wd(i, j);
      want(r, j) = static_cast<float>(y * norm / std::sqrt(6.));
    }
  }
  CHECK(max_abs_diff(sae.forward(Tensor(x)).value(), want) < 1e-5);
  // Scaling x scales the output and leaves the features.
  CHECK(max_abs_diff(sae.forward(Tensor(Array(x * 3.f))).value(), Array(want * 3.f)) < 1e-4);
  CHECK(max_abs_diff(sae.encode(Tensor(Array(x * 3.f))).value(), sae.encode(Tensor(x)).value()) < 1e-5);
}

TEST_CASE("a spliced SAE replaces the point's value, its features are cached, and the hook goes away", "[gemm]") {
  const auto model = testing::randomized_lm(nn::LanguageModelOptions(11, 16, 2, 2).d_ff(32).max_len(8).dropout(0.f), 5);
  model->eval();
  const IndexArray ids = testing::uniform_ids(2, 6, 11, 6);
  SaeConfig c;
  c.d_in = 16;
  c.d_sae = 40;
  c.hook_name = "blocks.0.hook_resid_post";  // TransformerLens's name for blocks.0.stream_out
  Generator gen(7);
  SparseAutoencoder sae(c, gen);
  sae.b_enc().mutable_value() = gen.normal({40}, 0.f, 0.1f);

  const Array plain = model->forward(ids).logits.value();
  const Array stream = cache_activations(
                           *model, [&] { model->forward(ids); }, points_named({"blocks.0.stream_out"}))
                           .at("blocks.0.stream_out");
  const Array want = sae.forward(Tensor(stream)).value();
  {
    const SaeSplice splice(*model, sae);
    CHECK(splice.point() == "blocks.0.stream_out");
    Array seen;
    const ActivationCache features = cache_activations(
        sae,
        [&] {
      seen = cache_activations(
                 *model, [&] { model->forward(ids); }, points_named({"blocks.0.stream_out"}))
                 .at("blocks.0.stream_out");
        },
        points_named({"sae_acts_post"}));
    CHECK(same_bits(seen, want));  // the cache after the splice holds the reconstruction
    CHECK(same_bits(features.at("sae_acts_post"), sae.encode(Tensor(stream)).value()));
    CHECK(features.at("sae_acts_post").shape() == Shape{2, 6, 40});
    CHECK(max_abs_diff(model->forward(ids).logits.value(), plain) > 1e-3);
  }
  {
    const SaeSplice splice(*model, sae, "blocks.0.stream_out", true);  // with the error term
    CHECK(max_abs_diff(model->forward(ids).logits.value(), plain) < 1e-4);
  }
  CHECK(model->num_hooks() == 0);
  CHECK(same_bits(model->forward(ids).logits.value(), plain));
}

TEST_CASE("SAEs splice into the GPT-2 and Llama layouts, and train on their streams", "[gemm]") {
  for (const nn::LanguageModelOptions& options : {nn::LanguageModelOptions::gpt2_style(11, 16, 2, 2).max_len(8),
                                                  nn::LanguageModelOptions::llama_style(11, 16, 4, 2, 2).max_len(8)}) {
    auto model = testing::randomized_lm(nn::LanguageModelOptions(options).dropout(0.f), 8);
    model->eval();
    INFO(model->summary());
    const IndexArray ids = testing::uniform_ids(2, 6, 11, 9);
    const Array plain = model->forward(ids).logits.value();
    SaeConfig c;
    c.d_in = 16;
    c.d_sae = 32;
    c.architecture = SaeArchitecture::topk;
    c.k = 4;
    c.hook_name = "blocks.1.hook_resid_mid";
    Generator gen(10);
    SparseAutoencoder sae(c, gen);
    std::uint64_t batch = 11;
    train_sae(sae, activations_at(*model, c.hook_name, [&] { return testing::uniform_ids(4, 6, 11, batch++); }),
              SaeTrainOptions().steps(20).batch_rows(24).buffer_rows(48));
    {
      const SaeSplice with_error(*model, sae, "", true);
      CHECK(with_error.point() == "blocks.1.stream_mid");
      CHECK(max_abs_diff(model->forward(ids).logits.value(), plain) < 1e-4);
    }
    const SaeEvaluation e = evaluate_sae(*model, sae, {{ids, testing::uniform_ids(2, 6, 11, 99)}});
    CHECK(e.mean_l0 <= 4);
    CHECK(e.loss_spliced != e.loss);
    CHECK(model->num_hooks() == 0);
  }
}

TEST_CASE("SAEs trained on a mixture of sparse directions recover them", "[gemm][long]") {
  constexpr std::size_t kD = 32, kTrue = 32;
  Generator gen(21);
  const Array truth = unit_directions(kTrue, kD, gen);
  Generator data(22);
  const ActivationSource source = [&] { return sparse_mixture(truth, 256, 3.f / kTrue, data); };

  // Trains an SAE of 2 * kTrue features for 3000 steps of 256 rows, and checks it found the
  // directions and reconstructs fresh rows.
  const auto train_and_check = [&](const SaeConfig& c, SaeTrainOptions options, std::uint64_t seed) {
    Generator init(seed);
    SparseAutoencoder sae(c, init);
    const SaeTrainingReport r = train_sae(sae, source, options.steps(3000).batch_rows(256).lr(3e-3f));
    const std::vector<double> cos = best_cosines(sae, truth);
    INFO("mse " << r.mse.front() << " -> " << r.mse.back() << ", L0 " << r.l0.back() << ", dead " << r.dead_features
                << ", recovered above 0.9: " << count_above(cos, 0.9) << " of " << kTrue << " in " << r.seconds
                << " s");
    CHECK(count_above(cos, 0.9) >= kTrue * 9 / 10);
    CHECK(explained_variance(sae, sparse_mixture(truth, 1024, 3.f / kTrue, data)) > 0.9);
  };
  SaeConfig c;
  c.d_in = kD;
  c.d_sae = 2 * kTrue;
  SECTION("ReLU with an L1 penalty") { train_and_check(c, SaeTrainOptions().l1_coefficient(0.3f), 23); }
  SECTION("TopK") {
    c.architecture = SaeArchitecture::topk;
    c.k = 4;
    train_and_check(c, SaeTrainOptions(), 24);
  }
  SECTION("a random SAE does not pass the same check") {
    Generator init(25);
    const SparseAutoencoder sae(c, init);
    CHECK(count_above(best_cosines(sae, truth), 0.9) == 0);
  }
}

TEST_CASE("SAE refusals: widths, dtypes, files, options", "[gemm]") {
  testing::TempDir tmp("xgrad_sae_bad");
  const std::string fixture = testing::fixture_path("sae/standard_v6");
  const auto copy_fixture = [&](const std::string& name) {
    const std::string dir = tmp.file(name);
    std::filesystem::create_directory(dir);
    std::filesystem::copy_file(fixture + "/cfg.json", dir + "/cfg.json");
    std::filesystem::copy_file(fixture + "/sae_weights.safetensors", dir + "/sae_weights.safetensors");
    return dir;
  };
  const auto edit_cfg = [&](const std::string& dir, const std::string& from, const std::string& to) {
    std::string cfg = testing::read_bytes(dir + "/cfg.json");
    const std::size_t at = cfg.find(from);
    REQUIRE(at != std::string::npos);
    cfg.replace(at, from.size(), to);
    std::ofstream(dir + "/cfg.json", std::ios::binary) << cfg;
  };

  SECTION("an SAE whose width is not the point's") {
    const auto model = testing::randomized_lm(nn::LanguageModelOptions(11, 16, 2, 1).max_len(8).dropout(0.f), 1);
    const auto sae = load_sae(fixture);  // d_in 8
    const SaeSplice splice(*model, *sae, "blocks.0.stream_out");
    REQUIRE_THROWS_WITH(
        model->forward(testing::uniform_ids(1, 4, 11, 2)),
        Contains("SaeSplice: point 'blocks.0.stream_out' holds (1, 4, 16), but the SAE reads d_in = 8"));
    REQUIRE_THROWS_WITH(
        evaluate_sae(*model, *sae, {{testing::uniform_ids(1, 4, 11, 2), testing::uniform_ids(1, 4, 11, 3)}},
                     "blocks.0.stream_out"),
        Contains("point 'blocks.0.stream_out' holds (1, 4, 16), but the SAE reads d_in = 8"));
    REQUIRE_THROWS_WITH(sae->encode(Tensor(xt::zeros<float>({2, 7}))), Contains("(2, 7) must end in an axis of 8"));
  }
  SECTION("a point the model lacks lists near names") {
    const auto model = testing::randomized_lm(nn::LanguageModelOptions(11, 16, 2, 1).max_len(8).dropout(0.f), 1);
    const auto sae = load_sae(fixture);  // reads blocks.1.hook_resid_pre: the model has one block
    REQUIRE_THROWS_WITH(SaeSplice(*model, *sae), Contains("blocks.1.hook_resid_pre"));
    REQUIRE_THROWS_WITH(activations_at(*model, "blocks.0.stream_outt", [] { return IndexArray(); }),
                        Contains("blocks.0.stream_out"));
  }
  SECTION("a dtype the weights do not hold, or one xgrad does not read") {
    const std::string dir = copy_fixture("f16");
    edit_cfg(dir, "\"dtype\": \"float32\"", "\"dtype\": \"float16\"");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("\"W_enc\" is F32, but cfg.json says F16"));
    edit_cfg(dir, "\"dtype\": \"float16\"", "\"dtype\": \"float64\"");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("field \"dtype\" is \"float64\""));
  }
  SECTION("weights F16 as cfg.json says become float32") {
    const std::string dir = copy_fixture("half");
    const SafetensorsContents w = load_safetensors(dir + "/sae_weights.safetensors");
    save_safetensors(dir + "/sae_weights.safetensors", w.tensors, {}, Dtype::f16);
    edit_cfg(dir, "\"dtype\": \"float32\"", "\"dtype\": \"torch.float16\"");
    const auto sae = load_sae(dir);
    CHECK(max_abs_diff(sae->W_enc().value(), load_sae(fixture)->W_enc().value()) < 1e-2);
  }
  SECTION("a weight that is NaN or infinite is refused, naming the file, the tensor and the position") {
    const std::string dir = copy_fixture("nan");
    const std::string weights = dir + "/sae_weights.safetensors";
    SafetensorsContents w = load_safetensors(weights);
    for (auto& [name, a] : w.tensors) {
      if (name == "W_dec") a.data()[13] = std::nanf("");
    }
    save_safetensors(weights, w.tensors);
    REQUIRE_THROWS_WITH(load_sae(dir),
                        Contains("load_sae: '" + weights + "': \"W_dec\" holds nan at flat position 13"));
    for (auto& [name, a] : w.tensors) {
      if (name == "W_dec") a.data()[13] = 0.f;
      if (name == "b_enc") a.data()[2] = -INFINITY;
    }
    save_safetensors(weights, w.tensors, {}, Dtype::bf16);
    edit_cfg(dir, "\"dtype\": \"float32\"", "\"dtype\": \"bfloat16\"");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("\"b_enc\" holds -inf at flat position 2"));
  }
  SECTION("a width in cfg.json that the weights do not have") {
    const std::string dir = copy_fixture("wide");
    edit_cfg(dir, "\"d_sae\": 24", "\"d_sae\": 25");
    REQUIRE_THROWS_WITH(load_sae(dir),
                        Contains("\"W_enc\" is (8, 24), but cfg.json's d_in 8 and d_sae 25 make it (8, 25)"));
  }
  SECTION("sizes in cfg.json that no memory holds are compared with the weights' shapes before anything is built") {
    // An SAE of these sizes needs 64 TB: the refusal must come from the shapes, not an allocation.
    const std::string dir = copy_fixture("huge");
    edit_cfg(dir, "\"d_sae\": 24", "\"d_sae\": 1000000000000");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("load_sae: '" + dir +
                                                "/sae_weights.safetensors': \"W_enc\" is (8, 24), but cfg.json's d_in "
                                                "8 and d_sae 1000000000000 make it (8, 1000000000000)"));
    edit_cfg(dir, "\"d_sae\": 1000000000000", "\"d_sae\": 24");
    edit_cfg(dir, "\"d_in\": 8", "\"d_in\": 1000000000000");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("\"W_enc\" is (8, 24), but cfg.json's d_in 1000000000000 and d_sae 24 "
                                                "make it (1000000000000, 24)"));
  }
  SECTION("an architecture, a normalization or a field xgrad does not know") {
    const std::string dir = copy_fixture("arch");
    edit_cfg(dir, "\"architecture\": \"standard\"", "\"architecture\": \"jumprelu\"");
    REQUIRE_THROWS_WITH(load_sae(dir),
                        Contains("field \"architecture\" is \"jumprelu\"; xgrad knows standard and topk"));
    edit_cfg(dir, "\"architecture\": \"jumprelu\"", "\"architecture\": \"topk\"");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("a TopK SAE needs \"k\""));
    edit_cfg(dir, "\"architecture\": \"topk\"", "\"architecture\": \"standard\"");
    edit_cfg(dir, "\"reshape_activations\": \"none\"", "\"reshape_activations\": \"hook_z\"");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("field \"reshape_activations\" is \"hook_z\""));
    edit_cfg(dir, "\"d_in\": 8", "\"d_in\": -8");
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("field \"d_in\" must be a positive integer, got -8"));
    std::ofstream(dir + "/cfg.json") << "[1, 2]";
    REQUIRE_THROWS_WITH(load_sae(dir), Contains("not an object"));
    REQUIRE_THROWS_WITH(load_sae(tmp.file("missing")), Contains("load_sae"));
  }
  SECTION("train_sae refuses before the first step, leaving the SAE as it was") {
    SaeConfig c;
    c.d_in = 4;
    c.d_sae = 8;
    Generator gen(1);
    SparseAutoencoder sae(c, gen);
    const Array before = sae.W_enc().value();
    const ActivationSource wrong = [] { return Array(xt::zeros<float>({3, 5})); };
    REQUIRE_THROWS_WITH(train_sae(sae, wrong),
                        Contains("train_sae: the source gave activations of shape (3, 5), not (..., 4)"));
    const ActivationSource nan = [] { return Array(xt::ones<float>({3, 4}) * NAN); };
    REQUIRE_THROWS_WITH(train_sae(sae, nan), Contains("train_sae: the source gave nan"));
    const ActivationSource fine = [] { return Array(xt::ones<float>({3, 4})); };
    REQUIRE_THROWS_WITH(train_sae(sae, fine, SaeTrainOptions().batch_rows(0)), Contains("batch_rows 0"));
    REQUIRE_THROWS_WITH(train_sae(sae, fine, SaeTrainOptions().batch_rows(64).buffer_rows(32)),
                        Contains("buffer_rows 32 is below batch_rows 64"));
    REQUIRE_THROWS_WITH(train_sae(sae, fine, SaeTrainOptions().lr(-1.f)), Contains("lr -1"));
    REQUIRE_THROWS_WITH(train_sae(sae, fine, SaeTrainOptions().buffer_rows(std::size_t{1} << 60)),
                        Contains("train_sae: a buffer of 1152921504606846976 rows needs"));
    SaeConfig layer_norm = c;
    layer_norm.normalization = SaeNormalization::layer_norm;
    SparseAutoencoder normalized(layer_norm, gen);
    REQUIRE_THROWS_WITH(train_sae(normalized, fine),
                        Contains("train_sae: the SAE normalizes its input at run time (layer_norm)"));
    CHECK(same_bits(sae.W_enc().value(), before));
    SaeConfig topk = c;
    topk.architecture = SaeArchitecture::topk;
    topk.k = 9;
    REQUIRE_THROWS_WITH(SparseAutoencoder(topk, gen), Contains("TopK's k 9 must be in [1, d_sae = 8]"));
    SaeConfig huge = c;
    huge.d_sae = 1000000000000;
    REQUIRE_THROWS_WITH(SparseAutoencoder(huge, gen),
                        Contains("SparseAutoencoder: an SAE of d_in 4 and d_sae 1000000000000 needs 32.7 TiB"));
  }
}

namespace {

// A source whose call i (step i, with buffer_rows == batch_rows) gives 16 rows of N(0, 1), or
// of `huge` from call `bad` on (their squared error overflows float32).
ActivationSource diverging_source(std::size_t bad, float huge = 1e20f) {
  auto calls = std::make_shared<std::size_t>(0);
  return [calls, bad, huge] {
    const std::size_t i = (*calls)++;
    Generator g(100 + i);
    return i >= bad ? Array(xt::ones<float>({16, 4}) * huge) : g.normal({16, 4}, 0.f, 1.f);
  };
}

void require_same_weights(const SparseAutoencoder& a, const SparseAutoencoder& b) {
  for (const char* name : {"W_enc", "b_enc", "W_dec", "b_dec"}) {
    INFO(name);
    CHECK(same_bits(a.parameter(name).value(), b.parameter(name).value()));
  }
}

}  // namespace

TEST_CASE("train_sae stops before a step that is not finite, keeping the weights after the last good step and the mode",
          "[gemm]") {
  SaeConfig c;
  c.d_in = 4;
  c.d_sae = 8;
  const SaeTrainOptions o = SaeTrainOptions().batch_rows(16).buffer_rows(16).lr(1e-2f);
  Generator gen_a(1), gen_b(1);
  SparseAutoencoder good(c, gen_a), diverged(c, gen_b);

  SECTION("a loss that overflows") {
    train_sae(good, diverging_source(99), SaeTrainOptions(o).steps(3));
    diverged.eval();
    REQUIRE_THROWS_WITH(train_sae(diverged, diverging_source(3), SaeTrainOptions(o).steps(10)),
                        Contains("train_sae: the loss is not finite at step 3 (mse inf"));
    require_same_weights(good, diverged);
    CHECK(!diverged.is_training());
  }
  SECTION("a gradient that is not finite while the loss is") {
    auto backwards = std::make_shared<int>(0);
    for (SparseAutoencoder* sae : {&good, &diverged}) {
      sae->W_enc().register_hook([backwards](Array& g) {
        if (++*backwards == 2 + 3) g(1, 2) = NAN;  // the failing run's third backward
      });
    }
    train_sae(good, diverging_source(99), SaeTrainOptions(o).steps(2));
    diverged.train();
    REQUIRE_THROWS_WITH(train_sae(diverged, diverging_source(99), SaeTrainOptions(o).steps(10)),
                        Contains("train_sae: the gradient of W_enc holds nan at flat position 10 at step 2"));
    require_same_weights(good, diverged);
    CHECK(diverged.is_training());
  }
  SECTION("a source that throws part way leaves the mode as it was") {
    const ActivationSource wrong_later = [calls = std::make_shared<int>(0)] {
      const std::size_t width = ++*calls < 3 ? 4 : 5;
      return Array(xt::zeros<float>({std::size_t{16}, width}));
    };
    diverged.eval();
    REQUIRE_THROWS_WITH(train_sae(diverged, wrong_later, SaeTrainOptions(o).steps(10)),
                        Contains("train_sae: the source gave activations of shape (16, 5)"));
    CHECK(!diverged.is_training());
  }
}
