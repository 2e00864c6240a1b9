// The TransformerLens name table and the lookups on it (hook_names.hpp).
#include "xgrad/inspect/hook_names.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "xgrad/core/error.hpp"

namespace xgrad::inspect {

const std::vector<HookNameRow>& transformer_lens_table() {
  static const std::vector<HookNameRow> table = {
      {"hook_embed", "tok_embed", ""},
      {"hook_pos_embed", "pos_embed", "learned or sinusoidal positions only; (T, C), or (B, T, C) with padding"},
      {"blocks.L.hook_resid_pre", "blocks.L.stream_in", ""},
      {"blocks.L.ln1.hook_scale", "", "not a point: the norms' statistics are not exposed"},
      {"blocks.L.ln1.hook_normalized", "", "not a point: attention's input norm is inside its residual connection"},
      {"blocks.L.attn.hook_q", "blocks.L.attn.q", "(B, T, H D): heads side by side, not (B, T, H, D)"},
      {"blocks.L.attn.hook_k", "blocks.L.attn.k", "(B, S, KV D): the key/value heads side by side"},
      {"blocks.L.attn.hook_v", "blocks.L.attn.v", "(B, S, KV D): the key/value heads side by side"},
      {"blocks.L.attn.hook_rot_q", "blocks.L.attn.rot_q", "rotary positions only; (B, T, H D)"},
      {"blocks.L.attn.hook_rot_k", "blocks.L.attn.rot_k", "rotary positions only; (B, S, KV D)"},
      {"blocks.L.attn.hook_attn_scores", "blocks.L.attn.scores",
       "before the masks (TransformerLens's: after, -inf where masked)"},
      {"blocks.L.attn.hook_pattern", "blocks.L.attn.pattern", ""},
      {"blocks.L.attn.hook_z", "blocks.L.attn.z", ""},
      {"blocks.L.attn.hook_result", "blocks.L.attn.result", ""},
      {"blocks.L.hook_attn_out", "blocks.L.attn.out", ""},
      {"blocks.L.hook_resid_mid", "blocks.L.stream_mid", ""},
      {"blocks.L.ln2.hook_scale", "", "not a point: the norms' statistics are not exposed"},
      {"blocks.L.ln2.hook_normalized", "", "not a point: the MLP's input norm is inside its residual connection"},
      {"blocks.L.mlp.hook_pre", "blocks.L.ffn.pre", "gated units: the gate"},
      {"blocks.L.mlp.hook_pre_linear", "blocks.L.ffn.pre_linear", "gated units only: the up projection"},
      {"blocks.L.mlp.hook_post", "blocks.L.ffn.hidden", "after dropout too (the same in eval mode)"},
      {"blocks.L.hook_mlp_out", "blocks.L.ffn.out", ""},
      {"blocks.L.hook_resid_post", "blocks.L.stream_out", ""},
      {"ln_final.hook_scale", "", "not a point: the norms' statistics are not exposed"},
      {"ln_final.hook_normalized", "normalized", "Pre-Norm models only"},
  };
  return table;
}

namespace {

// "blocks.12.attn.hook_z" -> {"blocks.L.attn.hook_z", "12"}; names without a block number unchanged.
std::pair<std::string, std::string> with_block_placeholder(const std::string& name) {
  const std::string prefix = "blocks.";
  if (name.compare(0, prefix.size(), prefix) != 0) return {name, ""};
  std::size_t end = prefix.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == prefix.size() || end >= name.size() || name[end] != '.') return {name, ""};
  return {prefix + "L" + name.substr(end), name.substr(prefix.size(), end - prefix.size())};
}

std::string fill_block(const std::string& pattern, const std::string& block) {
  const std::size_t at = pattern.find(".L.");
  if (at == std::string::npos) return pattern;
  return pattern.substr(0, at + 1) + block + pattern.substr(at + 2);
}

const HookNameRow* row_for_transformer_lens(const std::string& name, std::string& block) {
  const auto [pattern, number] = with_block_placeholder(name);
  block = number;
  const bool numbered = !number.empty();
  for (const HookNameRow& row : transformer_lens_table()) {
    const bool row_numbered = row.transformer_lens.find(".L.") != std::string::npos;
    if (row.transformer_lens == pattern && row_numbered == numbered) return &row;
  }
  return nullptr;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::optional<std::string> from_transformer_lens(const std::string& name) {
  std::string block;
  const HookNameRow* row = row_for_transformer_lens(name, block);
  if (!row || row->xgrad.empty()) return std::nullopt;
  return fill_block(row->xgrad, block);
}

std::optional<std::string> to_transformer_lens(const std::string& point) {
  const auto [pattern, block] = with_block_placeholder(point);
  for (const HookNameRow& row : transformer_lens_table()) {
    if (!row.xgrad.empty() && row.xgrad == pattern) return fill_block(row.transformer_lens, block);
  }
  return std::nullopt;
}

std::vector<std::string> near_names(const std::string& name, const std::vector<std::string>& candidates,
                                    std::size_t count) {
  std::vector<std::pair<std::size_t, std::size_t>> scored;  // (distance, index)
  const auto head = [](const std::string& s) { return std::string_view(s).substr(0, kNearNameBytes); };
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    scored.push_back({edit_distance(head(name), head(candidates[i])), i});
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && out.size() < count; ++i) {
    const std::string& c = candidates[scored[i].second];
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::string quoted_name(const std::string& name) {
  if (name.size() <= kNearNameBytes) return "'" + name + "'";
  return "'" + name.substr(0, kNearNameBytes) + "...' (" + std::to_string(name.size()) + " bytes)";
}

std::string resolve_point(const nn::Module& root, const std::string& name) {
  return resolve_point(root, name, "resolve_point");
}

std::string resolve_point(const nn::Module& root, const std::string& name, const char* who) {
  const std::vector<std::string> points = root.hook_points();
  if (std::find(points.begin(), points.end(), name) != points.end()) return name;
  std::string block;
  const HookNameRow* row = row_for_transformer_lens(name, block);
  if (row && !row->xgrad.empty()) {
    const std::string point = fill_block(row->xgrad, block);
    if (std::find(points.begin(), points.end(), point) != points.end()) return point;
  }
  std::vector<std::string> both = points;
  for (const std::string& p : points) {
    if (const auto tl = to_transformer_lens(p)) both.push_back(*tl);
  }
  std::string near;
  for (const std::string& n : near_names(name, both)) near += (near.empty() ? "" : ", ") + n;
  if (row && row->xgrad.empty()) {
    fail(who, ": TransformerLens's ", quoted_name(name), " has no xgrad point (", row->note, "); near names: ", near);
  }
  if (row) {
    fail(who, ": TransformerLens's ", quoted_name(name), " is xgrad's ", quoted_name(fill_block(row->xgrad, block)),
         ", which this model does not have (", row->note.empty() ? "no such block or layer" : row->note,
         "); near names: ", near);
  }
  fail(who, ": no hook point ", quoted_name(name),
       " in this model, in xgrad's or TransformerLens's spelling; near names: ", near);
}

}  // namespace xgrad::inspect
