// config.json's reader and the pieces every family shares.
#include "xgrad/weights/detail/hf_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"

namespace xgrad::weights::detail {

namespace {

using json = nlohmann::json;
using xgrad::detail::json_excerpt;

constexpr std::uint64_t kMaxJsonBytes = std::uint64_t{64} << 20;

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

}  // namespace

ConfigReader::ConfigReader(const char* who, std::string path)
    : who_(who), path_(std::move(path)), j_(xgrad::detail::read_json_object(path_, who, kMaxJsonBytes)) {}

ConfigReader::ConfigReader(const char* who, std::string path, json config)
    : who_(who), path_(std::move(path)), j_(std::move(config)) {}

void ConfigReader::fail_field(const std::string& message) const { fail(who_, ": '", path_, "': ", message); }

std::size_t ConfigReader::count(const char* field, std::size_t fallback, bool null_is_absent) const {
  const json* v = find(field, null_is_absent);
  if (!v) {
    if (fallback == 0) fail_field(std::string("missing field \"") + field + "\"");
    return fallback;
  }
  const bool positive = (v->is_number_unsigned() && v->get<std::uint64_t>() > 0) ||
                        (v->is_number_integer() && v->get<std::int64_t>() > 0);
  if (!positive) fail_field(std::string("field \"") + field + "\" must be a positive integer, got " + json_excerpt(*v));
  return static_cast<std::size_t>(v->get<std::uint64_t>());
}

float ConfigReader::positive_float(const char* field, bool required, float fallback) const {
  const json* v = find(field, false);
  if (!v) {
    if (required) fail_field(std::string("missing field \"") + field + "\"");
    return fallback;
  }
  return positive_float(*v, field);
}

float ConfigReader::positive_float(const json& v, const std::string& field) const {
  if (!v.is_number()) fail_field("field \"" + field + "\" must be a number, got " + json_excerpt(v));
  const double d = v.get<double>();
  const float f = static_cast<float>(d);
  if (!(d > 0) || !std::isfinite(f) || f == 0.f) {
    fail_field("field \"" + field + "\" must be finite and > 0 as a float32, got " + json_excerpt(v));
  }
  return f;
}

double ConfigReader::fraction(const char* field, double fallback) const {
  const json* v = find(field, true);
  if (!v) return fallback;
  if (!v->is_number() || !(v->get<double>() >= 0.0 && v->get<double>() <= 1.0))
    fail_field(std::string("field \"") + field + "\" must be a number in [0, 1], got " + json_excerpt(*v));
  return v->get<double>();
}

bool ConfigReader::flag(const char* field, bool fallback) const {
  const json* v = find(field, false);
  if (!v) return fallback;
  if (!v->is_boolean())
    fail_field(std::string("field \"") + field + "\" must be true or false, got " + json_excerpt(*v));
  return v->get<bool>();
}

std::string ConfigReader::text(const char* field, const char* fallback) const {
  const json* v = find(field, true);
  if (!v) {
    if (!fallback) fail_field(std::string("missing field \"") + field + "\"");
    return fallback;
  }
  if (!v->is_string()) fail_field(std::string("field \"") + field + "\" must be a string, got " + json_excerpt(*v));
  return v->get<std::string>();
}

const json* ConfigReader::find(const char* field, bool null_is_absent) const {
  read_.insert(field);
  const auto it = j_.find(field);
  if (it == j_.end() || (null_is_absent && it->is_null())) return nullptr;
  return &*it;
}

void ConfigReader::require(const char* field, const json& expected, const char* what) const {
  const json* v = find(field, true);
  if (v && *v != expected) {
    fail_field(std::string("field \"") + field + "\" is " + json_excerpt(*v) + "; " + what + " is not implemented");
  }
}

void ConfigReader::refuse_unread(const std::set<std::string>& more) const {
  for (const auto& [key, value] : j_.items()) {
    if (!read_.count(key) && !kInertFields.count(key) && !more.count(key)) {
      fail_field("field " + json_excerpt(json(key), 80) + " (" + json_excerpt(value, 40) +
                 ") is not implemented; it may change the forward pass, so the folder is refused");
    }
  }
}

namespace {

// The scaling `obj` (rope_scaling, or rope_parameters) describes; `field` names it in messages and
// *theta takes a rope_theta inside it.
RopeScaling read_scaling(const ConfigReader& r, const char* field, const json& obj, std::size_t max_position_embeddings,
                         const json* top_theta, float* theta) {
  using Type = RopeScaling::Type;
  const std::string at = std::string("field \"") + field + "\"";
  if (!obj.is_object()) r.fail_field(at + " must be an object, got " + json_excerpt(obj));
  const auto rope_type = obj.find("rope_type"), legacy = obj.find("type");
  if (rope_type != obj.end() && legacy != obj.end() && *rope_type != *legacy) {
    r.fail_field(at + " has rope_type " + json_excerpt(*rope_type) + " and type " + json_excerpt(*legacy) +
                 ", which differ");
  }
  const json type = rope_type != obj.end() ? *rope_type : legacy != obj.end() ? *legacy : json("default");
  static const std::pair<const char*, Type> kTypes[] = {
      {"default", Type::none}, {"linear", Type::linear}, {"dynamic", Type::dynamic}, {"llama3", Type::llama3}};
  RopeScaling s;
  bool known = false;
  for (const auto& [name, t] : kTypes) {
    if (type == name) s.type = t, known = true;
  }
  if (!known) {
    r.fail_field(at + " has rope_type " + json_excerpt(type) +
                 "; only \"default\", \"linear\", \"dynamic\" and \"llama3\" scaled rotary embeddings are implemented");
  }
  const auto number = [&](const std::string& key) {
    const auto it = obj.find(key);
    if (it == obj.end()) r.fail_field(at + " of rope_type " + json_excerpt(type) + " lacks \"" + key + "\"");
    return r.positive_float(*it, std::string(field) + "." + key);
  };
  std::vector<std::string> read = {"rope_type", "type"};
  if (s.type != Type::none) s.factor = number("factor"), read.push_back("factor");
  if (s.type == Type::dynamic) s.original_max_len = max_position_embeddings;  // as Hugging Face's dynamic RoPE
  if (s.type == Type::llama3) {
    s.low_freq_factor = number("low_freq_factor");
    s.high_freq_factor = number("high_freq_factor");
    const float original = number("original_max_position_embeddings");
    if (original != std::floor(original) || original > 4294967296.f) {
      r.fail_field(at + " has original_max_position_embeddings " +
                   json_excerpt(obj["original_max_position_embeddings"]) + ", which is not a whole number up to 2^32");
    }
    s.original_max_len = static_cast<std::size_t>(original);
    read.insert(read.end(), {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  }
  for (const auto& [key, value] : obj.items()) {
    if (std::find(read.begin(), read.end(), key) != read.end()) continue;
    if (key == "rope_theta") {
      const float given = r.positive_float(value, std::string(field) + ".rope_theta");
      if (top_theta && given != *theta) {
        fail(r.who(), ": '", r.path(), "': rope_theta ", *theta, " and ", field, ".rope_theta ", given, " differ");
      }
      *theta = given;
      continue;
    }
    r.fail_field(at + " has " + json_excerpt(json(key), 80) + " (" + json_excerpt(value, 40) + "), which rope_type " +
                 json_excerpt(type) + " does not read; it is not implemented");
  }
  return s;
}

}  // namespace

Rope read_rope(const ConfigReader& r, std::size_t max_position_embeddings) {
  const json* top = r.find("rope_theta", false);
  Rope rope{r.positive_float("rope_theta", false, 10000.f), {}};
  const json* scaling = r.find("rope_scaling", true);
  const json* parameters = r.find("rope_parameters", true);
  if (scaling && parameters)
    r.fail_field("fields \"rope_scaling\" and \"rope_parameters\" are both given; one describes RoPE");
  if (scaling) rope.scaling = read_scaling(r, "rope_scaling", *scaling, max_position_embeddings, top, &rope.theta);
  if (parameters) {
    rope.scaling = read_scaling(r, "rope_parameters", *parameters, max_position_embeddings, top, &rope.theta);
  }
  return rope;
}

void require_activation(const ConfigReader& r, const char* field, const char* expected, const char* what) {
  const std::string act = r.text(field, expected);
  if (act != expected) {
    r.fail_field(std::string("field \"") + field + "\" is " + json_excerpt(json(act)) + "; only \"" + expected +
                 "\" (" + what + ") is supported");
  }
}

std::vector<std::size_t> read_full_attention_layers(const ConfigReader& r, std::size_t L,
                                                    const std::function<bool(std::size_t)>& slides) {
  const json* types = r.find("layer_types", true);
  if (types && (!types->is_array() || types->size() != L)) {
    r.fail_field("field \"layer_types\" must be an array of num_hidden_layers " + std::to_string(L) + " entries, got " +
                 json_excerpt(*types));
  }
  // Without layer_types the list is built layer by layer: bounded here, before the model's size is checked.
  if (!types && L > (std::size_t{1} << 20)) {
    r.fail_field("num_hidden_layers " + std::to_string(L) + " is more than 2^20 layers");
  }
  std::vector<std::size_t> full;
  for (std::size_t i = 0; i < L; ++i) {
    const json t = types ? (*types)[i] : json(slides(i) ? "sliding_attention" : "full_attention");
    if (t == "full_attention") {
      full.push_back(i);
    } else if (t != "sliding_attention") {
      r.fail_field("field \"layer_types\" holds " + json_excerpt(t) + " at index " + std::to_string(i) +
                   "; \"sliding_attention\" and \"full_attention\" are implemented");
    }
  }
  return full;
}

json f32_json(float v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;  // the shortest that reads back as v
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

json layer_types_json(const nn::LanguageModelOptions& o) {
  json types = json::array();
  for (std::size_t l = 0; l < o.num_layers(); ++l)
    types.push_back(o.windowed(l) ? "sliding_attention" : "full_attention");
  return types;
}

json llama_like_config(const nn::LanguageModelOptions& o, const char* model_type, const char* architecture) {
  const RopeScaling s = o.rope_scaling_options();
  json scaling = nullptr;
  using T = RopeScaling::Type;
  if (s.type != T::none) {
    const char* names[] = {"default", "linear", "dynamic", "llama3"};
    scaling = {{"rope_type", names[static_cast<int>(s.type)]}, {"factor", f32_json(s.factor)}};
    if (s.type == T::llama3) {
      scaling["low_freq_factor"] = f32_json(s.low_freq_factor);
      scaling["high_freq_factor"] = f32_json(s.high_freq_factor);
      scaling["original_max_position_embeddings"] = s.original_max_len;
    }
  }
  const nn::MultiHeadAttentionOptions a = o.block().attention();
  // Dynamic RoPE reads its trained context from max_position_embeddings (max_len is factor times it).
  const std::size_t P = s.type == T::dynamic ? s.original_max_len : o.max_len();
  return {{"architectures", {architecture}},
          {"model_type", model_type},
          {"vocab_size", o.vocab_size()},
          {"hidden_size", o.d_model()},
          {"intermediate_size", o.d_ff()},
          {"num_hidden_layers", o.num_layers()},
          {"num_attention_heads", o.num_heads()},
          {"num_key_value_heads", a.kv_heads()},
          {"head_dim", a.head_dim()},
          {"max_position_embeddings", P},
          {"rms_norm_eps", f32_json(o.norm_eps())},
          {"rope_theta", f32_json(o.rope_theta())},
          {"rope_scaling", scaling},
          {"tie_word_embeddings", o.tie_embeddings()},
          {"hidden_act", "silu"},
          {"attention_dropout", 0.0},
          {"torch_dtype", "float32"}};
}

void add_linear(std::vector<TensorMap>& out, const std::string& hf, const std::string& xgrad, std::size_t rows,
                std::size_t cols, bool bias) {
  out.push_back({hf + ".weight", xgrad + ".weight", {rows, cols}});
  if (bias) out.push_back({hf + ".bias", xgrad + ".bias", {rows}});
}

}  // namespace xgrad::weights::detail
