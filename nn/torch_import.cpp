// PyTorch and GPT-2 state dicts to xgrad's names: the expected tensors of each layout, one check
// against them, then slices and transposes into xgrad's Linear layout (out, in).
#include "xgrad/nn/torch_import.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "xgrad/core/error.hpp"

namespace xgrad::nn {

namespace {

struct Expected {
  std::string name;  // without the input's prefix
  Shape shape;
};

// The input's tensors by name (after removing `prefix`), checked against the expected ones:
// missing, unexpected, duplicated and misshapen tensors are errors naming them, in that order.
class Source {
 public:
  Source(const char* who, const NamedArrays& state, const std::vector<Expected>& expected, const std::string& prefix = "",
         const std::set<std::string>& skipped = {})
      : who_(who), prefix_(prefix) {
    std::map<std::string, const Shape*> want;
    for (const Expected& e : expected) want[e.name] = &e.shape;
    for (const auto& [name, a] : state) {
      if (skipped.count(name)) continue;
      const std::string key = key_of(name);
      if (!key.empty() && !arrays_.emplace(key, &a).second) fail(who_, ": tensor '", name, "' appears twice");
    }
    std::vector<std::string> missing;
    for (const Expected& e : expected) {
      if (!arrays_.count(e.name)) missing.push_back("'" + full(e.name) + "' " + shape_str(e.shape));
    }
    if (!missing.empty()) fail(who_, ": missing ", missing.size() == 1 ? "tensor " : "tensors ", list(missing));
    std::vector<std::string> extra;
    for (const auto& [name, a] : state) {
      if (skipped.count(name)) continue;
      if (!want.count(key_of(name))) {
        extra.push_back("'" + name + "' " + shape_str(a.shape()));
      }
    }
    if (!extra.empty()) fail(who_, ": unexpected ", extra.size() == 1 ? "tensor " : "tensors ", list(extra));
    for (const Expected& e : expected) {
      const Array& a = *arrays_.at(e.name);
      if (a.shape() != e.shape) {
        fail(who_, ": tensor '", full(e.name), "' has shape ", shape_str(a.shape()), ", expected ", shape_str(e.shape));
      }
    }
  }

  const Array& operator[](const std::string& name) const { return *arrays_.at(name); }
  bool has(const std::string& name) const { return arrays_.count(name) != 0; }

 private:
  std::string full(const std::string& name) const { return name == "lm_head.weight" ? name : prefix_ + name; }

  // The name without the prefix; empty for a name that lacks it (an unexpected tensor), except
  // lm_head.weight, which Hugging Face keeps outside "transformer.".
  std::string key_of(const std::string& name) const {
    if (prefix_.empty() || name == "lm_head.weight") return name;
    return name.compare(0, prefix_.size(), prefix_) == 0 ? name.substr(prefix_.size()) : "";
  }

  // The first few, then how many more.
  static std::string list(const std::vector<std::string>& items) {
    std::ostringstream os;
    for (std::size_t i = 0; i < items.size() && i < 6; ++i) os << (i ? ", " : "") << items[i];
    if (items.size() > 6) os << " and " << items.size() - 6 << " more";
    return os.str();
  }

  const char* who_;
  std::string prefix_;
  std::map<std::string, const Array*> arrays_;
};

// Rows begin..end of a 2-D array, or elements begin..end of a 1-D one.
Array rows(const Array& a, std::size_t begin, std::size_t end) {
  const std::size_t width = a.dimension() == 2 ? a.shape()[1] : 1;
  Array out = Array::from_shape(a.dimension() == 2 ? Shape{end - begin, width} : Shape{end - begin});
  std::copy(a.data() + begin * width, a.data() + end * width, out.data());
  return out;
}

// Columns begin..end of a (R, K) array, transposed: (end - begin, R). Conv1D (in, out) -> Linear (out, in).
Array columns_transposed(const Array& a, std::size_t begin, std::size_t end) {
  const std::size_t R = a.shape()[0], K = a.shape()[1];
  Array out = Array::from_shape({end - begin, R});
  for (std::size_t r = 0; r < R; ++r) {
    for (std::size_t c = begin; c < end; ++c) out.data()[(c - begin) * R + r] = a.data()[r * K + c];
  }
  return out;
}

// The tensors of an nn.MultiheadAttention under `src` (e.g. "self_attn.").
void expect_attention(std::vector<Expected>& ex, const std::string& src, std::size_t E, std::size_t kdim, std::size_t vdim,
                      bool bias) {
  if (kdim == E && vdim == E) {
    ex.push_back({src + "in_proj_weight", {3 * E, E}});
  } else {
    ex.push_back({src + "q_proj_weight", {E, E}});
    ex.push_back({src + "k_proj_weight", {E, kdim}});
    ex.push_back({src + "v_proj_weight", {E, vdim}});
  }
  if (bias) ex.push_back({src + "in_proj_bias", {3 * E}});
  ex.push_back({src + "out_proj.weight", {E, E}});
  if (bias) ex.push_back({src + "out_proj.bias", {E}});
}

void map_attention(const Source& s, NamedArrays& out, const std::string& src, const std::string& dst, std::size_t E,
                   bool bias) {
  const char* names[3] = {"w_q", "w_k", "w_v"};
  const char* separate[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
  const bool packed = s.has(src + "in_proj_weight");
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string to = dst + names[i];
    out.emplace_back(to + ".weight", packed ? rows(s[src + "in_proj_weight"], i * E, (i + 1) * E) : s[src + separate[i]]);
    if (bias) out.emplace_back(to + ".bias", rows(s[src + "in_proj_bias"], i * E, (i + 1) * E));
  }
  out.emplace_back(dst + "w_o.weight", s[src + "out_proj.weight"]);
  if (bias) out.emplace_back(dst + "w_o.bias", s[src + "out_proj.bias"]);
}

// Key and value widths of the attention `o` builds.
std::pair<std::size_t, std::size_t> key_value_widths(const MultiHeadAttentionOptions& o) {
  return {o.kdim() ? o.kdim() : o.d_model(), o.vdim() ? o.vdim() : o.d_model()};
}

// "h.12.attn.bias" -> 12 and "attn.bias"; false for names of another form (at most 6 digits, no
// leading zeros).
bool layer_of(const std::string& name, std::size_t& layer, std::string& rest) {
  if (name.compare(0, 2, "h.") != 0) return false;
  const std::size_t dot = name.find('.', 2);
  if (dot == std::string::npos || dot == 2 || dot > 8 || (name[2] == '0' && dot > 3)) return false;
  layer = 0;
  for (std::size_t i = 2; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    layer = layer * 10 + static_cast<std::size_t>(name[i] - '0');
  }
  rest = name.substr(dot + 1);
  return true;
}

// GPT-2's causal-mask buffers (h.N.attn.bias (1, 1, P, P), h.N.attn.masked_bias ()), which older
// transformers versions save in the state dict: not parameters, skipped.
bool is_gpt2_buffer(const std::string& rest) { return rest == "attn.bias" || rest == "attn.masked_bias"; }

}  // namespace

NamedArrays from_torch_multihead_attention(const NamedArrays& state, const MultiHeadAttentionOptions& options) {
  const std::size_t E = options.d_model();
  const auto [kdim, vdim] = key_value_widths(options);
  std::vector<Expected> ex;
  expect_attention(ex, "", E, kdim, vdim, options.bias());
  const Source s("from_torch_multihead_attention", state, ex);
  NamedArrays out;
  map_attention(s, out, "", "", E, options.bias());
  return out;
}

NamedArrays from_torch_encoder_layer(const NamedArrays& state, const TransformerBlockOptions& options) {
  const std::size_t C = options.d_model(), F = options.d_ff();
  std::vector<Expected> ex;
  expect_attention(ex, "self_attn.", C, C, C, true);
  ex.push_back({"linear1.weight", {F, C}});
  ex.push_back({"linear1.bias", {F}});
  ex.push_back({"linear2.weight", {C, F}});
  ex.push_back({"linear2.bias", {C}});
  for (const char* n : {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}) ex.push_back({n, {C}});
  const Source s("from_torch_encoder_layer", state, ex);
  NamedArrays out;
  map_attention(s, out, "self_attn.", "attn.", C, true);
  out.emplace_back("attn.norm.weight", s["norm1.weight"]);
  out.emplace_back("attn.norm.bias", s["norm1.bias"]);
  for (const char* p : {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}) {
    out.emplace_back(std::string("ffn.") + p, s[p]);
  }
  out.emplace_back("ffn.norm.weight", s["norm2.weight"]);
  out.emplace_back("ffn.norm.bias", s["norm2.bias"]);
  return out;
}

ImportedLanguageModel from_gpt2(const NamedArrays& state, std::size_t num_heads) {
  const char* who = "from_gpt2";
  const std::string prefix =
      std::any_of(state.begin(), state.end(), [](const auto& e) { return e.first.compare(0, 12, "transformer.") == 0; })
          ? "transformer."
          : "";
  auto find = [&](const std::string& name) -> const Array* {
    for (const auto& [n, a] : state) {
      if (n == prefix + name) return &a;
    }
    return nullptr;
  };
  // The sizes, from the shapes; the full check below names anything that does not fit them.
  const Array* wte = find("wte.weight");
  if (!wte) fail(who, ": missing tensor '", prefix, "wte.weight' (V, C)");
  if (wte->dimension() != 2 || wte->shape()[0] == 0 || wte->shape()[1] == 0) {
    fail(who, ": tensor '", prefix, "wte.weight' has shape ", shape_str(wte->shape()), ", expected (V, C) with V, C > 0");
  }
  const std::size_t V = wte->shape()[0], C = wte->shape()[1];
  const Array* wpe = find("wpe.weight");
  const std::size_t P = wpe && wpe->dimension() == 2 && wpe->shape()[0] > 0 ? wpe->shape()[0] : 1;
  const Array* c_fc = find("h.0.mlp.c_fc.weight");
  const std::size_t F = c_fc && c_fc->dimension() == 2 && c_fc->shape()[1] > 0 ? c_fc->shape()[1] : 4 * C;
  if (num_heads == 0 || C % num_heads != 0) {
    fail(who, ": num_heads ", num_heads, " does not divide d_model ", C, " (wte.weight is ", shape_str(wte->shape()), ")");
  }

  // Layers h.0 .. h.L-1: every index up to the largest must be there (checked before the expected
  // list is built, so a name such as h.999999.x costs nothing).
  std::set<std::size_t> layers;
  std::set<std::string> skipped;
  for (const auto& [name, a] : state) {
    std::size_t n;
    std::string rest;
    const std::string key = name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
    if (layer_of(key, n, rest) && !is_gpt2_buffer(rest)) layers.insert(n);
  }
  const std::size_t L = layers.empty() ? 1 : *layers.rbegin() + 1;
  for (std::size_t n = 0; n < L; ++n) {
    if (!layers.count(n)) fail(who, ": missing tensor '", prefix, "h.", n, ".ln_1.weight' (", C, "): layer ", n, " is absent");
  }
  for (const auto& [name, a] : state) {
    std::size_t n;
    std::string rest;
    const std::string key = name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
    if (layer_of(key, n, rest) && is_gpt2_buffer(rest) && n < L) skipped.insert(name);
  }

  std::vector<Expected> ex = {{"wte.weight", {V, C}}, {"wpe.weight", {P, C}}};
  for (std::size_t n = 0; n < L; ++n) {
    const std::string h = "h." + std::to_string(n) + ".";
    ex.push_back({h + "ln_1.weight", {C}});
    ex.push_back({h + "ln_1.bias", {C}});
    ex.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    ex.push_back({h + "attn.c_attn.bias", {3 * C}});
    ex.push_back({h + "attn.c_proj.weight", {C, C}});
    ex.push_back({h + "attn.c_proj.bias", {C}});
    ex.push_back({h + "ln_2.weight", {C}});
    ex.push_back({h + "ln_2.bias", {C}});
    ex.push_back({h + "mlp.c_fc.weight", {C, F}});
    ex.push_back({h + "mlp.c_fc.bias", {F}});
    ex.push_back({h + "mlp.c_proj.weight", {F, C}});
    ex.push_back({h + "mlp.c_proj.bias", {C}});
  }
  ex.push_back({"ln_f.weight", {C}});
  ex.push_back({"ln_f.bias", {C}});
  // An lm_head.weight, when present, is the head (HF's GPT2LMHeadModel keeps it outside "transformer.").
  const bool has_head = std::any_of(state.begin(), state.end(), [](const auto& e) { return e.first == "lm_head.weight"; });
  if (has_head) ex.push_back({"lm_head.weight", {V, C}});
  const Source s(who, state, ex, prefix, skipped);

  ImportedLanguageModel out{LanguageModelOptions(V, C, num_heads, L)
                                .d_ff(F)
                                .max_len(P)
                                .dropout(0.f)
                                .norm(Norm::pre)
                                .activation(Activation::gelu_tanh)
                                .positional(Positional::learned)
                                .layer_norm_eps(1e-5f),
                            {}};
  LanguageModel::check(out.options);
  NamedArrays& o = out.state;
  o.emplace_back("tok_emb.weight", s["wte.weight"]);
  o.emplace_back("pos_emb.weight", s["wpe.weight"]);
  for (std::size_t n = 0; n < L; ++n) {
    const std::string h = "h." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    o.emplace_back(b + "attn.norm.weight", s[h + "ln_1.weight"]);
    o.emplace_back(b + "attn.norm.bias", s[h + "ln_1.bias"]);
    const Array& qkv = s[h + "attn.c_attn.weight"];  // (C, 3C): x @ qkv = [q | k | v]
    const Array& qkv_bias = s[h + "attn.c_attn.bias"];
    const char* names[3] = {"w_q", "w_k", "w_v"};
    for (std::size_t i = 0; i < 3; ++i) {
      o.emplace_back(b + "attn." + names[i] + ".weight", columns_transposed(qkv, i * C, (i + 1) * C));
      o.emplace_back(b + "attn." + names[i] + ".bias", rows(qkv_bias, i * C, (i + 1) * C));
    }
    o.emplace_back(b + "attn.w_o.weight", columns_transposed(s[h + "attn.c_proj.weight"], 0, C));
    o.emplace_back(b + "attn.w_o.bias", s[h + "attn.c_proj.bias"]);
    o.emplace_back(b + "ffn.norm.weight", s[h + "ln_2.weight"]);
    o.emplace_back(b + "ffn.norm.bias", s[h + "ln_2.bias"]);
    o.emplace_back(b + "ffn.linear1.weight", columns_transposed(s[h + "mlp.c_fc.weight"], 0, F));
    o.emplace_back(b + "ffn.linear1.bias", s[h + "mlp.c_fc.bias"]);
    o.emplace_back(b + "ffn.linear2.weight", columns_transposed(s[h + "mlp.c_proj.weight"], 0, C));
    o.emplace_back(b + "ffn.linear2.bias", s[h + "mlp.c_proj.bias"]);
  }
  o.emplace_back("final_norm.weight", s["ln_f.weight"]);
  o.emplace_back("final_norm.bias", s["ln_f.bias"]);
  o.emplace_back("head.weight", has_head ? s["lm_head.weight"] : s["wte.weight"]);
  Array zeros = Array::from_shape({V});
  zeros.fill(0.f);
  o.emplace_back("head.bias", std::move(zeros));
  return out;
}

}  // namespace xgrad::nn
