// Agreement with PyTorch for the optimizers on tests/fixtures/optim.json (make_nn_fixtures.py
// writes it): five steps of SGD (plain, momentum with dampening and weight decay, Nesterov),
// Adam with weight decay, AdamW, and AdamW with global-norm clipping and a warm-up + cosine
// learning-rate schedule, from the same parameters and the same gradients. Compares the
// parameters after every step, the clipping norms and the learning rates. No Python here.
// Set XGRAD_PRINT_REL_ERRORS=1 to print the measured max relative error of every case.
#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "fixture.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/optim/sgd.hpp"

using namespace xgrad;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // max |got - want| / max |want|, per tensor

const json& fixture() {
  static const json j = testing::load_fixture("optim.json");
  return j;
}

bool verbose() {
  const char* v = std::getenv("XGRAD_PRINT_REL_ERRORS");
  return v && *v && std::string(v) != "0";
}

double compare(const std::string& case_name, const std::string& what, const Array& got, const Array& want) {
  const double err = testing::rel_error(got, want);
  INFO("case " << case_name << ", " << what << ": got shape " << testing::shape_string(got.shape()) << ", want shape "
               << testing::shape_string(want.shape()));
  CAPTURE(err);
  CHECK(err <= kTol);
  return err;
}

double compare_scalar(const std::string& case_name, const std::string& what, double got, double want) {
  return compare(case_name, what, Array(static_cast<float>(got)), Array(static_cast<float>(want)));
}

// Fresh leaf parameters with the fixture's initial values, named as in the fixture.
NamedTensors make_params() {
  NamedTensors params;
  for (const auto& [name, v] : fixture().at("init").items())
    params.emplace_back(name, Tensor(testing::to_array(v), true));
  return params;
}

// Gives each parameter the fixture's gradient of step k, through the tape:
// d/dp sum(p * g) = g exactly.
void set_grads(const NamedTensors& params, std::size_t k) {
  for (const auto& [name, p] : params) {
    Tensor leaf = p;
    leaf.zero_grad();
    const Array g = testing::to_array(fixture().at("grads").at(name).at(k));
    sum(leaf * Tensor(g)).backward();
    INFO("parameter '" << name << "' step " << k << ": the gradient is not the fixture's");
    REQUIRE(testing::rel_error(leaf.grad(), g) == 0.0);
  }
}

std::unique_ptr<optim::Optimizer> make_optimizer(const json& c, const NamedTensors& params) {
  const std::string kind = c.at("optimizer").get<std::string>();
  const float lr = c.at("lr").get<float>();
  if (kind == "sgd") {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions(lr)
                                                    .momentum(c.at("momentum").get<float>())
                                                    .dampening(c.at("dampening").get<float>())
                                                    .weight_decay(c.at("weight_decay").get<float>())
                                                    .nesterov(c.at("nesterov").get<bool>()));
  }
  const optim::AdamOptions o = optim::AdamOptions(lr)
                                   .beta1(c.at("beta1").get<float>())
                                   .beta2(c.at("beta2").get<float>())
                                   .eps(c.at("eps").get<float>())
                                   .weight_decay(c.at("weight_decay").get<float>());
  if (kind == "adam") return std::make_unique<optim::Adam>(params, o);
  if (kind == "adamw") return std::make_unique<optim::AdamW>(params, o);
  FAIL("unknown optimizer '" << kind << "'");
  return nullptr;
}

std::unique_ptr<optim::LrSchedule> make_schedule(const json& c) {
  if (!c.contains("schedule")) return nullptr;
  const json& s = c.at("schedule");
  REQUIRE(s.at("decay").get<std::string>() == "cosine");
  return std::make_unique<optim::LrSchedule>(optim::ScheduleOptions(s.at("base_lr").get<float>())
                                                 .warmup_steps(s.at("warmup_steps").get<std::size_t>())
                                                 .total_steps(s.at("total_steps").get<std::size_t>())
                                                 .decay(optim::Decay::cosine)
                                                 .min_lr(s.at("min_lr").get<float>()));
}

// Steps the optimizer through the fixture's gradients (clipping and scheduling the learning
// rate when the case asks for it) and compares after every step.
void run_case(const std::string& name, const json& c) {
  const NamedTensors params = make_params();
  const std::unique_ptr<optim::Optimizer> opt = make_optimizer(c, params);
  const std::unique_ptr<optim::LrSchedule> schedule = make_schedule(c);
  const bool clip = c.contains("max_norm");
  const std::size_t steps = fixture().at("steps").get<std::size_t>();
  REQUIRE(c.at("values").size() == steps);
  double worst = 0;
  int clipped = 0;
  for (std::size_t k = 0; k < steps; ++k) {
    const std::string step = "step " + std::to_string(k);
    set_grads(params, k);
    if (clip) {
      const float max_norm = c.at("max_norm").get<float>();
      const float norm = optim::clip_grad_norm(params, max_norm);
      clipped += norm > max_norm;
      worst = std::max(worst, compare_scalar(name, step + " clip norm", norm, c.at("norms").at(k).get<double>()));
    }
    if (schedule) {
      const float lr = schedule->lr(k);
      worst = std::max(worst, compare_scalar(name, step + " lr", lr, c.at("lrs").at(k).get<double>()));
      opt->set_lr(lr);
    }
    opt->step();
    const json& want = c.at("values").at(k);
    REQUIRE(want.size() == params.size());
    for (const auto& [pname, p] : params) {
      worst = std::max(
          worst, compare(name, step + ", parameter '" + pname + "'", p.value(), testing::to_array(want.at(pname))));
    }
  }
  if (clip) {
    INFO("case " << name << ": clipping should trigger on some steps but not all (it did on " << clipped << ")");
    CHECK(clipped > 0);
    CHECK(clipped < static_cast<int>(steps));
  }
  if (verbose()) {
    std::cout << std::left << std::setw(24) << name << " max rel_error " << std::scientific << std::setprecision(3)
              << worst << '\n';
  }
}

}  // namespace

TEST_CASE("optim agreement: the fixture loads and has every case", "[torch][optim]") {
  const json& j = fixture();
  REQUIRE(j.contains("cases"));
  const std::set<std::string> expected = {"sgd_plain", "sgd_momentum", "sgd_nesterov",
                                          "adam_wd",   "adamw",        "adamw_clip_schedule"};
  std::set<std::string> found;
  for (const auto& [name, c] : j.at("cases").items()) found.insert(name);
  CHECK(found == expected);
  const std::size_t steps = j.at("steps").get<std::size_t>();
  CHECK(steps == 5);
  for (const auto& [name, g] : j.at("grads").items()) {
    INFO("parameter " << name);
    CHECK(g.size() == steps);
    CHECK(j.at("init").contains(name));
  }
}

TEST_CASE("optim agreement: SGD (plain, momentum with dampening and weight decay, Nesterov)", "[torch][optim][sgd]") {
  for (const char* name : {"sgd_plain", "sgd_momentum", "sgd_nesterov"}) {
    DYNAMIC_SECTION(name) { run_case(name, fixture().at("cases").at(name)); }
  }
}

TEST_CASE("optim agreement: Adam with weight decay", "[torch][optim][adam]") {
  run_case("adam_wd", fixture().at("cases").at("adam_wd"));
}

TEST_CASE("optim agreement: AdamW", "[torch][optim][adam]") { run_case("adamw", fixture().at("cases").at("adamw")); }

TEST_CASE("optim agreement: AdamW with clip_grad_norm and warm-up plus cosine schedule", "[torch][optim][adam]") {
  run_case("adamw_clip_schedule", fixture().at("cases").at("adamw_clip_schedule"));
}
