// LoRA adapters in PEFT's folder format: the config's fields, the tensors' names after the
// family's modules (the layout save_hf_model writes), and the checks before anything changes.
#include "xgrad/weights/peft.hpp"

#include <filesystem>
#include <map>
#include <set>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPrefix = "base_model.model.";

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// A Linear of the model under its Hugging Face module name; `whole` is false when the family's
// files fuse it with others or hold it transposed, where PEFT's adapter would be another one.
struct HfLinear {
  std::string xgrad, hf;
  nn::Linear* layer;
  bool whole;
};

std::vector<HfLinear> hf_linears(nn::LanguageModel& model, const std::string& model_type, const char* who) {
  const detail::HfLayout layout = detail::describe_layout(model.options(), model_type, who);
  std::map<std::string, const detail::TensorMap*> by_param;
  const std::vector<detail::TensorMap> maps = detail::layout_maps(layout, model.options().num_layers());
  for (const detail::TensorMap& t : maps) by_param.emplace(t.xgrad, &t);
  std::map<std::string, std::size_t> parts;  // file tensor -> parameters in it
  for (const detail::TensorMap& t : maps) ++parts[t.hf];
  std::vector<HfLinear> out;
  for (auto& [name, m] : model.named_modules()) {
    auto* l = dynamic_cast<nn::Linear*>(m);
    const auto t = by_param.find(name + ".weight");
    if (!l || t == by_param.end() || !ends_with(t->second->hf, ".weight")) continue;
    const std::string hf = t->second->hf.substr(0, t->second->hf.size() - 7);
    const bool whole = t->second->rows.empty() && !t->second->transposed && parts[t->second->hf] == 1;
    out.push_back({name, hf, l, whole});
  }
  return out;
}

std::string tensor_name(const std::string& hf_module, char which) {
  return kPrefix + hf_module + ".lora_" + which + ".weight";
}

}  // namespace

namespace {

// What save_peft_adapter writes: the tensors and adapter_config.json; every refusal happens here.
struct AdapterFiles {
  NamedArrays tensors;
  json config;
};

AdapterFiles adapter_files(nn::LanguageModel& model, const PeftExportOptions& options, const char* who) {
  const auto adapted = nn::lora_layers(model);
  if (adapted.empty()) fail(who, ": the model has no LoRA adapters (nn::apply_lora)");
  const nn::LoraOptions& first = adapted.front().second->lora->options();
  std::map<std::string, const HfLinear*> hf_of;
  const std::vector<HfLinear> linears = hf_linears(model, options.model_type, who);
  for (const HfLinear& l : linears) hf_of.emplace(l.xgrad, &l);
  NamedArrays tensors;
  std::set<std::string> modules;
  for (const auto& [name, layer] : adapted) {
    const nn::LoraOptions& o = layer->lora->options();
    if (o.rank() != first.rank() || o.alpha() != first.alpha() || o.dropout() != first.dropout() ||
        o.rslora() != first.rslora())
      fail(who, ": the adapter of '", name, "' has other options than that of '", adapted.front().first, "' (rank ",
           o.rank(), " and ", first.rank(), ", alpha ", o.alpha(), " and ", first.alpha(),
           "): one adapter_config.json describes one set");
    if (layer->lora->merged()) fail(who, ": the adapter of '", name, "' is merged into its weight (unmerge_lora)");
    const auto hf = hf_of.find(name);
    if (hf == hf_of.end()) fail(who, ": '", name, "' has no module in the family's files");
    if (!hf->second->whole)
      fail(who, ": '", name, "' is a part of '", hf->second->hf,
           "' in the family's files (fused or transposed); a PEFT adapter there is one over the whole");
    tensors.emplace_back(tensor_name(hf->second->hf, 'A'), layer->lora->A.value());
    tensors.emplace_back(tensor_name(hf->second->hf, 'B'), layer->lora->B.value());
    modules.insert(hf->second->hf);
  }
  // target_modules: the last names when they select exactly the adapted modules (PEFT's rule).
  std::set<std::string> last_names;
  for (const std::string& m : modules) last_names.insert(m.substr(m.rfind('.') + 1));
  bool exact = true;
  for (const HfLinear& l : linears) {
    const bool selected = last_names.count(l.hf.substr(l.hf.rfind('.') + 1)) > 0;
    exact = exact && selected == (modules.count(l.hf) > 0);
  }
  const std::set<std::string>& targets = exact ? last_names : modules;
  json config = {{"peft_type", "LORA"},
                 {"task_type", "CAUSAL_LM"},
                 {"base_model_name_or_path", options.base_model_name_or_path},
                 {"r", first.rank()},
                 {"lora_alpha", detail::f32_json(first.alpha())},
                 {"lora_dropout", detail::f32_json(first.dropout())},
                 {"use_rslora", first.rslora()},
                 {"bias", "none"},
                 {"fan_in_fan_out", false},
                 {"use_dora", false},
                 {"modules_to_save", nullptr},
                 {"inference_mode", true},
                 {"target_modules", json(std::vector<std::string>(targets.begin(), targets.end()))}};
  return {std::move(tensors), std::move(config)};
}

}  // namespace

void check_peft_adapter(nn::LanguageModel& model, const PeftExportOptions& options) {
  adapter_files(model, options, "save_peft_adapter");
}

void save_peft_adapter(nn::LanguageModel& model, const std::string& directory, const PeftExportOptions& options) {
  const char* who = "save_peft_adapter";
  const AdapterFiles files = adapter_files(model, options, who);
  prepare_output_dir(directory, who);
  save_safetensors((fs::path(directory) / "adapter_model.safetensors").string(), files.tensors, {{"format", "pt"}});
  write_file_atomically((fs::path(directory) / "adapter_config.json").string(), files.config.dump(2) + "\n", who);
}

std::vector<std::string> load_peft_adapter(nn::LanguageModel& model, const std::string& directory,
                                           const std::string& model_type) {
  const char* who = "load_peft_adapter";
  if (!nn::lora_layers(model).empty()) fail(who, ": the model has LoRA adapters already");
  const detail::ConfigReader r(who, (fs::path(directory) / "adapter_config.json").string());
  if (r.text("peft_type", nullptr) != "LORA")
    r.fail_field("peft_type \"" + r.text("peft_type", nullptr) + "\" is not implemented (only \"LORA\")");
  const std::string task = r.text("task_type", "CAUSAL_LM");
  if (task != "CAUSAL_LM") r.fail_field("task_type \"" + task + "\" is not implemented (only \"CAUSAL_LM\")");
  r.require("bias", "none", "trained biases");
  r.require("use_dora", false, "DoRA");
  r.require("fan_in_fan_out", false, "weights stored (in, out)");
  r.require("lora_bias", false, "a bias on lora_B");
  r.require("use_qalora", false, "QALoRA");
  r.require("use_bdlora", false, "block-diagonal LoRA");
  r.require("ensure_weight_tying", false, "adapters tied across tied weights");
  // These initialisations also rewrite the base weights: the adapter belongs to a changed base.
  if (const json* init = r.find("init_lora_weights", true); init && init->is_string()) {
    const std::string how = init->get<std::string>();
    if (how != "gaussian" && how != "eva")
      r.fail_field("init_lora_weights \"" + how.substr(0, 40) +
                   "\" rewrites the base model's weights when the adapter is made (PiSSA, OLoRA, CorDA, LoftQ, "
                   "LoRA-GA): the adapter needs that changed base, which is not implemented");
  }
  for (const char* field :
       {"modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules", "trainable_token_indices",
        "target_parameters", "layer_replication", "alora_invocation_tokens", "arrow_config"}) {
    const json* v = r.find(field, true);
    if (v && !(v->is_array() && v->empty())) r.require(field, nullptr, field);
  }
  for (const char* field : {"rank_pattern", "alpha_pattern"}) {
    const json* v = r.find(field, true);
    if (v && !(v->is_object() && v->empty())) r.require(field, nullptr, "per-module ranks or alphas");
  }
  nn::LoraOptions o;
  o.rank(r.count("r", 8)).alpha(r.positive_float("lora_alpha", false, 8.f)).rslora(r.flag("use_rslora", false));
  o.dropout(static_cast<float>(r.fraction("lora_dropout", 0.0)));
  if (!(o.dropout() < 1.f)) r.fail_field("lora_dropout 1 must be less than 1");
  const json* targets = r.find("target_modules", true);
  if (!targets) r.fail_field("missing field \"target_modules\"");
  std::vector<std::string> patterns;
  if (targets->is_string() && targets->get<std::string>() == "all-linear") {
    patterns = {"all-linear"};
  } else if (targets->is_string()) {
    patterns = {"re:" + targets->get<std::string>()};
  } else if (targets->is_array() && !targets->empty()) {
    for (const json& t : *targets) {
      if (!t.is_string() || t.get<std::string>().empty())
        r.fail_field("target_modules holds " + xgrad::detail::json_excerpt(t, 40) + ", not a module name");
      patterns.push_back(t.get<std::string>());
    }
  } else {
    r.fail_field("target_modules " + xgrad::detail::json_excerpt(*targets, 40) +
                 " is not a list of module names or a string");
  }
  r.refuse_unread({"peft_type", "auto_mapping", "base_model_name_or_path", "revision", "inference_mode",
                   "init_lora_weights", "loftq_config", "eva_config", "corda_config", "megatron_config",
                   "megatron_core", "runtime_config", "qalora_group_size", "peft_version", "lora_ga_config"});

  // The modules the config selects, by their Hugging Face names.
  const std::vector<HfLinear> linears = hf_linears(model, model_type, who);
  std::vector<const HfLinear*> chosen;
  for (const HfLinear& l : linears) {
    bool hit = false;
    for (const std::string& p : patterns) {
      if (p == "all-linear") {
        hit = hit || l.xgrad != "head";
      } else {
        try {
          hit = hit || nn::matches_name_pattern(p, l.hf);
        } catch (const Error& e) {
          r.fail_field(std::string("target_modules: ") + e.what());
        }
      }
    }
    if (!hit) continue;
    if (!l.whole)
      fail(who, ": target_modules selects '", l.hf,
           "', which xgrad holds in parts (a fused or transposed tensor): not implemented");
    chosen.push_back(&l);
  }
  if (chosen.empty()) r.fail_field("target_modules selects no module of the model");

  // Names and shapes first, then every value, then the model.
  const std::string file = (fs::path(directory) / "adapter_model.safetensors").string();
  std::error_code ec;
  if (!fs::exists(file, ec) && fs::exists(fs::path(directory) / "adapter_model.bin", ec))
    fail(who, ": '", directory, "' holds adapter_model.bin (a pickle, not read); save it as safetensors");
  SafetensorsReader reader(file);
  std::set<std::string> expected;
  for (const HfLinear* l : chosen) {
    for (char which : {'A', 'B'}) {
      const std::string name = tensor_name(l->hf, which);
      expected.insert(name);
      const std::size_t at = reader.find(name);
      if (at == reader.tensors().size())
        fail(who, ": '", file, "' has no tensor '", name, "', which target_modules needs");
      const Shape want =
          which == 'A' ? Shape{o.rank(), l->layer->in_features()} : Shape{l->layer->out_features(), o.rank()};
      if (reader.tensors()[at].shape != want)
        fail(who, ": '", file, "': tensor '", name, "' has shape ", shape_str(reader.tensors()[at].shape), ", '",
             l->xgrad, "' with r ", o.rank(), " needs ", shape_str(want));
    }
  }
  for (const TensorInfo& t : reader.tensors()) {
    if (!expected.count(t.name))
      fail(who, ": '", file, "' holds '", t.name, "', which is not an adapter target_modules selects in this model");
  }
  std::map<std::string, Array> values;
  for (const std::string& name : expected) {
    const std::size_t at = reader.find(name);
    Array a = Array::from_shape(reader.tensors()[at].shape);
    reader.read(at, 0, a.size(), a.data());
    values.emplace(name, std::move(a));
  }
  std::vector<std::string> names;
  for (const HfLinear* l : chosen) names.push_back(l->xgrad);
  o.targets(names);
  Generator scratch;  // A is overwritten: the default generator is left as it was
  const std::vector<std::string> out = nn::apply_lora(model, o, scratch);
  for (const HfLinear* l : chosen) {
    l->layer->lora->A.mutable_value() = values.at(tensor_name(l->hf, 'A'));
    l->layer->lora->B.mutable_value() = values.at(tensor_name(l->hf, 'B'));
  }
  return out;
}

}  // namespace xgrad::weights
