// Optimizers' semantics: convergence on a convex loss, closed forms of the first steps, skipped
// parameters, state save/restore (exact resume, hyperparameters restored, rejected states leave
// the state untouched), hyper-parameter validation, gradient clipping and learning-rate
// schedules. Agreement with PyTorch's numbers lives in the fixture tests.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/optim/sgd.hpp"

using namespace xgrad;
using namespace xgrad::optim;
using Catch::Contains;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

Tensor param(const Array& values) { return Tensor(values, true); }

bool bit_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool states_equal(const NamedArrays& a, const NamedArrays& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !bit_equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

// The per-parameter entries of a state_dict, without the "<type>:<name>" hyperparameters.
NamedArrays per_parameter(const NamedArrays& state) {
  NamedArrays out;
  for (const auto& e : state) {
    if (e.first.find(':') == std::string::npos) out.push_back(e);
  }
  return out;
}

std::set<std::string> names_of(const NamedArrays& state) {
  std::set<std::string> out;
  for (const auto& e : state) out.insert(e.first);
  return out;
}

// sum((p - target)^2): convex, minimum 0 at p = target.
Tensor quad_loss(const Tensor& p, const Array& target) {
  Tensor d = p - Tensor(target);
  return sum(d * d);
}

// Gradient of sum(p * k) is exactly k.
void set_grad(const Tensor& p, const Array& k) {
  Tensor loss = sum(p * Tensor(k));
  loss.backward();
}

// A non-quadratic loss whose gradients change from step to step.
Tensor wavy_loss(const NamedTensors& params) {
  Tensor total;
  for (const auto& [name, p] : params) {
    Tensor term = sum(tanh(p * 1.7f)) + sum((p - 0.3f) * (p - 0.3f) * (p + 1.1f) * 0.5f);
    total = total.defined() ? total + term : term;
  }
  return total;
}

// Fresh leaves with the same values (and names) as `params`.
NamedTensors clone(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) out.emplace_back(name, param(p.value()));
  return out;
}

NamedTensors make_params() {
  return {{"enc.w", param(Array{{0.5f, -1.25f, 2.f}, {0.75f, -0.1f, 1.5f}})},
          {"enc.b", param(Array{0.2f, -0.4f, 0.9f})}};
}

void train_step(const NamedTensors& params, Optimizer& opt) {
  opt.zero_grad();
  wavy_loss(params).backward();
  opt.step();
}

bool params_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!bit_equal(a[i].second.value(), b[i].second.value())) return false;
  }
  return true;
}

using OptFactory = std::function<std::unique_ptr<Optimizer>(const NamedTensors&)>;

struct Kind {
  const char* name;
  OptFactory make;
  bool stateful = true;  // plain SGD keeps nothing that changes its updates
};

std::vector<Kind> kinds() {
  return {
      {"SGD", [](const NamedTensors& p) { return std::make_unique<SGD>(p, SGDOptions(0.05f)); }, false},
      {"SGD momentum",
       [](const NamedTensors& p) {
    return std::make_unique<SGD>(p, SGDOptions(0.05f).momentum(0.9f).dampening(0.1f).weight_decay(0.01f));
       }},
      {"SGD nesterov",
       [](const NamedTensors& p) { return std::make_unique<SGD>(p, SGDOptions(0.05f).momentum(0.8f).nesterov(true)); }},
      {"Adam", [](const NamedTensors& p) { return std::make_unique<Adam>(p, AdamOptions(0.02f).weight_decay(0.05f)); }},
      {"AdamW",
       [](const NamedTensors& p) { return std::make_unique<AdamW>(p, AdamW::defaults(0.02f).weight_decay(0.1f)); }},
      };
}

// What `f` writes to stderr (through a temporary file put in place of descriptor 2).
std::string stderr_of(const std::function<void()>& f) {
  std::fflush(stderr);
  char path[] = "/tmp/xgrad_optim_stderr_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(fd);
    ::unlink(path);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(path);
  return text;
}

float entry(const NamedArrays& state, const std::string& key) {
  for (const auto& [name, a] : state) {
    if (name == key) return a.data()[0];
  }
  FAIL("no state entry " << key);
  return 0.f;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Convergence and skipped parameters
// ----------------------------------------------------------------------------------------------

TEST_CASE("SGD, Adam and AdamW minimize a convex quadratic", "[optim]") {
  const Array start{3.f, -2.f, 0.5f, 1.5f, -4.f};
  const Array target{1.f, 1.f, -1.f, 0.25f, 2.f};
  auto run = [&](auto make, float threshold) {
    Tensor p = param(start);
    auto opt = make(std::vector<Tensor>{p});
    const float initial = quad_loss(p, target).item();
    float loss = initial;
    for (int i = 0; i < 200; ++i) {
      opt.zero_grad();
      Tensor l = quad_loss(p, target);
      loss = l.item();
      l.backward();
      opt.step();
    }
    loss = quad_loss(p, target).item();
    CHECK(initial > 50.f);
    CHECK(loss < threshold);
    CHECK_THAT(static_cast<double>(p.value()(4)), Catch::Matchers::WithinAbs(2.0, 0.05));
    return loss;
  };
  SECTION("SGD") {
    run([](std::vector<Tensor> ps) { return SGD(ps, SGDOptions(0.1f)); }, 1e-8f);
  }
  SECTION("SGD with momentum") {
    run([](std::vector<Tensor> ps) { return SGD(ps, SGDOptions(0.02f).momentum(0.9f)); }, 1e-6f);
  }
  SECTION("Adam") {
    run([](std::vector<Tensor> ps) { return Adam(ps, AdamOptions(0.1f)); }, 1e-5f);
  }
  SECTION("AdamW without weight decay") {
    run([](std::vector<Tensor> ps) { return AdamW(ps, AdamW::defaults(0.1f).weight_decay(0.f)); }, 1e-5f);
  }
  // Decoupled decay (0.01 by default) pulls towards 0, so AdamW settles slightly short of the
  // target (about 1.5e-3 here): the minimum of the loss is not AdamW's fixed point.
  SECTION("AdamW") {
    run([](std::vector<Tensor> ps) { return AdamW(ps, AdamW::defaults(0.1f)); }, 5e-3f);
  }
}

TEST_CASE("parameters without a gradient are skipped by step", "[optim]") {
  for (const Kind& kind : kinds()) {
    INFO(kind.name);
    NamedTensors params = make_params();
    const Array w0 = params[0].second.value(), b0 = params[1].second.value();
    auto opt = kind.make(params);
    // Only "enc.w" takes part in the loss.
    sum(params[0].second * params[0].second).backward();
    REQUIRE(params[0].second.has_grad());
    REQUIRE(!params[1].second.has_grad());
    opt->step();
    opt->step();
    CHECK(!bit_equal(params[0].second.value(), w0));
    CHECK(bit_equal(params[1].second.value(), b0));  // no weight decay, no momentum for it
    // Only the updated parameter has state.
    std::set<std::string> names;
    for (const auto& [name, a] : opt->state_dict()) names.insert(name);
    CHECK(names.count("enc.w.step") == 1);
    for (const auto& n : names) CHECK(n.rfind("enc.b", 0) == std::string::npos);

    // After zero_grad no parameter has a gradient: step changes nothing.
    opt->zero_grad();
    const Array w1 = params[0].second.value();
    const NamedArrays state = opt->state_dict();
    opt->step();
    CHECK(bit_equal(params[0].second.value(), w1));
    CHECK(bit_equal(params[1].second.value(), b0));
    CHECK(states_equal(opt->state_dict(), state));
  }
}

// ----------------------------------------------------------------------------------------------
// Closed forms
// ----------------------------------------------------------------------------------------------

TEST_CASE("SGD first step is p - lr g", "[optim]") {
  const Array p0{1.f, -2.f, 0.5f, 3.f};
  const Array g{0.3f, -1.5f, 2.f, 0.f};
  const float lr = 0.1f;
  SECTION("plain") {
    Tensor p = param(p0);
    SGD opt({p}, SGDOptions(lr));
    set_grad(p, g);
    opt.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK(p.value()(i) == Approx(p0(i) - lr * g(i)).epsilon(1e-6));
  }
  SECTION("with momentum the first step is the same") {
    Tensor p = param(p0);
    SGD opt({p}, SGDOptions(lr).momentum(0.9f).dampening(0.5f));
    set_grad(p, g);
    opt.step();
    for (std::size_t i = 0; i < 4; ++i) CHECK(p.value()(i) == Approx(p0(i) - lr * g(i)).epsilon(1e-6));
  }
}

TEST_CASE("SGD momentum, dampening, Nesterov and weight decay follow the documented formulas", "[optim]") {
  const Array p0{1.f, -2.f, 0.5f};
  const std::vector<Array> grads = {Array{0.3f, -1.5f, 2.f}, Array{-0.7f, 0.2f, 1.f}, Array{0.1f, 0.4f, -3.f}};
  const double lr = 0.1, mu = 0.9, wd = 0.05;
  for (int variant = 0; variant < 3; ++variant) {
    const bool nesterov = variant == 2;
    const double damp = variant == 1 ? 0.25 : 0.0;
    INFO("variant " << variant);
    Tensor p = param(p0);
    SGD opt(
        {p},
        SGDOptions(float(lr)).momentum(float(mu)).dampening(float(damp)).weight_decay(float(wd)).nesterov(nesterov));
    std::vector<double> x(p0.begin(), p0.end()), b(3, 0.0);
    for (std::size_t t = 0; t < grads.size(); ++t) {
      opt.zero_grad();
      set_grad(p, grads[t]);
      opt.step();
      for (std::size_t i = 0; i < 3; ++i) {
        double g = grads[t](i) + wd * x[i];
        b[i] = t == 0 ? g : mu * b[i] + (1 - damp) * g;
        g = nesterov ? g + mu * b[i] : b[i];
        x[i] -= lr * g;
        CHECK(p.value()(i) == Approx(x[i]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("Adam first step moves each element by about lr times the sign of the gradient", "[optim]") {
  const Array p0{1.f, -2.f, 0.5f, 3.f, 0.f, -1.f};
  const Array g{1e-3f, -1.5f, 200.f, -0.02f, 7.f, -1e3f};
  for (bool decoupled : {false, true}) {
    INFO((decoupled ? "AdamW" : "Adam"));
    const float lr = 0.01f;
    Tensor p = param(p0);
    std::unique_ptr<Optimizer> opt;
    if (decoupled) {
      opt = std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamW::defaults(lr).weight_decay(0.f));
    } else {
      opt = std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions(lr));
    }
    set_grad(p, g);
    opt->step();
    for (std::size_t i = 0; i < p0.size(); ++i) {
      const double moved = static_cast<double>(p.value()(i)) - p0(i);
      const double sign = g(i) > 0 ? 1.0 : -1.0;
      CHECK(moved == Approx(-lr * sign).epsilon(1e-4));
      // The exact bias-corrected value: lr * g / (|g| + eps).
      CHECK(moved == Approx(-lr * g(i) / (std::fabs(g(i)) + 1e-8)).epsilon(1e-4));
    }
  }
}

TEST_CASE("AdamW decays weights by 1 - lr wd with a zero gradient, Adam with weight_decay does not", "[optim]") {
  const Array p0{2.f, -1.5f, 0.25f, -3.f};
  const Array zero = xt::zeros<float>({4});
  const double lr = 0.1, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const int steps = 4;

  Tensor pw = param(p0);
  AdamW adamw({pw}, AdamOptions(float(lr)).weight_decay(float(wd)));
  Tensor pa = param(p0);
  Adam adam({pa}, AdamOptions(float(lr)).weight_decay(float(wd)));
  set_grad(pw, zero);
  set_grad(pa, zero);
  REQUIRE(bit_equal(pw.grad(), zero));

  // Expected trajectories from the formulas in adam.hpp, in double.
  std::vector<double> xw(p0.begin(), p0.end()), xa(p0.begin(), p0.end()), m(4, 0.0), v(4, 0.0);
  for (int t = 1; t <= steps; ++t) {
    adamw.step();
    adam.step();
    for (std::size_t i = 0; i < 4; ++i) {
      // AdamW: p = p * (1 - lr wd); the zero gradient leaves m = v = 0 and adds nothing.
      xw[i] *= (1 - lr * wd);
      // Adam: g = grad + wd p.
      const double g = wd * xa[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      xa[i] -= lr / (1 - std::pow(b1, t)) * m[i] / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);

      INFO("step " << t << " element " << i);
      CHECK(pw.value()(i) == Approx(xw[i]).epsilon(1e-6));
      CHECK(pw.value()(i) == Approx(p0(i) * std::pow(1 - lr * wd, t)).epsilon(1e-6));
      CHECK(pa.value()(i) == Approx(xa[i]).epsilon(1e-5));
      // The two really differ: Adam moves about lr per step whatever |p| is.
      CHECK(std::fabs(pa.value()(i) - pw.value()(i)) > 1e-3);
    }
  }
  // Adam with weight_decay 0 and a zero gradient does not move at all.
  Tensor pz = param(p0);
  Adam plain({pz}, AdamOptions(float(lr)));
  set_grad(pz, zero);
  for (int t = 0; t < steps; ++t) plain.step();
  CHECK(bit_equal(pz.value(), p0));
}

// ----------------------------------------------------------------------------------------------
// State dictionaries
// ----------------------------------------------------------------------------------------------

TEST_CASE("Adam state entries are named after the parameters", "[optim][gemm]") {
  SECTION("module parameters") {
    Generator gen(1);
    nn::Linear lin(3, 2, true, gen);
    Adam opt(lin.named_parameters(), AdamOptions(0.01f));
    // No update yet: the hyperparameters alone.
    CHECK(names_of(opt.state_dict()) == std::set<std::string>{"Adam:lr", "Adam:beta1", "Adam:beta2", "Adam:eps",
                                                              "Adam:weight_decay", "Adam:parameters"});
    for (int i = 0; i < 3; ++i) {
      opt.zero_grad();
      sum(lin.forward(Tensor(Array{{1.f, 2.f, 3.f}})) * 0.5f).backward();
      opt.step();
    }
    std::map<std::string, Array> state;
    for (const auto& [name, a] : per_parameter(opt.state_dict())) state[name] = a;
    const std::set<std::string> expect = {"weight.step", "weight.exp_avg", "weight.exp_avg_sq",
                                          "bias.step",   "bias.exp_avg",   "bias.exp_avg_sq"};
    std::set<std::string> got;
    for (const auto& [name, a] : state) got.insert(name);
    CHECK(got == expect);
    CHECK(state["weight.step"].size() == 1);
    CHECK(state["weight.step"].data()[0] == 3.f);
    CHECK(state["bias.step"].data()[0] == 3.f);
    CHECK(state["weight.exp_avg"].shape() == lin.weight.shape());
    CHECK(state["weight.exp_avg_sq"].shape() == lin.weight.shape());
    CHECK(state["bias.exp_avg"].shape() == lin.bias.shape());
    // exp_avg_sq is non-negative and non-zero where the gradient was.
    for (float x : state["weight.exp_avg_sq"]) CHECK(x > 0.f);
  }
  SECTION("hand-built names and unnamed parameters") {
    NamedTensors params = make_params();
    AdamW opt(params);
    train_step(params, opt);
    std::set<std::string> got;
    for (const auto& [name, a] : per_parameter(opt.state_dict())) got.insert(name);
    CHECK(got == std::set<std::string>{"enc.w.step", "enc.w.exp_avg", "enc.w.exp_avg_sq", "enc.b.step", "enc.b.exp_avg",
                                       "enc.b.exp_avg_sq"});

    Tensor a = param(Array{1.f, 2.f}), b = param(Array{3.f});
    Adam unnamed({a, b}, AdamOptions(0.1f));
    set_grad(a, Array{1.f, 1.f});
    set_grad(b, Array{1.f});
    unnamed.step();
    got.clear();
    for (const auto& [name, x] : per_parameter(unnamed.state_dict())) got.insert(name);
    CHECK(got == std::set<std::string>{"0.step", "0.exp_avg", "0.exp_avg_sq", "1.step", "1.exp_avg", "1.exp_avg_sq"});
  }
  SECTION("SGD has a momentum_buffer") {
    NamedTensors params = make_params();
    SGD opt(params, SGDOptions(0.1f).momentum(0.9f));
    train_step(params, opt);
    train_step(params, opt);
    std::map<std::string, Array> state;
    for (const auto& [name, a] : per_parameter(opt.state_dict())) state[name] = a;
    std::set<std::string> got;
    for (const auto& [name, a] : state) got.insert(name);
    CHECK(got == std::set<std::string>{"enc.w.step", "enc.w.momentum_buffer", "enc.b.step", "enc.b.momentum_buffer"});
    CHECK(state["enc.w.step"].data()[0] == 2.f);
    CHECK(state["enc.w.momentum_buffer"].shape() == params[0].second.shape());
  }
}

TEST_CASE("an optimizer loaded with another's state continues with bitwise identical updates", "[optim]") {
  for (const Kind& kind : kinds()) {
    INFO(kind.name);
    NamedTensors p1 = make_params();
    auto opt1 = kind.make(p1);
    for (int i = 0; i < 3; ++i) train_step(p1, *opt1);

    NamedTensors p2 = clone(p1);
    auto opt2 = kind.make(p2);
    opt2->load_state_dict(opt1->state_dict());
    REQUIRE(states_equal(opt2->state_dict(), opt1->state_dict()));

    // A control without the state: it must end up elsewhere (so this test can fail).
    NamedTensors p3 = clone(p1);
    auto opt3 = kind.make(p3);

    for (int i = 0; i < 3; ++i) {
      train_step(p1, *opt1);
      train_step(p2, *opt2);
      train_step(p3, *opt3);
      REQUIRE(params_equal(p1, p2));
    }
    CHECK(states_equal(opt1->state_dict(), opt2->state_dict()));
    if (kind.stateful) CHECK(!params_equal(p1, p3));
  }
}

TEST_CASE("loading a partial state (some parameters never updated) resumes exactly", "[optim]") {
  NamedTensors p1 = make_params();
  Adam opt1(p1, AdamOptions(0.05f));
  // Only enc.w gets gradients for now.
  for (int i = 0; i < 2; ++i) {
    opt1.zero_grad();
    sum(tanh(p1[0].second)).backward();
    opt1.step();
  }
  REQUIRE(per_parameter(opt1.state_dict()).size() == 3);
  NamedTensors p2 = clone(p1);
  Adam opt2(p2, AdamOptions(0.05f));
  opt2.load_state_dict(opt1.state_dict());
  for (int i = 0; i < 3; ++i) {
    train_step(p1, opt1);
    train_step(p2, opt2);
    REQUIRE(params_equal(p1, p2));
  }
  CHECK(states_equal(opt1.state_dict(), opt2.state_dict()));
  std::map<std::string, float> steps;
  for (const auto& [name, a] : opt2.state_dict()) {
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0) steps[name] = a.data()[0];
  }
  CHECK(steps == std::map<std::string, float>{{"enc.w.step", 5.f}, {"enc.b.step", 3.f}});
}

TEST_CASE("loading an empty state resets the optimizer", "[optim]") {
  NamedTensors p1 = make_params();
  Adam opt1(p1, AdamOptions(0.05f));
  train_step(p1, opt1);
  REQUIRE(!per_parameter(opt1.state_dict()).empty());
  opt1.load_state_dict({});
  CHECK(per_parameter(opt1.state_dict()).empty());
  // It now behaves like a fresh optimizer.
  NamedTensors p2 = clone(p1);
  Adam fresh(p2, AdamOptions(0.05f));
  train_step(p1, opt1);
  train_step(p2, fresh);
  CHECK(params_equal(p1, p2));
}

// `opt` and `ref` run in lockstep; `opt` receives the bad states. `good` is a complete, valid
// state that differs from opt's (5 steps, other values): a loader that applied entries before
// finding the bad one would change opt.
struct BadStateFixture {
  NamedTensors p = make_params();
  NamedTensors p_ref = clone(p);
  Adam opt{p, AdamOptions(0.05f).weight_decay(0.01f)};
  Adam ref{p_ref, AdamOptions(0.05f).weight_decay(0.01f)};
  NamedArrays good;

  BadStateFixture() {
    for (int i = 0; i < 2; ++i) {
      train_step(p, opt);
      train_step(p_ref, ref);
    }
    NamedTensors p_other = make_params();
    Adam other(p_other, AdamOptions(0.3f));
    for (int i = 0; i < 5; ++i) train_step(p_other, other);
    good = other.state_dict();
  }
  // `good` with `key` set to `value` (appended when absent).
  NamedArrays with(const std::string& key, const Array& value) const {
    NamedArrays s = good;
    bool replaced = false;
    for (auto& [name, a] : s) {
      if (name == key) {
        a = value;
        replaced = true;
      }
    }
    if (!replaced) s.emplace_back(key, value);
    return s;
  }
  NamedArrays without(const std::string& key) const {
    NamedArrays s;
    for (const auto& e : good) {
      if (e.first != key) s.push_back(e);
    }
    return s;
  }
  // Whatever was rejected, opt still holds exactly ref's state and steps like ref.
  void require_untouched() {
    REQUIRE(states_equal(opt.state_dict(), ref.state_dict()));
    for (int i = 0; i < 2; ++i) {
      train_step(p, opt);
      train_step(p_ref, ref);
      REQUIRE(params_equal(p, p_ref));
    }
    CHECK(states_equal(opt.state_dict(), ref.state_dict()));
  }
};

TEST_CASE("load_state_dict rejects bad states and leaves the previous state untouched", "[optim]") {
  BadStateFixture f;
  REQUIRE(per_parameter(f.good).size() == 6);
  auto& opt = f.opt;
  auto with = [&](const std::string& k, const Array& v) { return f.with(k, v); };
  auto without = [&](const std::string& k) { return f.without(k); };

  SECTION("unknown names") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("nope.exp_avg", Array{1.f})),
                        Contains("Adam") && Contains("unexpected state entry 'nope.exp_avg'"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.velocity", xt::zeros<float>({2, 3}))),
                        Contains("unexpected state entry 'enc.w.velocity'"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w", xt::zeros<float>({2, 3}))),
                        Contains("unexpected state entry 'enc.w'"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.", xt::zeros<float>({2, 3}))),
                        Contains("unexpected state entry"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.wx.step", Array(1.f))),
                        Contains("unexpected state entry 'enc.wx.step'"));
    // SGD's slot in an Adam state.
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.b.momentum_buffer", xt::zeros<float>({3}))),
                        Contains("unexpected state entry 'enc.b.momentum_buffer'"));
  }
  SECTION("wrong shapes") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.exp_avg", xt::zeros<float>({3, 2}))),
                        Contains("Adam") && Contains("'enc.w.exp_avg'") && Contains("(3, 2)") && Contains("(2, 3)"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.b.exp_avg_sq", xt::zeros<float>({4}))),
                        Contains("'enc.b.exp_avg_sq'") && Contains("(4)") && Contains("(3)"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.b.exp_avg_sq", Array(0.f))), Contains("'enc.b.exp_avg_sq'"));
  }
  SECTION("incomplete per-parameter state") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(without("enc.b.exp_avg_sq")),
                        Contains("Adam") && Contains("incomplete state for parameter 'enc.b'") && Contains("2 of 3"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(without("enc.w.step")), Contains("incomplete state for parameter 'enc.w'"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(NamedArrays{{"enc.w.step", Array(2.f)}}),
                        Contains("incomplete state for parameter 'enc.w'") && Contains("1 of 3"));
  }
  SECTION("bad step counts") {
    for (float bad : {0.f, 1.5f, -1.f, -2.f, 0.5f, kNaN}) {
      INFO("step " << bad);
      REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.step", Array(bad))),
                          Contains("Adam") && Contains("'enc.w.step'") && Contains("not a positive step count"));
    }
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.step", Array{1.f, 2.f})),
                        Contains("not a positive step count"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.step", xt::zeros<float>({0}))),
                        Contains("not a positive step count"));
  }
  SECTION("a duplicated step") {
    NamedArrays s = f.good;
    s.emplace_back("enc.w.step", Array(7.f));
    REQUIRE_THROWS_AS(opt.load_state_dict(s), Error);
  }
  f.require_untouched();
}

// Each slot must appear exactly once and the step must be a finite count that fits size_t:
// counting the entries per parameter is not enough.
TEST_CASE("load_state_dict rejects infinite steps and duplicated entries standing in for missing ones", "[optim]") {
  BadStateFixture f;
  auto& opt = f.opt;
  auto with = [&](const std::string& k, const Array& v) { return f.with(k, v); };
  auto without = [&](const std::string& k) { return f.without(k); };

  // An infinite count, or one beyond what size_t holds, cannot be converted to a step count
  // (static_cast<std::size_t> of such a float is undefined behaviour).
  SECTION("an infinite step count") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.step", Array(kInf))), Contains("'enc.w.step'"));
  }
  SECTION("a step count beyond size_t") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("enc.w.step", Array(1e30f))), Contains("'enc.w.step'"));
  }
  // REQUIRE (not CHECK): if such a state were accepted, stepping would use an exp_avg_sq buffer
  // of the wrong size.
  SECTION("a duplicated slot cannot stand in for a missing one") {
    // 3 entries for enc.w, but exp_avg twice and no exp_avg_sq.
    NamedArrays s = without("enc.w.exp_avg_sq");
    s.emplace_back("enc.w.exp_avg", xt::zeros<float>({2, 3}));
    REQUIRE_THROWS_WITH(opt.load_state_dict(s), Contains("'enc.w"));
  }
  SECTION("a duplicated step standing in for a missing slot") {
    NamedArrays s = without("enc.b.exp_avg");
    s.emplace_back("enc.b.step", Array(5.f));
    REQUIRE_THROWS_WITH(opt.load_state_dict(s), Contains("'enc.b"));
  }

  f.require_untouched();
}

TEST_CASE("SGD load_state_dict checks its own slot", "[optim]") {
  NamedTensors p = make_params();
  SGD opt(p, SGDOptions(0.1f).momentum(0.9f));
  train_step(p, opt);
  const NamedArrays before = opt.state_dict();
  REQUIRE_THROWS_WITH(
      opt.load_state_dict(NamedArrays{{"enc.w.step", Array(1.f)}, {"enc.w.exp_avg", xt::zeros<float>({2, 3})}}),
      Contains("SGD") && Contains("unexpected state entry 'enc.w.exp_avg'"));
  REQUIRE_THROWS_WITH(
      opt.load_state_dict(NamedArrays{{"enc.w.step", Array(1.f)}, {"enc.w.momentum_buffer", xt::zeros<float>({6})}}),
      Contains("SGD") && Contains("'enc.w.momentum_buffer'") && Contains("(6)") && Contains("(2, 3)"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(NamedArrays{{"enc.w.momentum_buffer", xt::zeros<float>({2, 3})}}),
                      Contains("incomplete state for parameter 'enc.w'") && Contains("1 of 2"));
  CHECK(states_equal(opt.state_dict(), before));
}

// ----------------------------------------------------------------------------------------------
// Hyper-parameters
// ----------------------------------------------------------------------------------------------

TEST_CASE("invalid learning rates are rejected naming the optimizer and the value", "[optim]") {
  auto params = [] { return std::vector<Tensor>{param(Array{1.f, 2.f})}; };
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(-0.1f)), Contains("SGD") && Contains("learning rate -0.1"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(kNaN)), Contains("SGD") && Contains("learning rate nan"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(kInf)), Contains("SGD") && Contains("learning rate inf"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(-kInf)), Contains("SGD") && Contains("learning rate -inf"));
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions(-1e-3f)), Contains("Adam: learning rate -0.001"));
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions(kNaN)), Contains("Adam: learning rate nan"));
  REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults(-2.f)), Contains("AdamW: learning rate -2"));
  REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults(kInf)), Contains("AdamW: learning rate inf"));
  REQUIRE_NOTHROW(SGD(params(), SGDOptions(0.f)));  // lr 0 is allowed

  SECTION("set_lr") {
    Tensor p = param(Array{1.f, 2.f});
    SGD sgd({p}, SGDOptions(0.1f));
    AdamW adamw({p});
    for (float bad : {-0.5f, kNaN, kInf, -kInf}) {
      INFO("lr " << bad);
      REQUIRE_THROWS_WITH(sgd.set_lr(bad), Contains("SGD") && Contains("learning rate"));
      REQUIRE_THROWS_WITH(adamw.set_lr(bad), Contains("AdamW") && Contains("learning rate"));
    }
    REQUIRE_THROWS_WITH(sgd.set_lr(-0.5f), Contains("-0.5"));
    CHECK(sgd.lr() == 0.1f);  // unchanged after the failures
    CHECK(adamw.lr() == 1e-3f);
    sgd.set_lr(0.5f);
    CHECK(sgd.lr() == 0.5f);
    // The new rate is the one used.
    set_grad(p, Array{1.f, -2.f});
    sgd.step();
    CHECK(p.value()(0) == Approx(0.5f));
    CHECK(p.value()(1) == Approx(3.f));
  }
}

TEST_CASE("invalid SGD settings are rejected", "[optim]") {
  auto params = [] { return std::vector<Tensor>{param(Array{1.f, 2.f})}; };
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).momentum(-0.1f)), Contains("SGD: momentum -0.1"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).momentum(1.f)), Contains("SGD: momentum 1 is outside [0, 1)"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).momentum(1.5f)), Contains("SGD: momentum 1.5"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).momentum(kNaN)), Contains("SGD: momentum nan"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).dampening(-0.5f)), Contains("SGD: dampening -0.5"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).dampening(1.5f)), Contains("SGD: dampening 1.5"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).weight_decay(-0.01f)), Contains("SGD: weight_decay -0.01"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).weight_decay(kInf)), Contains("SGD: weight_decay inf"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).nesterov(true)),
                      Contains("SGD") && Contains("Nesterov") && Contains("momentum 0"));
  REQUIRE_THROWS_WITH(SGD(params(), SGDOptions(0.1f).nesterov(true).momentum(0.9f).dampening(0.1f)),
                      Contains("Nesterov") && Contains("dampening 0.1"));
  REQUIRE_NOTHROW(SGD(params(), SGDOptions(0.1f).nesterov(true).momentum(0.9f)));
  REQUIRE_NOTHROW(SGD(params(), SGDOptions(0.1f).momentum(0.f).dampening(1.f)));
}

TEST_CASE("invalid Adam and AdamW settings are rejected", "[optim]") {
  auto params = [] { return std::vector<Tensor>{param(Array{1.f, 2.f})}; };
  for (float bad : {-0.1f, 1.f, 1.5f, kNaN}) {
    INFO("beta " << bad);
    REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().beta1(bad)), Contains("Adam: beta1"));
    REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().beta2(bad)), Contains("Adam: beta2"));
    REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults().beta1(bad)), Contains("AdamW: beta1"));
    REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults().beta2(bad)), Contains("AdamW: beta2"));
  }
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().beta1(1.f)), Contains("beta1 1 is outside [0, 1)"));
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().beta2(-0.5f)), Contains("beta2 -0.5"));
  REQUIRE_NOTHROW(Adam(params(), AdamOptions().beta1(0.f).beta2(0.f)));
  for (float bad : {-1e-8f, kNaN, kInf}) {
    INFO("eps " << bad);
    REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().eps(bad)), Contains("Adam: eps"));
    REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults().eps(bad)), Contains("AdamW: eps"));
  }
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().eps(-1.f)), Contains("eps -1"));
  REQUIRE_THROWS_WITH(Adam(params(), AdamOptions().weight_decay(-0.01f)), Contains("Adam: weight_decay -0.01"));
  REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults().weight_decay(-1.f)), Contains("AdamW: weight_decay -1"));
  REQUIRE_THROWS_WITH(AdamW(params(), AdamW::defaults().weight_decay(kNaN)), Contains("AdamW: weight_decay nan"));
}

TEST_CASE("bad parameter lists are rejected", "[optim]") {
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{}, SGDOptions(0.1f)), Contains("SGD: no parameters to optimize"));
  REQUIRE_THROWS_WITH(Adam(NamedTensors{}, AdamOptions()), Contains("Adam: no parameters to optimize"));
  REQUIRE_THROWS_WITH(AdamW(std::vector<Tensor>{}), Contains("AdamW: no parameters to optimize"));

  Tensor leaf = param(Array{1.f, 2.f});
  Tensor non_leaf = leaf * 2.f;
  REQUIRE(!non_leaf.is_leaf());
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{leaf, non_leaf}, SGDOptions(0.1f)),
                      Contains("SGD") && Contains("parameter '1'") && Contains("leaf"));
  REQUIRE_THROWS_WITH(Adam(NamedTensors{{"h", non_leaf}}, AdamOptions()),
                      Contains("Adam: parameter 'h'") && Contains("leaf"));
  Tensor frozen(Array{1.f, 2.f}, false);
  REQUIRE_THROWS_WITH(AdamW(NamedTensors{{"frozen", frozen}}),
                      Contains("AdamW: parameter 'frozen'") && Contains("requires grad"));
  REQUIRE_THROWS_WITH(SGD(NamedTensors{{"x", Tensor()}}, SGDOptions(0.1f)),
                      Contains("SGD: parameter 'x' is undefined"));
}

// ----------------------------------------------------------------------------------------------
// Gradient clipping
// ----------------------------------------------------------------------------------------------

TEST_CASE("clip_grad_norm returns the global norm and scales gradients above max_norm", "[optim]") {
  Tensor a = param(Array{{1.f, -2.f, 3.f}, {0.5f, 0.f, -1.5f}});
  Tensor b = param(Array{4.f, -0.25f});
  Tensor c = param(Array{7.f});  // never gets a gradient
  const Array ga{{3.f, -1.f, 2.f}, {0.5f, -4.f, 1.f}};
  const Array gb{-2.5f, 6.f};
  auto reset = [&] {
    a.zero_grad();
    b.zero_grad();
    set_grad(a, ga);
    set_grad(b, gb);
  };
  double sq = 0;
  for (float g : ga) sq += double(g) * g;
  for (float g : gb) sq += double(g) * g;
  const double norm = std::sqrt(sq);

  SECTION("above max_norm: everything scaled by max_norm / (norm + 1e-6)") {
    reset();
    const float max_norm = 2.f;
    const float got = clip_grad_norm(std::vector<Tensor>{a, b, c}, max_norm);
    CHECK(got == Approx(norm).epsilon(1e-6));
    const double coef = max_norm / (norm + 1e-6);
    for (std::size_t i = 0; i < ga.size(); ++i)
      CHECK(a.grad().data()[i] == Approx(ga.data()[i] * coef).epsilon(1e-6).margin(1e-7));
    for (std::size_t i = 0; i < gb.size(); ++i) CHECK(b.grad().data()[i] == Approx(gb.data()[i] * coef).epsilon(1e-6));
    CHECK(!c.has_grad());
    // The new global norm is max_norm (up to the 1e-6).
    double after = 0;
    for (float g : a.grad()) after += double(g) * g;
    for (float g : b.grad()) after += double(g) * g;
    CHECK(std::sqrt(after) == Approx(max_norm).epsilon(1e-5));
  }
  SECTION("below max_norm: nothing changes") {
    reset();
    const float got = clip_grad_norm(std::vector<Tensor>{a, b, c}, 100.f);
    CHECK(got == Approx(norm).epsilon(1e-6));
    CHECK(bit_equal(a.grad(), ga));
    CHECK(bit_equal(b.grad(), gb));
    CHECK(!c.has_grad());
  }
  SECTION("named parameters give the same result") {
    reset();
    const float got = clip_grad_norm(NamedTensors{{"a", a}, {"b", b}, {"c", c}}, 1.f);
    CHECK(got == Approx(norm).epsilon(1e-6));
    CHECK(a.grad()(0, 0) == Approx(ga(0, 0) / (norm + 1e-6)).epsilon(1e-6));
  }
  SECTION("max_norm 0 zeroes the gradients") {
    reset();
    clip_grad_norm(std::vector<Tensor>{a, b}, 0.f);
    for (float g : a.grad()) CHECK(g == 0.f);
    for (float g : b.grad()) CHECK(g == 0.f);
  }
  SECTION("no gradients at all") {
    CHECK(clip_grad_norm(std::vector<Tensor>{c}, 1.f) == 0.f);
    CHECK(!c.has_grad());
  }
  SECTION("negative or NaN max_norm is rejected and changes nothing") {
    reset();
    REQUIRE_THROWS_WITH(clip_grad_norm(std::vector<Tensor>{a, b}, -1.f),
                        Contains("clip_grad_norm") && Contains("max_norm -1"));
    REQUIRE_THROWS_WITH(clip_grad_norm(std::vector<Tensor>{a, b}, kNaN),
                        Contains("clip_grad_norm") && Contains("max_norm nan"));
    REQUIRE_THROWS_AS(clip_grad_norm(NamedTensors{{"a", a}}, -0.5f), Error);
    CHECK(bit_equal(a.grad(), ga));
    CHECK(bit_equal(b.grad(), gb));
  }
}

TEST_CASE("clip_grad_norm returns a non-finite norm and leaves the gradients alone", "[optim]") {
  for (float bad : {kNaN, kInf, -kInf}) {
    INFO("bad gradient element " << bad);
    Tensor a = param(Array{1.f, 2.f, 3.f});
    Tensor b = param(Array{1.f, 2.f});
    const Array ga{3.f, bad, 1.f};
    const Array gb{100.f, -100.f};
    set_grad(a, ga);
    set_grad(b, gb);
    const float got = clip_grad_norm(std::vector<Tensor>{a, b}, 1.f);
    CHECK(!std::isfinite(got));
    if (std::isnan(bad)) CHECK(std::isnan(got));
    if (std::isinf(bad)) CHECK(got == kInf);
    CHECK(bit_equal(a.grad(), ga));
    CHECK(bit_equal(b.grad(), gb));
  }
}

// ----------------------------------------------------------------------------------------------
// Learning-rate schedules
// ----------------------------------------------------------------------------------------------

TEST_CASE("LrSchedule warm-up and decay follow the formulas", "[optim]") {
  const double base = 0.01, min = 1e-4;
  const std::size_t warmup = 4, total = 20;
  auto q_of = [&](std::size_t s) {
    return std::clamp((double(s) - double(warmup)) / double(total - warmup), 0.0, 1.0);
  };
  const double pi = std::acos(-1.0);

  for (Decay decay : {Decay::constant, Decay::linear, Decay::cosine}) {
    INFO("decay " << int(decay));
    LrSchedule sched(
        ScheduleOptions(float(base)).warmup_steps(warmup).total_steps(total).decay(decay).min_lr(float(min)));
    for (std::size_t s = 0; s < warmup; ++s) {
      INFO("step " << s);
      CHECK(sched.lr(s) == Approx(base * double(s + 1) / double(warmup)).epsilon(1e-6));
    }
    CHECK(sched.lr(warmup - 1) == Approx(base).epsilon(1e-6));  // warm-up reaches base
    auto expect = [&](std::size_t s) {
      if (decay == Decay::constant) return base;
      const double q = q_of(s);
      const double f = decay == Decay::linear ? 1.0 - q : 0.5 * (1.0 + std::cos(pi * q));
      return min + (base - min) * f;
    };
    for (std::size_t s : {warmup, warmup + 4, (warmup + total) / 2, total - 1, total, total + 1, 10 * total}) {
      INFO("step " << s);
      CHECK(sched.lr(s) == Approx(expect(s)).epsilon(1e-6));
    }
    // Start, middle and end explicitly.
    if (decay == Decay::constant) {
      CHECK(sched.lr(warmup) == Approx(base));
      CHECK(sched.lr(1000) == Approx(base));
    } else {
      CHECK(sched.lr(warmup) == Approx(base).epsilon(1e-6));
      CHECK(sched.lr((warmup + total) / 2) == Approx(min + (base - min) * 0.5).epsilon(1e-6));
      CHECK(sched.lr(total) == Approx(min).epsilon(1e-6));
      // min_lr is respected after total_steps, and never undershot before.
      for (std::size_t s = warmup; s < 3 * total; ++s) CHECK(sched.lr(s) >= float(min) * (1 - 1e-6f));
      for (std::size_t s = total; s < 3 * total; ++s) CHECK(sched.lr(s) == Approx(min).epsilon(1e-6));
      // Non-increasing after the warm-up.
      for (std::size_t s = warmup; s + 1 < 3 * total; ++s) CHECK(sched.lr(s + 1) <= sched.lr(s));
    }
  }
  SECTION("cosine at a quarter") {
    LrSchedule sched(
        ScheduleOptions(float(base)).warmup_steps(warmup).total_steps(total).decay(Decay::cosine).min_lr(float(min)));
    CHECK(sched.lr(warmup + 4) == Approx(min + (base - min) * 0.5 * (1 + std::cos(pi / 4))).epsilon(1e-6));
  }
  SECTION("no warm-up") {
    LrSchedule constant(ScheduleOptions(0.5f));
    CHECK(constant.lr(0) == 0.5f);
    CHECK(constant.lr(12345) == 0.5f);
    LrSchedule linear(ScheduleOptions(0.5f).total_steps(10).decay(Decay::linear));
    CHECK(linear.lr(0) == Approx(0.5));
    CHECK(linear.lr(5) == Approx(0.25));
    CHECK(linear.lr(10) == 0.f);
    CHECK(linear.lr(11) == 0.f);
  }
  SECTION("warm-up of one step") {
    LrSchedule sched(ScheduleOptions(0.5f).warmup_steps(1));
    CHECK(sched.lr(0) == Approx(0.5));
    CHECK(sched.lr(1) == Approx(0.5));
  }
}

TEST_CASE("invalid LrSchedule settings are rejected", "[optim]") {
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(0.1f).warmup_steps(5).total_steps(5).decay(Decay::linear)),
                      Contains("LrSchedule") && Contains("total_steps (5)") && Contains("warmup_steps (5)"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(0.1f).warmup_steps(10).total_steps(3).decay(Decay::cosine)),
                      Contains("LrSchedule") && Contains("total_steps (3)"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(0.1f).decay(Decay::cosine)), Contains("total_steps (0)"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(0.1f).min_lr(0.2f)), Contains("LrSchedule: min_lr 0.2"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(0.1f).min_lr(-0.01f)), Contains("LrSchedule: min_lr -0.01"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(-0.1f)), Contains("LrSchedule: base_lr -0.1"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(kNaN)), Contains("LrSchedule: base_lr nan"));
  REQUIRE_THROWS_WITH(LrSchedule(ScheduleOptions(kInf)), Contains("LrSchedule: base_lr inf"));
  REQUIRE_NOTHROW(LrSchedule(ScheduleOptions(0.1f).warmup_steps(5).total_steps(6).decay(Decay::linear)));
  REQUIRE_NOTHROW(LrSchedule(ScheduleOptions(0.1f).min_lr(0.1f).total_steps(3).decay(Decay::cosine)));
  REQUIRE_NOTHROW(LrSchedule(ScheduleOptions(0.1f).warmup_steps(5)));  // constant needs no total_steps
}

TEST_CASE("check_finite names the step, the parameter and the position of the first NaN or Inf", "[optim][bad_input]") {
  using namespace xgrad;
  Tensor a(Array{1.f, 2.f, 3.f}, true), b(Array{4.f, 5.f}, true), unused(Array{1.f}, true);
  sum(a * a + 0.f).backward();
  sum(b).backward();
  const NamedTensors params = {{"a", a}, {"unused", unused}, {"b", b}};
  REQUIRE_NOTHROW(optim::check_finite(1, 0.5f, params));  // no gradient on "unused": skipped
  REQUIRE_THROWS_WITH(optim::check_finite(7, std::nanf(""), params), "step 7: the loss is NaN");
  REQUIRE_THROWS_WITH(optim::check_finite(7, -std::numeric_limits<float>::infinity(), params),
                      "step 7: the loss is -inf");
  b.mutable_grad()(1) = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(optim::check_finite(9, 0.5f, params), "step 9: the gradient of 'b' is inf at flat position 1");
  a.mutable_grad()(2) = std::nanf("");
  REQUIRE_THROWS_WITH(optim::check_finite(9, 0.5f, params), "step 9: the gradient of 'a' is NaN at flat position 2");
}

// ----------------------------------------------------------------------------------------------
// Hyperparameters in the state (torch.optim's param_groups)
// ----------------------------------------------------------------------------------------------

TEST_CASE("state_dict stores every hyperparameter and load_state_dict restores them", "[optim]") {
  SECTION("SGD") {
    NamedTensors p1 = make_params();
    SGD saved(p1, SGDOptions(0.05f).momentum(0.8f).weight_decay(0.01f).nesterov(true));
    train_step(p1, saved);
    saved.set_lr(0.0125f);  // as a schedule would: the state holds the rate in use
    const NamedArrays state = saved.state_dict();
    CHECK(entry(state, "SGD:lr") == 0.0125f);
    CHECK(entry(state, "SGD:momentum") == 0.8f);
    CHECK(entry(state, "SGD:dampening") == 0.f);
    CHECK(entry(state, "SGD:weight_decay") == 0.01f);
    CHECK(entry(state, "SGD:nesterov") == 1.f);

    NamedTensors p2 = clone(p1);
    SGD resumed(p2, SGDOptions(0.9f));  // other values everywhere
    resumed.load_state_dict(state);
    CHECK(resumed.lr() == 0.0125f);
    CHECK(resumed.options().lr() == 0.0125f);
    CHECK(resumed.options().momentum() == 0.8f);
    CHECK(resumed.options().weight_decay() == 0.01f);
    CHECK(resumed.options().nesterov());
    for (int i = 0; i < 3; ++i) {
      train_step(p1, saved);
      train_step(p2, resumed);
      REQUIRE(params_equal(p1, p2));
    }
  }
  SECTION("Adam and AdamW") {
    for (const bool decoupled : {false, true}) {
      INFO((decoupled ? "AdamW" : "Adam"));
      const std::string type = decoupled ? "AdamW" : "Adam";
      const AdamOptions o = AdamOptions(0.03f).beta1(0.8f).beta2(0.95f).eps(1e-6f).weight_decay(0.2f);
      NamedTensors p1 = make_params();
      std::unique_ptr<Adam> saved, resumed;
      if (decoupled) {
        saved = std::make_unique<AdamW>(p1, o);
      } else {
        saved = std::make_unique<Adam>(p1, o);
      }
      train_step(p1, *saved);
      NamedTensors p2 = clone(p1);
      if (decoupled) {
        resumed = std::make_unique<AdamW>(p2);  // the defaults
      } else {
        resumed = std::make_unique<Adam>(p2, AdamOptions());
      }
      const NamedArrays state = saved->state_dict();
      CHECK(entry(state, type + ":lr") == 0.03f);
      CHECK(entry(state, type + ":beta1") == 0.8f);
      CHECK(entry(state, type + ":beta2") == 0.95f);
      CHECK(entry(state, type + ":eps") == 1e-6f);
      CHECK(entry(state, type + ":weight_decay") == 0.2f);
      REQUIRE(resumed->lr() != 0.03f);
      resumed->load_state_dict(state);
      CHECK(resumed->lr() == 0.03f);
      CHECK(resumed->options().beta1() == 0.8f);
      CHECK(resumed->options().beta2() == 0.95f);
      CHECK(resumed->options().eps() == 1e-6f);
      CHECK(resumed->options().weight_decay() == 0.2f);
      for (int i = 0; i < 3; ++i) {
        train_step(p1, *saved);
        train_step(p2, *resumed);
        REQUIRE(params_equal(p1, p2));
      }
    }
  }
}

TEST_CASE("a state of another optimizer type, or with bad hyperparameters, is refused and changes nothing", "[optim]") {
  BadStateFixture f;
  auto& opt = f.opt;
  auto with = [&](const std::string& k, const Array& v) { return f.with(k, v); };

  SECTION("another type, named with this one") {
    NamedTensors ps = make_params();
    SGD sgd(ps, SGDOptions(0.1f).momentum(0.9f));
    train_step(ps, sgd);
    REQUIRE_THROWS_WITH(
        opt.load_state_dict(sgd.state_dict()),
        Contains("Adam: the state was saved by another optimizer type, 'SGD' (entry 'SGD:") && Contains(", not Adam"));
    NamedTensors pw = make_params();
    AdamW adamw(pw);
    train_step(pw, adamw);
    REQUIRE_THROWS_WITH(opt.load_state_dict(adamw.state_dict()),
                        Contains("another optimizer type, 'AdamW'") && Contains("not Adam"));
  }
  SECTION("invalid values") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:beta1", Array(1.5f))),
                        Contains("Adam: the state's hyperparameters are invalid") && Contains("beta1 1.5"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:lr", Array(-1.f))),
                        Contains("hyperparameters are invalid") && Contains("lr -1"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:eps", Array(0.f))), Contains("eps 0 must be finite and > 0"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:lr", Array(kNaN))),
                        Contains("hyperparameter 'Adam:lr' is not one finite value"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:lr", Array{0.1f, 0.2f})),
                        Contains("'Adam:lr' is not one finite value (shape (2))"));
  }
  SECTION("another number of parameters") {
    // A state of one parameter (an optimizer over a part of the model) given to one of two: it
    // loaded as if the other had never been updated.
    NamedTensors one = {make_params()[0]};
    Adam small(one, AdamOptions(0.05f));
    train_step(one, small);
    REQUIRE_THROWS_WITH(
        opt.load_state_dict(small.state_dict()),
        Contains("Adam: the state was saved by an optimizer of 1 parameters ('Adam:parameters'); this one has 2"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:parameters", Array(3.f))),
                        Contains("optimizer of 3 parameters"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:parameters", Array(kNaN))),
                        Contains("optimizer of nan parameters"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:parameters", Array{2.f, 2.f})),
                        Contains("Adam: state entry 'Adam:parameters' is not one count (shape (2))"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:beta2", Array(-0.5f))),
                        Contains("beta2 -0.5 is outside [0, 1)"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:weight_decay", Array(-1.f))),
                        Contains("weight_decay -1 is outside [0, 1e+30]"));
    NamedArrays twice = f.good;
    twice.emplace_back("Adam:parameters", Array(2.f));
    REQUIRE_THROWS_WITH(opt.load_state_dict(twice), Contains("'Adam:parameters' appears twice"));
  }
  SECTION("unknown, missing or repeated hyperparameters") {
    REQUIRE_THROWS_WITH(opt.load_state_dict(with("Adam:momentum", Array(0.9f))),
                        Contains("Adam: unexpected hyperparameter 'Adam:momentum' (Adam has no momentum)"));
    REQUIRE_THROWS_WITH(opt.load_state_dict(f.without("Adam:beta2")),
                        Contains("Adam: the state's hyperparameters are incomplete: no 'Adam:beta2'"));
    NamedArrays twice = f.good;
    twice.emplace_back("Adam:lr", Array(0.5f));
    REQUIRE_THROWS_WITH(opt.load_state_dict(twice), Contains("'Adam:lr' appears twice"));
  }
  f.require_untouched();
  CHECK(opt.lr() == 0.05f);
  CHECK(opt.options().weight_decay() == 0.01f);
}

TEST_CASE("a state saved without hyperparameters keeps the constructor's and says so once", "[optim]") {
  NamedTensors p1 = make_params();
  Adam saved(p1, AdamOptions(0.05f));
  train_step(p1, saved);
  const NamedArrays old_state = per_parameter(saved.state_dict());  // as states were written before
  NamedTensors p2 = clone(p1);
  Adam resumed(p2, AdamOptions(0.02f).beta1(0.7f));
  const std::string said = stderr_of([&] { resumed.load_state_dict(old_state); });
  CHECK(
      said ==
      "xgrad: Adam::load_state_dict: the state holds no hyperparameters (saved before xgrad stored them); keeping this "
      "optimizer's lr 0.02, beta1 0.7, beta2 0.999, eps 1e-08, weight_decay 0\n");
  CHECK(resumed.lr() == 0.02f);
  CHECK(resumed.options().beta1() == 0.7f);
  CHECK(states_equal(per_parameter(resumed.state_dict()), old_state));
  // An empty state resets silently.
  CHECK(stderr_of([&] { resumed.load_state_dict({}); }).empty());
}

TEST_CASE("optimizer parameter names may not hold ':' and must be UTF-8", "[optim]") {
  NamedTensors params = {{"a:b", param(Array{1.f})}};
  REQUIRE_THROWS_WITH(
      Adam(params, AdamOptions()),
      Contains("Adam: parameter name 'a:b' holds ':', which state_dict keeps for the hyperparameters (\"Adam:lr\")"));
  NamedTensors bad = {{std::string("w") + '\xfe', param(Array{1.f})}};
  REQUIRE_THROWS_WITH(SGD(bad, SGDOptions(0.1f)),
                      Contains("SGD: parameter name \"w\\xFE\" is not valid UTF-8 (byte 0xFE at offset 1)"));
}

TEST_CASE("SGD's dampening and weight decay (without Nesterov) round-trip through state_dict", "[optim]") {
  NamedTensors p1 = make_params();
  SGD saved(p1, SGDOptions(0.07f).momentum(0.6f).dampening(0.3f).weight_decay(0.02f));
  train_step(p1, saved);
  NamedTensors p2 = clone(p1);
  SGD resumed(p2, SGDOptions(0.5f).momentum(0.9f).nesterov(true));
  resumed.load_state_dict(saved.state_dict());
  CHECK(resumed.options().lr() == 0.07f);
  CHECK(resumed.options().momentum() == 0.6f);
  CHECK(resumed.options().dampening() == 0.3f);
  CHECK(resumed.options().weight_decay() == 0.02f);
  CHECK(!resumed.options().nesterov());
  for (int i = 0; i < 3; ++i) {
    train_step(p1, saved);
    train_step(p2, resumed);
    REQUIRE(params_equal(p1, p2));
  }
}
