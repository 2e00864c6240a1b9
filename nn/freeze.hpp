// Freezing by name: parameters chosen by patterns over their dotted names (xgrad's, or another
// spelling such as Hugging Face's given as aliases) stop training.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

/// Other spellings of dotted names: xgrad's name -> another (such as Hugging Face's
/// "model.layers.0.self_attn.q_proj.weight" for "blocks.0.attn.w_q.weight";
/// weights::hf_parameter_names gives them for a model).
using NameAliases = std::map<std::string, std::string>;

/// Whether `name` matches `pattern`:
/// - "re:<expression>": the ECMAScript regular expression matches the whole name;
/// - a glob: '*' matches any run of characters (dots included) and '?' one character;
/// - a plain name also matches every name that ends in "." + pattern, as PEFT's target_modules
///   do ("q_proj" matches "model.layers.0.self_attn.q_proj").
///
/// An empty pattern or an expression that does not parse throws, naming the pattern.
bool matches_name_pattern(const std::string& pattern, const std::string& name);

/// The names of `names` (with their aliases) that `pattern` matches; `who` prefixes errors.
std::vector<std::string> select_names(const std::vector<std::string>& names, const std::string& pattern,
                                      const NameAliases& aliases, const char* who);

/// Stops training every parameter whose name, or its alias, matches one of `patterns`
/// (matches_name_pattern): requires_grad becomes false and its gradient is dropped, so it records
/// none and an optimizer built on named_trainable_parameters() holds no state for it. A pattern that
/// matches no parameter throws, naming it, before anything changes. Returns the names frozen.
///
///     nn::freeze(model, {"tok_emb.*", "blocks.0.*"});
std::vector<std::string> freeze(Module& model, const std::vector<std::string>& patterns,
                                const NameAliases& aliases = {});

/// Trains again the parameters freeze() would select: requires_grad becomes true. Returns their
/// names.
std::vector<std::string> unfreeze(Module& model, const std::vector<std::string>& patterns,
                                  const NameAliases& aliases = {});

}  // namespace xgrad::nn
