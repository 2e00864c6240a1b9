// Weights from PyTorch: safetensors F16 and BF16 (exact reading, round-to-nearest-even writing),
// and weights/torch_import's layouts against PyTorch's outputs on
// tests/fixtures/import_*.safetensors (make_import_fixtures.py writes them). No Python here.
// Shapes: B batch, T length, S key length, C d_model, H heads, V vocabulary.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "cpu_cost.hpp"
#include "fixture.hpp"
#include "peak_memory.hpp"
#include "run_program.hpp"
#include "safetensors_bytes.hpp"
#include "test_files.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/torch_import.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using xgrad::testing::ScopedEnv;

namespace {

constexpr double kTol = 1e-5;  // max |got - want| / max |want|

const NamedArrays& fixture(const std::string& file) {
  static std::map<std::string, NamedArrays> cache;
  auto it = cache.find(file);
  if (it == cache.end()) it = cache.emplace(file, load_safetensors(testing::fixture_path(file)).tensors).first;
  return it->second;
}

const Array& get(const NamedArrays& arrays, const std::string& name) {
  for (const auto& [n, a] : arrays) {
    if (n == name) return a;
  }
  FAIL("no tensor '" << name << "'");
  static const Array none;
  return none;
}

const Array& output(const std::string& name) { return get(fixture("import_outputs.safetensors"), name); }

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void require_close(const Array& got, const Array& want, const std::string& what) {
  const double err = testing::rel_error(got, want);
  INFO(what << ": got " << testing::shape_string(got.shape()) << ", want " << testing::shape_string(want.shape()));
  CAPTURE(err);
  REQUIRE(err <= kTol);
}

NamedArrays with(NamedArrays state, const std::string& name, const Array* value) {
  for (auto it = state.begin(); it != state.end(); ++it) {
    if (it->first == name) {
      if (value) {
        it->second = *value;
      } else {
        state.erase(it);
      }
      return state;
    }
  }
  state.emplace_back(name, *value);
  return state;
}

// A missing, an extra and a misshapen tensor: each an error naming it (and the shapes).
template <class Import>
void require_checked(const NamedArrays& state, const std::string& name, Import import) {
  REQUIRE_NOTHROW(import(state));
  REQUIRE_THROWS_WITH(import(with(state, name, nullptr)), Contains("missing tensor '" + name + "'"));
  const Array extra = Array::from_shape({2});
  REQUIRE_THROWS_WITH(import(with(state, "extra.weight", &extra)), Contains("unexpected tensor 'extra.weight' (2)"));
  const Array& good = get(state, name);
  Shape bad_shape = good.shape();
  bad_shape.back() += 1;
  Array bad = Array::from_shape(bad_shape);
  bad.fill(0.f);
  REQUIRE_THROWS_WITH(
      import(with(state, name, &bad)),
      Contains("tensor '" + name + "' has shape " + shape_str(bad_shape) + ", expected " + shape_str(good.shape())));
}

}  // namespace

TEST_CASE("every F16 value, and BF16 values, read as float32 exactly", "[import]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const int exp = static_cast<int>((h >> 10) & 0x1f), man = static_cast<int>(h & 0x3ff);
    const float sign = (h & 0x8000) ? -1.f : 1.f;
    const float got = f16_to_f32(static_cast<std::uint16_t>(h));
    INFO("F16 bits 0x" << std::hex << h);
    if (exp == 31 && man != 0) {
      REQUIRE(std::isnan(got));
      REQUIRE((bits_of(got) >> 13 & 0x3ff) == static_cast<std::uint32_t>(man));  // the payload stays
      REQUIRE(std::signbit(got) == (sign < 0));
      continue;
    }
    const double want = exp == 31 ? INFINITY : exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
    REQUIRE(bits_of(got) == bits_of(sign * static_cast<float>(want)));
    if (exp < 31 || man == 0) REQUIRE(f32_to_f16(got) == h);  // and back
  }
  const std::pair<std::uint16_t, float> known[] = {{0x3c00, 1.f},
                                                   {0xc000, -2.f},
                                                   {0x7bff, 65504.f},
                                                   {0x0400, 6.103515625e-05f},
                                                   {0x0001, 5.9604644775390625e-08f},
                                                   {0x03ff, 6.09755516052246094e-05f},
                                                   {0x3555, 0.333251953125f}};
  for (const auto& [h, f] : known) REQUIRE(f16_to_f32(h) == f);
  REQUIRE(std::isinf(f16_to_f32(0xfc00)));
  REQUIRE(bits_of(f16_to_f32(0x8000)) == 0x80000000u);
  for (std::uint32_t b = 0; b < 65536; b += 97) REQUIRE(bits_of(bf16_to_f32(static_cast<std::uint16_t>(b))) == b << 16);
  REQUIRE(bf16_to_f32(0x3f80) == 1.f);
}

TEST_CASE("float32 rounds to F16 and BF16 to nearest, ties to even, as numpy and torch do", "[import]") {
  const Array& values = output("rounding.f32");
  const Array& f16 = output("rounding.f16");    // numpy's astype(float16), read back
  const Array& bf16 = output("rounding.bf16");  // torch's to(bfloat16), read back
  REQUIRE(values.size() > 40);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values.data()[i];
    INFO("value " << v << " (bits 0x" << std::hex << bits_of(v) << ")");
    REQUIRE(bits_of(f16_to_f32(f32_to_f16(v))) == bits_of(f16.data()[i]));
    REQUIRE(bits_of(bf16_to_f32(f32_to_bf16(v))) == bits_of(bf16.data()[i]));
  }
  REQUIRE(f32_to_f16(1.f + 0x1p-11f) == 0x3c00);      // a tie, down to even
  REQUIRE(f32_to_f16(1.f + 3 * 0x1p-11f) == 0x3c02);  // a tie, up to even
  REQUIRE(f32_to_f16(2.5f * 0x1p-24f) == 0x0002);     // a subnormal tie
  REQUIRE(f32_to_f16(0x1p-25f) == 0x0000);            // half the smallest subnormal: to zero
  REQUIRE(f32_to_f16(65520.f) == 0x7c00);             // past the range
  REQUIRE(f32_to_bf16(1.f + 0x1p-8f) == 0x3f80);
  REQUIRE(f32_to_bf16(1.f + 3 * 0x1p-8f) == 0x3f82);
  REQUIRE((f32_to_f16(std::nanf("")) & 0x7fff) > 0x7c00);
  REQUIRE((f32_to_bf16(std::nanf("")) & 0x7fff) > 0x7f80);
}

TEST_CASE("save_safetensors writes F16 and BF16 when asked and refuses values out of range", "[import]") {
  testing::TempDir dir("xgrad_import_dtypes");
  const NamedArrays& gpt2 = fixture("import_gpt2.safetensors");
  const NamedArrays& f16 = fixture("import_gpt2_f16.safetensors");  // numpy's rounding of the same weights
  for (const Dtype dtype : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
    const std::string path = dir.file(std::string(dtype_name(dtype)) + ".safetensors");
    save_safetensors(path, gpt2, {{"k", "v"}}, dtype);
    const std::string bytes = testing::read_bytes(path);
    const std::uint64_t n = testing::read_u64_le(bytes);
    REQUIRE_THAT(bytes.substr(8, n), Contains(std::string("\"dtype\":\"") + dtype_name(dtype) + "\""));
    const SafetensorsContents back = parse_safetensors(bytes);
    REQUIRE(back.metadata.at("k") == "v");
    REQUIRE(back.tensors.size() == gpt2.size());
    for (std::size_t t = 0; t < gpt2.size(); ++t) {
      const auto& [name, a] = gpt2[t];
      const Array& b = get(back.tensors, name);
      REQUIRE(b.shape() == a.shape());
      for (std::size_t i = 0; i < a.size(); ++i) {
        const float v = a.data()[i];
        const float want = dtype == Dtype::f32   ? v
                           : dtype == Dtype::f16 ? f16_to_f32(f32_to_f16(v))
                                                 : bf16_to_f32(f32_to_bf16(v));
        REQUIRE(bits_of(b.data()[i]) == bits_of(want));
        if (dtype == Dtype::f16) REQUIRE(bits_of(b.data()[i]) == bits_of(get(f16, "transformer." + name).data()[i]));
      }
    }
  }
  // F32 stays the default.
  save_safetensors(dir.file("default.safetensors"), gpt2);
  REQUIRE_THAT(testing::read_bytes(dir.file("default.safetensors")), Contains("\"F32\"") && !Contains("\"F16\""));

  Array w = Array::from_shape({3});
  w.data()[0] = 1.f, w.data()[1] = 70000.f, w.data()[2] = 2.f;
  const std::string path = dir.file("range.safetensors");
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"ok", output("mha.x")}, {"w", w}}, {}, Dtype::f16),
                      Contains("save_safetensors") && Contains("'w'") && Contains("70000") &&
                          Contains("flat position 1") && Contains("F16"));
  REQUIRE_FALSE(std::filesystem::exists(path));
  w.data()[1] = 3.4e38f;
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", w}}, {}, Dtype::bf16),
                      Contains("'w'") && Contains("3.4e+38") && Contains("BF16"));
  w.data()[1] = INFINITY;  // an infinity is representable, and stays one
  save_safetensors(path, {{"w", w}}, {}, Dtype::f16);
  REQUIRE(std::isinf(load_safetensors(path).tensors[0].second.data()[1]));
}

TEST_CASE("F16 and BF16 files: other dtypes, odd byte counts and truncated data are errors", "[import]") {
  using testing::u64_le;
  auto file = [](const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; };
  const std::string two = std::string("\x00\x3c\x00\xc0", 4);  // F16 1, -2; BF16 bits 0x3c00, 0xc000
  Array got = parse_safetensors(file(R"({"h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", two))
                  .tensors[0]
                  .second;
  REQUIRE((got.data()[0] == 1.f && got.data()[1] == -2.f));
  got = parse_safetensors(file(R"({"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", two))
            .tensors[0]
            .second;
  REQUIRE((bits_of(got.data()[0]) == 0x3c000000u && bits_of(got.data()[1]) == 0xc0000000u));

  REQUIRE_THROWS_WITH(parse_safetensors(file(R"({"m": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}})", two)),
                      Contains("'m'") && Contains("\"BOOL\"") && Contains("F32, F16 and BF16"));
  REQUIRE_THROWS_WITH(
      parse_safetensors(file(R"({"h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 3]}})", two.substr(0, 3))),
      Contains("'h'") && Contains("F16 needs 4 bytes, its offsets span 3"));
  REQUIRE_THROWS_WITH(parse_safetensors(file(R"({"h": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}})", two)),
                      Contains("outside the 4-byte data"));
  REQUIRE_THROWS_WITH(parse_safetensors(file(
                          R"({"h": {"dtype": "BF16", "shape": [4611686018427387904], "data_offsets": [0, 4]}})", two)),
                      Contains("larger than the file"));
  // Every prefix of a real F16 file: an error, never a crash.
  const std::string real = testing::read_bytes(testing::fixture_path("import_gpt2_f16.safetensors"));
  for (std::size_t n = 0; n < real.size(); n += 7) REQUIRE_THROWS_AS(parse_safetensors(real.substr(0, n)), Error);
}

TEST_CASE("nn.MultiheadAttention's packed weights load into Attention", "[import][gemm]") {
  const auto options = nn::MultiHeadAttentionOptions(8, 2).norm(nn::Norm::none).dropout(0.f);
  const NamedArrays& torch_state = fixture("import_mha.safetensors");
  nn::MultiHeadAttention attn(options);
  weights::load_state_dict(attn, weights::from_torch_multihead_attention(torch_state, options));
  NoGradGuard no_grad;
  const nn::AttentionOutput y = attn.forward(Tensor(output("mha.x")));
  require_close(y.output.value(), output("mha.out"), "mha output");
  require_close(y.weights.value(), output("mha.weights"), "mha weights");
  for (const char* name : {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}) {
    INFO(name);
    require_checked(torch_state, name,
                    [&](const NamedArrays& s) { return weights::from_torch_multihead_attention(s, options); });
  }
}

TEST_CASE("nn.MultiheadAttention with kdim and vdim (separate projections) loads into cross-attention",
          "[import][gemm]") {
  const auto options = nn::MultiHeadAttentionOptions(8, 2).kdim(6).vdim(5).norm(nn::Norm::none).dropout(0.f);
  const NamedArrays& torch_state = fixture("import_mha_kv.safetensors");
  nn::MultiHeadAttention attn(options);
  weights::load_state_dict(attn, weights::from_torch_multihead_attention(torch_state, options));
  NoGradGuard no_grad;
  const nn::AttentionOutput y =
      attn.forward(Tensor(output("mha_kv.query")), Tensor(output("mha_kv.key")), Tensor(output("mha_kv.value")));
  require_close(y.output.value(), output("mha_kv.out"), "mha_kv output");
  require_close(y.weights.value(), output("mha_kv.weights"), "mha_kv weights");
  for (const char* name : {"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"}) {
    INFO(name);
    require_checked(torch_state, name,
                    [&](const NamedArrays& s) { return weights::from_torch_multihead_attention(s, options); });
  }
  // The packed layout where the widths differ is refused, naming what is missing.
  REQUIRE_THROWS_WITH(
      weights::from_torch_multihead_attention(fixture("import_mha.safetensors"), options),
      Contains("missing tensors 'q_proj_weight' (8, 8), 'k_proj_weight' (8, 6), 'v_proj_weight' (8, 5)"));
}

TEST_CASE("nn.TransformerEncoderLayer, Post-Norm (relu) and Pre-Norm (gelu), loads into TransformerBlock",
          "[import][gemm]") {
  for (const bool pre : {false, true}) {
    const std::string name = pre ? "encoder_pre" : "encoder_post";
    INFO(name);
    const auto options = nn::TransformerBlockOptions(8, 2)
                             .d_ff(16)
                             .dropout(0.f)
                             .norm(pre ? nn::Norm::pre : nn::Norm::post)
                             .activation(pre ? nn::Activation::gelu : nn::Activation::relu);
    const NamedArrays& torch_state = fixture("import_" + name + ".safetensors");
    nn::TransformerBlock block(options);
    weights::load_state_dict(block, weights::from_torch_encoder_layer(torch_state, options));
    block.eval();
    NoGradGuard no_grad;
    require_close(block.forward(Tensor(output(name + ".x"))).output.value(), output(name + ".out"), name);
    require_checked(torch_state, "norm2.weight",
                    [&](const NamedArrays& s) { return weights::from_torch_encoder_layer(s, options); });
    require_checked(torch_state, "self_attn.in_proj_weight",
                    [&](const NamedArrays& s) { return weights::from_torch_encoder_layer(s, options); });
  }
}

TEST_CASE("a GPT-2 state dict (F32, and F16 under transformer. with an lm_head) becomes a LanguageModel",
          "[import][gemm]") {
  const Array& ids_f = output("gpt2.ids");
  IndexArray ids = IndexArray::from_shape(ids_f.shape());
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>(ids_f.data()[i]);
  for (const std::string file : {"import_gpt2.safetensors", "import_gpt2_f16.safetensors"}) {
    INFO(file);
    const weights::ImportedLanguageModel imported = weights::from_gpt2(fixture(file), 2);
    const nn::LanguageModelOptions& o = imported.options;
    REQUIRE((o.vocab_size() == 256 && o.d_model() == 8 && o.num_heads() == 2 && o.num_layers() == 2 &&
             o.max_len() == 16 && o.d_ff() == 32));
    REQUIRE((o.norm() == nn::Norm::pre && o.activation() == nn::Activation::gelu_tanh && o.norm_eps() == 1e-5f));
    nn::LanguageModel model(o);
    weights::load_state_dict(model, imported.state);
    model.eval();
    NoGradGuard no_grad;
    const bool f16 = file.find("f16") != std::string::npos;
    require_close(model.forward(ids).logits.value(), output(f16 ? "gpt2_f16.logits" : "gpt2.logits"), file);
  }
  REQUIRE_THROWS_WITH(weights::from_gpt2(fixture("import_gpt2.safetensors"), 3),
                      Contains("from_gpt2: num_heads 3 does not divide d_model 8"));
}

TEST_CASE("GPT-2: missing, extra and misshapen tensors are errors naming them, and the model is unchanged",
          "[import]") {
  const NamedArrays& state = fixture("import_gpt2.safetensors");
  auto import = [](const NamedArrays& s) { return weights::from_gpt2(s, 2); };
  for (const char* name : {"wpe.weight", "h.1.attn.c_attn.weight", "h.0.mlp.c_proj.weight", "ln_f.bias"}) {
    INFO(name);
    require_checked(state, name, import);
  }
  // Under "transformer.", names in messages carry the prefix; the buffers are optional.
  NamedArrays prefixed = fixture("import_gpt2_f16.safetensors");
  require_checked(prefixed, "transformer.h.0.ln_2.bias", import);
  prefixed = with(with(prefixed, "transformer.h.0.attn.bias", nullptr), "transformer.h.1.attn.masked_bias", nullptr);
  REQUIRE_NOTHROW(import(prefixed));
  const Array one = Array::from_shape({1});
  REQUIRE_THROWS_WITH(import(with(prefixed, "h.0.ln_1.weight", &one)), Contains("unexpected tensor 'h.0.ln_1.weight'"));
  REQUIRE_THROWS_WITH(import(with(state, "h.5.attn.bias", &one)), Contains("unexpected tensor 'h.5.attn.bias'"));
  REQUIRE_THROWS_WITH(import(with(state, "h.999999.ln_1.weight", &one)), Contains("missing tensor 'h.2.ln_1.weight'"));
  REQUIRE_THROWS_WITH(import(with(state, "wte.weight", nullptr)), Contains("missing tensor 'wte.weight'"));

  // Loading stops before anything is written.
  nn::LanguageModel model(import(state).options);
  const NamedArrays before = weights::state_dict(model);
  Array wide = Array::from_shape({16, 9});
  REQUIRE_THROWS_AS(weights::load_state_dict(model, import(with(state, "wpe.weight", &wide)).state), Error);
  const NamedArrays after = weights::state_dict(model);
  for (std::size_t i = 0; i < before.size(); ++i) REQUIRE(testing::rel_error(after[i].second, before[i].second) == 0.0);
}

// ---------------------------------------------------------------------------------------------
// load_gpt2: a GPT-2 file read straight into a LanguageModel, tensor by tensor.

namespace {

// A GPT-2 state dict (Hugging Face's names) with random weights: V vocabulary, C d_model, P
// positions, L layers, F FFN width; with the causal-mask buffers of older transformers versions.
NamedArrays gpt2_state(std::size_t V, std::size_t C, std::size_t P, std::size_t L, std::size_t F, std::uint64_t seed) {
  Generator g(seed);
  NamedArrays s;
  auto add = [&](const std::string& name, const Shape& shape) { s.emplace_back(name, g.normal(shape, 0.f, 0.02f)); };
  add("wte.weight", {V, C});
  add("wpe.weight", {P, C});
  for (std::size_t n = 0; n < L; ++n) {
    const std::string h = "h." + std::to_string(n) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      add(h + ln + ".weight", {C});
      add(h + ln + ".bias", {C});
    }
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "mlp.c_fc.weight", {C, F});
    add(h + "mlp.c_fc.bias", {F});
    add(h + "mlp.c_proj.weight", {F, C});
    add(h + "mlp.c_proj.bias", {C});
    s.emplace_back(h + "attn.bias", Array(xt::ones<float>({std::size_t{1}, std::size_t{1}, P, P})));
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return s;
}

std::string self_exe() {
  char self[4096] = {};
  REQUIRE(::readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  return self;
}

long long field(const std::string& out, const std::string& name) {
  const std::size_t at = out.find(name + ": ");
  if (at == std::string::npos) return -1;
  return std::stoll(out.substr(at + name.size() + 2));
}

}  // namespace

TEST_CASE("load_gpt2 reads a GPT-2 file into the model from_gpt2 and load_state_dict build, bit for bit",
          "[import][load_gpt2][gemm]") {
  const Array& ids_f = output("gpt2.ids");
  IndexArray ids = IndexArray::from_shape(ids_f.shape());
  for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>(ids_f.data()[i]);
  for (const std::string file : {"import_gpt2.safetensors", "import_gpt2_f16.safetensors"}) {
    INFO(file);
    const std::string path = testing::fixture_path(file);
    const weights::ImportedLanguageModel imported = weights::from_gpt2(fixture(file), 2);
    nn::LanguageModel want(imported.options);
    weights::load_state_dict(want, imported.state);
    const std::shared_ptr<nn::LanguageModel> got = weights::load_gpt2(path, 2);
    const nn::LanguageModelOptions& o = got->options();
    REQUIRE((o.vocab_size() == 256 && o.d_model() == 8 && o.num_heads() == 2 && o.num_layers() == 2 &&
             o.max_len() == 16 && o.d_ff() == 32 && o.activation() == nn::Activation::gelu_tanh && o.dropout() == 0.f));
    const nn::LanguageModelOptions header_only = weights::gpt2_options(path, 2);
    REQUIRE((header_only.vocab_size() == 256 && header_only.num_layers() == 2 && header_only.d_ff() == 32));
    const NamedTensors a = got->named_parameters(), b = want.named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      REQUIRE(a[i].first == b[i].first);
      REQUIRE(a[i].second.shape() == b[i].second.shape());
      REQUIRE(std::memcmp(a[i].second.value().data(), b[i].second.value().data(), b[i].second.size() * 4) == 0);
    }
    got->eval();
    NoGradGuard no_grad;
    const bool f16 = file.find("f16") != std::string::npos;
    require_close(got->forward(ids).logits.value(), output(f16 ? "gpt2_f16.logits" : "gpt2.logits"), file);
  }
}

TEST_CASE("load_gpt2 refuses what from_gpt2 refuses, and non-finite weights, naming the tensor",
          "[import][load_gpt2][bad_input]") {
  testing::TempDir dir("xgrad_load_gpt2");
  const NamedArrays& state = fixture("import_gpt2.safetensors");
  const std::string short_path = dir.file("short.safetensors");
  save_safetensors(short_path, with(state, "h.1.mlp.c_fc.bias", nullptr));
  REQUIRE_THROWS_WITH(weights::load_gpt2(short_path, 2), "load_gpt2: missing tensor 'h.1.mlp.c_fc.bias' (32)");
  REQUIRE_THROWS_WITH(weights::gpt2_options(short_path, 2), "gpt2_options: missing tensor 'h.1.mlp.c_fc.bias' (32)");
  const std::string path = testing::fixture_path("import_gpt2.safetensors");
  REQUIRE_THROWS_WITH(weights::load_gpt2(path, 3), Contains("load_gpt2: num_heads 3 does not divide d_model 8"));
  Array wide = Array::from_shape({16, 9});
  wide.fill(0.f);
  const std::string wide_path = dir.file("wide.safetensors");
  save_safetensors(wide_path, with(state, "wpe.weight", &wide));
  REQUIRE_THROWS_WITH(weights::load_gpt2(wide_path, 2),
                      "load_gpt2: tensor 'wpe.weight' has shape (16, 9), expected (16, 8)");
  Array bad = get(state, "h.0.attn.c_attn.weight");
  bad(3, 17) = std::numeric_limits<float>::quiet_NaN();  // column 17 of (8, 24): w_v row 1, input 3
  const std::string nan_path = dir.file("nan.safetensors");
  save_safetensors(nan_path, with(state, "h.0.attn.c_attn.weight", &bad));
  REQUIRE_THROWS_WITH(weights::load_gpt2(nan_path, 2),
                      "load_gpt2: tensor 'h.0.attn.c_attn.weight' in '" + nan_path +
                          "' holds nan (in blocks.0.attn.w_v.weight at flat position 11); refusing "
                          "non-finite weights");
  REQUIRE_THROWS_WITH(weights::load_gpt2(dir.file("none.safetensors"), 2), Contains("load_safetensors: cannot open"));
}

// Run by the test below in a process of its own: loads XGRAD_GPT2_FILE with load_gpt2 (mode
// stream) or as train_lm did before load_gpt2 (mode whole: load_safetensors, from_gpt2,
// LanguageModel, load_state_dict), under RLIMIT_AS of XGRAD_GPT2_AS_MIB more than in use when set,
// and prints how far the peak resident size rose.
TEST_CASE("child: import a GPT-2 file and report the peak memory", "[.gpt2_child]") {
  const char* file = std::getenv("XGRAD_GPT2_FILE");
  const char* mode = std::getenv("XGRAD_GPT2_MODE");
  REQUIRE(file != nullptr);
  REQUIRE(mode != nullptr);
  if (const char* extra = std::getenv("XGRAD_GPT2_AS_MIB")) {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    const rlim_t n =
        static_cast<rlim_t>(pages * static_cast<double>(::sysconf(_SC_PAGESIZE))) + (std::stoull(extra) << 20);
    const rlimit rl{n, n};
    REQUIRE(::setrlimit(RLIMIT_AS, &rl) == 0);
  }
  REQUIRE(testing::reset_peak_rss());
  const long baseline = testing::status_kib("VmRSS");
  std::size_t params = 0;
  try {
    if (std::string(mode) == "stream") {
      params = weights::load_gpt2(file, 2)->num_parameters();
    } else {
      const NamedArrays tensors = load_safetensors(file).tensors;
      const weights::ImportedLanguageModel imported = weights::from_gpt2(tensors, 2);
      nn::LanguageModel model(imported.options);
      weights::load_state_dict(model, imported.state);
      params = model.num_parameters();
    }
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
  }
  std::printf("params: %zu\npeak_kib_increase: %ld\nfile_bytes: %lld\n", params, testing::peak_rise_kib(baseline),
              static_cast<long long>(std::filesystem::file_size(file)));
}

TEST_CASE("load_gpt2 peaks near the model's own size and refuses a model that cannot fit before building it",
          "[import][load_gpt2][bad_input][gemm]") {
  testing::TempDir dir("xgrad_load_gpt2");
  const std::string path = dir.file("gpt2.safetensors");
  // V 2048, C 256, P 256, L 4, F 1024: 4.3 M parameters, 17 MB as float32; the file is F16.
  save_safetensors(path, gpt2_state(2048, 256, 256, 4, 1024, 5), {}, Dtype::f16);
  auto run = [&](const std::string& mode, const char* as_mib) {
    const ScopedEnv file("XGRAD_GPT2_FILE", path), how("XGRAD_GPT2_MODE", mode);
    std::optional<ScopedEnv> limit, one_blas_thread;
    if (as_mib) {
      limit.emplace("XGRAD_GPT2_AS_MIB", as_mib);
      // Under a tight RLIMIT_AS, OpenBLAS's own threads retry a failing mmap forever at exit; the
      // child runs without them.
      one_blas_thread.emplace("OPENBLAS_NUM_THREADS", "1");
    }
    const testing::Outcome o = testing::run_program(dir, self_exe(), {"[.gpt2_child]"});
    INFO(o);
    REQUIRE(o.exited);
    REQUIRE(o.code == 0);
    return o.out;
  };
  const std::string stream = run("stream", nullptr);
  INFO(stream);
  const long long params = field(stream, "params");
  const long long V = 2048, C = 256, P = 256, L = 4, F = 1024;
  const long long per_layer = 2 * C + 3 * (C * C + C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  REQUIRE(params == V * C + P * C + L * per_layer + 2 * C + V * C + V);  // tok_emb, pos_emb, blocks, final_norm, head
  const long long model_kib = params * 4 / 1024;
  // The model, plus at most a quarter of it and 8 MiB (the file's header, the reading buffer, allocator slack).
  REQUIRE(field(stream, "peak_kib_increase") > 0);
  REQUIRE(field(stream, "peak_kib_increase") <= model_kib + model_kib / 4 + 8 * 1024);
  // As train_lm read it before: the file, from_gpt2's copies, the model and load_state_dict's copy.
  const std::string whole = run("whole", nullptr);
  INFO(whole);
  REQUIRE(field(whole, "params") == params);
  REQUIRE(field(whole, "peak_kib_increase") > 2 * model_kib);

  // 8 MiB more address space than in use: refused up front, naming the call, the file and both sizes.
  const std::string refused = run("stream", "8");
  REQUIRE_THAT(refused, Contains("error: load_gpt2: the model in '" + path + "' (" + std::to_string(params) +
                                 " float32 parameters in 4 blocks) needs ") &&
                            Contains("MiB, more than the ") &&
                            Contains(" this process can still allocate (RLIMIT_AS of "));
  REQUIRE(field(refused, "params") == 0);
}

TEST_CASE(
    "load_gpt2 of a file of many tiny layers takes time linear in the layers and counts each block's "
    "bookkeeping in its memory check",
    "[import][bad_input][bug][gemm][long]") {
  // Each tensor was matched against every piece of the model (16 L x 12 L string comparisons):
  // 6000 layers of d_model 2 took 10 s; a 100 MB header (120000 layers) would take hours. Four
  // times the layers cost four times the work when the match is linear and sixteen times when it
  // is quadratic: the ratio of the two loads' CPU times tells them apart on a loaded machine too.
  testing::TempDir dir("xgrad_import");
  const std::string path = dir.file("deep.safetensors"), quarter = dir.file("quarter.safetensors");
  const std::size_t L = 6000;
  save_safetensors(path, gpt2_state(2, 2, 1, L, 1, 7));  // num_heads 2, as the child reads it
  save_safetensors(quarter, gpt2_state(2, 2, 1, L / 4, 1, 7));
  std::shared_ptr<nn::LanguageModel> m;
  const double whole_cost = testing::least_cpu_seconds(2, [&] { m = weights::load_gpt2(path, 2); });
  const double quarter_cost = testing::least_cpu_seconds(2, [&] { weights::load_gpt2(quarter, 2); });
  REQUIRE(m->options().num_layers() == L);
  const weights::ImportedLanguageModel ref = weights::from_gpt2(load_safetensors(path).tensors, 2);
  std::map<std::string, const Array*> want;
  for (const auto& [name, a] : ref.state) want[name] = &a;
  const NamedArrays got = weights::state_dict(*m);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, a] : got) REQUIRE(a == *want.at(name));
  INFO(L << " layers: " << whole_cost << " CPU s; " << L / 4 << " layers: " << quarter_cost << " CPU s");
  // Linear matching with the model's n log n bookkeeping and its cache misses measured 6.8 to 7.0
  // alone and 8.04 beside other tests; quadratic would be about 16.
  REQUIRE(whole_cost < 11 * quarter_cost);

  // 6000 blocks hold 96k values but ~200 MB of modules: with 64 MiB of address space to spare the
  // model is refused before it is built (its values alone would fit). AddressSanitizer's allocator
  // ends the process instead of failing an allocation under such a limit: the real allocator only.
  if (testing::kAddressSanitizer) return;
  const ScopedEnv file("XGRAD_GPT2_FILE", path), how("XGRAD_GPT2_MODE", "stream"), limit("XGRAD_GPT2_AS_MIB", "64"),
      one_blas_thread("OPENBLAS_NUM_THREADS", "1");
  const testing::Outcome o = testing::run_program(dir, self_exe(), {"[.gpt2_child]"});
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 0);
  REQUIRE_THAT(o.out, Contains("error: load_gpt2: the model in '" + path + "' (") &&
                          Contains(" float32 parameters in 6000 blocks) needs ") &&
                          Contains(" this process can still allocate (RLIMIT_AS of "));
}
