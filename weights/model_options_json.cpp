// LanguageModelOptions to and from JSON (the architecture a checkpoint stores), and the fields
// in which two options differ.
#include "xgrad/weights/model_options_json.hpp"

#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/utf8.hpp"

namespace xgrad::weights {

using nn::Activation;
using nn::Init;
using nn::LanguageModel;
using nn::LanguageModelOptions;
using nn::Norm;
using nn::NormKind;
using nn::Positional;

namespace {

using nlohmann::json;

// One field: how to write it, how to read it into options (throwing a message on a bad value),
// and the value a file written before the field existed means (null: every file has it).
struct Field {
  const char* name;
  bool architecture;
  std::function<json(const LanguageModelOptions&)> get;
  std::function<void(LanguageModelOptions&, const json&)> set;
  json classic = nullptr;
};

std::size_t as_count(const json& v) {
  // Counts past 2^32 are no model this library can build; the bound keeps the arithmetic of the
  // checks that follow far from overflow.
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() > (std::uint64_t{1} << 32)) {
    throw std::invalid_argument("is not a whole number up to 2^32");
  }
  return static_cast<std::size_t>(v.get<std::uint64_t>());
}

// A list of counts, at most 2^20 of them (a layer index each).
std::vector<std::size_t> as_counts(const json& v) {
  const char* what = "is not a list of at most 2^20 whole numbers up to 2^32";
  if (!v.is_array() || v.size() > (std::size_t{1} << 20)) throw std::invalid_argument(what);
  std::vector<std::size_t> out;
  for (const json& e : v) {
    if (!e.is_number_unsigned() || e.get<std::uint64_t>() > (std::uint64_t{1} << 32)) throw std::invalid_argument(what);
    out.push_back(static_cast<std::size_t>(e.get<std::uint64_t>()));
  }
  return out;
}

float as_float(const json& v) {
  if (!v.is_number()) throw std::invalid_argument("is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::abs(d) > 3.4e38) throw std::invalid_argument("is not a finite float");
  return static_cast<float>(d);
}

bool as_bool(const json& v) {
  if (!v.is_boolean()) throw std::invalid_argument("is not true or false");
  return v.get<bool>();
}

template <class E>
using Names = OptionNames<E>;

template <class E>
E as_enum(const json& v, const Names<E>& names) {
  if (v.is_string()) {
    for (const auto& [n, e] : names) {
      if (v.get<std::string>() == n) return e;
    }
  }
  std::string known;
  for (const auto& [n, e] : names) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("is not one of " + known);
}

template <class E>
const char* name_of(E e, const Names<E>& names) {
  for (const auto& [n, v] : names) {
    if (v == e) return n.c_str();
  }
  return "?";
}

// A field written as its own value and read with `read` (as_count, as_float or as_bool).
#define XGRAD_FIELD(f, arch, read, ...)                                                                                \
  Field {                                                                                                              \
#f, arch, [](const LanguageModelOptions& o) { return json(o.f()); }, [](LanguageModelOptions & o,                  \
                                                                            const json& v) { o.f(read(v)); },          \
                                                                                                           __VA_ARGS__ \
  }
// A field written as its name in `names`.
#define XGRAD_ENUM_FIELD(f, names, ...)                                                                               \
  Field {                                                                                                             \
#f, true,                                                                                                         \
        [](const LanguageModelOptions&                                                                                \
               o) { return json(name_of(o.f(), names)); }, [](LanguageModelOptions & o,                               \
                                                              const json& v) { o.f(as_enum(v, names)); }, __VA_ARGS__ \
  }

const std::vector<Field>& fields() {
  static const std::vector<Field> all = {
      XGRAD_FIELD(vocab_size, true, as_count),
      XGRAD_FIELD(d_model, true, as_count),
      XGRAD_FIELD(num_heads, true, as_count),
      XGRAD_FIELD(num_kv_heads, true, as_count, 0u),
      XGRAD_FIELD(head_dim, true, as_count, 0u),
      XGRAD_FIELD(num_layers, true, as_count),
      XGRAD_FIELD(d_ff, true, as_count),
      XGRAD_FIELD(max_len, true, as_count),
      XGRAD_FIELD(dropout, false, as_float),
      XGRAD_ENUM_FIELD(norm, norm_names()),
      XGRAD_ENUM_FIELD(norm_kind, norm_kind_names(), "layer_norm"),
      XGRAD_FIELD(norm_eps, true, as_float, 1e-5),
      XGRAD_FIELD(norm_affine, true, as_bool, true),
      XGRAD_FIELD(norm_bias, true, as_bool, true),
      XGRAD_FIELD(norm_unit_offset, true, as_bool, false),
      XGRAD_ENUM_FIELD(activation, activation_names()),
      XGRAD_ENUM_FIELD(positional, positional_names()),
      XGRAD_FIELD(rope_theta, true, as_float, 10000.0),
      XGRAD_FIELD(rotary_dim, true, as_count, 0u),
      XGRAD_ENUM_FIELD(rope_scaling, rope_scaling_names(), "none"),
      XGRAD_FIELD(rope_factor, true, as_float, 1.0),
      XGRAD_FIELD(rope_low_freq_factor, true, as_float, 1.0),
      XGRAD_FIELD(rope_high_freq_factor, true, as_float, 4.0),
      XGRAD_FIELD(rope_original_max_len, true, as_count, 0u),
      XGRAD_FIELD(qk_norm, true, as_bool, false),
      XGRAD_FIELD(sliding_window, true, as_count, 0u),
      Field{"full_attention_layers", true,
            [](const LanguageModelOptions& o) { return json(o.full_attention_layers()); },
            [](LanguageModelOptions& o, const json& v) { o.full_attention_layers(as_counts(v)); }, json::array()},
      XGRAD_FIELD(rope_local_theta, true, as_float, 0.0),
      XGRAD_FIELD(attn_scale, true, as_float, 0.0),
      XGRAD_FIELD(attn_softcap, true, as_float, 0.0),
      XGRAD_FIELD(qkv_bias, true, as_bool, true),
      XGRAD_FIELD(out_bias, true, as_bool, true),
      XGRAD_FIELD(ffn_bias, true, as_bool, true),
      XGRAD_FIELD(parallel_residual, true, as_bool, false),
      XGRAD_FIELD(head_bias, true, as_bool, true),
      XGRAD_FIELD(tie_embeddings, true, as_bool, false),
      XGRAD_FIELD(embed_scale, true, as_float, 1.0),
      XGRAD_FIELD(final_softcap, true, as_float, 0.0),
      XGRAD_ENUM_FIELD(init, init_names(), "pytorch"),
  };
  return all;
}

#undef XGRAD_ENUM_FIELD
#undef XGRAD_FIELD

// Files written before norms were an option call the eps "layer_norm_eps".
constexpr const char* kOldEps = "layer_norm_eps";

}  // namespace

const OptionNames<Norm>& norm_names() {
  static const OptionNames<Norm> names = {{"pre", Norm::pre}, {"post", Norm::post}, {"sandwich", Norm::sandwich}};
  return names;
}

const OptionNames<NormKind>& norm_kind_names() {
  static const OptionNames<NormKind> names = {{"layer_norm", NormKind::layer_norm}, {"rms_norm", NormKind::rms_norm}};
  return names;
}

const OptionNames<Activation>& activation_names() {
  static const OptionNames<Activation> names = {{"gelu", Activation::gelu},   {"gelu_tanh", Activation::gelu_tanh},
                                                {"relu", Activation::relu},   {"swiglu", Activation::swiglu},
                                                {"geglu", Activation::geglu}, {"geglu_tanh", Activation::geglu_tanh}};
  return names;
}

const OptionNames<Positional>& positional_names() {
  static const OptionNames<Positional> names = {{"learned", Positional::learned},
                                                {"sinusoidal", Positional::sinusoidal},
                                                {"none", Positional::none},
                                                {"rotary", Positional::rotary}};
  return names;
}

const OptionNames<RopeScaling::Type>& rope_scaling_names() {
  using T = RopeScaling::Type;
  static const OptionNames<T> names = {
      {"none", T::none}, {"linear", T::linear}, {"dynamic", T::dynamic}, {"llama3", T::llama3}};
  return names;
}

const OptionNames<Init>& init_names() {
  static const OptionNames<Init> names = {{"pytorch", Init::pytorch}, {"gpt2", Init::gpt2}};
  return names;
}

std::string to_json(const LanguageModelOptions& o) {
  json j = json::object();
  for (const Field& f : fields()) j[f.name] = f.get(o);
  return j.dump();
}

LanguageModelOptions language_model_options_from_json(const std::string& text, const std::string& who) {
  json j;
  std::set<std::string> seen;  // the top-level keys: a field twice is ambiguous (the parser keeps the last)
  std::string twice;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second &&
        twice.empty()) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  j = xgrad::detail::parse_json(text, who + ": the model options text", note_keys);
  if (!twice.empty()) fail(who, ": the model options hold the field \"", escape_bytes(twice.substr(0, 80)), "\" twice");
  if (!j.is_object()) fail(who, ": the model options are not a JSON object: ", escape_bytes(text.substr(0, 80)));
  std::set<std::string> known;
  LanguageModelOptions o(1, 1, 1, 1);
  if (j.contains(kOldEps)) {
    if (j.contains("norm_eps"))
      fail(who, ": the model options hold both \"norm_eps\" and its old name \"", kOldEps, "\"");
    j["norm_eps"] = j[kOldEps];
    j.erase(kOldEps);
  }
  for (const Field& f : fields()) {
    known.insert(f.name);
    const auto it = j.find(f.name);
    if (it == j.end() && f.classic.is_null()) fail(who, ": the model options have no field \"", f.name, "\"");
    const json& value = it == j.end() ? f.classic : *it;
    try {
      f.set(o, value);
    } catch (const std::invalid_argument& e) {
      fail(who, ": model option ", f.name, " = ", xgrad::detail::json_excerpt(value, 40), " ", e.what());
    }
  }
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key))
      fail(who, ": unknown model option \"", key, "\" (this xgrad cannot build that architecture)");
  }
  // Values each of the right kind may still describe no model (num_heads 3 for d_model 8, dropout 5,
  // norm_eps -1): refused here, for every reader, not only by the constructor.
  try {
    LanguageModel::check(o);
  } catch (const Error& e) {
    fail(who, ": ", e.what());
  }
  return o;
}

namespace {

// The options with every field that builds nothing of its own written as in `other`: num_kv_heads
// 0 as num_heads and rotary_dim 0 as the head size where `other` spells them out, RoPE's fields
// without rotary positions, the head's bias when tied, the norms' bias where no LayerNorm has a weight.
LanguageModelOptions canonical(LanguageModelOptions o, const LanguageModelOptions& other) {
  const bool rotary = o.positional() == Positional::rotary;
  if (o.num_kv_heads() == 0 && other.num_kv_heads() != 0) o.num_kv_heads(o.num_heads());
  if (o.head_dim() == 0 && other.head_dim() != 0) o.head_dim(o.block().attention().head_dim());
  if (o.attn_scale() == 0.f && other.attn_scale() != 0.f) o.attn_scale(o.block().attention().score_scale());
  if (rotary && o.rotary_dim() == 0 && other.rotary_dim() != 0 && other.positional() == Positional::rotary)
    o.rotary_dim(o.block().attention().head_dim());
  if (!rotary) o.rotary_dim(0).rope_theta(10000.f).rope_scaling(RopeScaling::Type::none);
  if (o.rope_scaling() == RopeScaling::Type::none) {
    o.rope_factor(1.f).rope_low_freq_factor(1.f).rope_high_freq_factor(4.f).rope_original_max_len(0);
  }
  if (o.tie_embeddings()) o.head_bias(false);
  if (o.norm_kind() == NormKind::rms_norm || !o.norm_affine()) o.norm_bias(false);
  return o;
}

}  // namespace

std::vector<OptionsDifference> architecture_differences(const LanguageModelOptions& stored_in,
                                                        const LanguageModelOptions& given_in) {
  const LanguageModelOptions stored = canonical(stored_in, given_in), given = canonical(given_in, stored_in);
  std::vector<OptionsDifference> out;
  for (const Field& f : fields()) {
    if (!f.architecture) continue;
    const json a = f.get(stored), b = f.get(given);
    if (a != b) out.push_back({f.name, a.dump(), b.dump()});
  }
  return out;
}

}  // namespace xgrad::weights
