// Fine-tuning a part of a model: freezing by name pattern, LoRA adapters (forward, gradients,
// merge, hook points), and PEFT's adapter folders against the float64 mirror of PEFT's LoRA Linear
// (tests/fixtures/make_peft_fixtures.py).
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "error_of.hpp"
#include "fixture.hpp"
#include "module_gradcheck.hpp"
#include "test_files.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/inspect/residual_decomposition.hpp"
#include "xgrad/nn/freeze.hpp"
#include "xgrad/nn/lora.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/peft.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;
using testing::error_of;

namespace {

std::string peft_dir(const std::string& name) { return testing::fixture_path("peft/" + name); }

std::shared_ptr<nn::LanguageModel> base_model() { return weights::load_hf_model(peft_dir("base")); }

IndexArray as_ids(const Array& a) {
  IndexArray out = IndexArray::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = static_cast<std::int64_t>(a.data()[i]);
  return out;
}

std::map<std::string, Array> expected(const std::string& name) {
  std::map<std::string, Array> out;
  for (auto& [n, a] : load_safetensors(peft_dir(name) + "/expected.safetensors").tensors) out.emplace(n, a);
  return out;
}

// Every parameter's value, by name, to show that a refused call changed nothing.
std::map<std::string, Array> snapshot(const nn::Module& m) {
  std::map<std::string, Array> out;
  for (const auto& [n, p] : m.named_parameters()) out.emplace(n, p.value());
  return out;
}

nn::LanguageModelOptions small_options() {
  return nn::LanguageModelOptions::llama_style(19, 16, 4, 2, 2).max_len(16).dropout(0.f);
}

IndexArray small_ids() { return IndexArray({{1, 5, 7, 2, 9, 3}, {4, 4, 0, 18, 6, 11}}); }

}  // namespace

TEST_CASE("freeze: patterns select parameters by glob, regular expression, last names or Hugging Face's names",
          "[lora][gemm]") {
  nn::LanguageModel model(small_options());
  CHECK(nn::matches_name_pattern("blocks.*.attn.w_q.weight", "blocks.1.attn.w_q.weight"));
  CHECK_FALSE(nn::matches_name_pattern("blocks.*.attn.w_q.weight", "blocks.1.attn.w_k.weight"));
  CHECK(nn::matches_name_pattern("w_q.weight", "blocks.1.attn.w_q.weight"));      // PEFT's suffix rule
  CHECK_FALSE(nn::matches_name_pattern("q.weight", "blocks.1.attn.w_q.weight"));  // whole last names only
  CHECK(nn::matches_name_pattern("re:blocks\\.[01]\\.ffn\\..*", "blocks.0.ffn.gate.weight"));
  CHECK_FALSE(nn::matches_name_pattern("re:blocks\\.0", "blocks.0.ffn.gate.weight"));  // the whole name
  CHECK(nn::matches_name_pattern("blocks.?.ffn.*", "blocks.1.ffn.norm.weight"));

  const nn::NameAliases hf = weights::hf_parameter_names(model.options(), "llama");
  CHECK(hf.at("blocks.1.attn.w_q.weight") == "model.layers.1.self_attn.q_proj.weight");
  const auto frozen = nn::freeze(model, {"tok_emb.weight", "model.layers.0.*"}, hf);
  CHECK(frozen.size() == 1 + 9);  // the embedding; layer 0's two norms, four attention and three FFN matrices
  std::size_t trainable = 0;
  for (const auto& [n, p] : model.named_parameters()) {
    const bool want_frozen = n == "tok_emb.weight" || n.rfind("blocks.0.", 0) == 0;
    INFO(n);
    CHECK(p.requires_grad() == !want_frozen);
    trainable += !want_frozen;
  }
  CHECK(model.named_trainable_parameters().size() == trainable);

  // Frozen parameters record no gradient; the others do.
  model.loss(small_ids(), small_ids()).backward();
  for (const auto& [n, p] : model.named_parameters()) {
    INFO(n);
    CHECK(p.has_grad() == p.requires_grad());
  }
  CHECK(nn::unfreeze(model, {"tok_emb.weight"}).size() == 1);
  CHECK(model.parameter("tok_emb.weight").requires_grad());
}

TEST_CASE(
    "freeze: a pattern that matches nothing, an empty one and a broken expression are refused by name, "
    "and nothing changes",
    "[lora]") {
  nn::LanguageModel model(small_options());
  const std::string e = error_of([&] { nn::freeze(model, {"blocks.*", "decoder.*"}); });
  CHECK_THAT(e, Contains("freeze") && Contains("'decoder.*' matches no parameter"));
  for (const auto& [n, p] : model.named_parameters()) CHECK(p.requires_grad());  // blocks.* was not applied
  CHECK_THAT(error_of([&] { nn::freeze(model, {""}); }), Contains("freeze: a pattern is empty"));
  CHECK_THAT(error_of([&] { nn::freeze(model, {"re:blocks.(("}); }),
             Contains("'re:blocks.((' is not a regular expression"));
  CHECK_THAT(error_of([&] { nn::freeze(model, {std::string("blocks\xff")}); }), Contains("freeze"));
}

TEST_CASE("freeze: an optimizer over the trainable parameters holds state for those alone", "[lora][gemm]") {
  nn::LanguageModel full(small_options()), part(small_options());
  nn::freeze(part, {"blocks.*", "tok_emb.*"});
  optim::AdamW a(full.named_trainable_parameters(), optim::AdamOptions(1e-3f));
  optim::AdamW b(part.named_trainable_parameters(), optim::AdamOptions(1e-3f));
  for (auto* m : {&full, &part}) m->loss(small_ids(), small_ids()).backward();
  a.step();
  b.step();
  std::size_t trained = 0;
  for (const auto& [n, p] : part.named_trainable_parameters()) trained += p.size();
  CHECK(a.state_bytes() == 2 * sizeof(float) * full.num_parameters());
  CHECK(b.state_bytes() == 2 * sizeof(float) * trained);
  CHECK(trained < full.num_parameters() / 2);
}

TEST_CASE("LoRA: y = x W^T + b + s x A^T B^T, the identity change at PEFT's initialisation", "[lora][gemm]") {
  Generator gen(3);
  nn::Linear layer(6, 5, true, gen);
  const Tensor x = testing::randn({2, 3, 6}, 4);
  const Array before = layer.forward(x).value();
  auto lora = layer.add_lora(nn::LoraOptions().rank(2).alpha(3.f), gen);
  CHECK(lora->A.shape() == Shape{2, 6});
  CHECK(lora->B.shape() == Shape{5, 2});
  CHECK(xt::amax(xt::abs(lora->A.value()))() <= 1.f / std::sqrt(6.f));
  CHECK(xt::amax(xt::abs(lora->A.value()))() > 0.f);
  CHECK(layer.forward(x).value() == before);  // B = 0
  lora->B.mutable_value() = Generator(5).normal({5, 2}, 0.f, 1.f);
  // s = alpha / r = 1.5; rsLoRA's alpha / sqrt(r) below
  const Tensor want = linear(x, layer.weight, layer.bias) + mul(linear(linear(x, lora->A), lora->B), 1.5f);
  CHECK(testing::rel_error(layer.forward(x).value(), want.value()) < 1e-6);
  CHECK(nn::LoraOptions().rank(4).alpha(8.f).rslora(true).scaling() == Approx(4.f));
  CHECK(nn::LoraOptions().rank(4).alpha(8.f).scaling() == Approx(2.f));
}

TEST_CASE("LoRA: gradcheck of an adapted Linear (x, W, b, A, B) and of the adapted model", "[lora][gemm]") {
  Generator gen(7);
  nn::Linear layer(5, 4, true, gen);
  layer.add_lora(nn::LoraOptions().rank(3).alpha(5.f).rslora(true), gen);
  layer.lora->B.mutable_value() = gen.normal({4, 3}, 0.f, 0.5f);
  const Tensor x = testing::randn({2, 5}, 8);
  REQUIRE_GRADS_OK(
      testing::check_module_grads(layer, [&](const testing::Ins& in) { return layer.forward(in[0]); }, {x}));

  nn::LanguageModel model(small_options());
  nn::apply_lora(model, nn::LoraOptions().rank(2).alpha(4.f).targets({"w_q", "w_v", "linear2", "head"}));
  for (auto& [n, l] : nn::lora_layers(model)) l->lora->B.mutable_value() = gen.normal(l->lora->B.shape(), 0.f, 0.3f);
  const IndexArray ids = small_ids();
  GradcheckOptions opt;
  opt.eps = 2e-2;
  const GradcheckResult r = gradcheck([&](const std::vector<Tensor>&) { return model.loss(ids, ids); }, {},
                                      model.named_trainable_parameters(), opt);
  INFO(r.report);
  CHECK(r.ok);
  CHECK(r.checked > 0);
}

TEST_CASE("LoRA: merging gives the adapter's logits, unmerging the base weights back, merge_lora the base model",
          "[lora][gemm]") {
  nn::LanguageModel model(small_options());
  Generator gen(11);
  const auto names = nn::apply_lora(model, nn::LoraOptions().rank(3).alpha(6.f).targets({"w_q", "w_o", "gate"}));
  CHECK(names == std::vector<std::string>{"blocks.0.attn.w_q", "blocks.0.attn.w_o", "blocks.0.ffn.gate",
                                          "blocks.1.attn.w_q", "blocks.1.attn.w_o", "blocks.1.ffn.gate"});
  for (auto& [n, l] : nn::lora_layers(model)) l->lora->B.mutable_value() = gen.normal(l->lora->B.shape(), 0.f, 0.3f);
  NoGradGuard no_grad;
  const Array adapted = model.forward(small_ids()).logits.value();
  const Array w = model.parameter("blocks.0.attn.w_q.weight").value();
  for (auto& [n, l] : nn::lora_layers(model)) l->merge_lora();
  CHECK(model.parameter("blocks.0.attn.w_q.weight").value() != w);
  CHECK(testing::rel_error(model.forward(small_ids()).logits.value(), adapted) < 1e-5);
  for (auto& [n, l] : nn::lora_layers(model)) l->unmerge_lora();
  CHECK(xt::amax(xt::abs(model.parameter("blocks.0.attn.w_q.weight").value() - w))() < 1e-6);
  CHECK(testing::rel_error(model.forward(small_ids()).logits.value(), adapted) < 1e-5);

  CHECK(nn::merge_lora(model).size() == 6);
  CHECK(nn::lora_layers(model).empty());
  CHECK(model.named_parameters().size() == nn::LanguageModel(small_options()).named_parameters().size());
  CHECK(testing::rel_error(model.forward(small_ids()).logits.value(), adapted) < 1e-5);
  testing::TempDir dir("xgrad_lora_merged");
  weights::save_hf_model(model, dir.path, {"llama", ""});
  CHECK(testing::rel_error(weights::load_hf_model(dir.path)->forward(small_ids()).logits.value(), adapted) < 1e-5);
}

TEST_CASE("LoRA: the adapter's path has hook points, and its dropout runs while training only", "[lora][gemm]") {
  nn::LanguageModel model(small_options());
  nn::apply_lora(model, nn::LoraOptions().rank(2).alpha(2.f).dropout(0.5f).targets({"blocks.0.attn.w_v"}));
  auto& lora = *nn::lora_layers(model).front().second->lora;
  lora.B.mutable_value() = Generator(1).normal(lora.B.shape(), 0.f, 1.f);
  const auto points = model.hook_points();
  CHECK(std::count(points.begin(), points.end(), "blocks.0.attn.w_v.lora.hidden") == 1);
  CHECK(std::count(points.begin(), points.end(), "blocks.0.attn.w_v.lora.out") == 1);
  model.eval();
  NoGradGuard no_grad;
  const Array adapted = model.forward(small_ids()).logits.value();
  Array base;
  {
    auto h = model.add_forward_hook("blocks.0.attn.w_v.lora.out",
                                    [](const Tensor& t) { return Tensor(Array(xt::zeros<float>(t.shape()))); });
    base = model.forward(small_ids()).logits.value();
  }
  lora.B.mutable_value().fill(0.f);
  CHECK(testing::rel_error(model.forward(small_ids()).logits.value(), base) < 1e-6);  // the hook removed the path
  CHECK(testing::rel_error(base, adapted) > 1e-3);
  lora.B.mutable_value() = Generator(1).normal(lora.B.shape(), 0.f, 1.f);
  CHECK(model.forward(small_ids()).logits.value() == adapted);  // eval: no dropout, the same each time
  model.train();
  const Array a = model.forward(small_ids()).logits.value(), b = model.forward(small_ids()).logits.value();
  CHECK(a != b);  // a new mask each forward
  CHECK_THAT(error_of([&] { nn::lora_layers(model).front().second->effective_weight(); }),
             Contains("dropout 0.5 is active"));
}

TEST_CASE("LoRA: bad options and targets are refused by name before anything changes", "[lora]") {
  nn::LanguageModel model(small_options());
  const auto before = snapshot(model);
  auto refused = [&](const nn::LoraOptions& o) {
    const std::string e = error_of([&] { nn::apply_lora(model, o); });
    CHECK(nn::lora_layers(model).empty());
    CHECK(snapshot(model) == before);
    for (const auto& [n, p] : model.named_parameters()) CHECK(p.requires_grad());
    return e;
  };
  const auto o = [] { return nn::LoraOptions().targets({"w_q"}); };
  CHECK_THAT(refused(nn::LoraOptions()), Contains("apply_lora: LoRA targets are empty"));
  CHECK_THAT(refused(o().targets({"w_q", "q_proj"})), Contains("LoRA target 'q_proj' matches no module"));
  CHECK_THAT(refused(o().targets({"blocks.0.attn.norm"})),
             Contains("LoRA target module 'blocks.0.attn.norm' is not a Linear"));
  CHECK_THAT(refused(o().rank(0)), Contains("LoRA rank 0 must be at least 1"));
  CHECK_THAT(refused(o().rank(17)), Contains("LoRA rank 17 is larger than 'blocks.0.attn.w_q' (in 16, out 16)"));
  CHECK_THAT(refused(o().alpha(std::nanf(""))), Contains("LoRA alpha nan must be finite and > 0"));
  CHECK_THAT(refused(o().alpha(0.f)), Contains("LoRA alpha 0 must be finite and > 0"));
  CHECK_THAT(refused(o().dropout(1.f)), Contains("LoRA dropout 1 is outside [0, 1)"));
  nn::apply_lora(model, o());
  CHECK_THAT(error_of([&] { nn::apply_lora(model, o()); }), Contains("'blocks.0.attn.w_q' has a LoRA adapter already"));
  CHECK_THAT(error_of([&] { weights::save_hf_model(model, "/tmp/xgrad_never_written", {}); }),
             Contains("'blocks.0.attn.w_q.lora' is a LoRA adapter"));
}

TEST_CASE("PEFT: adapter folders load onto the base model with the mirror's logits, loss and gradients",
          "[lora][gemm]") {
  for (const std::string name : {"q_v", "all_rslora"}) {
    INFO(name);
    auto model = base_model();
    const auto adapted = weights::load_peft_adapter(*model, peft_dir(name));
    CHECK(adapted.size() == (name == "q_v" ? 4u : 14u));
    const auto e = expected(name);
    const IndexArray ids = as_ids(e.at("ids")), targets = as_ids(e.at("targets"));
    {
      NoGradGuard no_grad;
      CHECK(testing::rel_error(model->forward(ids).logits.value(), e.at("logits")) <= 1e-5);
    }
    const Tensor loss = model->loss(ids, targets);
    CHECK(loss.value()() == Approx(e.at("loss")()).epsilon(1e-5));
    loss.backward();
    const nn::NameAliases hf = weights::hf_parameter_names(model->options(), "llama");
    std::size_t compared = 0;
    for (const auto& [pname, p] : model->named_parameters()) {
      INFO(pname);
      if (!p.requires_grad()) {
        CHECK_FALSE(p.has_grad());
        continue;
      }
      const std::string module = pname.substr(0, pname.size() - std::string(".lora.A").size());
      const std::string hf_module = hf.at(module + ".weight").substr(0, hf.at(module + ".weight").size() - 7);
      const std::string want = "grad.base_model.model." + hf_module + ".lora_" + pname.back() + ".weight";
      REQUIRE(e.count(want));
      CHECK(testing::rel_error(p.grad(), e.at(want)) <= 1e-4);
      ++compared;
    }
    CHECK(compared == 2 * adapted.size());
  }
}

TEST_CASE("PEFT: an adapter saved by xgrad reads back bit for bit, under PEFT's names and config", "[lora]") {
  auto model = base_model();
  nn::apply_lora(*model, nn::LoraOptions().rank(4).alpha(16.f).rslora(true).targets({"q_proj", "v_proj"}),
                 default_generator(), weights::hf_parameter_names(model->options(), "llama"));
  Generator gen(2);
  for (auto& [n, l] : nn::lora_layers(*model)) l->lora->B.mutable_value() = gen.normal(l->lora->B.shape(), 0.f, 1.f);
  testing::TempDir dir("xgrad_peft");
  weights::save_peft_adapter(*model, dir.path, {"", "base"});
  const json config = json::parse(testing::read_bytes(dir.file("adapter_config.json")));
  CHECK(config.at("target_modules") == json({"q_proj", "v_proj"}));
  CHECK(config.at("r") == 4);
  CHECK(config.at("lora_alpha") == 16.0);
  CHECK(config.at("use_rslora") == true);
  CHECK(config.at("peft_type") == "LORA");
  const auto file = load_safetensors(dir.file("adapter_model.safetensors"));
  CHECK(file.tensors.size() == 8);
  CHECK(file.tensors.front().first == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  auto back = base_model();
  weights::load_peft_adapter(*back, dir.path);
  const auto want = model->named_state(), got = back->named_state();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(got[i].first == want[i].first);
    CHECK(got[i].second.value() == want[i].second.value());
  }
  // A set that last names cannot select exactly is written by full names.
  auto one = base_model();
  nn::apply_lora(*one, nn::LoraOptions().rank(2).targets({"blocks.1.attn.w_k"}));
  testing::TempDir dir2("xgrad_peft");
  weights::save_peft_adapter(*one, dir2.path);
  CHECK(json::parse(testing::read_bytes(dir2.file("adapter_config.json"))).at("target_modules") ==
        json({"model.layers.1.self_attn.k_proj"}));
}

TEST_CASE(
    "PEFT: adapters of another model, unimplemented options and broken folders are refused by name, and the "
    "model is unchanged",
    "[lora]") {
  auto model = base_model();
  const auto before = snapshot(*model);
  struct Broken {
    Broken() : dir("xgrad_peft_broken") {
      for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
        testing::write_bytes(dir.file(f), testing::read_bytes(peft_dir("q_v") + "/" + f));
    }
    void edit(const std::string& field, const json& value) const {
      json j = json::parse(testing::read_bytes(dir.file("adapter_config.json")));
      j[field] = value;
      testing::write_bytes(dir.file("adapter_config.json"), j.dump(2));
    }
    testing::TempDir dir;
  };
  auto refused = [&](const Broken& b) {
    const std::string e = error_of([&] { weights::load_peft_adapter(*model, b.dir.path); });
    CHECK(nn::lora_layers(*model).empty());
    CHECK(snapshot(*model) == before);
    return e;
  };
  {
    Broken b;
    b.edit("use_dora", true);
    CHECK_THAT(refused(b), Contains("load_peft_adapter") && Contains("use_dora"));
  }
  {
    Broken b;
    b.edit("rank_pattern", json{{"q_proj", 2}});
    CHECK_THAT(refused(b), Contains("rank_pattern"));
  }
  {
    Broken b;
    b.edit("modules_to_save", json{"lm_head"});
    CHECK_THAT(refused(b), Contains("modules_to_save"));
  }
  {
    Broken b;
    b.edit("bias", "all");
    CHECK_THAT(refused(b), Contains("\"bias\""));
  }
  {
    Broken b;
    b.edit("some_new_option", 3);
    CHECK_THAT(refused(b), Contains("some_new_option") && Contains("not implemented"));
  }
  {
    Broken b;
    b.edit("r", 2);  // the tensors hold rank 4
    CHECK_THAT(refused(b), Contains("has shape (4, 16)") && Contains("with r 2 needs (2, 16)"));
  }
  {
    Broken b;
    b.edit("target_modules", json{"q_proj", "v_proj", "k_proj"});
    CHECK_THAT(refused(b), Contains("has no tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight'"));
  }
  {
    Broken b;
    b.edit("target_modules", json{"q_proj"});
    CHECK_THAT(refused(b), Contains("v_proj.lora_A.weight', which is not an adapter target_modules selects"));
  }
  {
    Broken b;
    b.edit("target_modules", json{"decoder"});
    CHECK_THAT(refused(b), Contains("target_modules selects no module"));
  }
  {
    Broken b;
    b.edit("peft_type", "IA3");
    CHECK_THAT(refused(b), Contains("peft_type \"IA3\" is not implemented"));
  }
  {
    Broken b;
    testing::write_bytes(b.dir.file("adapter_model.safetensors"), "not a file of tensors");
    CHECK_THAT(refused(b), Contains("adapter_model.safetensors"));
  }
  {
    Broken b;
    testing::write_bytes(b.dir.file("adapter_config.json"), "[[[");
    CHECK_THAT(refused(b), Contains("adapter_config.json"));
  }
  // An adapter for a wider model: the shapes are compared before anything is read.
  nn::LanguageModel other(nn::LanguageModelOptions::llama_style(23, 32, 4, 2, 2).max_len(64));
  CHECK_THAT(error_of([&] { weights::load_peft_adapter(other, peft_dir("q_v")); }), Contains("has shape (4, 16)"));
  CHECK(nn::lora_layers(other).empty());
}

TEST_CASE("LoRA: merging twice, unmerging none and an adapter on a tied head are refused by name", "[lora][gemm]") {
  nn::LanguageModel model(small_options());
  auto& w_q = *model.blocks[0]->attn->w_q;
  CHECK_THAT(error_of([&] { w_q.unmerge_lora(); }), Contains("Linear::unmerge_lora: the layer has no merged adapter"));
  CHECK_THAT(error_of([&] { w_q.merge_lora(); }), Contains("Linear::merge_lora: the layer has no adapter"));
  nn::apply_lora(model, nn::LoraOptions().rank(2).targets({"blocks.0.attn.w_q"}));
  w_q.merge_lora();
  CHECK_THAT(error_of([&] { w_q.merge_lora(); }), Contains("Linear::merge_lora: the adapter is merged already"));
  nn::LanguageModel tied(nn::LanguageModelOptions::gpt2_style(19, 16, 4, 1).max_len(8));
  const auto before = snapshot(tied);
  CHECK_THAT(error_of([&] { nn::apply_lora(tied, nn::LoraOptions().rank(2).targets({"head"})); }),
             Contains("'head''s weight is also 'tok_emb''s (tied embeddings)"));
  CHECK(nn::lora_layers(tied).empty());
  CHECK(snapshot(tied) == before);
}

TEST_CASE("LoRA: the per-head decomposition of an adapted w_o adds up to the attention's output", "[lora][gemm]") {
  nn::LanguageModel model(small_options());
  nn::apply_lora(model, nn::LoraOptions().rank(2).alpha(4.f).targets({"w_o"}));
  for (auto& [n, l] : nn::lora_layers(model))
    l->lora->B.mutable_value() = Generator(3).normal(l->lora->B.shape(), 0.f, 1.f);
  model.eval();
  NoGradGuard no_grad;
  const inspect::ActivationCache cache = inspect::cache_activations(
      model, [&] { model.forward(small_ids()); },
      [](const std::string& n) { return inspect::residual_points()(n) || n == "blocks.0.attn.out"; });
  const inspect::ResidualStack s = inspect::decompose_residual(model, cache, true);
  Array sum = xt::zeros<float>(cache.at("blocks.0.attn.out").shape());
  for (std::size_t k = 0; k < s.labels.size(); ++k) {
    if (s.labels[k].rfind("blocks.0.attn.", 0) == 0) sum += xt::view(s.stack, k);
  }
  CHECK(xt::amax(xt::abs(sum - cache.at("blocks.0.attn.out")))() < 1e-4);
}

TEST_CASE("PEFT: newer fields are read or refused by name, and base-rewriting initialisations are refused", "[lora]") {
  auto model = base_model();
  auto with = [&](const std::string& field, const json& value) {
    testing::TempDir dir("xgrad_peft_fields");
    json j = json::parse(testing::read_bytes(peft_dir("q_v") + "/adapter_config.json"));
    j[field] = value;
    testing::write_bytes(dir.file("adapter_config.json"), j.dump(2));
    testing::write_bytes(dir.file("adapter_model.safetensors"),
                         testing::read_bytes(peft_dir("q_v") + "/adapter_model.safetensors"));
    auto m = base_model();
    return error_of([&] { weights::load_peft_adapter(*m, dir.path); });
  };
  CHECK(with("ensure_weight_tying", false).empty());
  CHECK(with("alora_invocation_tokens", nullptr).empty());
  CHECK(with("init_lora_weights", "gaussian").empty());
  CHECK_THAT(with("alora_invocation_tokens", json{1, 2}), Contains("alora_invocation_tokens"));
  CHECK_THAT(with("use_bdlora", true), Contains("use_bdlora"));
  CHECK_THAT(with("init_lora_weights", "pissa"), Contains("init_lora_weights \"pissa\" rewrites the base model"));
}

TEST_CASE("PEFT: an adapter on a module the family's files fuse is refused before anything is written", "[lora]") {
  auto model = weights::load_hf_model(testing::fixture_path("hf_families/phi3"));
  nn::apply_lora(*model, nn::LoraOptions().rank(2).targets({"w_q"}));
  testing::TempDir dir("xgrad_peft_fused");
  CHECK_THAT(error_of([&] { weights::check_peft_adapter(*model); }),
             Contains("'blocks.0.attn.w_q' is a part of 'model.layers.0.self_attn.qkv_proj'"));
  CHECK_THAT(error_of([&] { weights::save_peft_adapter(*model, dir.file("out")); }), Contains("fused or transposed"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out")));
}
