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

#include "agreement.hpp"
#include "fixture.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

using namespace testing;

const json& fixture() {
  static const json j = testing::load_fixture("nn_modules.json");
  return j;
}

const json& cases() { return fixture().at("cases"); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

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
  nn::MultiHeadAttention m(
      nn::MultiHeadAttentionOptions(c.at("d_model").get<std::size_t>(), c.at("num_heads").get<std::size_t>())
          .dropout(0.f)
          .norm(norm_of(c)));
  run_layer_case(name, c, m);
}

void run_block_case(const std::string& name, const json& c) {
  nn::TransformerBlock m(
      nn::TransformerBlockOptions(c.at("d_model").get<std::size_t>(), c.at("num_heads").get<std::size_t>())
          .d_ff(c.at("d_ff").get<std::size_t>())
          .dropout(0.f)
          .norm(norm_of(c)));
  run_layer_case(name, c, m);
}

void run_lm_case(const std::string& name, const json& c) {
  nn::LanguageModel m(lm_options_of(c));
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

}  // namespace

TEST_CASE("nn agreement: the fixture loads and every case has a test", "[torch][nn]") {
  const json& j = fixture();
  REQUIRE(j.contains("cases"));
  const std::set<std::string> expected = {"mha_pre_causal",
                                          "mha_post_causal",
                                          "mha_pre_key_padding",
                                          "mha_post_key_padding",
                                          "mha_none_nomask",
                                          "mha_pre_attn_mask",
                                          "block_pre",
                                          "block_post",
                                          "lm_pre",
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

TEST_CASE("nn agreement: MultiHeadAttention (Pre-Norm, Post-Norm, none, masks)", "[torch][nn][attention][gemm]") {
  run_family(cases(), "mha_", run_mha_case);
}

TEST_CASE("nn agreement: TransformerBlock (Pre-Norm and Post-Norm, causal)", "[torch][nn][transformer][gemm]") {
  run_family(cases(), "block_", run_block_case);
}

TEST_CASE("nn agreement: LanguageModel loss and gradients (Pre-Norm and Post-Norm)", "[torch][nn][transformer][gemm]") {
  run_family(cases(), "lm_", run_lm_case);
}
