// Agreement with PyTorch for the gradient-flow measurement of examples/gradient_flow (the
// quantities of gradflow::measure) on tests/fixtures/flow.json (make_flow_fixtures.py writes it):
// per layer, |E[dL/dW2]| of blocks.<l>.ffn.linear2.weight and E|dL/dx| of the residual stream
// entering the block, and the mean loss, for Pre-Norm and Post-Norm language models loaded with
// PyTorch's weights. Uses only the xgrad library (ProbeSet, not the example's code); no Python.
// Set XGRAD_PRINT_REL_ERRORS=1 to print the measured values and relative errors.
// Shapes: B batch, T length, C d_model, F FFN width, L layers.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "flow.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/inspect/probe.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-4;  // |got - want| / |want|, per layer (the values are scalars)

const json& fixture() {
  static const json j = testing::load_fixture("flow.json");
  return j;
}

bool verbose() {
  const char* v = std::getenv("XGRAD_PRINT_REL_ERRORS");
  return v && *v && std::string(v) != "0";
}

double scalar_rel_error(double got, double want) {
  const double d = std::abs(got - want);
  if (std::isnan(d)) return std::numeric_limits<double>::infinity();
  return d / std::max(std::abs(want), 1e-30);
}

std::vector<gradflow::LmBatch> batches_of(const json& j) {
  std::vector<gradflow::LmBatch> out;
  for (const auto& b : j.at("batches"))
    out.push_back({testing::to_index_array(b.at("ids")), testing::to_index_array(b.at("targets"))});
  return out;
}

// Compares per-entry scalars; returns the largest relative error.
double compare_each(const std::string& placement, const std::string& what, const std::vector<double>& got,
                    const json& want_json) {
  const std::vector<double> want = want_json.get<std::vector<double>>();
  INFO(placement << ": " << what << " has " << got.size() << " entries, the fixture " << want.size());
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = scalar_rel_error(got[i], want[i]);
    INFO(placement << ": " << what << "[" << i << "]: xgrad " << std::setprecision(9) << got[i] << ", PyTorch "
                   << want[i]);
    CAPTURE(err);
    CHECK(err <= kTol);
    worst = std::max(worst, err);
  }
  if (verbose()) {
    std::cout << std::left << std::setw(5) << placement << std::setw(22) << what << " max rel_error " << std::scientific
              << std::setprecision(3) << worst << "  xgrad";
    for (double v : got) std::cout << ' ' << v;
    std::cout << std::defaultfloat << '\n';
  }
  return worst;
}

void run_placement(const std::string& placement) {
  const json& j = fixture();
  const json& p = j.at("placements").at(placement);
  REQUIRE(p.at("norm").get<std::string>() == placement);
  const nn::Norm norm = placement == "pre" ? nn::Norm::pre : nn::Norm::post;
  nn::LanguageModel model(
      nn::LanguageModelOptions(j.at("vocab_size").get<std::size_t>(), j.at("d_model").get<std::size_t>(),
                               j.at("num_heads").get<std::size_t>(), j.at("num_layers").get<std::size_t>())
          .d_ff(j.at("d_ff").get<std::size_t>())
          .max_len(j.at("max_len").get<std::size_t>())
          .dropout(0.f)
          .norm(norm)
          .positional(nn::Positional::learned));
  NamedArrays state;
  for (const auto& [name, v] : p.at("params").items()) state.emplace_back(name, testing::to_array(v));
  weights::load_state_dict(model, state);  // throws naming a missing or unexpected parameter
  for (const auto& [name, param] : model.named_parameters()) {
    INFO(placement << ": parameter '" << name << "' was not loaded");
    REQUIRE(testing::rel_error(param.value(), testing::to_array(p.at("params").at(name))) == 0.0);
  }

  // The example's own measurement.
  const gradflow::FlowResult f = gradflow::measure(model, batches_of(j));
  const std::size_t L = j.at("num_layers").get<std::size_t>();
  REQUIRE(model.blocks.size() == L);
  REQUIRE(f.layers.size() == L);
  std::vector<double> ffn, stream;
  for (const gradflow::LayerFlow& l : f.layers) {
    ffn.push_back(l.ffn_weight_grad_norm);
    stream.push_back(l.residual_grad_norm);
  }
  compare_each(placement, "ffn_weight_grad_norm", ffn, p.at("ffn_weight_grad_norm"));
  compare_each(placement, "residual_grad_norm", stream, p.at("residual_grad_norm"));
  compare_each(placement, "loss", {f.loss}, json::array({p.at("loss")}));
}

}  // namespace

TEST_CASE("flow agreement: the fixture holds both placements and shift-task batches", "[torch][flow]") {
  const json& j = fixture();
  REQUIRE(j.at("placements").contains("pre"));
  REQUIRE(j.at("placements").contains("post"));
  const std::vector<gradflow::LmBatch> batches = batches_of(j);
  REQUIRE(batches.size() >= 2);  // a mean over batches, so the averaging itself is tested
  for (const gradflow::LmBatch& b : batches) {
    REQUIRE(b.ids.shape() == b.targets.shape());
    const std::size_t B = b.ids.shape()[0], T = b.ids.shape()[1];
    for (std::size_t s = 0; s < B; ++s) {
      CHECK(b.targets(s, 0) == -100);
      for (std::size_t t = 1; t < T; ++t) CHECK(b.targets(s, t) == b.ids(s, t - 1));
    }
  }
}

TEST_CASE("flow agreement: Pre-Norm per-layer gradient norms and loss match PyTorch", "[torch][flow][gemm]") {
  run_placement("pre");
}

TEST_CASE("flow agreement: Post-Norm per-layer gradient norms and loss match PyTorch", "[torch][flow][gemm]") {
  run_placement("post");
}
