// Agreement of every LanguageModel architecture with PyTorch: checkpoints that
// tests/fixtures/make_arch_fixtures.py wrote (tests/fixtures/arch/<case>.safetensors, through the
// mirror module of tools/xgrad_to_torch.py) are built and loaded by weights::load_language_model,
// and the logits, every block's attention weights, the loss and every parameter's gradient are
// compared with PyTorch's (<case>.expected.safetensors). No Python here.
// Shapes: B batch, T length, H heads, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "agreement.hpp"
#include "fixture.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kOutputTol = 1e-5;  // logits, attention weights, loss: max |xgrad - torch| / max |torch|
constexpr double kGradTol = 1e-4;    // each parameter's gradient, the same measure

// Every case make_arch_fixtures.py writes.
const char* const kCases[] = {
    "classic_pre",  "classic_post", "sinusoidal", "rms_norm",    "no_affine",   "rope",
    "rope_partial", "gqa",          "mqa",        "qk_norm",     "swiglu",      "geglu",
    "tied",         "no_bias",      "llama",      "llama_tied",  "padded_rope", "padded_learned",
    "parallel",     "wide_heads",   "window",     "rope_llama3", "gemma"};

std::string case_path(const std::string& name, const char* suffix) {
  return testing::fixture_path("arch/" + name + suffix);
}

struct Expected {
  std::map<std::string, Array> tensors;
  const Array& at(const std::string& name) const {
    const auto it = tensors.find(name);
    INFO("the expected file has no tensor '" << name << "'");
    REQUIRE(it != tensors.end());
    return it->second;
  }
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

Expected expected_of(const std::string& name) {
  Expected e;
  for (auto& [n, a] : load_safetensors(case_path(name, ".expected.safetensors")).tensors) e.tensors.emplace(n, a);
  return e;
}

// The fixture stores ids, targets and masks as float32 holding whole numbers.
IndexArray to_ids(const Array& a) {
  IndexArray out = IndexArray::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a.data()[i] == std::round(a.data()[i]));
    out.data()[i] = static_cast<std::int64_t>(a.data()[i]);
  }
  return out;
}
Mask to_padding(const Array& a) {
  Mask out = Mask::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = a.data()[i] != 0.f;
  return out;
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

void compare(const std::string& case_name, const std::string& what, const Array& got, const Array& want, double tol,
             testing::Worst& worst) {
  const double err = testing::rel_error(got, want);
  INFO("case " << case_name << ", " << what << ": got shape " << testing::shape_string(got.shape()) << ", want shape "
               << testing::shape_string(want.shape()));
  CAPTURE(err, tol);
  CHECK(err <= tol);
  worst.add(err, what);
}

// The options as stored and as xgrad writes them back: the same fields, numbers equal as float32.
void check_options_round_trip(const std::string& case_name, const nn::LanguageModel& model) {
  const json stored =
      json::parse(load_safetensors(case_path(case_name, ".safetensors")).metadata.at("xgrad.model_options"));
  const json written = json::parse(weights::to_json(model.options()));
  std::set<std::string> stored_fields, written_fields;
  for (const auto& [k, v] : stored.items()) stored_fields.insert(k);
  for (const auto& [k, v] : written.items()) written_fields.insert(k);
  INFO("case " << case_name << ": stored " << stored.dump() << ", to_json " << written.dump());
  REQUIRE(written_fields == stored_fields);
  for (const auto& [k, v] : stored.items()) {
    INFO("field " << k);
    if (v.is_number_float()) {
      CHECK(static_cast<float>(written.at(k).get<double>()) == static_cast<float>(v.get<double>()));
    } else {
      CHECK(written.at(k) == v);
    }
  }
}

// The key projection's bias adds q . b_k to every score of a query row, which softmax ignores,
// unless RoPE rotates it by position or QK-norm mixes it into k: then its gradient is zero in exact
// arithmetic and both frameworks hold float32 noise, measured against the key weight's gradient.
bool key_bias_grad_is_zero(const nn::LanguageModelOptions& o) {
  return o.positional() != nn::Positional::rotary && !o.qk_norm();
}

void run_case(const std::string& name) {
  const Expected want = expected_of(name);
  weights::LoadedLanguageModel loaded = weights::load_language_model(case_path(name, ".safetensors"));
  nn::LanguageModel& model = *loaded.model;
  model.eval();
  check_options_round_trip(name, model);

  // The model's parameters are exactly the checkpoint's tensors and the fixture's gradients.
  std::set<std::string> mine, stored, grads;
  for (const auto& [n, p] : model.named_parameters()) mine.insert(n);
  for (const auto& [n, a] : load_safetensors(case_path(name, ".safetensors")).tensors) stored.insert(n);
  for (const auto& [n, a] : want.tensors) {
    if (n.rfind("grad:", 0) == 0) grads.insert(n.substr(5));
  }
  {
    INFO("case " << name << ": named_parameters() differ from the checkpoint's tensors or the fixture's gradients");
    REQUIRE(mine == stored);
    REQUIRE(mine == grads);
  }

  const IndexArray ids = to_ids(want.at("ids")), targets = to_ids(want.at("targets"));
  const bool padded = want.has("key_padding_mask");
  const Mask padding = padded ? to_padding(want.at("key_padding_mask")) : Mask();
  testing::Worst worst;
  {
    NoGradGuard no_grad;
    const nn::LanguageModelOutput out = padded ? model.forward(ids, padding) : model.forward(ids);
    compare(name, "logits", out.logits.value(), want.at("logits"), kOutputTol, worst);
    std::size_t blocks = 0;
    while (want.has("attention." + std::to_string(blocks))) ++blocks;
    REQUIRE(blocks == model.options().num_layers());
    REQUIRE(out.attentions.size() == blocks);
    for (std::size_t l = 0; l < blocks; ++l) {
      const std::string what = "attention." + std::to_string(l);
      compare(name, what, out.attentions[l].value(), want.at(what), kOutputTol, worst);
    }
  }
  Tensor loss = padded ? model.loss(ids, targets, padding) : model.loss(ids, targets);
  compare(name, "loss", loss.value(), want.at("loss"), kOutputTol, worst);
  loss.backward();
  for (const auto& [n, p] : model.named_parameters()) {
    {
      INFO("case " << name << ": parameter '" << n << "' received no gradient");
      REQUIRE(p.has_grad());
    }
    const Array& g = want.at("grad:" + n);
    if (ends_with(n, "attn.w_k.bias") && key_bias_grad_is_zero(model.options())) {
      const std::string weight = n.substr(0, n.size() - 4) + "weight";
      const double scale = testing::max_abs(want.at("grad:" + weight));
      const double err = p.grad().shape() == g.shape() ? testing::max_abs(p.grad() - g) / std::max(scale, 1e-30)
                                                       : std::numeric_limits<double>::infinity();
      INFO("case " << name << ", grad of '" << n << "' (zero in exact arithmetic) against the scale " << scale
                   << " of the grad of '" << weight << "'");
      CAPTURE(err);
      CHECK(err <= kGradTol);
      worst.add(err, "grad of '" + n + "' (vs dW_k scale)");
    } else {
      compare(name, "grad of '" + n + "'", p.grad(), g, kGradTol, worst);
    }
  }
  testing::report(name, worst);
}

// The state of a case's checkpoint, for a model of other options.
NamedArrays state_of(const std::string& name) { return load_safetensors(case_path(name, ".safetensors")).tensors; }

// Logits of `options` holding a case's weights, against the case's logits.
double error_with(const std::string& name, const nn::LanguageModelOptions& options, bool use_padding = true) {
  const Expected want = expected_of(name);
  nn::LanguageModel model(options);
  weights::load_state_dict(model, state_of(name));
  model.eval();
  NoGradGuard no_grad;
  const IndexArray ids = to_ids(want.at("ids"));
  const Array logits = use_padding && want.has("key_padding_mask")
                           ? model.forward(ids, to_padding(want.at("key_padding_mask"))).logits.value()
                           : model.forward(ids).logits.value();
  return testing::rel_error(logits, want.at("logits"));
}

nn::LanguageModelOptions stored_options(const std::string& name) {
  return weights::load_language_model(case_path(name, ".safetensors")).model->options();
}

}  // namespace

TEST_CASE("arch agreement: every architecture gives PyTorch's logits, attention, loss and gradients",
          "[arch][torch][gemm]") {
  // Every case in the folder is run here, so that one the script adds cannot go untested.
  std::set<std::string> listed(std::begin(kCases), std::end(kCases)), found;
  const std::string suffix = ".expected.safetensors";
  for (const auto& entry : std::filesystem::directory_iterator(testing::fixture_path("arch"))) {
    const std::string file = entry.path().filename().string();
    if (ends_with(file, suffix)) found.insert(file.substr(0, file.size() - suffix.size()));
  }
  CHECK(found == listed);
  for (const char* name : kCases) {
    DYNAMIC_SECTION(name) { run_case(name); }
  }
}

TEST_CASE("arch agreement: the fixtures tell the options apart", "[arch][torch][gemm]") {
  // The same weights under options that differ in one field disagree with the fixture's logits,
  // while the stored options agree: a reader that dropped the field would fail above.
  SECTION("rope_theta") {
    const nn::LanguageModelOptions o = stored_options("llama");
    CHECK(error_with("llama", o) <= kOutputTol);
    CHECK(error_with("llama", nn::LanguageModelOptions(o).rope_theta(10000.f)) > 1e-3);
  }
  SECTION("rotary_dim") {
    const nn::LanguageModelOptions o = stored_options("rope_partial");
    CHECK(error_with("rope_partial", nn::LanguageModelOptions(o).rotary_dim(0)) > 1e-3);
  }
  SECTION("norm_eps") {
    const nn::LanguageModelOptions o = stored_options("rms_norm");
    CHECK(error_with("rms_norm", nn::LanguageModelOptions(o).norm_eps(1e-5f)) > 1e-4);
  }
  SECTION("activation") {
    // The tanh GELU moves the logits by about 3e-5 of their largest: more than the tolerance.
    const nn::LanguageModelOptions o = stored_options("geglu");
    CHECK(error_with("geglu", nn::LanguageModelOptions(o).activation(nn::Activation::geglu_tanh)) > 2 * kOutputTol);
  }
  SECTION("the positions of a padded batch count real tokens only") {
    // Without the mask the left-padded row's tokens sit at other positions and see the padding.
    CHECK(error_with("padded_rope", stored_options("padded_rope"), false) > 1e-3);
    CHECK(error_with("padded_learned", stored_options("padded_learned"), false) > 1e-3);
  }
}
