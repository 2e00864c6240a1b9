// LanguageModelOptions to and from JSON (the architecture a checkpoint stores), and the fields
// in which two options differ.
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/nn/transformer.hpp"

namespace xgrad::nn {

namespace {

using nlohmann::json;

const char* norm_name(Norm n) { return n == Norm::pre ? "pre" : n == Norm::post ? "post" : "none"; }
const char* activation_name(Activation a) {
  return a == Activation::gelu ? "gelu" : a == Activation::gelu_tanh ? "gelu_tanh" : "relu";
}
const char* positional_name(Positional p) { return p == Positional::learned ? "learned" : "sinusoidal"; }

// One field: how to write it, and how to read it into options (throwing a message on a bad value).
struct Field {
  const char* name;
  bool architecture;
  std::function<json(const LanguageModelOptions&)> get;
  std::function<void(LanguageModelOptions&, const json&)> set;
};

std::size_t as_count(const json& v) {
  // Counts past 2^32 are no model this library can build; the bound keeps the arithmetic of the
  // checks that follow far from overflow.
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() > (std::uint64_t{1} << 32)) {
    throw std::invalid_argument("is not a whole number up to 2^32");
  }
  return static_cast<std::size_t>(v.get<std::uint64_t>());
}

float as_float(const json& v) {
  if (!v.is_number()) throw std::invalid_argument("is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::abs(d) > 3.4e38) throw std::invalid_argument("is not a finite float");
  return static_cast<float>(d);
}

template <class E>
E as_enum(const json& v, std::initializer_list<std::pair<const char*, E>> names) {
  if (v.is_string()) {
    for (const auto& [n, e] : names) {
      if (v.get<std::string>() == n) return e;
    }
  }
  std::string known;
  for (const auto& [n, e] : names) known += (known.empty() ? "" : ", ") + std::string(n);
  throw std::invalid_argument("is not one of " + known);
}

// A field written as its own value and read with `read` (as_count or as_float).
#define XGRAD_FIELD(f, arch, read)                                                                           \
  Field {                                                                                                    \
#f, arch, [](const LanguageModelOptions& o) { return json(o.f()); }, [](LanguageModelOptions & o,        \
                                                                            const json& v) { o.f(read(v)); } \
  }
#define XGRAD_COUNT_FIELD(f) XGRAD_FIELD(f, true, as_count)
#define XGRAD_FLOAT_FIELD(f, arch) XGRAD_FIELD(f, arch, as_float)

const std::vector<Field>& fields() {
  static const std::vector<Field> all =
      {
          XGRAD_COUNT_FIELD(vocab_size),
          XGRAD_COUNT_FIELD(d_model),
          XGRAD_COUNT_FIELD(num_heads),
          XGRAD_COUNT_FIELD(num_layers),
          XGRAD_COUNT_FIELD(d_ff),
          XGRAD_COUNT_FIELD(max_len),
          XGRAD_FLOAT_FIELD(dropout, false),
          Field{"norm", true, [](const LanguageModelOptions& o) { return json(norm_name(o.norm())); },
                [](LanguageModelOptions& o, const json& v) {
    o.norm(as_enum<Norm>(v, {{"pre", Norm::pre}, {"post", Norm::post}}));
                }},
          Field{"activation", true, [](const LanguageModelOptions& o) { return json(activation_name(o.activation())); },
                [](LanguageModelOptions& o, const json& v) {
    o.activation(as_enum<Activation>(
        v, {{"gelu", Activation::gelu}, {"gelu_tanh", Activation::gelu_tanh}, {"relu", Activation::relu}}));
                }},
                                  Field{"positional", true,
                                        [](const LanguageModelOptions& o) {
    return json(positional_name(o.positional()));
                                        },
                                        [](LanguageModelOptions& o, const json& v) {
    o.positional(as_enum<Positional>(v, {{"learned", Positional::learned}, {"sinusoidal", Positional::sinusoidal}}));
                                  }},
                                  XGRAD_FLOAT_FIELD(layer_norm_eps, true),
                                  };
  return all;
}

#undef XGRAD_COUNT_FIELD
#undef XGRAD_FLOAT_FIELD
#undef XGRAD_FIELD

}  // namespace

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
  try {
    j = json::parse(text, note_keys);
  } catch (const json::exception&) {
    fail(who, ": the model options are not valid JSON: ", escape_bytes(text.substr(0, 80)));
  }
  if (!twice.empty()) fail(who, ": the model options hold the field \"", escape_bytes(twice.substr(0, 80)), "\" twice");
  if (!j.is_object()) fail(who, ": the model options are not a JSON object: ", escape_bytes(text.substr(0, 80)));
  std::set<std::string> known;
  LanguageModelOptions o(1, 1, 1, 1);
  for (const Field& f : fields()) {
    known.insert(f.name);
    const auto it = j.find(f.name);
    if (it == j.end()) fail(who, ": the model options have no field \"", f.name, "\"");
    try {
      f.set(o, *it);
    } catch (const std::invalid_argument& e) {
      fail(who, ": model option ", f.name, " = ", it->dump().substr(0, 40), " ", e.what());
    }
  }
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key))
      fail(who, ": unknown model option \"", key, "\" (this xgrad cannot build that architecture)");
  }
  // Values each of the right kind may still describe no model (num_heads 3 for d_model 8, dropout 5,
  // layer_norm_eps -1): refused here, for every reader, not only by the constructor.
  try {
    LanguageModel::check(o);
  } catch (const Error& e) {
    fail(who, ": ", e.what());
  }
  return o;
}

std::vector<OptionsDifference> architecture_differences(const LanguageModelOptions& stored,
                                                        const LanguageModelOptions& given) {
  std::vector<OptionsDifference> out;
  for (const Field& f : fields()) {
    if (!f.architecture) continue;
    const json a = f.get(stored), b = f.get(given);
    if (a != b) out.push_back({f.name, a.dump(), b.dump()});
  }
  return out;
}

}  // namespace xgrad::nn
