// Agreement with PyTorch on the cases in tests/fixtures/core_ops.json (make_fixtures.py writes
// them): forward values and the gradients backward(grad_out) gives every input. No Python here.
// Set XGRAD_PRINT_REL_ERRORS=1 to print the measured max relative error of every case.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tensor.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // max |got - want| / max |want|, per tensor

const json& fixture() {
  static const json j = testing::load_fixture("core_ops.json");
  return j;
}

const json& cases() { return fixture().at("cases"); }

using Inputs = std::map<std::string, Tensor>;
using OpFn = std::function<Tensor(const Inputs&, const json& c)>;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool verbose() {
  const char* v = std::getenv("XGRAD_PRINT_REL_ERRORS");
  return v && *v && std::string(v) != "0";
}

// Compares one tensor and returns its relative error; the message names the case and tensor.
double compare(const std::string& case_name, const std::string& what, const Array& got, const Array& want) {
  const double err = testing::rel_error(got, want);
  INFO("case " << case_name << ", " << what << ": got shape " << testing::shape_string(got.shape()) << ", want shape "
               << testing::shape_string(want.shape()));
  CAPTURE(err);
  CHECK(err <= kTol);
  return err;
}

// Builds leaf tensors from the case's inputs, runs op, checks the output, runs
// backward(grad_out) and checks the gradient of every input the fixture lists.
void run_case(const std::string& name, const json& c, const OpFn& op) {
  Inputs in;
  for (const auto& [k, v] : c.at("inputs").items()) in.emplace(k, Tensor(testing::to_array(v), true));

  const Tensor out = op(in, c);
  double worst = compare(name, "forward output", out.value(), testing::to_array(c.at("output")));

  const Array grad_out = testing::to_array(c.at("grad_out"));
  REQUIRE(out.shape() == grad_out.shape());
  out.backward(grad_out);

  for (const auto& [k, want] : c.at("grads").items()) {
    REQUIRE(in.count(k) == 1);
    const Tensor& leaf = in.at(k);
    {
      INFO("case " << name << ": input '" << k << "' received no gradient");
      REQUIRE(leaf.has_grad());
    }
    worst = std::max(worst, compare(name, "grad of '" + k + "'", leaf.grad(), testing::to_array(want)));
  }
  if (verbose()) {
    std::cout << std::left << std::setw(32) << name << " max rel_error " << std::scientific << std::setprecision(3)
              << worst << '\n';
  }
}

// Runs every fixture case whose name starts with prefix (at least one must exist), each in
// its own section.
void run_family(const std::string& prefix, const OpFn& op) {
  int found = 0;
  for (const auto& [name, c] : cases().items()) {
    if (!starts_with(name, prefix)) continue;
    ++found;
    DYNAMIC_SECTION(name) { run_case(name, c, op); }
  }
  INFO("no fixture case starts with '" << prefix << "'");
  CHECK(found > 0);
}

}  // namespace

TEST_CASE("torch agreement: the fixture loads and every case has a test", "[torch]") {
  const json& j = fixture();
  REQUIRE(j.contains("cases"));
  const std::set<std::string> expected = {"matmul_2d",
                                          "matmul_batched",
                                          "matmul_batch_2d_rhs",
                                          "matmul_broadcast_batch",
                                          "matmul_2d_ta",
                                          "matmul_2d_tb",
                                          "softmax_axis-1",
                                          "softmax_axis1",
                                          "softmax_large_logits",
                                          "log_softmax_axis-1",
                                          "log_softmax_axis1",
                                          "log_softmax_large_logits",
                                          "cross_entropy_3d_ignore",
                                          "cross_entropy_2d",
                                          "layer_norm_affine",
                                          "layer_norm_plain",
                                          "gelu_exact",
                                          "gelu_tanh",
                                          "linear_3d",
                                          "linear_no_bias",
                                          "linear_1d",
                                          "attention_weights_plain",
                                          "attention_weights_cross",
                                          "attention_weights_causal",
                                          "attention_weights_causal_padding",
                                          "attention_weights_row_fully_masked",
                                          "attend_self",
                                          "attend_cross",
                                          "rms_norm_affine",
                                          "rms_norm_plain",
                                          "rms_norm_large_eps"};
  for (const auto& name : expected) {
    INFO("missing fixture case " << name);
    CHECK(cases().contains(name));
  }
  // Every case must belong to a family tested below, so none is silently skipped.
  const char* families[] = {"matmul_", "softmax_", "log_softmax_",       "cross_entropy_", "layer_norm_",
                            "gelu_",   "linear_",  "attention_weights_", "attend_",        "rms_norm_"};
  for (const auto& [name, c] : cases().items()) {
    const bool covered =
        std::any_of(std::begin(families), std::end(families), [&](const char* f) { return starts_with(name, f); });
    INFO("fixture case " << name << " has no test family");
    CHECK(covered);
  }
}

TEST_CASE("torch agreement: load_fixture names a missing file", "[torch]") {
  CHECK_THROWS_WITH(testing::load_fixture("no_such_fixture.json"), Catch::Contains("no_such_fixture.json"));
}

TEST_CASE("torch agreement: rel_error rejects mismatched shapes", "[torch]") {
  const Array a = xt::zeros<float>({2, 3});
  const Array b = xt::zeros<float>({3, 2});
  CHECK(std::isinf(testing::rel_error(a, b)));
  Array c = xt::ones<float>({2, 3});
  Array d = c;
  d(1, 2) = 1.5f;
  CHECK(testing::rel_error(d, c) == Approx(0.5));
}

TEST_CASE("torch agreement: matmul (plain, batched, broadcast, transposed)", "[torch][matmul][gemm]") {
  run_family("matmul_", [](const Inputs& in, const json& c) {
    return matmul(in.at("a"), in.at("b"), c.at("transpose_a").get<bool>(), c.at("transpose_b").get<bool>());
  });
}

TEST_CASE("torch agreement: softmax", "[torch][softmax]") {
  run_family("softmax_", [](const Inputs& in, const json& c) { return softmax(in.at("x"), c.at("axis").get<int>()); });
}

TEST_CASE("torch agreement: log_softmax", "[torch][softmax]") {
  run_family("log_softmax_",
             [](const Inputs& in, const json& c) { return log_softmax(in.at("x"), c.at("axis").get<int>()); });
}

TEST_CASE("torch agreement: cross_entropy (mean over non-ignored targets)", "[torch][cross_entropy]") {
  run_family("cross_entropy_", [](const Inputs& in, const json& c) {
    return cross_entropy(in.at("logits"), testing::to_index_array(c.at("targets")),
                         c.at("ignore_index").get<std::int64_t>());
  });
}

TEST_CASE("torch agreement: layer_norm (with and without affine)", "[torch][layer_norm]") {
  run_family("layer_norm_", [](const Inputs& in, const json& c) {
    const Tensor gamma = in.count("gamma") ? in.at("gamma") : Tensor();
    const Tensor beta = in.count("beta") ? in.at("beta") : Tensor();
    return layer_norm(in.at("x"), gamma, beta, c.at("eps").get<float>());
  });
}

TEST_CASE("torch agreement: rms_norm (with and without a weight, a large eps)", "[torch][rms_norm]") {
  run_family("rms_norm_", [](const Inputs& in, const json& c) {
    return rms_norm(in.at("x"), in.count("gamma") ? in.at("gamma") : Tensor(), c.at("eps").get<float>());
  });
}

TEST_CASE("torch agreement: gelu (exact and tanh)", "[torch][gelu]") {
  run_family("gelu_", [](const Inputs& in, const json& c) {
    const std::string approx = c.at("approximate").get<std::string>();
    REQUIRE((approx == "none" || approx == "tanh"));
    return gelu(in.at("x"), approx == "none" ? GeluApprox::exact : GeluApprox::tanh);
  });
}

TEST_CASE("torch agreement: linear (with and without bias, 1-D input)", "[torch][linear][gemm]") {
  run_family("linear_", [](const Inputs& in, const json&) {
    return linear(in.at("x"), in.at("weight"), in.count("bias") ? in.at("bias") : Tensor());
  });
}

TEST_CASE("torch agreement: attention_weights (plain, cross, causal, padding, a fully masked row)",
          "[torch][attention][gemm]") {
  run_family("attention_weights_", [](const Inputs& in, const json& c) {
    const std::size_t heads = c.at("heads").get<std::size_t>();
    const float scale = c.at("scale").get<float>();
    const bool causal = c.at("causal").get<bool>();
    if (!c.contains("mask")) return attention_weights(in.at("q"), in.at("k"), heads, scale, causal);
    const IndexArray flags = testing::to_index_array(c.at("mask"));
    Mask mask = Mask::from_shape(flags.shape());
    for (std::size_t i = 0; i < flags.size(); ++i) mask.data()[i] = flags.data()[i] != 0;
    return attention_weights(in.at("q"), in.at("k"), heads, scale, causal, &mask);
  });
}

TEST_CASE("torch agreement: attend (self and cross attention)", "[torch][attention][gemm]") {
  run_family("attend_", [](const Inputs& in, const json& c) {
    return attend(in.at("weights"), in.at("v"), c.at("heads").get<std::size_t>());
  });
}
