// Llama-layout checkpoints into a LanguageModel: config.json read field by field, the files'
// headers checked against the tensors it implies, then each tensor read once into its parameter.
#include "xgrad/weights/llama_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/io/detail/json_file.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad::weights {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::uint64_t kMaxJsonBytes = std::uint64_t{64} << 20;  // config.json, the index

using xgrad::detail::json_excerpt;

json read_json_object(const std::string& path, const char* who) {
  return xgrad::detail::read_json_object(path, who, kMaxJsonBytes);
}

// The fields of config.json, each checked as it is read; errors name the file and the field.
class ConfigReader {
 public:
  ConfigReader(const char* who, std::string path)
      : who_(who), path_(std::move(path)), j_(read_json_object(path_, who)) {}

  // A positive integer. `fallback` 0: the field is required. `null_is_absent`: Hugging Face reads
  // an explicit null as the default.
  std::size_t count(const char* field, std::size_t fallback = 0, bool null_is_absent = false) const {
    const json* v = find(field, null_is_absent);
    if (!v) {
      if (fallback == 0) fail(who_, ": '", path_, "': missing field \"", field, "\"");
      return fallback;
    }
    const bool positive = (v->is_number_unsigned() && v->get<std::uint64_t>() > 0) ||
                          (v->is_number_integer() && v->get<std::int64_t>() > 0);
    if (!positive)
      fail(who_, ": '", path_, "': field \"", field, "\" must be a positive integer, got ", json_excerpt(*v));
    return static_cast<std::size_t>(v->get<std::uint64_t>());
  }

  // A number > 0 that float32 holds as a finite value other than 0.
  float positive_float(const char* field, bool required, float fallback = 0.f) const {
    const json* v = find(field, false);
    if (!v) {
      if (required) fail(who_, ": '", path_, "': missing field \"", field, "\"");
      return fallback;
    }
    return positive_float(*v, field);
  }
  float positive_float(const json& v, const std::string& field) const {
    if (!v.is_number()) fail(who_, ": '", path_, "': field \"", field, "\" must be a number, got ", json_excerpt(v));
    const double d = v.get<double>();
    const float f = static_cast<float>(d);
    if (!(d > 0) || !std::isfinite(f) || f == 0.f) {
      fail(who_, ": '", path_, "': field \"", field, "\" must be finite and > 0 as a float32, got ", json_excerpt(v));
    }
    return f;
  }

  bool flag(const char* field, bool fallback) const {
    const json* v = find(field, false);
    if (!v) return fallback;
    if (!v->is_boolean())
      fail(who_, ": '", path_, "': field \"", field, "\" must be true or false, got ", json_excerpt(*v));
    return v->get<bool>();
  }

  // The field, or nullptr when it is absent (or null, when that reads as absent).
  const json* find(const char* field, bool null_is_absent) const {
    read_.insert(field);
    const auto it = j_.find(field);
    if (it == j_.end() || (null_is_absent && it->is_null())) return nullptr;
    return &*it;
  }

  // Every field may change the forward pass unless it was read or is in `inert`: the first other
  // one is refused by name.
  void refuse_unread(const std::set<std::string>& inert) const {
    for (const auto& [key, value] : j_.items()) {
      if (!read_.count(key) && !inert.count(key)) {
        fail(who_, ": '", path_, "': field ", json_excerpt(json(key), 80), " (", json_excerpt(value, 40),
             ") is not implemented; it may change the forward pass, so the folder is refused");
      }
    }
  }

  const std::string& path() const { return path_; }

 private:
  const char* who_;
  std::string path_;
  json j_;
  mutable std::set<std::string> read_;
};

// Fields that do not change the forward pass: names and versions, token ids, generation defaults,
// the initialisation of training from scratch, the files' dtype (their headers give it), and the
// runtime's settings. pretraining_tp > 1 makes Hugging Face compute the same products in slices.
const std::set<std::string> kInertFields = {"_name_or_path",
                                            "architectures",
                                            "transformers_version",
                                            "torch_dtype",
                                            "dtype",
                                            "_commit_hash",
                                            "_attn_implementation",
                                            "transformers.js_config",
                                            "is_llama_config",
                                            "tokenizer_class",
                                            "bos_token_id",
                                            "eos_token_id",
                                            "pad_token_id",
                                            "use_cache",
                                            "initializer_range",
                                            "pretraining_tp",
                                            "output_attentions",
                                            "output_hidden_states",
                                            "return_dict",
                                            "torchscript",
                                            "id2label",
                                            "label2id",
                                            "max_length",
                                            "min_length",
                                            "do_sample",
                                            "num_beams",
                                            "temperature",
                                            "top_k",
                                            "top_p",
                                            "repetition_penalty",
                                            "length_penalty",
                                            "no_repeat_ngram_size",
                                            "num_return_sequences",
                                            "early_stopping",
                                            "task_specific_params"};

// RoPE's base: `rope_theta`, or transformers 5's `rope_parameters` {"rope_type": "default",
// "rope_theta": ...}. Scaled variants (llama3, linear, dynamic, yarn, ...) are refused by name.
float read_rope_theta(const ConfigReader& r, const char* who) {
  const std::string& path = r.path();
  const json* top = r.find("rope_theta", false);
  float theta = r.positive_float("rope_theta", false, 10000.f);
  if (const json* scaling = r.find("rope_scaling", true)) {
    fail(who, ": '", path, "': field \"rope_scaling\" is ", json_excerpt(*scaling),
         "; scaled rotary embeddings are not implemented (only an absent or null rope_scaling)");
  }
  const json* p = r.find("rope_parameters", true);
  if (!p) return theta;
  if (!p->is_object()) fail(who, ": '", path, "': field \"rope_parameters\" must be an object, got ", json_excerpt(*p));
  if (const auto type = p->find("rope_type"); type != p->end() && *type != "default") {
    fail(who, ": '", path, "': field \"rope_parameters\" has rope_type ", json_excerpt(*type),
         "; scaled rotary embeddings are not implemented (only \"default\")");
  }
  for (const auto& [key, value] : p->items()) {
    if (key == "rope_type") continue;
    if (key == "rope_theta") {
      const float given = r.positive_float(value, "rope_parameters.rope_theta");
      if (top && given != theta) {
        fail(who, ": '", path, "': rope_theta ", theta, " and rope_parameters.rope_theta ", given, " differ");
      }
      theta = given;
    } else {
      fail(who, ": '", path, "': field \"rope_parameters\" has ", json_excerpt(json(key), 80),
           ", which is not implemented (only rope_type \"default\" and rope_theta)");
    }
  }
  return theta;
}

// A field whose only value xgrad implements is `expected` (or null): any other is refused by name.
void require_value(const ConfigReader& r, const char* who, const char* field, const json& expected, const char* what) {
  const json* v = r.find(field, true);
  if (v && *v != expected) {
    fail(who, ": '", r.path(), "': field \"", field, "\" is ", json_excerpt(*v), "; ", what, " is not implemented");
  }
}

// config.json, read and checked.
struct LlamaConfig {
  std::size_t V, C, H, KV, L, F;
  bool tied, attention_bias, mlp_bias;
  nn::LanguageModelOptions options;
};

LlamaConfig read_config(const std::string& directory, const char* who) {
  const ConfigReader r(who, (fs::path(directory) / "config.json").string());
  const std::string& path = r.path();
  const std::size_t V = r.count("vocab_size"), C = r.count("hidden_size"), F = r.count("intermediate_size");
  const std::size_t L = r.count("num_hidden_layers"), H = r.count("num_attention_heads");
  const std::size_t KV = r.count("num_key_value_heads", H, true), P = r.count("max_position_embeddings");
  const float eps = r.positive_float("rms_norm_eps", true);
  if (const json* type = r.find("model_type", false); type && *type != "llama") {
    fail(who, ": '", path, "': model_type ", json_excerpt(*type), " is not implemented (this xgrad loads \"llama\")");
  }
  const float theta = read_rope_theta(r, who);
  const bool tied = r.flag("tie_word_embeddings", false);
  const bool attention_bias = r.flag("attention_bias", false), mlp_bias = r.flag("mlp_bias", false);
  if (const json* act = r.find("hidden_act", false)) {
    if (!act->is_string()) fail(who, ": '", path, "': field \"hidden_act\" must be a string, got ", json_excerpt(*act));
    if (act->get<std::string>() != "silu") {
      fail(who, ": '", path, "': field \"hidden_act\" is ", json_excerpt(*act),
           "; only \"silu\" (the SwiGLU feed-forward) is supported");
    }
  }
  require_value(r, who, "attention_dropout", 0.0, "dropout on the attention weights");
  require_value(r, who, "sliding_window", nullptr, "sliding-window attention");
  require_value(r, who, "rope_interleaved", false, "rotating interleaved channel pairs");
  if (C % H != 0) fail(who, ": '", path, "': num_attention_heads ", H, " does not divide hidden_size ", C);
  if (H % KV != 0) fail(who, ": '", path, "': num_key_value_heads ", KV, " does not divide num_attention_heads ", H);
  if (r.find("head_dim", true)) {
    const std::size_t D = r.count("head_dim");
    if (D != C / H) {
      fail(who, ": '", path, "': field \"head_dim\" is ", D, ", not hidden_size / num_attention_heads = ", C, " / ", H,
           " = ", C / H, " (xgrad's heads are that wide)");
    }
  }
  if ((C / H) % 2 != 0) {
    fail(who, ": '", path, "': the head width hidden_size / num_attention_heads = ", C / H,
         " is odd; rotary embeddings need it even");
  }
  r.refuse_unread(kInertFields);
  nn::LanguageModelOptions options = nn::LanguageModelOptions(V, C, H, L)
                                         .d_ff(F)
                                         .max_len(P)
                                         .dropout(0.f)
                                         .norm(nn::Norm::pre)
                                         .norm_kind(nn::NormKind::rms_norm)
                                         .norm_eps(eps)
                                         .norm_affine(true)
                                         .norm_bias(false)
                                         .num_kv_heads(KV)
                                         .activation(nn::Activation::swiglu)
                                         .positional(nn::Positional::rotary)
                                         .rope_theta(theta)
                                         .rotary_dim(0)
                                         .qk_norm(false)
                                         .qkv_bias(attention_bias)
                                         .out_bias(attention_bias)
                                         .ffn_bias(mlp_bias)
                                         .head_bias(false)
                                         .tie_embeddings(tied)
                                         .init(nn::Init::gpt2);
  try {
    nn::LanguageModel::check(options);
  } catch (const Error& e) {
    fail(who, ": '", path, "' describes a model xgrad refuses: ", e.what());
  }
  return {V, C, H, KV, L, F, tied, attention_bias, mlp_bias, options};
}

// One tensor the model takes: its Hugging Face name, the parameter's name and the shape.
struct Expected {
  std::string hf, xgrad;
  Shape shape;
};

std::vector<Expected> expected_tensors(const LlamaConfig& c) {
  const std::size_t D = c.C / c.H;
  std::vector<Expected> ex = {{"model.embed_tokens.weight", "tok_emb.weight", {c.V, c.C}}};
  auto linear = [&](const std::string& hf, const std::string& to, std::size_t out, std::size_t in, bool bias) {
    ex.push_back({hf + ".weight", to + ".weight", {out, in}});
    if (bias) ex.push_back({hf + ".bias", to + ".bias", {out}});
  };
  for (std::size_t n = 0; n < c.L; ++n) {
    const std::string h = "model.layers." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    ex.push_back({h + "input_layernorm.weight", b + "attn.norm.weight", {c.C}});
    linear(h + "self_attn.q_proj", b + "attn.w_q", c.H * D, c.C, c.attention_bias);
    linear(h + "self_attn.k_proj", b + "attn.w_k", c.KV * D, c.C, c.attention_bias);
    linear(h + "self_attn.v_proj", b + "attn.w_v", c.KV * D, c.C, c.attention_bias);
    linear(h + "self_attn.o_proj", b + "attn.w_o", c.C, c.H * D, c.attention_bias);
    ex.push_back({h + "post_attention_layernorm.weight", b + "ffn.norm.weight", {c.C}});
    linear(h + "mlp.gate_proj", b + "ffn.gate", c.F, c.C, c.mlp_bias);
    linear(h + "mlp.up_proj", b + "ffn.linear1", c.F, c.C, c.mlp_bias);
    linear(h + "mlp.down_proj", b + "ffn.linear2", c.C, c.F, c.mlp_bias);
  }
  ex.push_back({"model.norm.weight", "final_norm.weight", {c.C}});
  if (!c.tied) ex.push_back({"lm_head.weight", "head.weight", {c.V, c.C}});
  return ex;
}

// Where a tensor is: which file, and its index in that file's header.
struct Location {
  std::size_t file, index;
};

// The checkpoint's files, opened (headers read and checked), and every tensor they hold.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, Location> tensors;
  std::string source;  // model.safetensors or the index, for "missing" errors

  const TensorInfo& info(const Location& at) const { return files[at.file]->tensors()[at.index]; }
  const std::string& path(const Location& at) const { return files[at.file]->path(); }
};

// A shard's name from the index: a plain file name in the checkpoint's folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

Checkpoint open_checkpoint(const std::string& directory, const char* who) {
  Checkpoint ck;
  const fs::path dir(directory);
  const std::string single = (dir / "model.safetensors").string();
  const std::string index_path = (dir / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(single, ec)) {
    ck.source = single;
    ck.files.push_back(std::make_unique<SafetensorsReader>(single));
    const auto& t = ck.files[0]->tensors();
    for (std::size_t i = 0; i < t.size(); ++i) ck.tensors.emplace(t[i].name, Location{0, i});
    return ck;
  }
  if (!fs::exists(index_path, ec)) {
    const bool bin = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
    fail(who, ": '", directory, "' holds neither model.safetensors nor model.safetensors.index.json",
         bin ? " (pytorch_model.bin files are not read: convert them to safetensors)" : "");
  }
  ck.source = index_path;
  const json index = read_json_object(index_path, who);
  const auto wm = index.find("weight_map");
  if (wm == index.end()) fail(who, ": '", index_path, "': missing field \"weight_map\"");
  if (!wm->is_object()) {
    fail(who, ": '", index_path, "': field \"weight_map\" must be an object (tensor name -> shard file), got ",
         json_excerpt(*wm));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::map<std::string, std::string> shards;      // shard -> the first tensor it is named for
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string() || !is_plain_file_name(shard.get<std::string>())) {
      fail(who, ": '", index_path, "': weight_map[\"", tensor, "\"] must be the name of a file in '", directory,
           "', got ", json_excerpt(shard));
    }
    weight_map[tensor] = shard.get<std::string>();
    shards.emplace(shard.get<std::string>(), tensor);
  }
  std::map<std::string, std::size_t> file_of;  // shard -> index in ck.files
  for (const auto& [shard, tensor] : shards) {
    const std::string path = (dir / shard).string();
    if (!fs::exists(path, ec)) {
      fail(who, ": '", index_path, "' puts tensor '", tensor, "' in shard '", shard, "', but '", path,
           "' does not exist");
    }
    file_of[shard] = ck.files.size();
    ck.files.push_back(std::make_unique<SafetensorsReader>(path));
  }
  for (std::size_t f = 0; f < ck.files.size(); ++f) {
    const auto& t = ck.files[f]->tensors();
    for (std::size_t i = 0; i < t.size(); ++i) {
      const auto [it, fresh] = ck.tensors.emplace(t[i].name, Location{f, i});
      if (!fresh) {
        fail(who, ": tensor '", t[i].name, "' is in two shards, '", ck.path(it->second), "' and '", ck.files[f]->path(),
             "'");
      }
    }
  }
  for (const auto& [name, at] : ck.tensors) {
    const auto named = weight_map.find(name);
    if (named == weight_map.end()) {
      fail(who, ": shard '", ck.path(at), "' holds tensor '", name, "', which the weight_map of '", index_path,
           "' does not name");
    }
    if (file_of.at(named->second) != at.file) {
      fail(who, ": '", index_path, "' puts tensor '", name, "' in shard '", named->second, "', but it is in '",
           ck.path(at), "'");
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ck.tensors.count(name)) {
      fail(who, ": '", index_path, "' puts tensor '", name, "' in shard '", shard, "', which does not hold it");
    }
  }
  return ck;
}

// Buffers that older Hugging Face versions saved with the weights: model.layers.N.self_attn.rotary_emb.inv_freq.
bool is_rotary_buffer(const std::string& name) {
  static const std::string suffix = ".self_attn.rotary_emb.inv_freq";
  return name.compare(0, 13, "model.layers.") == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every expected tensor present with its shape, and nothing else (but the skipped buffers and, when
// tied, an lm_head.weight of the embedding's shape, compared later).
// `more`, when not empty, replaces the count of the other missing tensors (ex is then cut short).
void check_tensors(const Checkpoint& ck, const std::vector<Expected>& ex, const LlamaConfig& c, const char* who,
                   const std::string& more = "") {
  std::vector<const Expected*> missing;
  for (const Expected& e : ex) {
    if (!ck.tensors.count(e.hf)) missing.push_back(&e);
  }
  if (!missing.empty()) {
    const Expected& e = *missing.front();
    fail(who, ": '", ck.source, "' lacks tensor '", e.hf, "' ", shape_str(e.shape), " (xgrad's ", e.xgrad, ")",
         !more.empty()        ? more
         : missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more tensors the model needs"
                              : "");
  }
  std::set<std::string> wanted;
  for (const Expected& e : ex) wanted.insert(e.hf);
  for (const auto& [name, at] : ck.tensors) {
    if (wanted.count(name) || is_rotary_buffer(name)) continue;
    if (c.tied && name == "lm_head.weight") {
      const Shape want{c.V, c.C};
      if (ck.info(at).shape != want) {
        fail(who, ": tensor 'lm_head.weight' in '", ck.path(at), "' has shape ", shape_str(ck.info(at).shape),
             "; tied to tok_emb.weight (tie_word_embeddings), it must be a copy of it, ", shape_str(want));
      }
      continue;
    }
    fail(who, ": tensor '", name, "' ", shape_str(ck.info(at).shape), " in '", ck.path(at),
         "' is not part of the model config.json describes (no xgrad parameter takes it)");
  }
  for (const Expected& e : ex) {
    const Location& at = ck.tensors.at(e.hf);
    if (ck.info(at).shape != e.shape) {
      fail(who, ": tensor '", e.hf, "' in '", ck.path(at), "' has shape ", shape_str(ck.info(at).shape), "; xgrad's ",
           e.xgrad, " needs ", shape_str(e.shape));
    }
  }
}

}  // namespace

nn::LanguageModelOptions llama_options(const std::string& directory) {
  return read_config(directory, "llama_options").options;
}

std::shared_ptr<nn::LanguageModel> load_llama(const std::string& directory) {
  const char* who = "load_llama";
  const LlamaConfig c = read_config(directory, who);
  Checkpoint ck = open_checkpoint(directory, who);
  // More layers than the files have tensors for: the first missing one is among the layers they
  // could hold, so the list of every expected tensor (which could be vast) is never built.
  const std::size_t per_layer = 9 + (c.attention_bias ? 4 : 0) + (c.mlp_bias ? 3 : 0);
  const std::size_t layers_held = ck.tensors.size() / per_layer + 1;
  if (c.L > layers_held) {
    LlamaConfig first = c;
    first.L = layers_held;
    check_tensors(ck, expected_tensors(first), c, who,
                  "; num_hidden_layers " + std::to_string(c.L) + " needs " + std::to_string(per_layer) +
                      " tensors per layer, and the checkpoint holds " + std::to_string(ck.tensors.size()) +
                      " tensors in all");
  }
  const std::vector<Expected> ex = expected_tensors(c);
  check_tensors(ck, ex, c, who);

  // The model's own memory, checked before it is built; each block's modules and tensors take
  // some memory of their own besides the parameters.
  constexpr std::size_t kChunk = std::size_t{1} << 18;  // floats compared at a time for a tied lm_head
  double values = 0;
  for (const Expected& e : ex) {
    double n = 1;
    for (const std::size_t d : e.shape) n *= static_cast<double>(d);
    values += n;
  }
  check_available_memory(values * sizeof(float) + 2.0 * kChunk * sizeof(float) + static_cast<double>(c.L) * 64 * 1024,
                         who,
                         "the model in '" + directory + "' (" + std::to_string(static_cast<std::uint64_t>(values)) +
                             " float32 parameters in " + std::to_string(c.L) + " blocks)");

  Generator init = Generator::for_loading(0);  // every parameter is read from the file below
  auto model = std::make_shared<nn::LanguageModel>(c.options, init);
  std::map<std::string, Array*> params;
  for (auto& [name, t] : model->named_parameters()) params[name] = &t.mutable_value();
  if (params.size() != ex.size()) {
    fail(who, ": the LanguageModel has ", params.size(), " parameters, but ", ex.size(),
         " tensors were expected for it (xgrad's layout and this importer disagree)");
  }
  for (const Expected& e : ex) {
    const auto it = params.find(e.xgrad);
    if (it == params.end() || it->second->shape() != e.shape) {
      fail(who, ": the LanguageModel has no parameter '", e.xgrad, "' ", shape_str(e.shape),
           " (xgrad's layout and this importer disagree)");
    }
    const Location& at = ck.tensors.at(e.hf);
    Array& dst = *it->second;
    ck.files[at.file]->read(at.index, 0, dst.size(), dst.data());
    if (const std::size_t i = first_non_finite(dst); i < dst.size()) {
      fail(who, ": tensor '", e.hf, "' in '", ck.path(at), "' holds ", dst.data()[i], " (in ", e.xgrad,
           " at flat position ", i, "); refusing non-finite weights");
    }
  }
  // A tied model's lm_head.weight, when the file has one, must be the embedding itself.
  const auto head = ck.tensors.find("lm_head.weight");
  if (c.tied && head != ck.tensors.end()) {
    const Array& emb = *params.at("tok_emb.weight");
    std::vector<float> chunk(std::min(kChunk, emb.size()));
    for (std::size_t first = 0; first < emb.size(); first += chunk.size()) {
      const std::size_t n = std::min(chunk.size(), emb.size() - first);
      ck.files[head->second.file]->read(head->second.index, first, n, chunk.data());
      for (std::size_t i = 0; i < n; ++i) {
        const float e = emb.data()[first + i], h = chunk[i];
        if (e != h) {
          fail(who, ": tie_word_embeddings is true, but 'lm_head.weight' in '", ck.path(head->second),
               "' differs from 'model.embed_tokens.weight' at flat position ", first + i, " (", h, " against ", e,
               "); a tied model has one matrix: set tie_word_embeddings false to use lm_head.weight as the head");
        }
      }
    }
  }
  model->eval();
  return model;
}

}  // namespace xgrad::weights
