// PyTorch and GPT-2 state dicts to xgrad's names: the expected tensors of each layout, one check
// against them, then slices and transposes into xgrad's Linear layout (out, in).
#include "xgrad/weights/torch_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad::weights {

namespace {

struct Expected {
  std::string name;  // without the input's prefix
  Shape shape;
};

// One tensor of the input: its name and shape (an array in memory, or a tensor of a file).
struct Input {
  const std::string* name;
  const Shape* shape;
};

std::vector<Input> inputs_of(const NamedArrays& state) {
  std::vector<Input> out;
  out.reserve(state.size());
  for (const auto& [name, a] : state) out.push_back({&name, &a.shape()});
  return out;
}

// The input's tensors by name (after removing `prefix`), checked against the expected ones:
// missing, unexpected, duplicated and misshapen tensors are errors naming them, in that order.
class Source {
 public:
  Source(const char* who, const std::vector<Input>& inputs, const std::vector<Expected>& expected,
         const std::string& prefix = "", const std::set<std::string>& skipped = {})
      : who_(who), prefix_(prefix) {
    std::map<std::string, const Shape*> want;
    for (const Expected& e : expected) want[e.name] = &e.shape;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::string& name = *inputs[i].name;
      if (skipped.count(name)) continue;
      const std::string key = key_of(name);
      if (!key.empty() && !index_.emplace(key, i).second) fail(who_, ": tensor '", name, "' appears twice");
    }
    std::vector<std::string> missing;
    for (const Expected& e : expected) {
      if (!index_.count(e.name)) missing.push_back("'" + full(e.name) + "' " + shape_str(e.shape));
    }
    if (!missing.empty()) fail(who_, ": missing ", missing.size() == 1 ? "tensor " : "tensors ", list(missing));
    std::vector<std::string> extra;
    for (const Input& in : inputs) {
      if (skipped.count(*in.name)) continue;
      if (!want.count(key_of(*in.name))) extra.push_back("'" + *in.name + "' " + shape_str(*in.shape));
    }
    if (!extra.empty()) fail(who_, ": unexpected ", extra.size() == 1 ? "tensor " : "tensors ", list(extra));
    for (const Expected& e : expected) {
      const Shape& shape = *inputs[index_.at(e.name)].shape;
      if (shape != e.shape)
        fail(who_, ": tensor '", full(e.name), "' has shape ", shape_str(shape), ", expected ", shape_str(e.shape));
    }
  }

  // The position in the input of the tensor `name` (without the prefix).
  std::size_t operator[](const std::string& name) const { return index_.at(name); }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // The name without the prefix; empty for a name that lacks it (an unexpected tensor), except
  // lm_head.weight, which Hugging Face keeps outside "transformer.".
  std::string key_of(const std::string& name) const {
    if (prefix_.empty() || name == "lm_head.weight") return name;
    return name.compare(0, prefix_.size(), prefix_) == 0 ? name.substr(prefix_.size()) : "";
  }

 private:
  std::string full(const std::string& name) const { return name == "lm_head.weight" ? name : prefix_ + name; }

  // The first few, then how many more.
  static std::string list(const std::vector<std::string>& items) {
    std::ostringstream os;
    for (std::size_t i = 0; i < items.size() && i < 6; ++i) os << (i ? ", " : "") << items[i];
    if (items.size() > 6) os << " and " << items.size() - 6 << " more";
    return os.str();
  }

  const char* who_;
  std::string prefix_;
  std::map<std::string, std::size_t> index_;
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
void expect_attention(std::vector<Expected>& ex, const std::string& src, std::size_t E, std::size_t kdim,
                      std::size_t vdim, bool bias) {
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

void map_attention(const Source& source, const NamedArrays& state, NamedArrays& out, const std::string& src,
                   const std::string& dst, std::size_t E, bool bias) {
  auto s = [&](const std::string& name) -> const Array& { return state[source[name]].second; };
  const Source& so = source;
  const char* names[3] = {"w_q", "w_k", "w_v"};
  const char* separate[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
  const bool packed = so.has(src + "in_proj_weight");
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string to = dst + names[i];
    out.emplace_back(to + ".weight",
                     packed ? rows(s(src + "in_proj_weight"), i * E, (i + 1) * E) : s(src + separate[i]));
    if (bias) out.emplace_back(to + ".bias", rows(s(src + "in_proj_bias"), i * E, (i + 1) * E));
  }
  out.emplace_back(dst + "w_o.weight", s(src + "out_proj.weight"));
  if (bias) out.emplace_back(dst + "w_o.bias", s(src + "out_proj.bias"));
}

// Key and value widths of the attention `o` builds.
std::pair<std::size_t, std::size_t> key_value_widths(const nn::MultiHeadAttentionOptions& o) {
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

NamedArrays from_torch_multihead_attention(const NamedArrays& state, const nn::MultiHeadAttentionOptions& options) {
  const std::size_t E = options.d_model();
  if (options.qkv_bias() != options.out_bias() || options.kv_heads() != options.num_heads() || options.qk_norm() ||
      options.head_dim_set()) {
    fail(
        "from_torch_multihead_attention: torch.nn.MultiheadAttention has one bias switch for all four projections, "
        "one key/value head per head, no QK-norm and heads of d_model / num_heads; the options ask for qkv_bias ",
        options.qkv_bias(), ", out_bias ", options.out_bias(), ", num_kv_heads ", options.kv_heads(), ", qk_norm ",
        options.qk_norm(), ", head_dim ", options.head_dim_set() ? std::to_string(options.head_dim()) : "unset");
  }
  const auto [kdim, vdim] = key_value_widths(options);
  std::vector<Expected> ex;
  expect_attention(ex, "", E, kdim, vdim, options.qkv_bias());
  const Source s("from_torch_multihead_attention", inputs_of(state), ex);
  NamedArrays out;
  map_attention(s, state, out, "", "", E, options.qkv_bias());
  return out;
}

NamedArrays from_torch_encoder_layer(const NamedArrays& state, const nn::TransformerBlockOptions& options) {
  const std::size_t C = options.d_model(), F = options.d_ff();
  // The options whose block torch.nn.TransformerEncoderLayer cannot be (the state would not load into it).
  const nn::MultiHeadAttentionOptions& a = options.attention();
  const nn::NormOptions& n = options.norm_options();
  const nn::FeedForwardOptions& f = options.feed_forward();
  std::string asked;
  auto unless = [&](bool fits, const std::string& what) {
    if (!fits) asked += (asked.empty() ? "" : ", ") + what;
  };
  unless(n.kind() == nn::NormKind::layer_norm, "norm_kind rms_norm");
  unless(n.affine() && n.bias(), "norms without a weight or bias");
  unless(a.qkv_bias() && a.out_bias() && f.bias(), "a projection without a bias");
  unless(a.kv_heads() == a.num_heads(), "num_kv_heads " + std::to_string(a.kv_heads()));
  unless(!a.qk_norm(), "qk_norm");
  unless(!a.rotary(), "rotary positions");
  unless(!nn::is_gated(f.activation()), "a gated activation");
  unless(!a.head_dim_set(), "head_dim " + std::to_string(a.head_dim()));
  unless(!options.parallel_residual(), "parallel_residual");
  if (!asked.empty()) {
    fail(
        "from_torch_encoder_layer: torch.nn.TransformerEncoderLayer has LayerNorms with weights and biases, every "
        "bias, one key/value head per head, no QK-norm, no rotary positions and an ungated activation; the options "
        "ask for ",
        asked);
  }
  std::vector<Expected> ex;
  expect_attention(ex, "self_attn.", C, C, C, true);
  ex.push_back({"linear1.weight", {F, C}});
  ex.push_back({"linear1.bias", {F}});
  ex.push_back({"linear2.weight", {C, F}});
  ex.push_back({"linear2.bias", {C}});
  for (const char* n : {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}) ex.push_back({n, {C}});
  const Source source("from_torch_encoder_layer", inputs_of(state), ex);
  auto s = [&](const std::string& name) -> const Array& { return state[source[name]].second; };
  NamedArrays out;
  map_attention(source, state, out, "self_attn.", "attn.", C, true);
  out.emplace_back("attn.norm.weight", s("norm1.weight"));
  out.emplace_back("attn.norm.bias", s("norm1.bias"));
  for (const char* p : {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}) {
    out.emplace_back(std::string("ffn.") + p, s(p));
  }
  out.emplace_back("ffn.norm.weight", s("norm2.weight"));
  out.emplace_back("ffn.norm.bias", s("norm2.bias"));
  return out;
}

namespace {

// A GPT-2 input, checked: its sizes, the options of the LanguageModel it becomes, and its tensors.
struct Gpt2Layout {
  std::size_t V, C, P, F, L;
  bool has_head;  // an lm_head.weight (else the head is tied to wte)
  nn::LanguageModelOptions options;
  std::unique_ptr<Source> source;
};

Gpt2Layout gpt2_layout(const char* who, const std::vector<Input>& inputs, std::size_t num_heads) {
  const std::string prefix = std::any_of(inputs.begin(), inputs.end(),
                                         [](const Input& e) { return e.name->compare(0, 12, "transformer.") == 0; })
                                 ? "transformer."
                                 : "";
  auto find = [&](const std::string& name) -> const Shape* {
    for (const Input& in : inputs) {
      if (*in.name == prefix + name) return in.shape;
    }
    return nullptr;
  };
  // The sizes, from the shapes; the full check below names anything that does not fit them.
  const Shape* wte = find("wte.weight");
  if (!wte) fail(who, ": missing tensor '", prefix, "wte.weight' (V, C)");
  if (wte->size() != 2 || (*wte)[0] == 0 || (*wte)[1] == 0) {
    fail(who, ": tensor '", prefix, "wte.weight' has shape ", shape_str(*wte), ", expected (V, C) with V, C > 0");
  }
  const std::size_t V = (*wte)[0], C = (*wte)[1];
  const Shape* wpe = find("wpe.weight");
  const std::size_t P = wpe && wpe->size() == 2 && (*wpe)[0] > 0 ? (*wpe)[0] : 1;
  const Shape* c_fc = find("h.0.mlp.c_fc.weight");
  const std::size_t F = c_fc && c_fc->size() == 2 && (*c_fc)[1] > 0 ? (*c_fc)[1] : 4 * C;
  if (num_heads == 0 || C % num_heads != 0) {
    fail(who, ": num_heads ", num_heads, " does not divide d_model ", C, " (wte.weight is ", shape_str(*wte), ")");
  }

  // Layers h.0 .. h.L-1: every index up to the largest must be there (checked before the expected
  // list is built, so a name such as h.999999.x costs nothing).
  std::set<std::size_t> layers;
  std::set<std::string> skipped;
  for (const Input& in : inputs) {
    std::size_t n;
    std::string rest;
    const std::string& name = *in.name;
    const std::string key = name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
    if (layer_of(key, n, rest) && !is_gpt2_buffer(rest)) layers.insert(n);
  }
  const std::size_t L = layers.empty() ? 1 : *layers.rbegin() + 1;
  for (std::size_t n = 0; n < L; ++n) {
    if (!layers.count(n))
      fail(who, ": missing tensor '", prefix, "h.", n, ".ln_1.weight' (", C, "): layer ", n, " is absent");
  }
  for (const Input& in : inputs) {
    std::size_t n;
    std::string rest;
    const std::string& name = *in.name;
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
  const bool has_head =
      std::any_of(inputs.begin(), inputs.end(), [](const Input& e) { return *e.name == "lm_head.weight"; });
  if (has_head) ex.push_back({"lm_head.weight", {V, C}});
  auto source = std::make_unique<Source>(who, inputs, ex, prefix, skipped);

  nn::LanguageModelOptions options = nn::LanguageModelOptions(V, C, num_heads, L)
                                         .d_ff(F)
                                         .max_len(P)
                                         .dropout(0.f)
                                         .norm(nn::Norm::pre)
                                         .activation(nn::Activation::gelu_tanh)
                                         .positional(nn::Positional::learned)
                                         .norm_eps(1e-5f);
  nn::LanguageModel::check(options);
  return {V, C, P, F, L, has_head, options, std::move(source)};
}

// One parameter of the LanguageModel and the part of a GPT-2 tensor (named without the prefix) it takes.
struct Piece {
  enum How { whole, range, columns };  // columns: begin..end of an (R, K) Conv1D weight, transposed
  std::string to, from;
  How how;
  std::size_t begin = 0, end = 0;
};

// Every parameter but head.bias (zeros), in the order from_gpt2 returns them.
std::vector<Piece> gpt2_pieces(const Gpt2Layout& g) {
  const std::size_t C = g.C, F = g.F;
  std::vector<Piece> p = {{"tok_emb.weight", "wte.weight", Piece::whole},
                          {"pos_emb.weight", "wpe.weight", Piece::whole}};
  for (std::size_t n = 0; n < g.L; ++n) {
    const std::string h = "h." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    p.push_back({b + "attn.norm.weight", h + "ln_1.weight", Piece::whole});
    p.push_back({b + "attn.norm.bias", h + "ln_1.bias", Piece::whole});
    const char* names[3] = {"w_q", "w_k", "w_v"};
    for (std::size_t i = 0; i < 3; ++i) {  // c_attn (C, 3C): x @ c_attn = [q | k | v]
      p.push_back({b + "attn." + names[i] + ".weight", h + "attn.c_attn.weight", Piece::columns, i * C, (i + 1) * C});
      p.push_back({b + "attn." + names[i] + ".bias", h + "attn.c_attn.bias", Piece::range, i * C, (i + 1) * C});
    }
    p.push_back({b + "attn.w_o.weight", h + "attn.c_proj.weight", Piece::columns, 0, C});
    p.push_back({b + "attn.w_o.bias", h + "attn.c_proj.bias", Piece::whole});
    p.push_back({b + "ffn.norm.weight", h + "ln_2.weight", Piece::whole});
    p.push_back({b + "ffn.norm.bias", h + "ln_2.bias", Piece::whole});
    p.push_back({b + "ffn.linear1.weight", h + "mlp.c_fc.weight", Piece::columns, 0, F});
    p.push_back({b + "ffn.linear1.bias", h + "mlp.c_fc.bias", Piece::whole});
    p.push_back({b + "ffn.linear2.weight", h + "mlp.c_proj.weight", Piece::columns, 0, C});
    p.push_back({b + "ffn.linear2.bias", h + "mlp.c_proj.bias", Piece::whole});
  }
  p.push_back({"final_norm.weight", "ln_f.weight", Piece::whole});
  p.push_back({"final_norm.bias", "ln_f.bias", Piece::whole});
  p.push_back({"head.weight", g.has_head ? "lm_head.weight" : "wte.weight", Piece::whole});
  return p;
}

}  // namespace

ImportedLanguageModel from_gpt2(const NamedArrays& state, std::size_t num_heads) {
  const Gpt2Layout g = gpt2_layout("from_gpt2", inputs_of(state), num_heads);
  ImportedLanguageModel out{g.options, {}};
  for (const Piece& p : gpt2_pieces(g)) {
    const Array& a = state[(*g.source)[p.from]].second;
    out.state.emplace_back(p.to, p.how == Piece::whole   ? a
                                 : p.how == Piece::range ? rows(a, p.begin, p.end)
                                                         : columns_transposed(a, p.begin, p.end));
  }
  Array zeros = Array::from_shape({g.V});
  zeros.fill(0.f);
  out.state.emplace_back("head.bias", std::move(zeros));
  return out;
}

namespace {

std::vector<Input> inputs_of(const SafetensorsReader& file) {
  std::vector<Input> out;
  out.reserve(file.tensors().size());
  for (const TensorInfo& t : file.tensors()) out.push_back({&t.name, &t.shape});
  return out;
}

}  // namespace

nn::LanguageModelOptions gpt2_options(const std::string& path, std::size_t num_heads) {
  const SafetensorsReader file(path);
  return gpt2_layout("gpt2_options", inputs_of(file), num_heads).options;
}

std::shared_ptr<nn::LanguageModel> load_gpt2(const std::string& path, std::size_t num_heads) {
  const char* who = "load_gpt2";
  SafetensorsReader file(path);
  const Gpt2Layout g = gpt2_layout(who, inputs_of(file), num_heads);
  const std::vector<Piece> pieces = gpt2_pieces(g);

  // The model's own memory, checked before it is built; the file is then read through a buffer of
  // at most kChunk floats.
  constexpr std::size_t kChunk = std::size_t{1} << 18;
  double values = static_cast<double>(g.V);  // head.bias
  for (const Piece& p : pieces) {
    const Shape& from = file.tensors()[(*g.source)[p.from]].shape;
    double n = 1;
    for (const std::size_t d : from) n *= static_cast<double>(d);
    values += p.how == Piece::whole   ? n
              : p.how == Piece::range ? static_cast<double>(p.end - p.begin)
                                      : static_cast<double>(p.end - p.begin) * static_cast<double>(from[0]);
  }
  // Each block's modules and tensors also take about 34 KiB of their own (measured at d_model 1).
  check_available_memory(values * sizeof(float) + kChunk * sizeof(float) + static_cast<double>(g.L) * 34 * 1024, who,
                         "the model in '" + path + "' (" + std::to_string(static_cast<std::uint64_t>(values)) +
                             " float32 parameters in " + std::to_string(g.L) + " blocks)");

  Generator init = Generator::for_loading(0);  // every parameter is read from the file below
  auto model = std::make_shared<nn::LanguageModel>(g.options, init);
  std::map<std::string, Array*> params;
  for (auto& [name, t] : model->named_parameters()) params[name] = &t.mutable_value();
  auto param = [&](const std::string& name) -> Array& {
    const auto it = params.find(name);
    if (it == params.end()) fail(who, ": the LanguageModel has no parameter '", name, "'");
    return *it->second;
  };
  std::set<std::string> written;
  std::vector<float> chunk;

  // The pieces of each file tensor, in one pass (matching every tensor against every piece took
  // 16 L x 12 L string comparisons: hours for a header of 100000 tiny layers).
  std::vector<std::vector<const Piece*>> by_tensor(file.tensors().size());
  for (const Piece& p : pieces) by_tensor[(*g.source)[p.from]].push_back(&p);

  // The file's tensors in data order, each read once into every parameter that takes part of it.
  for (std::size_t t = 0; t < file.tensors().size(); ++t) {
    const TensorInfo& info = file.tensors()[t];
    const std::vector<const Piece*>& mine = by_tensor[t];
    if (mine.empty()) continue;  // a skipped buffer
    std::size_t elements = 1;
    for (const std::size_t d : info.shape) elements *= d;
    const std::size_t K = info.shape.size() == 2 ? info.shape[1] : elements, R = K ? elements / K : 0;
    for (const Piece* p : mine) {
      Array& dst = param(p->to);
      if (p->how == Piece::whole) file.read(t, 0, elements, dst.data());
      if (p->how == Piece::range) file.read(t, p->begin, p->end - p->begin, dst.data());
    }
    // Conv1D weights (R, K) -> Linear (out, R), a block of rows at a time.
    if (std::any_of(mine.begin(), mine.end(), [](const Piece* p) { return p->how == Piece::columns; })) {
      const std::size_t block = std::max<std::size_t>(1, kChunk / std::max<std::size_t>(K, 1));
      chunk.resize(std::min(block, R) * K);
      for (std::size_t r0 = 0; r0 < R; r0 += block) {
        const std::size_t rows_here = std::min(block, R - r0);
        file.read(t, r0 * K, rows_here * K, chunk.data());
        for (const Piece* p : mine) {
          if (p->how != Piece::columns) continue;
          float* out = param(p->to).data();
          for (std::size_t r = 0; r < rows_here; ++r) {
            for (std::size_t c = p->begin; c < p->end; ++c) out[(c - p->begin) * R + r0 + r] = chunk[r * K + c];
          }
        }
      }
    }
    for (const Piece* p : mine) {
      const Array& dst = param(p->to);
      if (const std::size_t i = first_non_finite(dst); i < dst.size()) {
        fail(who, ": tensor '", info.name, "' in '", path, "' holds ", dst.data()[i], " (in ", p->to,
             " at flat position ", i, "); refusing non-finite weights");
      }
      written.insert(p->to);
    }
  }
  param("head.bias").fill(0.f);
  written.insert("head.bias");
  if (written.size() != params.size())
    fail(who, ": ", params.size() - written.size(), " parameters of the model were not read");
  return model;
}

}  // namespace xgrad::weights
