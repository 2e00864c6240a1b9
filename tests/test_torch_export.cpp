// Agreement of tools/xgrad_to_torch.py with xgrad: LanguageModel checkpoints that xgrad wrote
// (tests/fixtures/xgrad_lm_llama.safetensors and xgrad_lm_gpt2_style.safetensors, format 2 with
// every model option stored; xgrad_lm_pre.safetensors and xgrad_lm_post.safetensors, format 2
// from before the architecture options existed, and xgrad_lm_format1.safetensors, written before
// checkpoints stored options or marked their format, all three kept as they were) and the logits
// PyTorch computed from them through the tool (tests/fixtures/torch_export.json, written by
// make_export_fixtures.py); and the tool's Hugging Face directory of the Llama checkpoint
// (tests/fixtures/xgrad_lm_llama_hf/), read back. No Python here.
// To regenerate: run this test with XGRAD_WRITE_FIXTURES=1 (it rewrites the llama and gpt2_style
// checkpoints, deterministically), then /usr/bin/python3 tests/fixtures/make_export_fixtures.py.
// Shapes: B batch, T length, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // max |xgrad - torch| / max |torch|

enum class Preset { classic, llama, gpt2 };

struct Case {
  const char* name;  // the case in torch_export.json
  const char* file;  // the checkpoint in tests/fixtures
  Preset preset;     // classic: the fields below; llama, gpt2: LanguageModelOptions::llama_style, ::gpt2_style
  nn::Norm norm;
  nn::Positional positional;
  nn::Activation activation;
  const char* activation_name;  // as the tool spells it
  float eps;
  std::size_t heads;
  bool writes;          // false: not written by this test (the files of earlier xgrads, or an earlier case's)
  bool stored_options;  // format 2: the tool reads the options from the file, given no arguments
  bool optimizer;       // the file holds an optimizer's state ("optimizer:*", in format 1 "optimizer.*")
};

// The format-1 file holds the Pre-Norm weights of an earlier xgrad; its second case runs them
// with the other GELU and a larger eps, so that the tool's activation and eps arguments are
// checked too. The format-2 Post-Norm file has eps 1e-3, which the tool must read from it. The
// Llama file has 4 query heads on 2 key/value heads, eps 1e-6 and RoPE theta 500000.
const Case kCases[] = {
    {"pre", "xgrad_lm_pre.safetensors", Preset::classic, nn::Norm::pre, nn::Positional::learned, nn::Activation::gelu,
     "gelu", 1e-5f, 2, false, true, true},
    {"post", "xgrad_lm_post.safetensors", Preset::classic, nn::Norm::post, nn::Positional::sinusoidal,
     nn::Activation::relu, "relu", 1e-3f, 2, false, true, false},
    {"format1", "xgrad_lm_format1.safetensors", Preset::classic, nn::Norm::pre, nn::Positional::learned,
     nn::Activation::gelu, "gelu", 1e-5f, 2, false, false, true},
    {"format1_gelu_tanh", "xgrad_lm_format1.safetensors", Preset::classic, nn::Norm::pre, nn::Positional::learned,
     nn::Activation::gelu_tanh, "gelu_tanh", 1e-3f, 2, false, false, true},
    {"llama", "xgrad_lm_llama.safetensors", Preset::llama, nn::Norm::pre, nn::Positional::rotary,
     nn::Activation::swiglu, "swiglu", 1e-6f, 4, true, true, false},
    {"gpt2_style", "xgrad_lm_gpt2_style.safetensors", Preset::gpt2, nn::Norm::pre, nn::Positional::learned,
     nn::Activation::gelu_tanh, "gelu_tanh", 1e-5f, 2, true, true, false},
};
constexpr std::size_t kVocab = 11, kDModel = 8, kLayers = 2, kMaxLen = 8;
constexpr std::size_t kLlamaDModel = 16, kLlamaKvHeads = 2, kLlamaDFF = 24;
constexpr float kLlamaTheta = 500000.f;

nn::LanguageModelOptions options(const Case& c, std::size_t heads = 0) {
  heads = heads ? heads : c.heads;
  if (c.preset == Preset::llama) {
    return nn::LanguageModelOptions::llama_style(kVocab, kLlamaDModel, heads, kLayers, kLlamaKvHeads)
        .max_len(kMaxLen)
        .dropout(0.f)
        .d_ff(kLlamaDFF)
        .norm_eps(c.eps)
        .rope_theta(kLlamaTheta);
  }
  if (c.preset == Preset::gpt2) {
    return nn::LanguageModelOptions::gpt2_style(kVocab, kDModel, heads, kLayers).max_len(kMaxLen).dropout(0.f);
  }
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

// Seeded weights, norms moved away from 1 and 0 (the files from earlier xgrads, kept as they
// were, carry optimizer state too).
void write_checkpoint(const Case& c, std::uint64_t seed) {
  Generator gen(seed);
  nn::LanguageModel model(options(c), gen);
  for (auto& [name, p] : model.named_parameters()) {
    if (!is_norm(name)) continue;
    const bool weight = ends_with(name, ".weight");
    p.mutable_value() = gen.normal(p.shape(), weight ? 1.f : 0.f, weight ? 0.3f : 0.2f);
  }
  weights::save_checkpoint(testing::fixture_path(c.file), model, {}, {{"written_by", "tests/test_torch_export.cpp"}});
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
          "[torch][export][gemm]") {
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
      CHECK(f.at("num_heads").get<std::size_t>() == c.heads);
      CHECK(f.at("activation").get<std::string>() == c.activation_name);
      CHECK(f.at("norm_eps").get<double>() == Approx(c.eps));
      // The tool got no arguments for a format-2 file, and all three for a format-1 file.
      CHECK(f.at("tool_arguments").size() == (c.stored_options ? 0u : 3u));

      nn::LanguageModel model(options(c));
      const weights::Checkpoint ckpt = weights::load_checkpoint(testing::fixture_path(c.file), model);
      CHECK(ckpt.optimizer_state.empty() == !c.optimizer);
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
        weights::LoadedLanguageModel loaded = weights::load_language_model(testing::fixture_path(c.file));
        CHECK(weights::architecture_differences(loaded.model->options(), options(c)).empty());
        loaded.model->eval();
        CHECK(testing::rel_error(logits_of(*loaded.model, f), want) <= kTol);
      }
    }
  }
}

TEST_CASE("torch export: the comparison fails for the wrong options", "[torch][export][gemm]") {
  const Case& pre = kCases[0];
  const Case& post = kCases[1];
  const Case& format1 = kCases[2];
  const json& f = fixture().at("cases").at(pre.name);
  const Array want = testing::to_array(f.at("logits"));
  const json& f1 = fixture().at("cases").at(format1.name);
  const Array want1 = testing::to_array(f1.at("logits"));

  SECTION("a file with stored options refuses a model of other options, naming each field") {
    nn::LanguageModel as_post(options(pre).norm(nn::Norm::post));
    CHECK_THROWS_WITH(weights::load_checkpoint(testing::fixture_path(pre.file), as_post),
                      Catch::Contains("xgrad_lm_pre.safetensors") &&
                          Catch::Contains("norm \"pre\" in the file, \"post\" in the model"));
    nn::LanguageModel four_heads(options(pre, 4).activation(nn::Activation::relu));
    CHECK_THROWS_WITH(weights::load_checkpoint(testing::fixture_path(pre.file), four_heads),
                      Catch::Contains("num_heads 2 in the file, 4 in the model") &&
                          Catch::Contains("activation \"gelu\" in the file, \"relu\" in the model"));
    CHECK_THROWS_WITH(weights::load_language_model(testing::fixture_path(post.file), options(post, 4).norm_eps(1e-5f)),
                      Catch::Contains("load_language_model") && Catch::Contains("num_heads 2 in the file, 4 asked") &&
                          Catch::Contains("norm_eps"));
  }
  SECTION("the wrong placement is an error for a format-1 file too: final_norm is unexpected") {
    nn::LanguageModel as_post(options(format1).norm(nn::Norm::post));
    CHECK_THROWS_WITH(weights::load_checkpoint(testing::fixture_path(format1.file), as_post),
                      Catch::Contains("final_norm"));
  }
  SECTION("the wrong placement disagrees once final_norm is dropped") {
    nn::LanguageModel as_post(options(pre).norm(nn::Norm::post));
    NamedArrays state;
    for (auto& [name, a] : load_safetensors(testing::fixture_path(pre.file)).tensors) {
      if (name.rfind("final_norm.", 0) != 0 && name.rfind("optimizer:", 0) != 0) state.emplace_back(name, a);
    }
    weights::load_state_dict(as_post, state);
    as_post.eval();
    CHECK(testing::rel_error(logits_of(as_post, f), want) > 1e-2);
  }
  SECTION("a format-1 file cannot tell: other head counts and activations load but disagree") {
    nn::LanguageModel four_heads(options(format1, 4));
    weights::load_checkpoint(testing::fixture_path(format1.file), four_heads);
    four_heads.eval();
    CHECK(testing::rel_error(logits_of(four_heads, f1), want1) > 1e-3);
    nn::LanguageModel relu(options(format1).activation(nn::Activation::relu));
    weights::load_checkpoint(testing::fixture_path(format1.file), relu);
    relu.eval();
    CHECK(testing::rel_error(logits_of(relu, f1), want1) > 1e-3);
    CHECK_THROWS_WITH(weights::load_language_model(testing::fixture_path(format1.file)),
                      Catch::Contains("stores no model options"));
  }
}

namespace {

// LlamaForCausalLM's name of an xgrad parameter of a Llama-style model.
std::string llama_name(const std::string& name) {
  if (name == "tok_emb.weight") return "model.embed_tokens.weight";
  if (name == "final_norm.weight") return "model.norm.weight";
  if (name == "head.weight") return "lm_head.weight";
  static const std::map<std::string, std::string> parts = {
      {"attn.norm.weight", "input_layernorm.weight"}, {"ffn.norm.weight", "post_attention_layernorm.weight"},
      {"attn.w_q.weight", "self_attn.q_proj.weight"}, {"attn.w_k.weight", "self_attn.k_proj.weight"},
      {"attn.w_v.weight", "self_attn.v_proj.weight"}, {"attn.w_o.weight", "self_attn.o_proj.weight"},
      {"ffn.gate.weight", "mlp.gate_proj.weight"},    {"ffn.linear1.weight", "mlp.up_proj.weight"},
      {"ffn.linear2.weight", "mlp.down_proj.weight"}};
  const std::string prefix = "blocks.";
  REQUIRE(name.rfind(prefix, 0) == 0);
  const std::size_t dot = name.find('.', prefix.size());
  const auto it = parts.find(name.substr(dot + 1));
  INFO(name << " has no Llama name");
  REQUIRE(it != parts.end());
  return "model.layers." + name.substr(prefix.size(), dot - prefix.size()) + "." + it->second;
}

}  // namespace

TEST_CASE("torch export: --hf-out wrote the Llama checkpoint as a Hugging Face LlamaForCausalLM directory",
          "[torch][export]") {
  const Case& llama = kCases[4];
  REQUIRE(std::string(llama.name) == "llama");
  REQUIRE(fixture().at("cases").at(llama.name).at("hf_dir").get<std::string>() == "xgrad_lm_llama_hf");
  const std::string dir = testing::fixture_path("xgrad_lm_llama_hf");
  std::ifstream in(dir + "/config.json");
  REQUIRE(in);
  const json config = json::parse(in);
  weights::LoadedLanguageModel loaded = weights::load_language_model(testing::fixture_path(llama.file));
  const nn::LanguageModelOptions& o = loaded.model->options();
  CHECK(weights::architecture_differences(o, options(llama)).empty());

  SECTION("config.json") {
    CHECK(config.at("architectures") == json::array({"LlamaForCausalLM"}));
    CHECK(config.at("model_type") == "llama");
    CHECK(config.at("hidden_act") == "silu");
    CHECK(config.at("vocab_size").get<std::size_t>() == o.vocab_size());
    CHECK(config.at("hidden_size").get<std::size_t>() == o.d_model());
    CHECK(config.at("intermediate_size").get<std::size_t>() == o.d_ff());
    CHECK(config.at("num_hidden_layers").get<std::size_t>() == o.num_layers());
    CHECK(config.at("num_attention_heads").get<std::size_t>() == o.num_heads());
    CHECK(config.at("num_key_value_heads").get<std::size_t>() == kLlamaKvHeads);
    CHECK(config.at("head_dim").get<std::size_t>() == o.d_model() / o.num_heads());
    CHECK(config.at("max_position_embeddings").get<std::size_t>() == o.max_len());
    // The shortest decimals of xgrad's float32 values.
    CHECK(config.at("rms_norm_eps").get<double>() == 1e-6);
    CHECK(static_cast<float>(config.at("rms_norm_eps").get<double>()) == o.norm_eps());
    CHECK(config.at("rope_theta").get<double>() == 500000.0);
    CHECK(static_cast<float>(config.at("rope_theta").get<double>()) == o.rope_theta());
    CHECK(config.at("tie_word_embeddings") == false);
    CHECK(config.at("attention_bias") == false);
    CHECK(config.at("mlp_bias") == false);
  }
  SECTION("model.safetensors: every parameter under its Llama name, unchanged") {
    const SafetensorsContents hf = load_safetensors(dir + "/model.safetensors");
    CHECK(hf.metadata == Metadata{{"format", "pt"}});
    std::map<std::string, Array> by_name(hf.tensors.begin(), hf.tensors.end());
    const auto params = loaded.model->named_parameters();
    CHECK(by_name.size() == params.size());
    for (const auto& [name, p] : params) {
      const std::string hf_name = llama_name(name);
      INFO(name << " as " << hf_name);
      REQUIRE(by_name.count(hf_name) == 1);
      CHECK(testing::rel_error(by_name.at(hf_name), p.value()) == 0.0);
    }
    // Two names spelled out, so that the mapping above is not only checked against itself.
    CHECK(by_name.count("model.layers.1.self_attn.k_proj.weight") == 1);
    CHECK(by_name.at("model.layers.1.self_attn.k_proj.weight").shape() ==
          Shape{kLlamaKvHeads * kLlamaDModel / llama.heads, kLlamaDModel});
    CHECK(by_name.count("lm_head.weight") == 1);
  }
}
