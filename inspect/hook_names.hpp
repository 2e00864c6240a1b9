// TransformerLens's hook names and xgrad's points: the table between them, a lookup that takes
// either spelling, and the near names an unknown one is told about.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/nn/module.hpp"

namespace xgrad::inspect {

/// One row of the table from TransformerLens's HookedTransformer hook names to xgrad's points.
/// L stands for a block number. `xgrad` is empty where xgrad has no such point.
struct HookNameRow {
  std::string transformer_lens;  ///< e.g. "blocks.L.attn.hook_z"
  std::string xgrad;             ///< e.g. "blocks.L.attn.z"
  std::string note;              ///< how the two differ (shape, where in the computation), or ""
};

/// The whole table, in TransformerLens's forward order (docs/inspect.md prints it).
const std::vector<HookNameRow>& transformer_lens_table();

/// xgrad's point for a TransformerLens hook name, e.g.\ "blocks.3.attn.hook_z" -> "blocks.3.attn.z";
/// nullopt when `name` is not a TransformerLens hook name with an xgrad point.
std::optional<std::string> from_transformer_lens(const std::string& name);

/// The TransformerLens name of an xgrad point, e.g.\ "blocks.3.ffn.hidden" -> "blocks.3.mlp.hook_post";
/// nullopt when TransformerLens has none.
std::optional<std::string> to_transformer_lens(const std::string& point);

/// The full name of `root`'s hook point `name`, spelled as xgrad spells it or as TransformerLens
/// does. Throws when it is neither: the message names `name`, says so when it is a TransformerLens
/// name xgrad has no point for (and why), and lists the nearest names of the model's points in
/// both spellings.
std::string resolve_point(const nn::Module& root, const std::string& name);
/// The same, with the messages naming `who` (the function that was given the name).
std::string resolve_point(const nn::Module& root, const std::string& name, const char* who);

/// The bytes of a name near_names compares, and of a name a message quotes whole.
inline constexpr std::size_t kNearNameBytes = 200;

/// Up to `count` of `candidates` nearest to `name` (edit distance, ties in candidates' order).
/// Only the first kNearNameBytes of `name` and of each candidate are compared, so a call costs at
/// most kNearNameBytes^2 steps a candidate whatever the lengths (no hook point is that long).
std::vector<std::string> near_names(const std::string& name, const std::vector<std::string>& candidates,
                                    std::size_t count = 5);

/// `name` in single quotes for a message; one longer than kNearNameBytes is cut there, as
/// 'its first bytes...' (N bytes).
std::string quoted_name(const std::string& name);

}  // namespace xgrad::inspect
