// weights/llama_import against tests/fixtures/llama/ (make_llama_fixtures.py: Hugging Face folders
// of a tiny LlamaForCausalLM and its logits from a float64 torch mirror), and every bad input it
// refuses.
// Shapes: B batch, T length, V vocabulary, C hidden_size, H heads, KV key/value heads, F intermediate.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "safetensors_bytes.hpp"
#include "test_files.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 1e-5;  // max |got - want| / max |want|

std::string folder(const std::string& name) { return testing::fixture_path("llama/" + name); }

const Array& get(const NamedArrays& arrays, const std::string& name) {
  for (const auto& [n, a] : arrays) {
    if (n == name) return a;
  }
  FAIL("no tensor '" << name << "'");
  static const Array none;
  return none;
}

// The fixture's ids (B, T) and the mirror's logits (B, T, V).
std::pair<IndexArray, Array> expected(const std::string& name) {
  const NamedArrays e = load_safetensors(folder(name) + "/expected.safetensors").tensors;
  const Array& ids = get(e, "ids");
  IndexArray out = IndexArray::from_shape(ids.shape());
  for (std::size_t i = 0; i < ids.size(); ++i) out.data()[i] = static_cast<std::int64_t>(ids.data()[i]);
  return {out, get(e, "logits")};
}

// Parameters of a Llama-style LanguageModel, counted from its sizes.
std::size_t llama_parameters(std::size_t V, std::size_t C, std::size_t H, std::size_t KV, std::size_t L, std::size_t F,
                             bool tied, bool bias) {
  const std::size_t D = C / H;
  std::size_t block = 2 * C + H * D * C + 2 * KV * D * C + C * H * D + 3 * F * C;
  if (bias) block += H * D + 2 * KV * D + C + 2 * F + C;
  return V * C + L * block + C + (tied ? 0 : V * C);
}

// A copy of a fixture folder to break.
struct Broken {
  explicit Broken(const std::string& name) : dir("xgrad_llama") {
    for (const auto& e : fs::directory_iterator(folder(name)))
      fs::copy(e.path(), dir.path + "/" + e.path().filename().string());
  }
  std::string path(const std::string& file = "") const { return file.empty() ? dir.path : dir.file(file); }
  json config() const { return json::parse(testing::read_bytes(path("config.json"))); }
  void set_config(const json& j) const { testing::write_bytes(path("config.json"), j.dump(2)); }
  // config.json with one field set (or removed, for a discarded value).
  void edit(const std::string& field, const json& value) const {
    json j = config();
    if (value.is_discarded()) {
      j.erase(field);
    } else {
      j[field] = value;
    }
    set_config(j);
  }
  testing::TempDir dir;
};

const json kRemove = json(json::value_t::discarded);

NamedArrays without(NamedArrays state, const std::string& name) {
  for (auto it = state.begin(); it != state.end(); ++it) {
    if (it->first == name) {
      state.erase(it);
      return state;
    }
  }
  FAIL("no tensor '" << name << "'");
  return state;
}

}  // namespace

TEST_CASE("Llama-layout folders load with the logits of the PyTorch mirror (F32, F16, BF16, tied MQA, sharded)",
          "[llama_import][gemm]") {
  struct Case {
    const char* name;
    std::size_t KV;
    bool tied, bias;
    std::size_t max_len;
    float eps, theta;
  };
  const Case cases[] = {{"untied_f32", 2, false, false, 32, 1e-5f, 500000.f},
                        {"untied_f16", 2, false, false, 32, 1e-5f, 500000.f},
                        {"untied_bf16", 2, false, false, 32, 1e-5f, 500000.f},
                        {"tied_mqa", 1, true, false, 32, 1e-6f, 10000.f},
                        {"sharded", 2, false, true, 8, 1e-5f, 500000.f}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      const std::shared_ptr<nn::LanguageModel> model = weights::load_llama(folder(c.name));
      const nn::LanguageModelOptions& o = model->options();
      CHECK(o.vocab_size() == 19);
      CHECK(o.d_model() == 16);
      CHECK(o.num_heads() == 4);
      CHECK(o.num_kv_heads() == c.KV);
      CHECK(o.num_layers() == 2);
      CHECK(o.d_ff() == 40);
      CHECK(o.max_len() == c.max_len);
      CHECK(o.dropout() == 0.f);
      CHECK(o.norm() == nn::Norm::pre);
      CHECK(o.norm_kind() == nn::NormKind::rms_norm);
      CHECK(o.norm_eps() == c.eps);
      CHECK(o.norm_affine());
      CHECK_FALSE(o.norm_bias());
      CHECK(o.activation() == nn::Activation::swiglu);
      CHECK(o.positional() == nn::Positional::rotary);
      CHECK(o.rope_theta() == c.theta);
      CHECK(o.rotary_dim() == 0);
      CHECK_FALSE(o.qk_norm());
      CHECK(o.qkv_bias() == c.bias);
      CHECK(o.out_bias() == c.bias);
      CHECK(o.ffn_bias() == c.bias);
      CHECK_FALSE(o.head_bias());
      CHECK(o.tie_embeddings() == c.tied);
      CHECK(model->num_parameters() == llama_parameters(19, 16, 4, c.KV, 2, 40, c.tied, c.bias));
      CHECK(weights::to_json(weights::llama_options(folder(c.name))) == weights::to_json(o));

      const auto [ids, want] = expected(c.name);
      NoGradGuard no_grad;
      const Array got = model->forward(ids).logits.value();
      const double err = testing::rel_error(got, want);
      INFO(c.name << ": logits " << testing::shape_string(got.shape()) << ", want "
                  << testing::shape_string(want.shape()));
      CAPTURE(err);
      REQUIRE(err <= kTol);
    }
  }
}

TEST_CASE("Llama import: every Hugging Face tensor lands in its xgrad parameter, bit for bit", "[llama_import]") {
  const NamedArrays file = load_safetensors(folder("untied_f32") + "/model.safetensors").tensors;
  const std::shared_ptr<nn::LanguageModel> model = weights::load_llama(folder("untied_f32"));
  const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn.norm.weight"}, {"self_attn.q_proj.weight", "attn.w_q.weight"},
      {"self_attn.k_proj.weight", "attn.w_k.weight"}, {"self_attn.v_proj.weight", "attn.w_v.weight"},
      {"self_attn.o_proj.weight", "attn.w_o.weight"}, {"post_attention_layernorm.weight", "ffn.norm.weight"},
      {"mlp.gate_proj.weight", "ffn.gate.weight"},    {"mlp.up_proj.weight", "ffn.linear1.weight"},
      {"mlp.down_proj.weight", "ffn.linear2.weight"}};
  std::map<std::string, std::string> names = {{"model.embed_tokens.weight", "tok_emb.weight"},
                                              {"model.norm.weight", "final_norm.weight"},
                                              {"lm_head.weight", "head.weight"}};
  for (const char* n : {"0", "1"}) {
    for (const auto& [hf, x] : layer)
      names[std::string("model.layers.") + n + "." + hf] = std::string("blocks.") + n + "." + x;
  }
  REQUIRE(names.size() == file.size());
  REQUIRE(model->named_parameters().size() == file.size());
  for (const auto& [hf, x] : names) {
    INFO(hf << " -> " << x);
    CHECK(model->parameter(x).value() == get(file, hf));
  }
}

TEST_CASE("Llama import: the sharded folder gives the parameters of the same tensors in one file", "[llama_import]") {
  // One model.safetensors holding both shards' tensors loads the same model as the index.
  Broken b("sharded");
  NamedArrays all = load_safetensors(b.path("model-00001-of-00002.safetensors")).tensors;
  for (auto& t : load_safetensors(b.path("model-00002-of-00002.safetensors")).tensors) all.push_back(t);
  save_safetensors(b.path("model.safetensors"), all);
  const auto one = weights::load_llama(b.path());
  const auto sharded = weights::load_llama(folder("sharded"));
  for (const auto& [name, p] : sharded->named_parameters()) {
    INFO(name);
    CHECK(one->parameter(name).value() == p.value());
  }
}

TEST_CASE("Llama import: a tied model's lm_head.weight is accepted only as a copy of the embedding",
          "[llama_import][bad_input]") {
  Broken b("tied_mqa");
  NamedArrays state = load_safetensors(b.path("model.safetensors")).tensors;
  const Array emb = get(state, "model.embed_tokens.weight");
  state.emplace_back("lm_head.weight", emb);
  save_safetensors(b.path("model.safetensors"), state);
  const auto model = weights::load_llama(b.path());
  CHECK(model->parameter("tok_emb.weight").value() == emb);
  CHECK(model->num_parameters() == llama_parameters(19, 16, 4, 1, 2, 40, true, false));

  Array other = emb;
  other.data()[5] += 1.f;
  state.back().second = other;
  save_safetensors(b.path("model.safetensors"), state);
  REQUIRE_THROWS_WITH(
      weights::load_llama(b.path()),
      Contains("load_llama: tie_word_embeddings is true, but 'lm_head.weight' in '" + b.path("model.safetensors") +
               "' differs from 'model.embed_tokens.weight' at flat position 5") &&
          Contains("set tie_word_embeddings false to use lm_head.weight as the head"));

  state.back().second = Array::from_shape({19, 8});
  state.back().second.fill(0.f);
  save_safetensors(b.path("model.safetensors"), state);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), Contains("load_llama: tensor 'lm_head.weight' in '" +
                                                              b.path("model.safetensors") + "' has shape (19, 8)"));
}

TEST_CASE("Llama import: rotary inv_freq buffers of older checkpoints are skipped", "[llama_import]") {
  Broken b("untied_f32");
  NamedArrays state = load_safetensors(b.path("model.safetensors")).tensors;
  Array inv_freq = Array::from_shape({2});
  inv_freq.fill(1.f);
  state.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", inv_freq);
  save_safetensors(b.path("model.safetensors"), state);
  CHECK(weights::load_llama(b.path())->num_parameters() == llama_parameters(19, 16, 4, 2, 2, 40, false, false));
}

TEST_CASE("map_file: F32 weights become parameters over the file, bit for bit the read model's, mapped while it lives",
          "[llama_import][map_file][gemm]") {
  const IndexArray ids = expected("untied_f32").first;
  for (const char* name : {"untied_f32", "tied_mqa", "sharded", "untied_bf16"}) {
    SECTION(name) {
      const bool f32 = std::string(name) != "untied_bf16";
      const std::size_t before = adopted_arrays();
      const auto read = weights::load_llama(folder(name));
      REQUIRE(adopted_arrays() == before);
      auto mapped = weights::load_llama(folder(name), weights::HfLoadOptions().map_file(true));
      // Every tensor of these files is F32 and taken whole (or BF16, and read).
      CHECK(adopted_arrays() == before + (f32 ? mapped->named_parameters().size() : 0));
      for (const auto& [n, p] : read->named_parameters()) {
        INFO(n);
        CHECK(mapped->parameter(n).value() == p.value());
      }
      NoGradGuard no_grad;
      CHECK(mapped->forward(ids).logits.value() == read->forward(ids).logits.value());
      mapped.reset();
      CHECK(adopted_arrays() == before);
    }
  }
}

TEST_CASE(
    "map_file: writing a mapped weight writes the process's own copy, never the file; a file replaced by rename "
    "changes nothing",
    "[llama_import][map_file]") {
  Broken b("untied_f32");
  const std::string file = b.path("model.safetensors"), bytes = testing::read_bytes(file);
  const auto original = weights::load_llama(b.path());
  auto mapped = weights::load_llama(b.path(), weights::HfLoadOptions().map_file(true));
  for (auto& [n, p] : mapped->named_parameters()) p.mutable_value() += 1.f;
  CHECK(testing::read_bytes(file) == bytes);
  const auto again = weights::load_llama(b.path(), weights::HfLoadOptions().map_file(true));
  for (const auto& [n, p] : original->named_parameters()) {
    INFO(n);
    CHECK(again->parameter(n).value() == p.value());
    CHECK(mapped->parameter(n).value() == Array(p.value() + 1.f));
  }
  // save_safetensors renames a new file over the old one: the mapped model keeps the old bytes.
  NamedArrays zeros = load_safetensors(file).tensors;
  for (auto& [n, a] : zeros) a.fill(0.f);
  save_safetensors(file, zeros);
  fs::remove_all(b.path());
  for (const auto& [n, p] : original->named_parameters()) CHECK(again->parameter(n).value() == p.value());
}

TEST_CASE(
    "map_file: a tensor not aligned for float32 is read instead, and a file cut shorter before mapping is an Error",
    "[llama_import][map_file][bad_input]") {
  testing::TempDir dir("xgrad_map");
  // The header's length puts the data at byte 8 + 18: not a multiple of 4.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE((8 + header.size()) % 4 != 0);
  const std::string path = dir.file("odd.safetensors");
  testing::write_bytes(path, testing::u64_le(header.size()) + header + testing::f32_le({1.5f, -2.f}));
  SafetensorsReader odd(path);
  CHECK_FALSE(odd.map_f32(0).has_value());
  REQUIRE_THROWS_WITH(odd.map_f32(1),
                      Contains("SafetensorsReader::map_f32: '" + path + "' has 1 tensors, no tensor 1"));

  const std::string aligned = dir.file("aligned.safetensors");
  Array w = Array::from_shape({3});
  w(0) = 1.f, w(1) = 2.f, w(2) = 3.f;
  save_safetensors(aligned, {{"w", w}, {"v", w * 2.f}});
  const std::size_t before = adopted_arrays();
  {
    SafetensorsReader reader(aligned);
    std::optional<Array> a = reader.map_f32(reader.find("w"));
    REQUIRE(a.has_value());
    CHECK((*a == w));
    CHECK(adopted_arrays() == before + 1);
    const Array copy = *a;  // an ordinary array
    CHECK(adopted_arrays() == before + 1);
    a.reset();
    CHECK(copy == w);
  }
  CHECK(adopted_arrays() == before);

  SafetensorsReader cut(aligned);
  std::filesystem::resize_file(aligned, std::filesystem::file_size(aligned) - 4);
  REQUIRE_THROWS_WITH(cut.map_f32(0), Contains("load_safetensors: '" + aligned + "' holds") &&
                                          Contains("bytes now, fewer than the") &&
                                          Contains("its header promised (it changed since it was opened)"));
}

TEST_CASE("bad input: config.json missing, not JSON, or with a missing, mistyped or out-of-range field",
          "[llama_import][bad_input]") {
  Broken b("untied_f32");
  const std::string cfg = b.path("config.json");
  const std::string at = "load_llama: '" + cfg + "': ";

  fs::remove(cfg);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: cannot open '" + cfg + "': No such file or directory");
  REQUIRE_THROWS_WITH(weights::llama_options(b.path()),
                      "llama_options: cannot open '" + cfg + "': No such file or directory");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path("none")), Contains("load_llama: cannot open '" + b.path("none") +
                                                                    "/config.json': No such file or directory"));

  testing::write_bytes(cfg, "{\"hidden_size\": 16,");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), Contains("load_llama: '" + cfg + "' is not JSON: "));
  testing::write_bytes(cfg, "[16, 4]");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: '" + cfg + "' holds a JSON array, not an object");
  testing::write_bytes(cfg, "{\"rope_theta\": 1e999}");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      Contains("load_llama: '" + cfg + "' is not JSON: ") && Contains("number overflow"));

  fs::copy(folder("untied_f32") + "/config.json", cfg, fs::copy_options::overwrite_existing);
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "rms_norm_eps"}) {
    INFO(field);
    const json saved = b.config();
    b.edit(field, kRemove);
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), at + "missing field \"" + field + "\"");
    REQUIRE_THROWS_WITH(weights::llama_options(b.path()),
                        "llama_options: '" + cfg + "': missing field \"" + field + "\"");
    b.set_config(saved);
  }
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "head_dim"}) {
    INFO(field);
    const json saved = b.config();
    for (const json& bad : {json("16"), json(-16), json(16.5), json(0), json(true), json::array({16})}) {
      b.edit(field, bad);
      REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                          at + "field \"" + field + "\" must be a positive integer, got " + bad.dump());
    }
    b.set_config(saved);
  }
  for (const char* field : {"rms_norm_eps", "rope_theta"}) {
    INFO(field);
    const json saved = b.config();
    b.edit(field, "1e-5");
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), at + "field \"" + field + "\" must be a number, got \"1e-5\"");
    // 1e39 and 1e-50 are finite doubles but infinity and 0 in float32.
    for (const json& bad : {json(0), json(-1e-5), json(1e39), json(1e-50), json(-1e39)}) {
      b.edit(field, bad);
      REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                          at + "field \"" + field + "\" must be finite and > 0 as a float32, got " + bad.dump());
    }
    b.set_config(saved);
  }
  for (const char* field : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    INFO(field);
    const json saved = b.config();
    b.edit(field, 1);
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), at + "field \"" + field + "\" must be true or false, got 1");
    b.set_config(saved);
  }
}

TEST_CASE("bad input: config.json fields that disagree, or that xgrad's model cannot follow",
          "[llama_import][bad_input]") {
  Broken b("untied_f32");
  const std::string cfg = b.path("config.json");
  const std::string at = "load_llama: '" + cfg + "': ";
  const json saved = b.config();
  auto refused = [&](const std::string& field, const json& value, const std::string& message) {
    INFO(field << " = " << value.dump());
    b.set_config(saved);
    b.edit(field, value);
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), at + message);
    REQUIRE_THROWS_WITH(weights::llama_options(b.path()), "llama_options: '" + cfg + "': " + message);
  };
  refused("num_attention_heads", 3, "num_attention_heads 3 does not divide hidden_size 16");
  refused("num_key_value_heads", 3, "num_key_value_heads 3 does not divide num_attention_heads 4");
  refused("num_key_value_heads", 8, "num_key_value_heads 8 does not divide num_attention_heads 4");
  refused("hidden_act", "gelu",
          "field \"hidden_act\" is \"gelu\"; only \"silu\" (the SwiGLU feed-forward) is supported");
  refused("hidden_act", 7, "field \"hidden_act\" must be a string, got 7");
  refused("rope_scaling", json({{"factor", 8.0}, {"rope_type", "llama3"}}),
          "field \"rope_scaling\" of rope_type \"llama3\" lacks \"low_freq_factor\"");
  refused("rope_scaling", json({{"factor", 8.0}, {"rope_type", "yarn"}}),
          "field \"rope_scaling\" has rope_type \"yarn\"; only \"default\", \"linear\", \"dynamic\" and \"llama3\" "
          "scaled rotary embeddings are implemented");
  refused("head_dim", 5, "field \"head_dim\" is 5 is odd; rotary embeddings need it even");
  refused("num_attention_heads", 16,
          "the head width hidden_size / num_attention_heads = 1 is odd; rotary embeddings need it even");

  // Defaults and nulls, as Hugging Face reads them: num_key_value_heads = num_attention_heads,
  // rope_theta 10000, no rope_scaling, head_dim C / H.
  b.set_config(saved);
  b.edit("num_key_value_heads", nullptr);
  b.edit("rope_theta", kRemove);
  b.edit("rope_scaling", kRemove);
  b.edit("head_dim", nullptr);
  b.edit("hidden_act", kRemove);
  const nn::LanguageModelOptions o = weights::llama_options(b.path());
  CHECK(o.head_dim() == 0);
  CHECK(o.num_kv_heads() == 4);
  CHECK(o.rope_theta() == 10000.f);
  CHECK(o.activation() == nn::Activation::swiglu);
  // A head_dim other than C / H: w_q maps C to H D and w_o back (the weights must then be that shape).
  b.edit("head_dim", 8);
  CHECK(weights::llama_options(b.path()).head_dim() == 8);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      Contains("tensor 'model.layers.0.self_attn.q_proj.weight' in '" + b.path("model.safetensors") +
                               "' has shape (16, 16); xgrad's blocks.0.attn.w_q.weight needs (32, 16)"));
}

// Every field that changes the forward pass is read or refused by name: a field no reader looks at
// (Granite's multipliers on Llama's names), a model_type other than llama, sliding windows, RoPE's
// base where transformers 5 writes it.
TEST_CASE("bad input: config.json fields that change the forward pass are read or refused by name",
          "[llama_import][bad_input]") {
  Broken b("untied_f32");
  const std::string cfg = b.path("config.json");
  const std::string at = "load_llama: '" + cfg + "': ";
  const json saved = b.config();
  auto with = [&](const json& fields) {
    json j = saved;
    for (const auto& [key, value] : fields.items()) {
      if (value.is_discarded()) {
        j.erase(key);
      } else {
        j[key] = value;
      }
    }
    b.set_config(j);
  };
  auto refused = [&](const json& fields, const std::string& message) {
    INFO(fields.dump());
    with(fields);
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), at + message);
    REQUIRE_THROWS_WITH(weights::llama_options(b.path()), "llama_options: '" + cfg + "': " + message);
  };
  const std::string families =
      "(this xgrad loads \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"phi3\", \"gpt_neox\", \"gpt2\", "
      "\"gemma2\", \"gemma3_text\")";
  refused({{"model_type", "granite"}}, "model_type \"granite\" is not implemented " + families);
  refused({{"model_type", "mistral"}, {"sliding_window", 4096}},
          "model_type \"mistral\" is not \"llama\"; load_hf_model and hf_model_options read every family");
  refused({{"sliding_window", 4}}, "field \"sliding_window\" is 4; sliding-window attention is not implemented");
  refused({{"attention_dropout", 0.1}},
          "field \"attention_dropout\" is 0.1; dropout on the attention weights is not implemented");
  refused({{"rope_interleaved", true}},
          "field \"rope_interleaved\" is true; rotating interleaved channel pairs is not implemented");
  refused({{"embedding_multiplier", 12.0}, {"logits_scaling", 8.0}},
          "field \"embedding_multiplier\" (12.0) is not implemented; it may change the forward pass, so the folder "
          "is refused");
  refused({{"quantization_config", {{"bits", 4}}}},
          "field \"quantization_config\" ({\"bits\":4}) is not implemented; it may change the forward pass, so the "
          "folder is refused");
  refused({{"rope_theta", kRemove}, {"rope_parameters", {{"rope_type", "longrope"}, {"factor", 8.0}}}},
          "field \"rope_parameters\" has rope_type \"longrope\"; only \"default\", \"linear\", \"dynamic\" and "
          "\"llama3\" scaled rotary embeddings are implemented");
  refused({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000.0}}}},
          "rope_theta 500000 and rope_parameters.rope_theta 1000 differ");
  refused({{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}}},
          "field \"rope_parameters\" has \"partial_rotary_factor\" (0.5), which rope_type \"default\" does not read; "
          "it is not implemented");
  refused({{"rope_parameters", {{"rope_theta", -1}}}},
          "field \"rope_parameters.rope_theta\" must be finite and > 0 as a float32, got -1");
  refused({{"rope_parameters", 5}}, "field \"rope_parameters\" must be an object, got 5");

  // transformers 5 writes RoPE's base only in rope_parameters.
  with({{"rope_theta", kRemove}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}});
  CHECK(weights::llama_options(b.path()).rope_theta() == 500000.f);
  // The fields that change nothing, and the neutral values of the refused ones, load.
  with({{"model_type", kRemove},
        {"sliding_window", nullptr},
        {"rope_interleaved", false},
        {"attention_dropout", 0},
        {"pad_token_id", 0},
        {"_name_or_path", "tiny"},
        {"transformers.js_config", {{"dtype", "q4"}}}});
  CHECK(weights::llama_options(b.path()).rope_theta() == 500000.f);
}

TEST_CASE("bad input: a tensor missing, unexpected, of the wrong shape or not finite names both names and shapes",
          "[llama_import][bad_input]") {
  Broken b("untied_f32");
  const std::string file = b.path("model.safetensors");
  const NamedArrays state = load_safetensors(file).tensors;

  save_safetensors(file, without(state, "model.layers.1.mlp.up_proj.weight"));
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: '" + file +
                                                         "' lacks tensor 'model.layers.1.mlp.up_proj.weight' (40, 16) "
                                                         "(xgrad's blocks.1.ffn.linear1.weight)");
  save_safetensors(file, without(without(state, "lm_head.weight"), "model.norm.weight"));
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: '" + file +
                          "' lacks tensor 'model.norm.weight' (16) (xgrad's final_norm.weight) and 1 more tensors "
                          "the model needs");

  // A layer count far past the file's: the first missing tensor, without a list of every layer's.
  save_safetensors(file, state);
  b.edit("num_hidden_layers", 1000000000000);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: '" + file +
                          "' lacks tensor 'model.layers.2.input_layernorm.weight' (16) (xgrad's "
                          "blocks.2.attn.norm.weight); num_hidden_layers 1000000000000 needs 9 tensors per layer, and "
                          "the checkpoint holds 21 tensors in all");
  b.edit("num_hidden_layers", 2);

  NamedArrays extra = state;
  extra.emplace_back("model.layers.2.mlp.up_proj.weight", get(state, "model.layers.1.mlp.up_proj.weight"));
  save_safetensors(file, extra);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: tensor 'model.layers.2.mlp.up_proj.weight' (40, 16) in '" + file +
                          "' is not part of the model config.json describes (no xgrad "
                          "parameter takes it)");
  // A bias when attention_bias is false.
  extra = state;
  Array bias = Array::from_shape({16});
  bias.fill(0.f);
  extra.emplace_back("model.layers.0.self_attn.q_proj.bias", bias);
  save_safetensors(file, extra);
  REQUIRE_THROWS_WITH(
      weights::load_llama(b.path()),
      Contains("tensor 'model.layers.0.self_attn.q_proj.bias' (16) in '" + file + "' is not part of the model"));

  NamedArrays wide = state;
  for (auto& [name, a] : wide) {
    if (name == "model.layers.0.self_attn.k_proj.weight") a = get(state, "model.layers.0.self_attn.q_proj.weight");
  }
  save_safetensors(file, wide);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: tensor 'model.layers.0.self_attn.k_proj.weight' in '" + file +
                          "' has shape (16, 16); xgrad's blocks.0.attn.w_k.weight needs (8, 16)");
  // config.json and the weights of another model: the first tensor whose shape differs.
  b.edit("intermediate_size", 48);
  save_safetensors(file, state);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: tensor 'model.layers.0.mlp.gate_proj.weight' in '" +
                                                         file +
                                                         "' has shape (40, 16); xgrad's blocks.0.ffn.gate.weight "
                                                         "needs (48, 16)");
  b.edit("intermediate_size", 40);

  NamedArrays nan = state;
  for (auto& [name, a] : nan) {
    if (name == "model.layers.1.self_attn.o_proj.weight") a.data()[3] = std::numeric_limits<float>::quiet_NaN();
  }
  save_safetensors(file, nan);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: tensor 'model.layers.1.self_attn.o_proj.weight' in '" + file +
                          "' holds nan (in blocks.1.attn.w_o.weight at flat position 3); refusing non-finite weights");

  fs::remove(file);
  REQUIRE_THROWS_WITH(
      weights::load_llama(b.path()),
      "load_llama: '" + b.path() + "' holds neither model.safetensors nor model.safetensors.index.json");
  testing::write_bytes(b.path("pytorch_model.bin"), "not read");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      Contains("(pytorch_model.bin files are not read: convert them to safetensors)"));
}

TEST_CASE("bad input: an index naming a missing shard, not naming a tensor, or two shards holding one tensor",
          "[llama_import][bad_input]") {
  Broken b("sharded");
  const std::string index = b.path("model.safetensors.index.json");
  const std::string one = b.path("model-00001-of-00002.safetensors"), two = b.path("model-00002-of-00002.safetensors");
  const json saved = json::parse(testing::read_bytes(index));
  auto write_index = [&](const json& j) { testing::write_bytes(index, j.dump(2)); };

  json j = saved;
  j["weight_map"]["lm_head.weight"] = "model-00003-of-00003.safetensors";
  write_index(j);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: '" + index +
                          "' puts tensor 'lm_head.weight' in shard 'model-00003-of-00003.safetensors', but '" +
                          b.path("model-00003-of-00003.safetensors") + "' does not exist");

  j = saved;
  j["weight_map"].erase("model.norm.weight");
  write_index(j);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: shard '" + two + "' holds tensor 'model.norm.weight', which the weight_map of '" +
                          index + "' does not name");

  j = saved;
  j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_index(j);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: '" + index +
                          "' puts tensor 'model.norm.weight' in shard 'model-00001-of-00002.safetensors', but it is "
                          "in '" +
                          two + "'");

  j = saved;
  j["weight_map"]["model.layers.7.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors";
  write_index(j);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: '" + index +
                                                         "' puts tensor 'model.layers.7.mlp.up_proj.weight' in shard "
                                                         "'model-00002-of-00002.safetensors', which does not hold it");

  for (const json& bad : {json("../model-00001-of-00002.safetensors"), json(""), json(3)}) {
    j = saved;
    j["weight_map"]["model.norm.weight"] = bad;
    write_index(j);
    REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: '" + index +
                                                           "': weight_map[\"model.norm.weight\"] must be the name of a "
                                                           "file in '" +
                                                           b.path() + "', got " + bad.dump());
  }
  write_index(json({{"metadata", {{"total_size", 1}}}}));
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), "load_llama: '" + index + "': missing field \"weight_map\"");
  write_index(json({{"weight_map", json::array()}}));
  REQUIRE_THROWS_WITH(
      weights::load_llama(b.path()),
      "load_llama: '" + index + "': field \"weight_map\" must be an object (tensor name -> shard file), got []");
  testing::write_bytes(index, "{\"weight_map\": ");
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()), Contains("load_llama: '" + index + "' is not JSON: "));

  // Both shards hold model.norm.weight.
  write_index(saved);
  NamedArrays first = load_safetensors(one).tensors;
  first.emplace_back("model.norm.weight", get(load_safetensors(two).tensors, "model.norm.weight"));
  save_safetensors(one, first);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: tensor 'model.norm.weight' is in two shards, '" + one + "' and '" + two + "'");

  // A tensor neither shard holds nor the index names: the index lacks it.
  save_safetensors(one, without(first, "model.norm.weight"));
  NamedArrays second = without(load_safetensors(two).tensors, "model.norm.weight");
  save_safetensors(two, second);
  j = saved;
  j["weight_map"].erase("model.norm.weight");
  write_index(j);
  REQUIRE_THROWS_WITH(weights::load_llama(b.path()),
                      "load_llama: '" + index + "' lacks tensor 'model.norm.weight' (16) (xgrad's final_norm.weight)");
}

TEST_CASE("bad input: a model larger than the memory left is refused before it is built", "[llama_import][bad_input]") {
  // V 2^23, C 2^14, 128 heads of 128, 1 layer, F 16, tied: about 516 GiB as float32. The F16 file's
  // header is real and its data a hole (a sparse file), so it takes no disk and no time to write.
  const std::size_t V = std::size_t{1} << 23, C = std::size_t{1} << 14, H = 128, F = 16;
  testing::TempDir dir("xgrad_llama_big");
  json cfg = {{"vocab_size", V},        {"hidden_size", C},           {"num_attention_heads", H},
              {"num_hidden_layers", 1}, {"intermediate_size", F},     {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},   {"tie_word_embeddings", true}};
  testing::write_bytes(dir.file("config.json"), cfg.dump());
  const std::vector<std::pair<std::string, Shape>> tensors = {{"model.embed_tokens.weight", {V, C}},
                                                              {"model.layers.0.input_layernorm.weight", {C}},
                                                              {"model.layers.0.self_attn.q_proj.weight", {C, C}},
                                                              {"model.layers.0.self_attn.k_proj.weight", {C, C}},
                                                              {"model.layers.0.self_attn.v_proj.weight", {C, C}},
                                                              {"model.layers.0.self_attn.o_proj.weight", {C, C}},
                                                              {"model.layers.0.post_attention_layernorm.weight", {C}},
                                                              {"model.layers.0.mlp.gate_proj.weight", {F, C}},
                                                              {"model.layers.0.mlp.up_proj.weight", {F, C}},
                                                              {"model.layers.0.mlp.down_proj.weight", {C, F}},
                                                              {"model.norm.weight", {C}}};
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    std::uint64_t bytes = 2;
    for (const std::size_t d : shape) bytes *= d;
    header[name] = {{"dtype", "F16"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string text = header.dump();
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  const std::string file = dir.file("model.safetensors");
  testing::write_bytes(file, head + text);
  fs::resize_file(file, 8 + text.size() + offset);

  const std::size_t params = llama_parameters(V, C, H, H, 1, F, true, false);
  REQUIRE_THROWS_WITH(weights::load_llama(dir.path),
                      Contains("load_llama: the model in '" + dir.path + "' (" + std::to_string(params) +
                               " float32 parameters in 1 blocks) needs ") &&
                          Contains("GiB, more than the ") && Contains(" this process can still allocate"));
  // The options alone are fine: llama_options reads no weights.
  CHECK(weights::llama_options(dir.path).d_model() == C);
}
