// Agreement of tools/xgrad_to_torch.py with xgrad: LanguageModel checkpoints that xgrad wrote
// (tests/fixtures/xgrad_lm_pre.safetensors, xgrad_lm_post.safetensors, format 2 with the model
// options stored; xgrad_lm_format1.safetensors, written before checkpoints stored options or
// marked their format, kept as it was) and the logits PyTorch computed from them through the
// tool (tests/fixtures/torch_export.json, written by make_export_fixtures.py). No Python here.
// To regenerate: run this test with XGRAD_WRITE_FIXTURES=1 (it rewrites the format-2
// checkpoints, deterministically), then /usr/bin/python3 tests/fixtures/make_export_fixtures.py.
// Shapes: B batch, T length, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/checkpoint.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // max |xgrad - torch| / max |torch|

struct Case {
  const char* name;  // the case in torch_export.json
  const char* file;  // the checkpoint in tests/fixtures
  nn::Norm norm;
  nn::Positional positional;
  nn::Activation activation;
  const char* activation_name;  // as the tool spells it
  float eps;
  bool writes;          // false: not written by this test (the format-1 file, or weights of an earlier case)
  bool stored_options;  // format 2: the tool reads the options from the file, given no arguments
};

// The format-1 file holds the Pre-Norm weights of an earlier xgrad; its second case runs them
// with the other GELU and a larger eps, so that the tool's activation and eps arguments are
// checked too. The format-2 Post-Norm file has eps 1e-3, which the tool must read from it.
const Case kCases[] = {
    {"pre", "xgrad_lm_pre.safetensors", nn::Norm::pre, nn::Positional::learned, nn::Activation::gelu, "gelu", 1e-5f,
     true, true},
    {"post", "xgrad_lm_post.safetensors", nn::Norm::post, nn::Positional::sinusoidal, nn::Activation::relu, "relu",
     1e-3f, true, true},
    {"format1", "xgrad_lm_format1.safetensors", nn::Norm::pre, nn::Positional::learned, nn::Activation::gelu, "gelu",
     1e-5f, false, false},
    {"format1_gelu_tanh", "xgrad_lm_format1.safetensors", nn::Norm::pre, nn::Positional::learned,
     nn::Activation::gelu_tanh, "gelu_tanh", 1e-3f, false, false},
};
constexpr std::size_t kVocab = 11, kDModel = 8, kHeads = 2, kLayers = 2, kMaxLen = 8;

nn::LanguageModelOptions options(const Case& c, std::size_t heads = kHeads) {
  return nn::LanguageModelOptions(kVocab, kDModel, heads, kLayers)
      .max_len(kMaxLen)
      .dropout(0.f)
      .norm(c.norm)
      .positional(c.positional)
      .activation(c.activation)
      .norm_eps(c.eps);
}

bool is_norm(const std::string& name) { return name.find("norm.") != std::string::npos; }
bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// Seeded weights, LayerNorms moved away from 1 and 0; the Pre-Norm model also takes one AdamW
// step, so its file carries "optimizer:*" tensors that the tool must skip.
void write_checkpoint(const Case& c, std::uint64_t seed) {
  Generator gen(seed);
  nn::LanguageModel model(options(c), gen);
  for (auto& [name, p] : model.named_parameters()) {
    if (!is_norm(name)) continue;
    const bool weight = ends_with(name, ".weight");
    p.mutable_value() = gen.normal(p.shape(), weight ? 1.f : 0.f, weight ? 0.3f : 0.2f);
  }
  NamedArrays optimizer_state;
  if (c.norm == nn::Norm::pre) {
    optim::AdamW opt(model.named_parameters(), optim::AdamW::defaults(0.01f));
    IndexArray ids = IndexArray::from_shape({2, kMaxLen}), targets = IndexArray::from_shape({2, kMaxLen});
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids.data()[i] = static_cast<std::int64_t>(gen.below(kVocab));
      targets.data()[i] = static_cast<std::int64_t>(gen.below(kVocab));
    }
    model.loss(ids, targets).backward();
    opt.step();
    optimizer_state = opt.state_dict();
  }
  save_checkpoint(testing::fixture_path(c.file), model, optimizer_state,
                  {{"written_by", "tests/test_torch_export.cpp"}});
}

const json& fixture() {
  static const json j = testing::load_fixture("torch_export.json");
  return j;
}

Array logits_of(const nn::LanguageModel& model, const json& c) {
  NoGradGuard no_grad;
  return model.forward(testing::to_index_array(c.at("ids"))).logits.value();
}

}  // namespace

TEST_CASE("torch export: xgrad's checkpoints give PyTorch's logits through tools/xgrad_to_torch.py",
          "[torch][export]") {
  static const bool written = [] {  // once, though Catch runs this body once per section
    const char* write = std::getenv("XGRAD_WRITE_FIXTURES");
    if (!write || std::string(write) != "1") return false;
    std::uint64_t seed = 7;
    for (const Case& c : kCases) {
      if (c.writes) write_checkpoint(c, seed++);
    }
    return true;
  }();
  if (written) WARN("rewrote the checkpoints: now run /usr/bin/python3 tests/fixtures/make_export_fixtures.py");
  for (const Case& c : kCases) {
    DYNAMIC_SECTION(c.name) {
      REQUIRE(fixture().at("cases").contains(c.name));
      const json& f = fixture().at("cases").at(c.name);
      CHECK(f.at("checkpoint").get<std::string>() == c.file);
      CHECK(f.at("stored_options").get<bool>() == c.stored_options);
      CHECK(f.at("num_heads").get<std::size_t>() == kHeads);
      CHECK(f.at("activation").get<std::string>() == c.activation_name);
      CHECK(f.at("layer_norm_eps").get<double>() == Approx(c.eps));
      // The tool got no arguments for a format-2 file, and all three for a format-1 file.
      CHECK(f.at("tool_arguments").size() == (c.stored_options ? 0u : 3u));

      nn::LanguageModel model(options(c));
      const nn::Checkpoint ckpt = nn::load_checkpoint(testing::fixture_path(c.file), model);
      CHECK(ckpt.optimizer_state.empty() == (c.norm == nn::Norm::post));
      CHECK(ckpt.model_options.has_value() == c.stored_options);
      for (const auto& [name, p] : model.named_parameters()) {
        if (!is_norm(name)) continue;
        const float init = ends_with(name, ".weight") ? 1.f : 0.f;
        float moved = 0;
        for (const float v : p.value()) moved = std::max(moved, std::abs(v - init));
        INFO(name << " is still near its initial value " << init);
        CHECK(moved > 0.05f);
      }
      model.eval();
      const Array want = testing::to_array(f.at("logits"));
      REQUIRE(want.dimension() == 3);
      REQUIRE(want.shape()[2] == kVocab);
      const double err = testing::rel_error(logits_of(model, f), want);
      INFO(c.name << ": max relative error " << err);
      CHECK(err <= kTol);
      if (c.stored_options) {
        // The model the file describes, built from the file alone, gives the same logits.
        nn::LoadedLanguageModel loaded = nn::load_language_model(testing::fixture_path(c.file));
        CHECK(nn::architecture_differences(loaded.model->options(), options(c)).empty());
        loaded.model->eval();
        CHECK(testing::rel_error(logits_of(*loaded.model, f), want) <= kTol);
      }
    }
  }
}

TEST_CASE("torch export: the comparison fails for the wrong options", "[torch][export]") {
  const Case& pre = kCases[0];
  const Case& post = kCases[1];
  const Case& format1 = kCases[2];
  const json& f = fixture().at("cases").at(pre.name);
  const Array want = testing::to_array(f.at("logits"));
  const json& f1 = fixture().at("cases").at(format1.name);
  const Array want1 = testing::to_array(f1.at("logits"));

  SECTION("a file with stored options refuses a model of other options, naming each field") {
    nn::LanguageModel as_post(options(pre).norm(nn::Norm::post));
    CHECK_THROWS_WITH(nn::load_checkpoint(testing::fixture_path(pre.file), as_post),
                      Catch::Contains("xgrad_lm_pre.safetensors") &&
                          Catch::Contains("norm \"pre\" in the file, \"post\" in the model"));
    nn::LanguageModel four_heads(options(pre, 4).activation(nn::Activation::relu));
    CHECK_THROWS_WITH(nn::load_checkpoint(testing::fixture_path(pre.file), four_heads),
                      Catch::Contains("num_heads 2 in the file, 4 in the model") &&
                          Catch::Contains("activation \"gelu\" in the file, \"relu\" in the model"));
    CHECK_THROWS_WITH(nn::load_language_model(testing::fixture_path(post.file), options(post, 4).norm_eps(1e-5f)),
                      Catch::Contains("load_language_model") && Catch::Contains("num_heads 2 in the file, 4 asked") &&
                          Catch::Contains("norm_eps"));
  }
  SECTION("the wrong placement is an error for a format-1 file too: final_norm is unexpected") {
    nn::LanguageModel as_post(options(format1).norm(nn::Norm::post));
    CHECK_THROWS_WITH(nn::load_checkpoint(testing::fixture_path(format1.file), as_post), Catch::Contains("final_norm"));
  }
  SECTION("the wrong placement disagrees once final_norm is dropped") {
    nn::LanguageModel as_post(options(pre).norm(nn::Norm::post));
    NamedArrays state;
    for (auto& [name, a] : load_safetensors(testing::fixture_path(pre.file)).tensors) {
      if (name.rfind("final_norm.", 0) != 0 && name.rfind("optimizer:", 0) != 0) state.emplace_back(name, a);
    }
    nn::load_state_dict(as_post, state);
    as_post.eval();
    CHECK(testing::rel_error(logits_of(as_post, f), want) > 1e-2);
  }
  SECTION("a format-1 file cannot tell: other head counts and activations load but disagree") {
    nn::LanguageModel four_heads(options(format1, 4));
    nn::load_checkpoint(testing::fixture_path(format1.file), four_heads);
    four_heads.eval();
    CHECK(testing::rel_error(logits_of(four_heads, f1), want1) > 1e-3);
    nn::LanguageModel relu(options(format1).activation(nn::Activation::relu));
    nn::load_checkpoint(testing::fixture_path(format1.file), relu);
    relu.eval();
    CHECK(testing::rel_error(logits_of(relu, f1), want1) > 1e-3);
    CHECK_THROWS_WITH(nn::load_language_model(testing::fixture_path(format1.file)),
                      Catch::Contains("stores no model options"));
  }
}
