// Optimizer parameter groups: agreement with torch.optim's param_groups on
// tests/fixtures/optim_groups.json (make_optim_group_fixtures.py writes it), the learning rate of
// groups under set_lr and set_group_lr, nn::split_for_weight_decay with optim::decay_groups,
// the state round trip with its group entries, and bad groups and bad group states.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "small_models.hpp"
#include "test_files.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/nn/weight_decay.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/optim/sgd.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using namespace xgrad::optim;
using Catch::Contains;
using nlohmann::json;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

const json& fixture() {
  static const json j = testing::load_fixture("optim_groups.json");
  return j;
}

Tensor param(const Array& values) { return Tensor(values, true); }

bool bit_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool states_equal(const NamedArrays& a, const NamedArrays& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !bit_equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

bool params_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!bit_equal(a[i].second.value(), b[i].second.value())) return false;
  }
  return true;
}

std::vector<std::string> names(const NamedTensors& params) {
  std::vector<std::string> out;
  for (const auto& [n, p] : params) out.push_back(n);
  return out;
}

std::map<std::string, std::vector<float>> as_map(const NamedArrays& state) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [k, v] : state) out[k] = std::vector<float>(v.begin(), v.end());
  return out;
}

float entry(const NamedArrays& state, const std::string& key) {
  for (const auto& [k, v] : state) {
    if (k == key) return v.data()[0];
  }
  FAIL("no state entry '" << key << "'");
  return 0.f;
}

// ---- the torch agreement ----

std::map<std::string, Tensor> fixture_params() {
  std::map<std::string, Tensor> out;
  for (const auto& [name, v] : fixture().at("init").items()) out.emplace(name, param(testing::to_array(v)));
  return out;
}

std::vector<ParamGroup> fixture_groups(const json& c, const std::map<std::string, Tensor>& params) {
  std::vector<ParamGroup> groups;
  for (const json& g : c.at("groups")) {
    NamedTensors members;
    for (const json& n : g.at("params")) members.emplace_back(n.get<std::string>(), params.at(n.get<std::string>()));
    ParamGroup group(members);
    for (const auto& [k, v] : g.at("set").items()) group.set(k, v.get<float>());
    groups.push_back(group);
  }
  return groups;
}

std::unique_ptr<Optimizer> fixture_optimizer(const json& c, const std::map<std::string, Tensor>& params) {
  const std::string kind = c.at("optimizer").get<std::string>();
  const json& o = c.at("options");
  const float lr = o.at("lr").get<float>();
  if (kind == "sgd") {
    return std::make_unique<SGD>(fixture_groups(c, params), SGDOptions(lr)
                                                                .momentum(o.at("momentum").get<float>())
                                                                .dampening(o.at("dampening").get<float>())
                                                                .weight_decay(o.at("weight_decay").get<float>())
                                                                .nesterov(o.at("nesterov").get<bool>()));
  }
  const AdamOptions ao = AdamOptions(lr)
                             .beta1(o.at("beta1").get<float>())
                             .beta2(o.at("beta2").get<float>())
                             .eps(o.at("eps").get<float>())
                             .weight_decay(o.at("weight_decay").get<float>());
  if (kind == "adam") return std::make_unique<Adam>(fixture_groups(c, params), ao);
  REQUIRE(kind == "adamw");
  return std::make_unique<AdamW>(fixture_groups(c, params), ao);
}

void run_case(const std::string& name) {
  const json& c = fixture().at("cases").at(name);
  const std::map<std::string, Tensor> params = fixture_params();
  const auto opt = fixture_optimizer(c, params);
  REQUIRE(opt->num_groups() == c.at("groups").size());
  std::unique_ptr<LrSchedule> schedule;
  if (c.contains("schedule")) {
    const json& s = c.at("schedule");
    schedule = std::make_unique<LrSchedule>(ScheduleOptions(s.at("base_lr").get<float>())
                                                .warmup_steps(s.at("warmup_steps").get<std::size_t>())
                                                .total_steps(s.at("total_steps").get<std::size_t>())
                                                .decay(Decay::cosine)
                                                .min_lr(s.at("min_lr").get<float>()));
  }
  const std::size_t steps = fixture().at("steps").get<std::size_t>();
  for (std::size_t k = 0; k < steps; ++k) {
    for (auto [pname, p] : params) {
      p.zero_grad();
      p.set_grad(testing::to_array(fixture().at("grads").at(pname).at(k)));
    }
    if (schedule) {
      const float lr = schedule->lr(k);
      opt->set_lr(lr);
      for (std::size_t g = 0; g < opt->num_groups(); ++g) {
        INFO("case " << name << ", step " << k << ", group " << g);
        CHECK(opt->group_lr(g) == lr * opt->group_lr_factor(g));
        // The script's schedule rounds its double arithmetic once more than schedule.cpp does.
        const float want = c.at("lrs").at(k).at(g).get<float>();
        CHECK(std::abs(opt->group_lr(g) - want) <= 1e-6f * want);
      }
    }
    opt->step();
    for (const auto& [pname, p] : params) {
      const double err = testing::rel_error(p.value(), testing::to_array(c.at("values").at(k).at(pname)));
      INFO("case " << name << ", step " << k << ", parameter '" << pname << "'");
      CAPTURE(err);
      CHECK(err <= 1e-5);
    }
  }
}

// ---- the small optimizers of the other tests ----

NamedTensors make_params() {
  return {{"w", param(Array{{0.5f, -1.25f, 2.f}, {0.75f, -0.1f, 1.5f}})},
          {"b", param(Array{0.2f, -0.4f, 0.9f})},
          {"v", param(Array{{1.f, -2.f}, {0.25f, 3.f}})}};
}

NamedTensors clone(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) out.emplace_back(name, param(p.value()));
  return out;
}

// A loss whose gradients change from step to step.
void train_step(const NamedTensors& params, Optimizer& opt) {
  opt.zero_grad();
  Tensor total;
  for (const auto& [name, p] : params) {
    Tensor term = sum(tanh(p * 1.7f)) + sum((p - 0.3f) * (p - 0.3f) * (p + 1.1f) * 0.5f);
    total = total.defined() ? total + term : term;
  }
  total.backward();
  opt.step();
}

// {w, v} with weight decay 0.1, {b} with lr 0.003 and no weight decay.
std::vector<ParamGroup> two_groups(const NamedTensors& p) {
  return {ParamGroup({p[0], p[2]}).weight_decay(0.1f), ParamGroup({p[1]}).lr(0.003f).weight_decay(0.f)};
}

}  // namespace

TEST_CASE("optim groups agree with torch.optim param_groups: SGD", "[optim][groups][torch]") { run_case("sgd_groups"); }

TEST_CASE("optim groups agree with torch.optim param_groups: Adam", "[optim][groups][torch]") {
  run_case("adam_groups");
}

TEST_CASE("optim groups agree with torch.optim param_groups: AdamW", "[optim][groups][torch]") {
  run_case("adamw_groups");
}

TEST_CASE("optim groups agree with torch.optim param_groups: AdamW with a schedule scaling each group",
          "[optim][groups][torch]") {
  run_case("adamw_groups_schedule");
}

TEST_CASE("one group that sets nothing is the optimizer without groups, bit for bit and in its state",
          "[optim][groups]") {
  NamedTensors p1 = make_params(), p2 = clone(p1);
  AdamW plain(p1, AdamOptions(0.02f).weight_decay(0.05f));
  AdamW grouped({ParamGroup(p2)}, AdamOptions(0.02f).weight_decay(0.05f));
  REQUIRE(grouped.num_groups() == 1);
  for (int i = 0; i < 3; ++i) {
    train_step(p1, plain);
    train_step(p2, grouped);
    REQUIRE(params_equal(p1, p2));
  }
  CHECK(states_equal(plain.state_dict(), grouped.state_dict()));
  for (const auto& [key, v] : plain.state_dict()) {
    INFO(key);
    CHECK(key.find("group") == std::string::npos);
  }
}

TEST_CASE("set_lr scales every group by its factor, set_group_lr sets one group", "[optim][groups]") {
  NamedTensors p = make_params();
  AdamW opt(two_groups(p), AdamOptions(0.01f));
  REQUIRE(opt.num_groups() == 2);
  CHECK(opt.lr() == 0.01f);
  CHECK(opt.group_lr(0) == 0.01f);
  CHECK(opt.group_lr(1) == 0.003f);  // exactly as given
  CHECK(opt.group_lr_factor(0) == 1.f);
  CHECK(opt.group_lr_factor(1) == 0.003f / 0.01f);
  CHECK(opt.group_options(0).weight_decay() == 0.1f);
  CHECK(opt.group_options(1).weight_decay() == 0.f);
  CHECK(opt.group_options(1).lr() == 0.003f);
  CHECK(opt.options().weight_decay() == 0.f);  // the options given: AdamOptions(lr) has none
  CHECK(names(opt.params()) == std::vector<std::string>{"w", "v", "b"});
  CHECK(names(opt.group_params(0)) == std::vector<std::string>{"w", "v"});
  CHECK(names(opt.group_params(1)) == std::vector<std::string>{"b"});

  opt.set_lr(0.02f);
  CHECK(opt.lr() == 0.02f);
  CHECK(opt.group_lr(0) == 0.02f);
  CHECK(opt.group_lr(1) == 0.02f * (0.003f / 0.01f));
  CHECK(opt.group_options(1).lr() == opt.group_lr(1));

  opt.set_group_lr(1, 0.001f);
  CHECK(opt.group_lr(1) == 0.001f);
  CHECK(opt.group_lr(0) == 0.02f);
  CHECK(opt.group_lr_factor(1) == 0.001f / 0.02f);
  opt.set_lr(0.04f);
  CHECK(opt.group_lr(1) == 0.04f * (0.001f / 0.02f));

  SECTION("a group at lr 0 stays frozen under set_lr and step") {
    opt.set_group_lr(0, 0.f);
    opt.set_lr(0.5f);
    CHECK(opt.group_lr(0) == 0.f);
    CHECK(opt.group_lr(1) == 0.5f * (0.001f / 0.02f));
    const Array w = p[0].second.value(), b = p[1].second.value();
    // lr 0 and AdamW's decay 1 - 0 * wd leave group 0 as it was; group 1 moves.
    train_step(p, opt);
    CHECK(bit_equal(p[0].second.value(), w));
    CHECK(!bit_equal(p[1].second.value(), b));
  }
  SECTION("a group given lr 0 keeps it, also when the optimizer's lr is 0") {
    NamedTensors q = clone(p);
    SGD sgd({ParamGroup({q[0]}).lr(0.f), ParamGroup({q[1], q[2]})}, SGDOptions(0.f));
    sgd.set_lr(0.3f);
    CHECK(sgd.group_lr(0) == 0.f);
    CHECK(sgd.group_lr(1) == 0.3f);
    CHECK(sgd.group_options(1).lr() == 0.3f);
  }
}

TEST_CASE("nn::split_for_weight_decay splits a LanguageModel by module type, each parameter once",
          "[optim][groups][nn]") {
  Generator gen(3);
  nn::LanguageModel model(testing::small_lm(), gen);
  const auto [decay, no_decay] = nn::split_for_weight_decay(model);
  std::vector<std::string> want_decay, want_no_decay = {"tok_emb.weight", "pos_emb.weight"};
  for (const std::string b : {"blocks.0.", "blocks.1."}) {
    for (const char* w : {"w_q", "w_k", "w_v", "w_o"}) want_decay.push_back(b + "attn." + w + ".weight");
    want_decay.push_back(b + "ffn.linear1.weight");
    want_decay.push_back(b + "ffn.linear2.weight");
    want_no_decay.push_back(b + "attn.norm.weight");
    want_no_decay.push_back(b + "attn.norm.bias");
    for (const char* w : {"w_q", "w_k", "w_v", "w_o"}) want_no_decay.push_back(b + "attn." + w + ".bias");
    want_no_decay.push_back(b + "ffn.norm.weight");
    want_no_decay.push_back(b + "ffn.norm.bias");
    want_no_decay.push_back(b + "ffn.linear1.bias");
    want_no_decay.push_back(b + "ffn.linear2.bias");
  }
  want_decay.push_back("head.weight");
  want_no_decay.insert(want_no_decay.end(), {"final_norm.weight", "final_norm.bias", "head.bias"});
  const std::vector<std::string> got_decay = names(decay), got_no_decay = names(no_decay);
  CHECK(std::multiset<std::string>(got_decay.begin(), got_decay.end()) ==
        std::multiset<std::string>(want_decay.begin(), want_decay.end()));
  CHECK(std::multiset<std::string>(got_no_decay.begin(), got_no_decay.end()) ==
        std::multiset<std::string>(want_no_decay.begin(), want_no_decay.end()));
  // Every parameter in exactly one of the two, in named_parameters() order within each.
  const NamedTensors all = model.named_parameters();
  REQUIRE(decay.size() + no_decay.size() == all.size());
  std::size_t i = 0, j = 0;
  for (const auto& [name, p] : all) {
    const bool in_decay = i < decay.size() && decay[i].first == name;
    const bool in_no = j < no_decay.size() && no_decay[j].first == name;
    INFO(name);
    REQUIRE(in_decay != in_no);
    CHECK((in_decay ? decay[i] : no_decay[j]).second.is_same(p));
    (in_decay ? i : j)++;
  }

  AdamW opt(decay_groups(nn::split_for_weight_decay(model), 0.1f), AdamOptions(3e-4f));
  REQUIRE(opt.num_groups() == 2);
  CHECK(names(opt.group_params(0)) == got_decay);
  CHECK(names(opt.group_params(1)) == got_no_decay);
  CHECK(opt.group_options(0).weight_decay() == 0.1f);
  CHECK(opt.group_options(1).weight_decay() == 0.f);
  CHECK(opt.group_lr(0) == 3e-4f);
  CHECK(opt.group_lr(1) == 3e-4f);
}

namespace {
// A module of the other kinds: an RMSNorm, a Linear without bias, an Embedding registered
// under two parents (as tied tables are), a parameter of its own type of each rank, and an
// unknown module holding the Embedding's table as its own 2-D parameter.
class HoldsTable : public nn::Module {
 public:
  explicit HoldsTable(const Tensor& table) { register_parameter("table", table); }
};

class Wrap : public nn::Module {
 public:
  explicit Wrap(std::shared_ptr<nn::Module> m) { register_module("m", std::move(m)); }
};

class Mixed : public nn::Module {
 public:
  explicit Mixed(Generator& gen) {
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(4));
    proj = register_module("proj", std::make_shared<nn::Linear>(4, 3, false, gen));
    emb = register_module("emb", std::make_shared<nn::Embedding>(5, 4, gen));
    register_module("holder", std::make_shared<HoldsTable>(emb->weight));
    register_module("again", std::make_shared<Wrap>(emb));
    register_parameter("scalar", Tensor(Array(0.5f)));
    register_parameter("gains", Tensor::ones({3}));
    register_parameter("kernel", Tensor::ones({2, 2, 2}));
  }
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> proj;
  std::shared_ptr<nn::Embedding> emb;
};

}  // namespace

TEST_CASE("nn::split_for_weight_decay: RMSNorm, a Linear without bias, shared tables, 0-, 1- and 3-D parameters",
          "[optim][groups][nn]") {
  Generator gen(4);
  Mixed m(gen);
  // named_parameters lists the shared table once, under its first name.
  const NamedTensors all = m.named_parameters();
  REQUIRE(names(all) ==
          std::vector<std::string>{"scalar", "gains", "kernel", "norm.weight", "proj.weight", "emb.weight"});
  const auto [decay, no_decay] = nn::split_for_weight_decay(m);
  CHECK(names(decay) == std::vector<std::string>{"kernel", "proj.weight"});
  // holder.table and again.m.weight are emb.weight: once, under its first name, with no decay as
  // its Embedding says (HoldsTable alone would decay a 2-D parameter).
  CHECK(names(no_decay) == std::vector<std::string>{"scalar", "gains", "norm.weight", "emb.weight"});
  REQUIRE_NOTHROW(AdamW(decay_groups(decay, no_decay, 0.1f), AdamOptions(1e-3f)));
  // The same tensor under two names, given by hand, is refused naming both.
  NamedTensors twice = all;
  twice.emplace_back("holder.table", m.emb->weight);
  REQUIRE_THROWS_WITH(AdamW(twice, AdamOptions(1e-3f)),
                      Contains("AdamW: parameter 'holder.table' is the same tensor as 'emb.weight'"));
}

TEST_CASE("optim::decay_groups: the decay group first, an empty list gives no group", "[optim][groups]") {
  NamedTensors p = make_params();
  const std::vector<ParamGroup> both = decay_groups({p[0]}, {p[1], p[2]}, 0.2f);
  REQUIRE(both.size() == 2);
  CHECK(names(both[0].params()) == std::vector<std::string>{"w"});
  CHECK(both[0].overrides() == std::vector<std::pair<std::string, float>>{{"weight_decay", 0.2f}});
  CHECK(names(both[1].params()) == std::vector<std::string>{"b", "v"});
  CHECK(both[1].overrides() == std::vector<std::pair<std::string, float>>{{"weight_decay", 0.f}});
  const std::vector<ParamGroup> one = decay_groups({}, {p[1]}, 0.2f);
  REQUIRE(one.size() == 1);
  CHECK(names(one[0].params()) == std::vector<std::string>{"b"});
  // Setting a hyperparameter again replaces it.
  CHECK(ParamGroup(p).lr(1.f).weight_decay(2.f).lr(3.f).overrides() ==
        std::vector<std::pair<std::string, float>>{{"lr", 3.f}, {"weight_decay", 2.f}});
}

TEST_CASE("a grouped optimizer's state stores each group, and a fresh optimizer resumes bit for bit",
          "[optim][groups]") {
  SECTION("AdamW") {
    NamedTensors p1 = make_params();
    AdamW saved(two_groups(p1), AdamOptions(0.01f));
    for (int i = 0; i < 3; ++i) train_step(p1, saved);
    saved.set_lr(0.02f);  // as a schedule would
    saved.set_group_lr(0, 0.015f);
    const NamedArrays state = saved.state_dict();
    CHECK(entry(state, "AdamW:lr") == 0.02f);
    CHECK(entry(state, "AdamW:weight_decay") == 0.f);
    CHECK(entry(state, "AdamW:parameters") == 3.f);
    CHECK(entry(state, "AdamW:groups") == 2.f);
    CHECK(entry(state, "AdamW:group0:lr") == 0.015f);
    CHECK(entry(state, "AdamW:group0:lr_factor") == 0.015f / 0.02f);
    CHECK(entry(state, "AdamW:group0:weight_decay") == 0.1f);
    CHECK(entry(state, "AdamW:group1:lr") == 0.02f * (0.003f / 0.01f));
    CHECK(entry(state, "AdamW:group1:weight_decay") == 0.f);
    CHECK(entry(state, "AdamW:group1:beta2") == 0.999f);
    CHECK(entry(state, "AdamW:group_of:w") == 0.f);
    CHECK(entry(state, "AdamW:group_of:v") == 0.f);
    CHECK(entry(state, "AdamW:group_of:b") == 1.f);

    // Other hyperparameters everywhere, the groups given in another order of members.
    NamedTensors p2 = clone(p1);
    AdamW resumed({ParamGroup({p2[2], p2[0]}).weight_decay(0.7f).beta1(0.5f), ParamGroup({p2[1]}).lr(0.5f)},
                  AdamOptions(0.9f).weight_decay(0.3f));
    resumed.load_state_dict(state);
    // The same entries, group 0's members listed in another order.
    CHECK(as_map(resumed.state_dict()) == as_map(state));
    CHECK(names(resumed.group_params(0)) == std::vector<std::string>{"v", "w"});
    CHECK(resumed.lr() == 0.02f);
    CHECK(resumed.options().weight_decay() == 0.f);
    for (std::size_t g = 0; g < 2; ++g) {
      INFO("group " << g);
      CHECK(resumed.group_lr(g) == saved.group_lr(g));
      CHECK(resumed.group_lr_factor(g) == saved.group_lr_factor(g));
      CHECK(resumed.group_options(g).weight_decay() == saved.group_options(g).weight_decay());
      CHECK(resumed.group_options(g).beta1() == saved.group_options(g).beta1());
    }
    for (int i = 0; i < 3; ++i) {
      train_step(p1, saved);
      train_step(p2, resumed);
      REQUIRE(bit_equal(p1[0].second.value(), p2[0].second.value()));
      REQUIRE(bit_equal(p1[1].second.value(), p2[1].second.value()));
      REQUIRE(bit_equal(p1[2].second.value(), p2[2].second.value()));
      saved.set_lr(0.01f / static_cast<float>(i + 2));
      resumed.set_lr(0.01f / static_cast<float>(i + 2));
    }
  }
  SECTION("SGD with a group momentum, into the same layout: the state comes back whole") {
    NamedTensors p1 = make_params();
    const SGDOptions o = SGDOptions(0.05f).momentum(0.9f);
    SGD saved({ParamGroup({p1[0], p1[2]}).weight_decay(0.01f), ParamGroup({p1[1]}).lr(0.2f).momentum(0.5f)}, o);
    for (int i = 0; i < 2; ++i) train_step(p1, saved);
    NamedTensors p2 = clone(p1);
    SGD resumed({ParamGroup({p2[0], p2[2]}), ParamGroup({p2[1]}).nesterov(true)}, o);
    resumed.load_state_dict(saved.state_dict());
    CHECK(states_equal(resumed.state_dict(), saved.state_dict()));
    CHECK(resumed.group_options(1).momentum() == 0.5f);
    CHECK(!resumed.group_options(1).nesterov());
    CHECK(resumed.group_options(0).weight_decay() == 0.01f);
    for (int i = 0; i < 3; ++i) {
      train_step(p1, saved);
      train_step(p2, resumed);
      REQUIRE(params_equal(p1, p2));
    }
  }
  SECTION("one group with a weight decay of its own writes its group, and loads into one group only") {
    NamedTensors p1 = make_params();
    Adam saved({ParamGroup(p1).weight_decay(0.2f)}, AdamOptions(0.01f));
    train_step(p1, saved);
    const NamedArrays state = saved.state_dict();
    CHECK(entry(state, "Adam:groups") == 1.f);
    CHECK(entry(state, "Adam:weight_decay") == 0.f);
    CHECK(entry(state, "Adam:group0:weight_decay") == 0.2f);
    NamedTensors p2 = clone(p1);
    Adam plain(p2, AdamOptions(0.01f));
    plain.load_state_dict(state);
    CHECK(plain.group_options(0).weight_decay() == 0.2f);
    CHECK(plain.options().weight_decay() == 0.f);
    train_step(p1, saved);
    train_step(p2, plain);
    CHECK(params_equal(p1, p2));
  }
}

TEST_CASE("a state of other groups is refused naming what differs, and changes nothing", "[optim][groups]") {
  NamedTensors p = make_params();
  AdamW opt(two_groups(p), AdamOptions(0.01f));
  train_step(p, opt);
  const NamedArrays before = opt.state_dict();
  auto with = [&](const std::string& key, const Array& v) {
    NamedArrays s = before;
    bool found = false;
    for (auto& [k, a] : s) {
      if (k == key) {
        a = v;
        found = true;
      }
    }
    if (!found) s.emplace_back(key, v);
    return s;
  };
  auto without = [&](const std::string& key) {
    NamedArrays s;
    for (const auto& e : before) {
      if (e.first != key) s.push_back(e);
    }
    return s;
  };

  // Another membership: w moved to group 1.
  NamedTensors q = clone(p);
  AdamW moved({ParamGroup({q[2]}), ParamGroup({q[1], q[0]})}, AdamOptions(0.01f));
  train_step(q, moved);
  REQUIRE_THROWS_WITH(opt.load_state_dict(moved.state_dict()),
                      Contains("AdamW: the state puts parameter 'w' in group 1; this optimizer has it in group 0"));
  // Another number of groups.
  AdamW three({ParamGroup({q[0]}), ParamGroup({q[1]}), ParamGroup({q[2]})}, AdamOptions(0.01f));
  REQUIRE_THROWS_WITH(opt.load_state_dict(three.state_dict()),
                      Contains("AdamW: the state has 3 parameter groups ('AdamW:groups'); this optimizer has 2"));
  // A state of one group (no group entries, as every optimizer without groups writes).
  AdamW plain(q, AdamOptions(0.01f));
  REQUIRE_THROWS_WITH(opt.load_state_dict(plain.state_dict()),
                      Contains("AdamW: the state holds one parameter group (no 'AdamW:groups'); this optimizer has 2"));
  REQUIRE_THROWS_WITH(plain.load_state_dict(before),
                      Contains("AdamW: the state has 2 parameter groups ('AdamW:groups'); this optimizer has 1"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(without("AdamW:group_of:b")),
                      Contains("AdamW: the state names no group for parameter 'b' (no 'AdamW:group_of:b')"));
  REQUIRE_THROWS_WITH(
      opt.load_state_dict(with("AdamW:group_of:ghost", Array(1.f))),
      Contains("AdamW: the state puts parameter 'ghost' in group 1, but this optimizer has no parameter 'ghost'"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group_of:b", Array(0.5f))),
                      Contains("AdamW: state entry 'AdamW:group_of:b' is not a group index"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(without("AdamW:groups")),
                      Contains("AdamW: state entry 'AdamW:group0:lr' belongs to parameter groups, but the state has no "
                               "'AdamW:groups'"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:groups", Array(0.f))),
                      Contains("AdamW: state entry 'AdamW:groups' is not a count of groups"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group2:lr", Array(0.1f))),
                      Contains("AdamW: the state holds hyperparameters of group 2 ('AdamW:group2:lr'), but it has 2 "
                               "groups"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(without("AdamW:group1:beta2")),
                      Contains("AdamW: the state's hyperparameters are incomplete: no 'AdamW:group1:beta2'"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(without("AdamW:group0:lr_factor")),
                      Contains("incomplete: no 'AdamW:group0:lr_factor'"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group1:momentum", Array(0.9f))),
                      Contains("AdamW: unexpected hyperparameter 'AdamW:group1:momentum' (AdamW has no momentum)"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group1:weight_decay", Array(-1.f))),
                      Contains("AdamW: the state's hyperparameters are invalid (AdamW: group 1: weight_decay -1 is "
                               "outside [0, 1e+30])"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group0:lr_factor", Array(-2.f))),
                      Contains("(AdamW: group 0: lr_factor -2 is outside [0, 1e+30])"));
  REQUIRE_THROWS_WITH(opt.load_state_dict(with("AdamW:group1:lr", Array(kNaN))),
                      Contains("AdamW: hyperparameter 'AdamW:group1:lr' is not one finite value"));
  NamedArrays twice = before;
  twice.emplace_back("AdamW:group_of:w", Array(0.f));
  REQUIRE_THROWS_WITH(opt.load_state_dict(twice), Contains("AdamW: state entry 'AdamW:group_of:w' appears twice"));
  // Nothing changed.
  CHECK(states_equal(opt.state_dict(), before));
  CHECK(opt.group_lr(1) == 0.003f);
  CHECK(opt.group_options(0).weight_decay() == 0.1f);
}

TEST_CASE("bad groups are refused naming the optimizer, the group and the value", "[optim][groups][bad_input]") {
  NamedTensors p = make_params();
  REQUIRE_THROWS_WITH(AdamW(std::vector<ParamGroup>{}, AdamOptions(0.01f)),
                      Contains("AdamW: no parameter groups to optimize"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup(p), ParamGroup({})}, AdamOptions(0.01f)),
                      Contains("AdamW: group 1 has no parameters"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({})}, SGDOptions(0.1f)), Contains("SGD: no parameters to optimize"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0], p[1]}), ParamGroup({p[2], p[1]})}, AdamOptions(0.01f)),
                      Contains("AdamW: parameter 'b' is in group 0 and in group 1 (a parameter belongs to one group)"));
  REQUIRE_THROWS_WITH(
      Adam({ParamGroup({p[0]}), ParamGroup({{"w2", p[0].second}})}, AdamOptions(0.01f)),
      Contains(
          "Adam: parameter 'w2' of group 1 is the same tensor as 'w' of group 0 (a parameter belongs to one group)"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({p[0]}), ParamGroup({{"w", p[1].second}})}, SGDOptions(0.1f)),
                      Contains("SGD: two parameters are named 'w', in group 0 and in group 1"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0]}), ParamGroup({p[1]}).weight_decay(-0.1f)}, AdamOptions(0.01f)),
                      Contains("AdamW: group 1: weight_decay -0.1 is outside [0, 1e+30]"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0]}).lr(-1.f), ParamGroup({p[1]})}, AdamOptions(0.01f)),
                      Contains("AdamW: group 0: learning rate -1 must be finite and >= 0"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0]}), ParamGroup({p[1]}).lr(kNaN)}, AdamOptions(0.01f)),
                      Contains("AdamW: group 1: learning rate nan must be finite and >= 0"));
  REQUIRE_THROWS_WITH(Adam({ParamGroup({p[0]}), ParamGroup({p[1]}).beta1(1.5f)}, AdamOptions(0.01f)),
                      Contains("Adam: group 1: beta1 1.5 is outside [0, 1)"));
  REQUIRE_THROWS_WITH(Adam({ParamGroup({p[0]}).eps(0.f)}, AdamOptions(0.01f)),
                      Contains("Adam: group 0: eps 0 must be finite and > 0"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({p[0]}), ParamGroup({p[1]}).momentum(1.f)}, SGDOptions(0.1f)),
                      Contains("SGD: group 1: momentum 1 is outside [0, 1)"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({p[0]}), ParamGroup({p[1]}).nesterov(true)}, SGDOptions(0.1f)),
                      Contains("SGD: group 1: Nesterov momentum needs momentum > 0 and dampening 0"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({p[0]}).set("nesterov", 0.5f)}, SGDOptions(0.1f).momentum(0.9f)),
                      Contains("SGD: group 0: nesterov 0.5 is not 0 or 1"));
  REQUIRE_THROWS_WITH(Adam({ParamGroup({p[0]}).momentum(0.9f)}, AdamOptions(0.01f)),
                      Contains("Adam: group 0 sets momentum, which Adam does not have (it has lr, beta1, beta2, eps, "
                               "weight_decay)"));
  REQUIRE_THROWS_WITH(SGD({ParamGroup({p[0]}).beta2(0.9f)}, SGDOptions(0.1f)),
                      Contains("SGD: group 0 sets beta2, which SGD does not have (it has lr, momentum, dampening, "
                               "weight_decay, nesterov)"));
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0]}), ParamGroup({p[1]}).lr(1e-3f)}, AdamOptions(0.f)),
                      Contains("AdamW: group 1: learning rate 0.001 cannot be a multiple of the optimizer's learning "
                               "rate 0"));
  // The options are checked as without groups.
  REQUIRE_THROWS_WITH(AdamW({ParamGroup({p[0]})}, AdamOptions(0.01f).beta2(1.f)),
                      Contains("AdamW: beta2 1 is outside [0, 1)"));

  AdamW opt(two_groups(p), AdamOptions(0.01f));
  REQUIRE_THROWS_WITH(opt.group_lr(2), Contains("AdamW: there is no group 2 (the optimizer has 2)"));
  REQUIRE_THROWS_WITH(opt.group_options(5), Contains("AdamW: there is no group 5"));
  REQUIRE_THROWS_WITH(opt.group_params(2), Contains("AdamW: there is no group 2"));
  REQUIRE_THROWS_WITH(opt.set_group_lr(3, 0.1f), Contains("AdamW: there is no group 3"));
  REQUIRE_THROWS_WITH(opt.set_group_lr(1, -1.f), Contains("AdamW: group 1: learning rate -1 must be finite and >= 0"));
  REQUIRE_THROWS_WITH(opt.set_group_lr(1, kNaN), Contains("AdamW: group 1: learning rate nan"));
  CHECK(opt.group_lr(1) == 0.003f);
  opt.set_lr(0.f);
  REQUIRE_THROWS_WITH(opt.set_group_lr(0, 0.5f), Contains("AdamW: group 0: learning rate 0.5 cannot be a multiple"));
  opt.set_lr(0.01f);
  CHECK(opt.group_lr(1) == 0.01f * (0.003f / 0.01f));
}

TEST_CASE("a LanguageModel trained with the decay groups resumes bit for bit from a checkpoint",
          "[optim][groups][nn][gemm]") {
  const IndexArray ids = {{1, 4, 2, 7, 3}, {9, 0, 5, 5, 10}}, targets = {{4, 2, 7, 3, 8}, {0, 5, 5, 10, 1}};
  auto step = [&](nn::LanguageModel& model, Optimizer& opt) {
    opt.zero_grad();
    model.loss(ids, targets).backward();
    opt.step();
  };
  Generator gen(11);
  nn::LanguageModel model(testing::small_lm(), gen);
  AdamW opt(decay_groups(nn::split_for_weight_decay(model), 0.1f), AdamOptions(3e-3f));
  for (int i = 0; i < 2; ++i) step(model, opt);
  opt.set_lr(1.5e-3f);
  testing::TempDir dir("xgrad_optim_groups");
  weights::save_checkpoint(dir.file("lm.safetensors"), model, opt.state_dict());

  Generator other(12);
  nn::LanguageModel resumed(testing::small_lm(), other);
  const weights::Checkpoint c = weights::load_checkpoint(dir.file("lm.safetensors"), resumed);
  AdamW resumed_opt(decay_groups(nn::split_for_weight_decay(resumed), 0.5f), AdamOptions(1.f));
  resumed_opt.load_state_dict(c.optimizer_state);
  CHECK(resumed_opt.lr() == 1.5e-3f);
  CHECK(resumed_opt.group_options(0).weight_decay() == 0.1f);
  CHECK(resumed_opt.group_options(1).weight_decay() == 0.f);
  for (int i = 0; i < 2; ++i) {
    step(model, opt);
    step(resumed, resumed_opt);
  }
  CHECK(params_equal(model.named_parameters(), resumed.named_parameters()));
  CHECK(states_equal(opt.state_dict(), resumed_opt.state_dict()));
}

TEST_CASE("a state without hyperparameters loads into a grouped optimizer, which keeps its groups", "[optim][groups]") {
  NamedTensors p1 = make_params();
  AdamW saved(two_groups(p1), AdamOptions(0.01f));
  train_step(p1, saved);
  NamedArrays old_state;  // as states were written before hyperparameters were stored
  for (const auto& e : saved.state_dict()) {
    if (e.first.find(':') == std::string::npos) old_state.push_back(e);
  }
  REQUIRE(old_state.size() == 9);
  NamedTensors p2 = clone(p1);
  AdamW resumed(two_groups(p2), AdamOptions(0.01f));
  resumed.set_group_lr(1, 0.004f);
  resumed.load_state_dict(old_state);
  CHECK(resumed.num_groups() == 2);
  CHECK(resumed.group_lr(1) == 0.004f);
  CHECK(resumed.group_options(0).weight_decay() == 0.1f);
  CHECK(entry(resumed.state_dict(), "w.step") == 1.f);
}
