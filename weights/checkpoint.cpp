// Module state dictionaries and checkpoint files.
#include "xgrad/weights/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/detail/model_size.hpp"
#include "xgrad/weights/model_options_json.hpp"

namespace xgrad::weights {

namespace {
const std::string kFormatKey = "xgrad.checkpoint", kFormat = "2", kModelOptionsKey = "xgrad.model_options";
const std::string kReserved = "xgrad.";
const std::string kOptimizerPrefix = "optimizer:", kOldOptimizerPrefix = "optimizer.";  // format 2, format 1

// Names from before a TransformerBlock's feed-forward sublayer owned its norm:
// "blocks.<i>.ffn_norm.<p>" is now "blocks.<i>.ffn.norm.<p>". Returns the current name, or the
// name unchanged.
std::string current_name(const std::string& name) {
  const std::string old_part = "ffn_norm.", new_part = "ffn.norm.";
  const std::size_t at = name.find(old_part);
  if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) return name;
  return name.substr(0, at) + new_part + name.substr(at + old_part.size());
}

// Renames old entries whose current name the module expects (and the state does not hold
// under that name already); returns how many.
template <class IsExpected>
std::size_t rename_old_entries(NamedArrays& state, IsExpected is_expected) {
  std::set<std::string> names;
  for (const auto& [name, a] : state) names.insert(name);
  std::size_t renamed = 0;
  for (auto& [name, a] : state) {
    const std::string now = current_name(name);
    if (now == name || names.count(now) || !is_expected(now)) continue;
    name = now;
    ++renamed;
  }
  return renamed;
}

std::size_t rename_old_parameters(const nn::Module& module, NamedArrays& state) {
  std::set<std::string> params;
  for (const auto& [name, p] : module.named_state()) params.insert(name);
  return rename_old_entries(state, [&](const std::string& n) { return params.count(n) != 0; });
}

void say_renamed(const std::string& who, std::size_t renamed) {
  if (!renamed) return;
  std::fprintf(stderr,
               "xgrad: %s: %zu tensor(s) use the names from before the rename of blocks.N.ffn_norm to "
               "blocks.N.ffn.norm; loaded under the new names (save again to update the file)\n",
               who.c_str(), renamed);
}
}  // namespace

NamedArrays state_dict(const nn::Module& module) {
  NamedArrays out;
  for (const auto& [name, t] : module.named_state()) out.emplace_back(name, t.value());
  return out;
}

LoadResult load_state_dict(nn::Module& module, const NamedArrays& state_in, const LoadOptions& options) {
  NamedTensors targets = module.named_state();
  std::set<std::string> params;
  for (const auto& [name, p] : module.named_parameters()) params.insert(name);
  // Only a state with old names is copied (to rename it); others are read in place.
  NamedArrays renamed;
  const bool old_names =
      std::any_of(state_in.begin(), state_in.end(), [](const auto& e) { return current_name(e.first) != e.first; });
  if (old_names) {
    renamed = state_in;
    say_renamed("load_state_dict", rename_old_parameters(module, renamed));
  }
  const NamedArrays& state = old_names ? renamed : state_in;
  std::map<std::string, const Array*> given;
  for (const auto& [name, a] : state) {
    if (!given.emplace(name, &a).second) fail("load_state_dict: '", name, "' appears twice");
  }
  // A tied parameter's other names (head.weight with tied embeddings), as torch's state_dict
  // writes them: each entry is the parameter listed under its first name.
  std::set<std::string> target_names;
  for (const auto& [name, t] : targets) target_names.insert(name);
  std::map<std::string, std::vector<std::pair<const std::string*, const Array*>>> aliases;  // first name -> entries
  std::set<std::string> alias_names;
  for (const auto& [name, a] : state) {
    if (target_names.count(name)) continue;
    Tensor p;
    try {
      p = module.parameter(name);
    } catch (const Error&) {
      continue;
    }
    for (const auto& [first, t] : targets) {
      if (!t.is_same(p)) continue;
      aliases[first].emplace_back(&name, &a);
      alias_names.insert(name);
      break;
    }
  }
  LoadResult result;
  struct Copy {
    const std::string* name;
    Tensor* target;
    const Array* value;
    bool parameter;
  };
  std::vector<Copy> plan;
  for (auto& [name, t] : targets) {
    const bool parameter = params.count(name) != 0;
    const char* kind = parameter ? "parameter" : "buffer";
    auto it = given.find(name);
    const auto tied = aliases.find(name);
    const std::string* source = &name;  // the state's name for the value loaded
    const Array* value = nullptr;
    if (it != given.end()) {
      value = it->second;
    } else if (tied != aliases.end()) {
      std::tie(source, value) = tied->second[0];
    }
    if (!value) {
      if (options.strict()) fail("load_state_dict: missing ", kind, " '", name, "'");
      result.missing_keys.push_back(name);
      continue;
    }
    auto check_shape = [&](const std::string& entry, const Array& a) {
      if (a.shape() != t.shape()) {
        fail("load_state_dict: ", kind, " '", entry, "' has shape ", shape_str(a.shape()), " in the state but ",
             shape_str(t.shape()), " in the module");
      }
    };
    check_shape(*source, *value);
    if (tied != aliases.end()) {
      for (const auto& [alias, a] : tied->second) {
        check_shape(*alias, *a);
        const float *x = a->data(), *y = value->data();
        std::size_t i = 0;
        while (i < a->size() && (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) ++i;
        if (i < a->size()) {
          fail("load_state_dict: '", *alias, "' is the parameter '", name,
               "' (tied), and the state gives the two names different values (first at flat position ", i, ")");
        }
      }
    }
    plan.push_back({&name, &t, value, parameter});
  }
  if (plan.size() != given.size()) {
    for (const auto& [name, a] : state) {
      if (target_names.count(name) || alias_names.count(name)) continue;
      if (options.strict())
        fail("load_state_dict: unexpected entry '", name, "' (the module has no such parameter or buffer)");
      result.unexpected_keys.push_back(name);
    }
  }
  if (!options.allow_non_finite()) {
    for (const Copy& c : plan) {
      if (!c.parameter) continue;  // buffers may hold any value
      if (const std::size_t i = first_non_finite(*c.value); i < c.value->size()) {
        fail("load_state_dict: parameter '", *c.name, "' holds ", c.value->data()[i], " at flat position ", i, " of ",
             c.value->size(), "; refusing non-finite weights (LoadOptions().allow_non_finite(true) loads them)");
      }
    }
  }
  for (const Copy& c : plan) c.target->mutable_value() = *c.value;
  return result;
}

namespace {

// `asked`: the given options are a caller's ("4 asked"), otherwise a model's ("4 in the model").
void check_model_options(const nn::LanguageModelOptions& stored, const nn::LanguageModelOptions& given,
                         const std::string& who, bool asked) {
  const std::vector<OptionsDifference> diff = architecture_differences(stored, given);
  if (diff.empty()) return;
  std::string list;
  for (const auto& d : diff) {
    list += (list.empty() ? "" : "; ") + d.field + " " + d.stored + " in the file, " + d.given +
            (asked ? " asked" : " in the model");
  }
  fail(who, ": the stored model options contradict the ones ", asked ? "asked for" : "of the model", ": ", list);
}

// A file split into the module's entries and the rest.
struct Split {
  NamedArrays model;
  Checkpoint rest;
};

Split split(const std::string& path, SafetensorsContents& file, const char* who) {
  Split out;
  const auto format = file.metadata.find(kFormatKey);
  const bool old_format = format == file.metadata.end();
  if (!old_format && format->second != kFormat) {
    fail(who, ": '", path, "' has checkpoint format \"", escape_bytes(format->second.substr(0, 40)),
         "\"; this xgrad reads formats 1 and ", kFormat);
  }
  const std::string& prefix = old_format ? kOldOptimizerPrefix : kOptimizerPrefix;
  for (auto& [name, a] : file.tensors) {
    if (name.compare(0, prefix.size(), prefix) == 0) {
      out.rest.optimizer_state.emplace_back(name.substr(prefix.size()), std::move(a));
    } else {
      out.model.emplace_back(name, std::move(a));
    }
  }
  for (auto& [key, value] : file.metadata) {
    // Format 1 reserved nothing: its metadata comes back whole.
    if (old_format || key.compare(0, kReserved.size(), kReserved) != 0)
      out.rest.metadata.emplace(key, std::move(value));
  }
  if (!old_format) {
    const auto options = file.metadata.find(kModelOptionsKey);
    if (options != file.metadata.end()) {
      out.rest.model_options = language_model_options_from_json(options->second, std::string(who) + ": '" + path + "'");
    }
  }
  return out;
}

// Loads split entries into `module`: renames old names, checks a LanguageModel's options, loads.
Checkpoint load_split(const std::string& path, Split& s, nn::Module& module, const LoadOptions& options,
                      const char* who) {
  if (const auto* lm = dynamic_cast<const nn::LanguageModel*>(&module); lm && s.rest.model_options) {
    check_model_options(*s.rest.model_options, lm->options(), std::string(who) + ": '" + path + "'", false);
  }
  // Optimizer entries are "<parameter>.<slot>".
  std::set<std::string> params;
  for (const auto& [name, p] : module.named_parameters()) params.insert(name);
  say_renamed(
      std::string(who) + ": '" + path + "'",
      rename_old_parameters(module, s.model) + rename_old_entries(s.rest.optimizer_state, [&](const std::string& key) {
        const std::size_t dot = key.rfind('.');
        return dot != std::string::npos && params.count(key.substr(0, dot)) != 0;
      }));
  try {
    LoadResult r = load_state_dict(module, s.model, options);
    s.rest.missing_keys = std::move(r.missing_keys);
    s.rest.unexpected_keys = std::move(r.unexpected_keys);
  } catch (const Error& e) {
    fail(who, ": '", path, "': ", e.what());
  }
  return std::move(s.rest);
}

LoadedLanguageModel build_and_load(const std::string& path, const std::optional<nn::LanguageModelOptions>& expected,
                                   const LoadOptions& load_options) {
  const char* who = "load_language_model";
  const std::string where = std::string(who) + ": '" + path + "'";
  SafetensorsContents file = load_safetensors(path);
  Split s = split(path, file, who);
  nn::LanguageModelOptions o(1, 1, 1, 1);
  if (s.rest.model_options) {
    if (expected) check_model_options(*s.rest.model_options, *expected, where, true);
    o = *s.rest.model_options;
    if (expected) o.dropout(expected->dropout());
  } else if (expected) {
    o = *expected;
  } else {
    fail(where, ": the file stores no model options (\"", kModelOptionsKey,
         "\"); give them for a file saved without them: load_language_model(path, options)");
  }
  try {
    nn::LanguageModel::check(o);
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  // Options far beyond the file's tensors (tampered, or given for another file) are refused before
  // the model is built; the slack lets strict(false) load a file that lacks some of them.
  double file_values = 0;
  for (const auto& [name, a] : s.model) file_values += static_cast<double>(a.size());
  const double file_tensors = static_cast<double>(s.model.size());
  const nn::detail::ModelSize wanted = nn::detail::model_size(o);
  if (wanted.values > 4 * file_values + (1 << 20) || wanted.tensors > 4 * file_tensors + 64) {
    const auto whole = [](double v) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%.0f", v);
      return std::string(buf);
    };
    fail(where, ": its model options (", to_json(o), ") describe a model of ", whole(wanted.values), " values in ",
         whole(wanted.tensors), " tensors, but the file holds ", whole(file_values), " values in ", whole(file_tensors),
         " tensors");
  }
  check_available_memory(wanted.bytes, who,
                         "building the model of '" + path + "' (" + std::to_string(o.num_layers()) + " blocks, " +
                             std::to_string(static_cast<std::uint64_t>(wanted.values)) + " float32 values)");
  // A strict load overwrites every value: the weights are not drawn first. A loose one keeps the
  // drawn values of what the file lacks.
  Generator init = load_options.strict() ? Generator::for_loading(0) : Generator(0);
  LoadedLanguageModel out;
  out.model = std::make_unique<nn::LanguageModel>(o, init);
  out.checkpoint = load_split(path, s, *out.model, load_options, who);
  return out;
}

}  // namespace

void check_model_options(const nn::LanguageModelOptions& stored, const nn::LanguageModelOptions& given,
                         const std::string& who) {
  check_model_options(stored, given, who, true);
}

SafetensorsContents checkpoint_contents(const nn::Module& module, const NamedArrays& optimizer_state,
                                        const Metadata& metadata) {
  const char* who = "save_checkpoint";
  SafetensorsContents out;
  out.tensors = state_dict(module);
  for (const auto& [name, a] : out.tensors) check_utf8(name, who, "tensor name");
  for (const auto& [name, a] : optimizer_state) {
    check_utf8(name, who, "optimizer state name");
    out.tensors.emplace_back(kOptimizerPrefix + name, a);
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, who, "metadata key");
    check_utf8(value, who, ("metadata value of '" + escape_bytes(key) + "'").c_str());
    if (key.compare(0, kReserved.size(), kReserved) == 0) {
      fail(who, ": metadata key '", key, "' is reserved (keys starting with \"", kReserved, "\" are xgrad's own)");
    }
  }
  out.metadata = metadata;
  out.metadata[kFormatKey] = kFormat;
  if (const auto* lm = dynamic_cast<const nn::LanguageModel*>(&module))
    out.metadata[kModelOptionsKey] = to_json(lm->options());
  return out;
}

void save_checkpoint(const std::string& path, const nn::Module& module, const NamedArrays& optimizer_state,
                     const Metadata& metadata) {
  const SafetensorsContents c = checkpoint_contents(module, optimizer_state, metadata);
  save_safetensors(path, c.tensors, c.metadata);
}

Checkpoint load_checkpoint(const std::string& path, nn::Module& module, const LoadOptions& options) {
  SafetensorsContents file = load_safetensors(path);
  Split s = split(path, file, "load_checkpoint");
  return load_split(path, s, module, options, "load_checkpoint");
}

LoadedLanguageModel load_language_model(const std::string& path, const LoadOptions& options) {
  return build_and_load(path, std::nullopt, options);
}

LoadedLanguageModel load_language_model(const std::string& path, const nn::LanguageModelOptions& expected,
                                        const LoadOptions& options) {
  return build_and_load(path, expected, options);
}

}  // namespace xgrad::weights
