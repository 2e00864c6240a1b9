// Agreement with PyTorch for the nn modules on tests/fixtures/nn_modules.json (make_nn_fixtures.py
// writes it): MultiHeadAttention (Pre-/Post-Norm, none; causal, key padding and explicit masks),
// TransformerBlock and LanguageModel, loaded with PyTorch's weights. Forward outputs, attention
// weights, the loss, and the gradients of the input and of every parameter. No Python here.
// Set XGRAD_PRINT_REL_ERRORS=1 to print the measured max relative error of every case.
// Shapes: B batch, T length, S key length, C d_model, H heads, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "xgrad/core/ops.hpp"
#include "xgrad/core/tape.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/checkpoint.hpp"
#include "xgrad/nn/transformer.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // max |got - want| / max |want|, per tensor

const json& fixture() {
  static const json j = testing::load_fixture("nn_modules.json");
  return j;
}

const json& cases() { return fixture().at("cases"); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool verbose() {
  const char* v = std::getenv("XGRAD_PRINT_REL_ERRORS");
  return v && *v && std::string(v) != "0";
}

// The largest relative error seen in one case, and the tensor it came from.
struct Worst {
  double err = 0;
  std::string what = "-";
  void add(double e, const std::string& w) {
    if (e > err || what == "-") {
      err = std::max(err, e);
      what = w;
    }
  }
};

// Compares one tensor; the message names the case and the tensor.
void compare(const std::string& case_name, const std::string& what, const Array& got, const Array& want, Worst& worst) {
  const double err = testing::rel_error(got, want);
  INFO("case " << case_name << ", " << what << ": got shape " << testing::shape_string(got.shape()) << ", want shape "
               << testing::shape_string(want.shape()));
  CAPTURE(err);
  CHECK(err <= kTol);
  worst.add(err, what);
}

void report(const std::string& name, const Worst& worst) {
  if (verbose()) {
    std::cout << std::left << std::setw(24) << name << " max rel_error " << std::scientific << std::setprecision(3)
              << worst.err << "  (" << worst.what << ")\n";
  }
}

nn::Norm norm_of(const json& c) {
  const std::string s = c.at("norm").get<std::string>();
  if (s == "pre") return nn::Norm::pre;
  if (s == "post") return nn::Norm::post;
  if (s == "none") return nn::Norm::none;
  FAIL("unknown norm '" << s << "'");
  return nn::Norm::none;
}

// {"shape", "data": [0/1 ...]} -> boolean mask (true = blocked).
Mask to_mask(const json& j) {
  const IndexArray a = testing::to_index_array(j);
  Mask m = Mask::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) m.data()[i] = a.data()[i] != 0;
  return m;
}

std::set<std::string> keys(const json& obj) {
  std::set<std::string> out;
  for (const auto& [k, v] : obj.items()) out.insert(k);
  return out;
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The fixture's parameter names (and gradient names) must be exactly the module's
// named_parameters(), so a renamed or added parameter shows up here first.
void check_names(const std::string& case_name, const nn::Module& module, const json& c) {
  std::set<std::string> mine;
  for (const auto& [n, p] : module.named_parameters()) mine.insert(n);
  const std::set<std::string> params = keys(c.at("params")), grads = keys(c.at("grads"));
  INFO("case " << case_name << "\n  module:  " << join(mine) << "\n  fixture: " << join(params));
  REQUIRE(params == mine);
  REQUIRE(grads == mine);
}

// Builds the module's state from the fixture and loads it (all or nothing).
void load_params(const std::string& case_name, nn::Module& module, const json& c) {
  check_names(case_name, module, c);
  NamedArrays state;
  for (const auto& [name, v] : c.at("params").items()) state.emplace_back(name, testing::to_array(v));
  nn::load_state_dict(module, state);
  module.eval();  // dropout off (it is 0 as well)
  for (const auto& [name, p] : module.named_parameters()) {
    INFO("case " << case_name << ": parameter '" << name << "' was not loaded");
    REQUIRE(testing::rel_error(p.value(), testing::to_array(c.at("params").at(name))) == 0.0);
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double max_abs(const Array& a) {
  double m = 0;
  for (float v : a) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

// The key projection's bias adds q . b_k to every score of a query row, which softmax ignores:
// its gradient is exactly zero in exact arithmetic, and both frameworks store float32 rounding
// noise (about 1e-8 here) whose relative error against itself means nothing. It is measured
// against the scale of the key weight's gradient instead: max |got - want| / max |dW_k|.
void compare_zero_grad(const std::string& case_name, const std::string& name, const Array& got, const json& c,
                       Worst& worst) {
  const std::string weight = name.substr(0, name.size() - std::string("bias").size()) + "weight";
  const Array want = testing::to_array(c.at("grads").at(name));
  const double scale = max_abs(testing::to_array(c.at("grads").at(weight)));
  const double err = got.shape() == want.shape() ? max_abs(got - want) / std::max(scale, 1e-30)
                                                 : std::numeric_limits<double>::infinity();
  INFO("case " << case_name << ", grad of '" << name << "' (zero in exact arithmetic) against the scale of the grad of '"
               << weight << "' " << scale << ": max |got| " << max_abs(got) << ", max |want| " << max_abs(want));
  CAPTURE(err);
  CHECK(err <= kTol);
  worst.add(err, "grad of '" + name + "' (vs dW_k scale)");
}

void check_param_grads(const std::string& case_name, const nn::Module& module, const json& c, Worst& worst) {
  for (const auto& [name, p] : module.named_parameters()) {
    {
      INFO("case " << case_name << ": parameter '" << name << "' received no gradient");
      REQUIRE(p.has_grad());
    }
    if (ends_with(name, "w_k.bias")) {
      compare_zero_grad(case_name, name, p.grad(), c, worst);
    } else {
      compare(case_name, "grad of '" + name + "'", p.grad(), testing::to_array(c.at("grads").at(name)), worst);
    }
  }
}

nn::AttentionMask mask_of(const json& c) {
  nn::AttentionMask mask;
  mask.causal = c.at("causal").get<bool>();
  if (c.contains("attn_mask") && !c.at("attn_mask").is_null()) mask.attn_mask = to_mask(c.at("attn_mask"));
  if (c.contains("key_padding_mask") && !c.at("key_padding_mask").is_null()) {
    mask.key_padding_mask = to_mask(c.at("key_padding_mask"));
  }
  return mask;
}

const Tensor& attention_of(const nn::AttentionOutput& out) { return out.weights; }
const Tensor& attention_of(const nn::BlockOutput& out) { return out.attention; }

// Runs forward on the fixture's x, compares output and attention, backpropagates grad_out and
// compares the input's and every parameter's gradient.
template <class M>
void run_layer_case(const std::string& name, const json& c, M& module) {
  load_params(name, module, c);
  Worst worst;
  const Tensor x(testing::to_array(c.at("x")), true);
  const auto out = module.forward(x, mask_of(c));
  const Tensor& y = out.output;
  const Tensor& weights = attention_of(out);
  compare(name, "output", y.value(), testing::to_array(c.at("output")), worst);
  compare(name, "attention weights", weights.value(), testing::to_array(c.at("attention")), worst);

  const Array grad_out = testing::to_array(c.at("grad_out"));
  REQUIRE(y.shape() == grad_out.shape());
  y.backward(grad_out);
  {
    INFO("case " << name << ": the input received no gradient");
    REQUIRE(x.has_grad());
  }
  compare(name, "grad of x", x.grad(), testing::to_array(c.at("grad_x")), worst);
  check_param_grads(name, module, c, worst);
  report(name, worst);
}

void run_mha_case(const std::string& name, const json& c) {
  nn::MultiHeadAttention m(nn::MultiHeadAttentionOptions(c.at("d_model").get<std::size_t>(), c.at("num_heads").get<std::size_t>())
                               .dropout(0.f)
                               .norm(norm_of(c)));
  run_layer_case(name, c, m);
}

void run_block_case(const std::string& name, const json& c) {
  nn::TransformerBlock m(nn::TransformerBlockOptions(c.at("d_model").get<std::size_t>(), c.at("num_heads").get<std::size_t>())
                             .d_ff(c.at("d_ff").get<std::size_t>())
                             .dropout(0.f)
                             .norm(norm_of(c)));
  run_layer_case(name, c, m);
}

void run_lm_case(const std::string& name, const json& c) {
  nn::LanguageModel m(nn::LanguageModelOptions(c.at("vocab_size").get<std::size_t>(), c.at("d_model").get<std::size_t>(),
                                               c.at("num_heads").get<std::size_t>(), c.at("num_layers").get<std::size_t>())
                          .d_ff(c.at("d_ff").get<std::size_t>())
                          .max_len(c.at("max_len").get<std::size_t>())
                          .dropout(0.f)
                          .norm(norm_of(c))
                          .positional(nn::Positional::learned));
  load_params(name, m, c);
  Worst worst;
  const IndexArray ids = testing::to_index_array(c.at("ids"));
  const IndexArray targets = testing::to_index_array(c.at("targets"));
  {
    NoGradGuard no_grad;  // logits and attention only; the loss below records its own forward
    const nn::LanguageModelOutput out = m.forward(ids);
    compare(name, "logits", out.logits.value(), testing::to_array(c.at("logits")), worst);
    const json& attentions = c.at("attentions");
    REQUIRE(out.attentions.size() == attentions.size());
    for (std::size_t i = 0; i < attentions.size(); ++i) {
      compare(name, "attention of block " + std::to_string(i), out.attentions[i].value(),
              testing::to_array(attentions[i]), worst);
    }
  }
  const Tensor loss = m.loss(ids, targets);
  compare(name, "loss", loss.value(), testing::to_array(c.at("loss")), worst);
  loss.backward();
  check_param_grads(name, m, c, worst);
  report(name, worst);
}

// Runs every case whose name starts with prefix (at least one must exist), each in its own
// section.
template <class Run>
void run_family(const std::string& prefix, Run run) {
  int found = 0;
  for (const auto& [name, c] : cases().items()) {
    if (!starts_with(name, prefix)) continue;
    ++found;
    DYNAMIC_SECTION(name) { run(name, c); }
  }
  INFO("no fixture case starts with '" << prefix << "'");
  CHECK(found > 0);
}

}  // namespace

TEST_CASE("nn agreement: the fixture loads and every case has a test", "[torch][nn]") {
  const json& j = fixture();
  REQUIRE(j.contains("cases"));
  const std::set<std::string> expected = {"mha_pre_causal",     "mha_post_causal",      "mha_pre_key_padding",
                                          "mha_post_key_padding", "mha_none_nomask",   "mha_pre_attn_mask",
                                          "block_pre",          "block_post",           "lm_pre",
                                          "lm_post"};
  for (const auto& name : expected) {
    INFO("missing fixture case " << name);
    CHECK(cases().contains(name));
  }
  const char* families[] = {"mha_", "block_", "lm_"};
  for (const auto& [name, c] : cases().items()) {
    const bool covered =
        std::any_of(std::begin(families), std::end(families), [&](const char* f) { return starts_with(name, f); });
    INFO("fixture case " << name << " has no test family");
    CHECK(covered);
  }
}

TEST_CASE("nn agreement: MultiHeadAttention (Pre-Norm, Post-Norm, none, masks)", "[torch][nn][attention]") {
  run_family("mha_", run_mha_case);
}

TEST_CASE("nn agreement: TransformerBlock (Pre-Norm and Post-Norm, causal)", "[torch][nn][transformer]") {
  run_family("block_", run_block_case);
}

TEST_CASE("nn agreement: LanguageModel loss and gradients (Pre-Norm and Post-Norm)", "[torch][nn][transformer]") {
  run_family("lm_", run_lm_case);
}
