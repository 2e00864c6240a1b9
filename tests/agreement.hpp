// Comparing xgrad's modules with PyTorch's fixtures (test_nn_agreement.cpp,
// test_attention_agreement.cpp): a case's parameters loaded by name, every tensor compared by
// relative error, and the worst one reported when XGRAD_PRINT_REL_ERRORS is set.
#pragma once

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
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/weights/checkpoint.hpp"

namespace xgrad::testing {

constexpr double kAgreementTol = 1e-5;  // max |got - want| / max |want|, per tensor

inline bool print_rel_errors() {
  const char* v = std::getenv("XGRAD_PRINT_REL_ERRORS");
  return v && *v && std::string(v) != "0";
}

// {"shape", "data": [0/1 ...]} -> boolean mask (true = blocked).
inline Mask to_mask(const nlohmann::json& j) {
  const IndexArray a = to_index_array(j);
  Mask m = Mask::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) m.data()[i] = a.data()[i] != 0;
  return m;
}

// A case's "norm": "pre", "post" or "none".
inline nn::Norm norm_of(const nlohmann::json& c) {
  const std::string s = c.at("norm").get<std::string>();
  if (s == "pre") return nn::Norm::pre;
  if (s == "post") return nn::Norm::post;
  REQUIRE(s == "none");
  return nn::Norm::none;
}

// The options of a language-model case (learned positions, no dropout).
inline nn::LanguageModelOptions lm_options_of(const nlohmann::json& c) {
  return nn::LanguageModelOptions(c.at("vocab_size").get<std::size_t>(), c.at("d_model").get<std::size_t>(),
                                  c.at("num_heads").get<std::size_t>(), c.at("num_layers").get<std::size_t>())
      .d_ff(c.at("d_ff").get<std::size_t>())
      .max_len(c.at("max_len").get<std::size_t>())
      .dropout(0.f)
      .norm(norm_of(c))
      .positional(nn::Positional::learned);
}

inline double max_abs(const Array& a) {
  double m = 0;
  for (float v : a) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
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
inline void compare(const std::string& case_name, const std::string& what, const Array& got, const Array& want,
                    Worst& worst) {
  const double err = rel_error(got, want);
  INFO("case " << case_name << ", " << what << ": got shape " << shape_string(got.shape()) << ", want shape "
               << shape_string(want.shape()));
  CAPTURE(err);
  CHECK(err <= kAgreementTol);
  worst.add(err, what);
}

inline void report(const std::string& name, const Worst& worst) {
  if (print_rel_errors()) {
    std::cout << std::left << std::setw(24) << name << " max rel_error " << std::scientific << std::setprecision(3)
              << worst.err << "  (" << worst.what << ")\n";
  }
}

// The fixture's parameter (and gradient) names must be exactly the module's named_parameters(),
// so a renamed or added parameter shows up here first; then the values are loaded.
inline void load_params(const std::string& case_name, nn::Module& module, const nlohmann::json& c) {
  std::set<std::string> mine, params, grads;
  for (const auto& [n, p] : module.named_parameters()) mine.insert(n);
  for (const auto& [n, v] : c.at("params").items()) params.insert(n);
  for (const auto& [n, v] : c.at("grads").items()) grads.insert(n);
  {
    INFO("case " << case_name << ": the fixture's parameter names differ from named_parameters()");
    REQUIRE(params == mine);
    REQUIRE(grads == mine);
  }
  NamedArrays state;
  for (const auto& [n, v] : c.at("params").items()) state.emplace_back(n, to_array(v));
  weights::load_state_dict(module, state);
  module.eval();  // dropout off (it is 0 as well)
  for (const auto& [n, p] : module.named_parameters()) {
    INFO("case " << case_name << ": parameter '" << n << "' was not loaded");
    REQUIRE(rel_error(p.value(), to_array(c.at("params").at(n))) == 0.0);
  }
}

// Every parameter's gradient. The key projection's bias adds q . b_k to every score of a query
// row, which softmax ignores: its gradient is zero in exact arithmetic and both frameworks hold
// float32 noise, so it is measured against the scale of the key weight's gradient instead.
inline void check_param_grads(const std::string& case_name, const nn::Module& module, const nlohmann::json& c,
                              Worst& worst) {
  for (const auto& [n, p] : module.named_parameters()) {
    {
      INFO("case " << case_name << ": parameter '" << n << "' received no gradient");
      REQUIRE(p.has_grad());
    }
    const Array want = to_array(c.at("grads").at(n));
    const std::string suffix = "w_k.bias";
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string weight = n.substr(0, n.size() - 4) + "weight";
      const double scale = max_abs(to_array(c.at("grads").at(weight)));
      const double err = p.grad().shape() == want.shape() ? max_abs(p.grad() - want) / std::max(scale, 1e-30)
                                                          : std::numeric_limits<double>::infinity();
      INFO("case " << case_name << ", grad of '" << n << "' (zero in exact arithmetic) against the scale " << scale
                   << " of the grad of '" << weight << "'");
      CAPTURE(err);
      CHECK(err <= kAgreementTol);
      worst.add(err, "grad of '" + n + "' (vs dW_k scale)");
    } else {
      compare(case_name, "grad of '" + n + "'", p.grad(), want, worst);
    }
  }
}

// Runs every case of `cases` whose name starts with prefix (at least one must exist), each in its
// own section.
template <class Run>
void run_family(const nlohmann::json& cases, const std::string& prefix, Run run) {
  int found = 0;
  for (const auto& [name, c] : cases.items()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    ++found;
    DYNAMIC_SECTION(name) { run(name, c); }
  }
  INFO("no fixture case starts with '" << prefix << "'");
  CHECK(found > 0);
}

}  // namespace xgrad::testing
