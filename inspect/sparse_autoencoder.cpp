// Sparse autoencoders: the module, SAELens's files, splicing (sparse_autoencoder.hpp).
#include "xgrad/inspect/sparse_autoencoder.hpp"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/inspect/hook_names.hpp"

namespace xgrad::inspect {

namespace {

using json = nlohmann::json;

constexpr float kLayerNormEps = 1e-5f;  // SAELens's run-time layer norm
constexpr const char* kConfigFile = "cfg.json";
constexpr const char* kWeightsFile = "sae_weights.safetensors";

void check_config(const SaeConfig& c, const char* who) {
  if (c.d_in == 0 || c.d_sae == 0) fail(who, ": d_in ", c.d_in, " and d_sae ", c.d_sae, " must both be > 0");
  if (c.architecture == SaeArchitecture::topk && (c.k == 0 || c.k > c.d_sae)) {
    fail(who, ": TopK's k ", c.k, " must be in [1, d_sae = ", c.d_sae, "]");
  }
}

// Rows of random directions, each of norm `norm`: (rows, cols).
Array random_directions(std::size_t rows, std::size_t cols, float norm, Generator& gen) {
  Array w = gen.normal({rows, cols}, 0.f, 1.f);
  for (std::size_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (std::size_t c = 0; c < cols; ++c) sq += double(w(r, c)) * w(r, c);
    const float scale = norm / static_cast<float>(std::sqrt(sq));
    for (std::size_t c = 0; c < cols; ++c) w(r, c) *= scale;
  }
  return w;
}

// The input's statistics that the output's normalization undoes.
struct Normalized {
  Tensor x;      // (rows, d_in), normalized
  Tensor scale;  // undefined for none
  Tensor shift;  // layer_norm only
};

Normalized normalize(const Tensor& x, const SaeConfig& c) {
  switch (c.normalization) {
    case SaeNormalization::none:
      return {x, Tensor(), Tensor()};
    case SaeNormalization::layer_norm: {
      const Tensor mu = mean(x, {1}, true);
      const Tensor centred = x - mu;
      const float unbiased = c.d_in > 1 ? 1.f / static_cast<float>(c.d_in - 1) : 1.f;
      const Tensor std = sqrt(sum(centred * centred, {1}, true) * unbiased);
      return {centred / (std + kLayerNormEps), std, mu};
    }
    case SaeNormalization::constant_norm_rescale: {
      const Tensor norm = sqrt(sum(x * x, {1}, true));
      const Tensor scale = norm / std::sqrt(static_cast<float>(c.d_in));  // x = x' * scale
      return {x / scale, scale, Tensor()};
    }
  }
  return {x, Tensor(), Tensor()};
}

Tensor denormalize(const Tensor& y, const Normalized& n) {
  if (!n.scale.defined()) return y;
  const Tensor scaled = y * n.scale;
  return n.shift.defined() ? scaled + n.shift : scaled;
}

// (..., d_in) as (rows, d_in), checked.
Tensor as_rows(const Tensor& x, std::size_t width, const char* who, const char* what) {
  const Shape& s = x.shape();
  if (s.empty() || s.back() != width) {
    fail(who, ": ", what, " of shape ", shape_str(s), " must end in an axis of ", width);
  }
  return reshape(x, {static_cast<std::int64_t>(x.size() / width), static_cast<std::int64_t>(width)});
}

Tensor with_shape(const Tensor& rows, Shape shape, std::size_t last) {
  shape.back() = last;
  return reshape(rows, std::vector<std::int64_t>(shape.begin(), shape.end()));
}

// ---- cfg.json ----

const char* architecture_name(SaeArchitecture a) { return a == SaeArchitecture::topk ? "topk" : "standard"; }

const char* normalization_name(SaeNormalization n) {
  switch (n) {
    case SaeNormalization::layer_norm:
      return "layer_norm";
    case SaeNormalization::constant_norm_rescale:
      return "constant_norm_rescale";
    default:
      return "none";
  }
}

// The fields of a cfg.json, each checked as it is read; errors name the file and the field.
class ConfigFields {
 public:
  ConfigFields(const std::string& path, const json& j) : path_(path), j_(j) {}

  const json* find(const char* field) const {
    const auto it = j_.find(field);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::size_t count(const char* field) const {
    const json* v = find(field);
    if (!v) fail(who, ": '", path_, "': missing field \"", field, "\"");
    if (!v->is_number_integer() || v->get<std::int64_t>() <= 0) {
      fail(who, ": '", path_, "': field \"", field, "\" must be a positive integer, got ",
           xgrad::detail::json_excerpt(*v));
    }
    return static_cast<std::size_t>(v->get<std::int64_t>());
  }
  std::string text(const char* field, const std::string& fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_string())
      fail(who, ": '", path_, "': field \"", field, "\" must be a string, got ", xgrad::detail::json_excerpt(*v));
    return v->get<std::string>();
  }
  bool flag(const char* field, bool fallback) const {
    const json* v = find(field);
    if (!v) return fallback;
    if (!v->is_boolean())
      fail(who, ": '", path_, "': field \"", field, "\" must be true or false, got ", xgrad::detail::json_excerpt(*v));
    return v->get<bool>();
  }
  [[noreturn]] void refuse(const char* field, const std::string& value, const char* known) const {
    fail(who, ": '", path_, "': field \"", field, "\" is \"", value, "\"; xgrad knows ", known);
  }

  static constexpr const char* who = "load_sae";

 private:
  const std::string& path_;
  const json& j_;
};

// The dtype's safetensors name, from cfg.json's spelling ("float32" or "torch.float32").
Dtype config_dtype(const ConfigFields& f) {
  std::string d = f.text("dtype", "float32");
  if (d.rfind("torch.", 0) == 0) d = d.substr(6);
  if (d == "float32") return Dtype::f32;
  if (d == "float16") return Dtype::f16;
  if (d == "bfloat16") return Dtype::bf16;
  f.refuse("dtype", d, "float32, float16 and bfloat16");
}

SaeConfig read_config(const std::string& path, Dtype& dtype) {
  const char* who = ConfigFields::who;
  const json j = xgrad::detail::read_json_object(path, who, std::uint64_t{1} << 20);
  const ConfigFields f(path, j);
  SaeConfig c;
  c.d_in = f.count("d_in");
  c.d_sae = f.count("d_sae");
  dtype = config_dtype(f);
  c.apply_b_dec_to_input = f.flag("apply_b_dec_to_input", true);

  // SAELens 6 names the architecture; earlier layouts name the activation ("relu", "topk").
  const std::string activation = f.text("activation_fn_str", f.text("activation_fn", "relu"));
  std::string architecture = f.text("architecture", activation == "topk" ? "topk" : "standard");
  if (architecture == "standard" && activation == "topk") architecture = "topk";
  if (architecture == "topk") {
    c.architecture = SaeArchitecture::topk;
    if (f.find("k")) {
      c.k = f.count("k");
    } else {
      const json* kwargs = f.find("activation_fn_kwargs");
      if (!kwargs || !kwargs->is_object() || !kwargs->contains("k")) {
        fail(who, ": '", path, "': a TopK SAE needs \"k\" (or \"activation_fn_kwargs\": {\"k\": ...})");
      }
      c.k = ConfigFields(path, *kwargs).count("k");
    }
  } else if (architecture != "standard") {
    f.refuse("architecture", architecture, "standard and topk");
  } else if (activation != "relu") {
    f.refuse("activation_fn_str", activation, "relu and topk");
  }

  // Before SAELens 6 the field could be a flag: true meant expected_average_only_in.
  const json* norm_field = f.find("normalize_activations");
  const std::string norm = norm_field && norm_field->is_boolean()
                               ? (norm_field->get<bool>() ? "expected_average_only_in" : "none")
                               : f.text("normalize_activations", "none");
  if (norm == "none" || norm == "expected_average_only_in") {
    c.normalization = SaeNormalization::none;
  } else if (norm == "layer_norm") {
    c.normalization = SaeNormalization::layer_norm;
  } else if (norm == "constant_norm_rescale") {
    c.normalization = SaeNormalization::constant_norm_rescale;
  } else {
    f.refuse("normalize_activations", norm, "none, expected_average_only_in, layer_norm and constant_norm_rescale");
  }
  const std::string reshape = f.text("reshape_activations", "none");
  if (reshape != "none") f.refuse("reshape_activations", reshape, "none");
  if (f.flag("finetuning_scaling_factor", false)) {
    fail(who, ": '", path, "': \"finetuning_scaling_factor\" true is not supported");
  }
  if (f.flag("rescale_acts_by_decoder_norm", false)) {
    fail(who, ": '", path, "': \"rescale_acts_by_decoder_norm\" true is not supported");
  }
  if (f.find("hook_head_index")) fail(who, ": '", path, "': a \"hook_head_index\" (one head's SAE) is not supported");

  // SAELens 6 keeps where the SAE reads under "metadata" (or "meta"); earlier layouts at the top.
  const json* meta = f.find("metadata");
  if (!meta) meta = f.find("meta");
  if (meta && !meta->is_object())
    fail(who, ": '", path, "': \"metadata\" must be an object, got ", xgrad::detail::json_excerpt(*meta));
  const ConfigFields m(path, meta ? *meta : j);
  c.hook_name = m.text("hook_name", f.text("hook_name", f.text("hook_point", "")));
  c.model_name = m.text("model_name", f.text("model_name", ""));
  check_config(c, who);
  return c;
}

}  // namespace

SparseAutoencoder::SparseAutoencoder(const SaeConfig& config, const char* who) : config_(config) {
  check_config(config_, who);
  declare_hook_points({"sae_input", "sae_acts_pre", "sae_acts_post", "sae_recons", "sae_error", "sae_output"});
  const std::size_t d_in = config_.d_in, d_sae = config_.d_sae;
  const double floats = 2. * double(d_in) * double(d_sae) + double(d_in) + double(d_sae);
  check_available_memory(4. * floats, who,
                         "an SAE of d_in " + std::to_string(d_in) + " and d_sae " + std::to_string(d_sae));
  w_enc_ = register_parameter("W_enc", Tensor(Array::from_shape({d_in, d_sae}), true));
  b_enc_ = register_parameter("b_enc", Tensor(Array::from_shape({d_sae}), true));
  w_dec_ = register_parameter("W_dec", Tensor(Array::from_shape({d_sae, d_in}), true));
  b_dec_ = register_parameter("b_dec", Tensor(Array::from_shape({d_in}), true));
}

SparseAutoencoder::SparseAutoencoder(const SaeConfig& config, Generator& gen)
    : SparseAutoencoder(config, "SparseAutoencoder") {
  const float norm = config_.architecture == SaeArchitecture::topk ? 1.f : 0.1f;
  w_dec_.mutable_value() = random_directions(config_.d_sae, config_.d_in, norm, gen);
  w_enc_.mutable_value() = xt::transpose(w_dec_.value());
  b_enc_.mutable_value().fill(0.f);
  b_dec_.mutable_value().fill(0.f);
}

Tensor SparseAutoencoder::hook_rows(const char* point, const Tensor& rows, const Shape& shape,
                                    std::size_t width) const {
  if (!hooked(point)) return rows;
  return as_rows(hook(point, with_shape(rows, shape, width)), width, "SparseAutoencoder", point);
}

Tensor SparseAutoencoder::encode_normalized(const Tensor& x, const Shape& shape, Tensor* pre_out) const {
  const Tensor in = config_.apply_b_dec_to_input ? x - b_dec_ : x;
  const Tensor pre = hook_rows("sae_acts_pre", matmul(in, w_enc_) + b_enc_, shape, config_.d_sae);
  if (pre_out) *pre_out = pre;
  if (config_.architecture == SaeArchitecture::standard) {
    return hook_rows("sae_acts_post", relu(pre), shape, config_.d_sae);
  }
  // TopK: relu of the k largest of each row, zero elsewhere (the gradient reaches only those).
  const IndexArray top = topk(pre.detach(), config_.k, 1).indices;
  Mask dropped = xt::ones<bool>(pre.shape());
  for (std::size_t r = 0; r < top.shape()[0]; ++r) {
    for (std::size_t i = 0; i < config_.k; ++i) dropped(r, static_cast<std::size_t>(top(r, i))) = false;
  }
  return hook_rows("sae_acts_post", masked_fill(relu(pre), dropped, 0.f), shape, config_.d_sae);
}

Tensor SparseAutoencoder::encode(const Tensor& x) const {
  const Tensor in = hook("sae_input", x);
  const Tensor rows = as_rows(in, config_.d_in, "SparseAutoencoder::encode", "x");
  return with_shape(encode_normalized(normalize(rows, config_).x, x.shape(), nullptr), x.shape(), config_.d_sae);
}

Tensor SparseAutoencoder::decode(const Tensor& f) const {
  const Tensor rows = as_rows(f, config_.d_sae, "SparseAutoencoder::decode", "f");
  return with_shape(matmul(rows, w_dec_) + b_dec_, f.shape(), config_.d_in);
}

SparseAutoencoder::Parts SparseAutoencoder::parts(const Tensor& x) const {
  Parts p;
  p.rows = as_rows(hook("sae_input", x), config_.d_in, "SparseAutoencoder", "x");
  const Normalized n = normalize(p.rows, config_);
  p.features = encode_normalized(n.x, x.shape(), &p.pre);
  p.recons = hook_rows("sae_recons", denormalize(matmul(p.features, w_dec_) + b_dec_, n), x.shape(), config_.d_in);
  return p;
}

Tensor SparseAutoencoder::forward(const Tensor& x, bool keep_error) const {
  const Parts p = parts(x);
  Tensor out = p.recons;
  if (keep_error) out = out + hook_rows("sae_error", (p.rows - p.recons).detach(), x.shape(), config_.d_in);
  return hook("sae_output", with_shape(out, x.shape(), config_.d_in));
}

void save_sae(const std::string& dir, const SparseAutoencoder& sae) {
  const char* who = "save_sae";
  const SaeConfig& c = sae.config();
  check_utf8(c.hook_name, who, "the hook name");
  check_utf8(c.model_name, who, "the model name");
  prepare_output_dir(dir, who);
  json cfg = {{"architecture", architecture_name(c.architecture)},
              {"d_in", c.d_in},
              {"d_sae", c.d_sae},
              {"dtype", "float32"},
              {"device", "cpu"},
              {"apply_b_dec_to_input", c.apply_b_dec_to_input},
              {"normalize_activations", normalization_name(c.normalization)},
              {"reshape_activations", "none"},
              // SAELens 6 tells its layout from the earlier one by metadata.sae_lens_version.
              {"metadata", {{"hook_name", c.hook_name}, {"model_name", c.model_name}, {"sae_lens_version", "6.0.0"}}}};
  if (c.architecture == SaeArchitecture::topk) cfg["k"] = c.k;
  const std::filesystem::path folder(dir);
  // Both paths checked before either file is written: a refused save changes neither.
  check_writable_file((folder / kWeightsFile).string(), who);
  check_writable_file((folder / kConfigFile).string(), who);
  save_safetensors((folder / kWeightsFile).string(), {{"W_enc", sae.W_enc().value()},
                                                      {"b_enc", sae.b_enc().value()},
                                                      {"W_dec", sae.W_dec().value()},
                                                      {"b_dec", sae.b_dec().value()}});
  write_file_atomically((folder / kConfigFile).string(), cfg.dump(2) + "\n", who);
}

std::unique_ptr<SparseAutoencoder> load_sae(const std::string& dir) {
  const char* who = "load_sae";
  const std::filesystem::path folder(dir);
  Dtype dtype = Dtype::f32;
  const SaeConfig c = read_config((folder / kConfigFile).string(), dtype);
  SafetensorsReader weights((folder / kWeightsFile).string());
  const std::pair<const char*, Shape> expected[] = {
      {"W_enc", {c.d_in, c.d_sae}}, {"b_enc", {c.d_sae}}, {"W_dec", {c.d_sae, c.d_in}}, {"b_dec", {c.d_in}}};
  for (const TensorInfo& t : weights.tensors()) {
    bool known = false;
    for (const auto& [name, shape] : expected) known = known || t.name == name;
    if (!known) fail(who, ": '", weights.path(), "' holds \"", t.name, "\", which a standard or TopK SAE has not");
  }
  // Every shape and dtype checked against cfg.json before anything of the SAE's size is allocated.
  std::size_t index[4];
  for (std::size_t e = 0; e < 4; ++e) {
    const auto& [name, shape] = expected[e];
    index[e] = weights.find(name);
    if (index[e] == weights.tensors().size()) fail(who, ": '", weights.path(), "' has no \"", name, "\"");
    const TensorInfo& t = weights.tensors()[index[e]];
    if (t.shape != shape) {
      fail(who, ": '", weights.path(), "': \"", name, "\" is ", shape_str(t.shape), ", but cfg.json's d_in ", c.d_in,
           " and d_sae ", c.d_sae, " make it ", shape_str(shape));
    }
    if (t.dtype != dtype) {
      fail(who, ": '", weights.path(), "': \"", name, "\" is ", dtype_name(t.dtype), ", but cfg.json says ",
           dtype_name(dtype));
    }
  }
  std::unique_ptr<SparseAutoencoder> sae(new SparseAutoencoder(c, who));
  for (std::size_t e = 0; e < 4; ++e) {
    const char* name = expected[e].first;
    Array& a = sae->parameter(name).mutable_value();
    weights.read(index[e], 0, a.size(), a.data());
    if (const std::size_t j = first_non_finite(a); j < a.size()) {
      fail(who, ": '", weights.path(), "': \"", name, "\" holds ", a.data()[j], " at flat position ", j,
           "; refusing non-finite weights");
    }
  }
  return sae;
}

SaeSplice::SaeSplice(nn::Module& root, const SparseAutoencoder& sae, const std::string& point, bool keep_error) {
  const std::string& name = point.empty() ? sae.config().hook_name : point;
  if (name.empty()) fail("SaeSplice: no point given, and the SAE's config names none");
  point_ = resolve_point(root, name, "SaeSplice");
  const std::size_t width = sae.config().d_in;
  hook_ = root.add_forward_hook(point_, [this, &sae, width, keep_error](const Tensor& value) {
    const Shape& s = value.shape();
    if (s.empty() || s.back() != width) {
      fail("SaeSplice: point '", point_, "' holds ", shape_str(s), ", but the SAE reads d_in = ", width);
    }
    return sae.forward(value, keep_error);
  });
}

}  // namespace xgrad::inspect
