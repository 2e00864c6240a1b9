// Steering vectors: what Steering adds and where, during forward and generation; the mean
// difference of activations; the safetensors file; the refusals. The trained-model case is in
// tests/test_inspect_trained.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/inspect/steering.hpp"
#include "xgrad/nn/transformer.hpp"

#include "error_of.hpp"
#include "small_models.hpp"

using namespace xgrad;
using xgrad::testing::error_of;
using namespace xgrad::inspect;
using Catch::Matchers::Contains;

namespace {

constexpr std::size_t kV = 13, kC = 16, kB = 2, kT = 6;

std::unique_ptr<nn::LanguageModel> make_model(std::uint64_t seed) {
  return testing::randomized_lm(nn::LanguageModelOptions(kV, kC, 4, 2).d_ff(32).max_len(16).dropout(0.f), seed);
}

IndexArray random_ids(std::uint64_t seed, std::size_t B = kB, std::size_t T = kT) {
  return testing::uniform_ids(B, T, kV, seed);
}

SteeringVector some_vector(const std::string& point, std::uint64_t seed) {
  Generator gen(seed);
  return {point, gen.normal({kC}, 0.f, 1.f), 2.5f};
}

}  // namespace

TEST_CASE("Steering adds scale times the vector at its point, at the chosen positions only", "[gemm]") {
  auto model = make_model(1);
  const IndexArray ids = random_ids(2);
  const SteeringVector v = some_vector("blocks.1.hook_resid_pre", 3);  // TransformerLens's name for stream_in
  const ActivationCache plain = cache_activations(
      *model, [&] { model->forward(ids); }, points_named({"blocks.1.stream_in"}));
  const Array& a = plain.at("blocks.1.stream_in");
  for (std::size_t from : {std::size_t{0}, std::size_t{3}}) {
    INFO("from position " << from);
    Array seen;
    {
      const Steering steer(*model, v, from);
      nn::HookHandle read = model->add_forward_hook("blocks.1.stream_in", [&](const Tensor& t) {
        seen = t.value();
        return Tensor();
      });
      model->forward(ids);
    }
    for (std::size_t b = 0; b < kB; ++b) {
      for (std::size_t t = 0; t < kT; ++t) {
        for (std::size_t c = 0; c < kC; ++c) {
          const float expected = t >= from ? a(b, t, c) + v.vector(c) * v.scale : a(b, t, c);
          REQUIRE(seen(b, t, c) == expected);
        }
      }
    }
  }
  REQUIRE(model->num_hooks() == 0);
  // Gone with its handle: the model computes what it did before.
  const Array after = model->forward(ids).logits.value();
  const ActivationCache again = cache_activations(
      *model, [&] { model->forward(ids); }, points_named({"logits"}));
  REQUIRE(std::memcmp(after.data(), again.at("logits").data(), after.size() * sizeof(float)) == 0);
}

TEST_CASE("Steering moves generation, and generation comes back when it ends", "[gemm]") {
  auto model = make_model(4);
  const std::vector<std::int64_t> prompt = {1, 2, 3};
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  Generator g1(0), g2(0), g3(0);
  const std::vector<std::int64_t> plain = model->generate(prompt, 8, greedy, g1);
  std::vector<std::int64_t> steered;
  {
    SteeringVector v = some_vector("blocks.0.stream_out", 5);
    v.scale = 8.f;
    const Steering steer(*model, v);
    steered = model->generate(prompt, 8, greedy, g2);
  }
  REQUIRE(steered.size() == plain.size());
  REQUIRE(steered != plain);
  REQUIRE(model->generate(prompt, 8, greedy, g3) == plain);
}

TEST_CASE("during generate, from_position counts from the prompt's first token", "[gemm]") {
  auto model = make_model(4);
  const std::vector<std::int64_t> prompt = {1, 2, 3};  // generate returns the prompt, then 8 tokens
  constexpr std::size_t kCount = 8;
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  Generator g(0);
  const std::vector<std::int64_t> plain = model->generate(prompt, kCount, greedy, g);
  SteeringVector v = some_vector("blocks.0.stream_out", 5);
  v.scale = 8.f;
  const auto steered_from = [&](std::size_t from) {
    const Steering steer(*model, v, from);
    return model->generate(prompt, kCount, greedy, g);
  };
  // The last context holds prompt + kCount - 1 tokens: steering from there on touches nothing.
  CHECK(steered_from(prompt.size() + kCount - 1) == plain);
  // From the prompt's length: the first choice reads the prompt's positions alone, so it is
  // plain's; later ones read steered positions.
  const std::vector<std::int64_t> after_prompt = steered_from(prompt.size());
  CHECK(after_prompt[prompt.size()] == plain[prompt.size()]);
  CHECK(after_prompt != plain);
  // From the prompt's last token: the first choice moves already.
  CHECK(steered_from(prompt.size() - 1)[prompt.size()] != plain[prompt.size()]);
}

TEST_CASE("mean_difference_vector is the difference of the two sets' mean activations", "[gemm]") {
  auto model = make_model(6);
  const std::vector<IndexArray> positive = {random_ids(7), random_ids(8, 3, 4)}, negative = {random_ids(9)};
  for (bool last_only : {true, false}) {
    INFO("last position only: " << last_only);
    const SteeringVector v = mean_difference_vector(*model, "blocks.1.hook_resid_mid", positive, negative, last_only);
    REQUIRE(v.point == "blocks.1.stream_mid");
    REQUIRE(v.scale == 1.f);
    auto mean = [&](const std::vector<IndexArray>& set) {
      std::vector<double> sum(kC, 0.);
      double count = 0;
      for (const IndexArray& ids : set) {
        const ActivationCache c = cache_activations(
            *model, [&] { model->forward(ids); }, points_named({v.point}));
        const Array& a = c.at(v.point);
        for (std::size_t b = 0; b < a.shape()[0]; ++b) {
          for (std::size_t t = last_only ? a.shape()[1] - 1 : 0; t < a.shape()[1]; ++t, ++count) {
            for (std::size_t k = 0; k < kC; ++k) sum[k] += a(b, t, k);
          }
        }
      }
      for (double& s : sum) s /= count;
      return sum;
    };
    const std::vector<double> plus = mean(positive), minus = mean(negative);
    for (std::size_t c = 0; c < kC; ++c) REQUIRE(v.vector(c) == Approx(plus[c] - minus[c]).margin(1e-6));
  }
}

TEST_CASE("a steering vector's file keeps the vector bit for bit, its point and its scale") {
  const auto dir = std::filesystem::temp_directory_path() / "xgrad_test_steering";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "v.safetensors").string();
  SteeringVector v = some_vector("blocks.0.stream_out", 11);
  v.scale = 0.1f;
  save_steering_vector(path, v);
  const SteeringVector back = load_steering_vector(path);
  REQUIRE(back.point == v.point);
  REQUIRE(back.scale == v.scale);
  REQUIRE(std::memcmp(back.vector.data(), v.vector.data(), kC * sizeof(float)) == 0);

  // Not a steering vector's file: refused, naming it.
  const std::string other = (dir / "other.safetensors").string();
  save_safetensors(other, {{"weights", v.vector}});
  REQUIRE_THROWS_WITH(load_steering_vector(other), Contains("is not a steering vector"));
  save_safetensors(other, {{"vector", v.vector}}, {{"xgrad.steering.point", "x"}, {"xgrad.steering.scale", "big"}});
  REQUIRE_THROWS_WITH(load_steering_vector(other), Contains("has scale 'big', not a number"));
  // A save that fails leaves the earlier file as it was.
  SteeringVector bad = v;
  bad.vector(3) = std::nanf("");
  REQUIRE_THROWS_WITH(save_steering_vector(path, bad), Contains("holds nan at 3"));
  REQUIRE(load_steering_vector(path).scale == v.scale);
  REQUIRE_THROWS_AS(save_steering_vector((dir / "no_such_folder" / "v.safetensors").string(), v), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("steering refuses a vector that does not fit, a point the model lacks and empty prompt sets", "[gemm]") {
  auto model = make_model(12);
  const IndexArray ids = random_ids(13);
  SteeringVector v = some_vector("blocks.0.stream_out", 14);
  v.vector = Array::from_shape({kC + 1});
  v.vector.fill(1.f);
  {
    const Steering steer(*model, v);
    REQUIRE_THROWS_WITH(model->forward(ids), Contains("Steering: point 'blocks.0.stream_out' holds (2, 6, 16), whose "
                                                      "last axis is not the vector's 17"));
  }
  v = some_vector("blocks.0.stream_out", 14);
  v.vector(0) = INFINITY;
  REQUIRE_THROWS_WITH(Steering(*model, v), Contains("holds inf at 0"));
  v = some_vector("blocks.0.stream_outt", 14);
  REQUIRE_THROWS_WITH(Steering(*model, v),
                      Contains("no hook point 'blocks.0.stream_outt'") && Contains("blocks.0.stream_out"));
  v = some_vector("blocks.0.stream_out", 14);
  v.scale = NAN;
  REQUIRE_THROWS_WITH(Steering(*model, v), Contains("scale nan is not finite"));
  v.scale = 1.f;
  v.point = "blocks.0.attn.pattern";  // (B, H, T, S): its last axis is keys, not the vector's
  {
    const Steering steer(*model, some_vector("blocks.0.attn.pattern", 1), 2);
    REQUIRE_THROWS_WITH(model->forward(ids), Contains("whose last axis is not the vector's"));
  }
  REQUIRE(model->num_hooks() == 0);
  REQUIRE_THROWS_WITH(mean_difference_vector(*model, "blocks.0.stream_out", {}, {ids}),
                      Contains("no positive prompts"));
  REQUIRE_THROWS_WITH(mean_difference_vector(*model, "blocks.0.stream_out", {ids}, {}),
                      Contains("no negative prompts"));
  REQUIRE_THROWS_WITH(mean_difference_vector(*model, "blocks.0.attn.pattern", {ids}, {ids}), Contains("not (B, T, C)"));
}

TEST_CASE("a point name of megabytes costs a bounded comparison and a short message", "[gemm]") {
  auto model = make_model(15);
  const std::vector<std::string> points = model->hook_points();
  // near_names reads the first kNearNameBytes (200) of a name: what follows them changes nothing,
  // so each comparison costs at most 200^2 steps whatever the name's length.
  const std::string junk(200, 'x');
  REQUIRE(near_names(junk + "blocks.0.attn.pattern", points) == near_names(junk, points));
  REQUIRE(near_names(junk + std::string(5000, 'y'), points) == near_names(junk, points));
  REQUIRE(near_names("blocks.0.atn.pattern", points).front() == "blocks.0.attn.pattern");

  const auto dir = std::filesystem::temp_directory_path() / "xgrad_test_steering_long";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "v.safetensors").string();
  SteeringVector v = some_vector("blocks.0.stream_out", 16);
  v.point += std::string(2000000 - v.point.size(), 'z');
  save_steering_vector(path, v);
  v = load_steering_vector(path);
  REQUIRE(v.point.size() == 2000000);
  const std::string message = error_of([&] { Steering steer(*model, v); });
  std::filesystem::remove_all(dir);
  CHECK_THAT(message, Contains("Steering: no hook point 'blocks.0.stream_outzzz") && Contains("...' (2000000 bytes)") &&
                          Contains("near names: blocks.0.stream_out"));
  CHECK(message.size() < 1000);
  v.vector(1) = NAN;
  const std::string nan_message = error_of([&] { Steering steer(*model, v); });
  CHECK_THAT(nan_message, Contains("Steering: the vector for 'blocks.0.stream_outzzz") &&
                              Contains("...' (2000000 bytes) holds nan at 1"));
  CHECK(nan_message.size() < 1000);
}

TEST_CASE("a scale that float32 cannot hold is refused, naming the file, the field and the value") {
  const auto dir = std::filesystem::temp_directory_path() / "xgrad_test_steering_scale";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "v.safetensors").string();
  const Array vector = some_vector("x", 17).vector;
  const auto load_with_scale = [&](const std::string& scale) {
    save_safetensors(path, {{"vector", vector}}, {{"xgrad.steering.point", "x"}, {"xgrad.steering.scale", scale}});
    return load_steering_vector(path);
  };
  const std::string field = "load_steering_vector: '" + path + "': xgrad.steering.scale ";
  REQUIRE_THROWS_WITH(load_with_scale("1e-50"), Contains(field + "'1e-50' does not fit a float32 (it would be 0)"));
  REQUIRE_THROWS_WITH(load_with_scale("-1e-40"), Contains("'-1e-40' does not fit a float32 (it would be -9.99995e-41, "
                                                          "a subnormal)"));
  REQUIRE_THROWS_WITH(load_with_scale("1e39"), Contains(field + "'1e39' does not fit a float32 (it would be inf)"));
  REQUIRE_THROWS_WITH(load_with_scale("nan"), Contains(field + "'nan' does not fit a float32 (it would be nan)"));
  const std::string long_scale = error_of([&] { load_with_scale(std::string(100000, '1')); });
  CHECK_THAT(long_scale, Contains("(it would be inf)") && Contains("(100000 bytes)"));
  CHECK(long_scale.size() < 1000);
  CHECK(load_with_scale("0").scale == 0.f);
  CHECK(load_with_scale("-2.5e-30").scale == -2.5e-30f);
  CHECK(load_with_scale("1.17549435e-38").scale == std::numeric_limits<float>::min());
  // What save_steering_vector writes, load_steering_vector reads: a subnormal scale is refused on save.
  SteeringVector tiny{"x", vector, 1e-40f};
  REQUIRE_THROWS_WITH(save_steering_vector(path, tiny),
                      Contains("save_steering_vector: scale 9.99995e-41 is subnormal"));
  tiny.scale = std::numeric_limits<float>::min();
  save_steering_vector(path, tiny);
  CHECK(load_steering_vector(path).scale == tiny.scale);
  std::filesystem::remove_all(dir);
}
