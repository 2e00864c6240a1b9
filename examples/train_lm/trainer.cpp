// The language-model training loop and its checkpoints.
#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include <xtensor/xview.hpp>

#include "common/cli.hpp"
#include "common/memory.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/nn/freeze.hpp"
#include "xgrad/nn/random_stream.hpp"
#include "xgrad/nn/weight_decay.hpp"
#include "xgrad/optim/accumulate.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_file.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/model_options_json.hpp"

namespace lm {

using namespace xgrad;

namespace {

constexpr const char* kFormat = "xgrad-train-lm-1";

// Sizes past these are typos, not plans; they also bound what a checkpoint may ask us to build.
constexpr std::size_t kMaxLayers = 1024, kMaxWidth = 1 << 16, kMaxSeqLen = 1 << 16, kMaxBatch = 1 << 20,
                      kMaxSteps = 100'000'000, kMaxVocab = 1 << 24;

const std::string& meta_field(const Metadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  if (it == meta.end()) fail("train_lm: checkpoint '", path, "' has no \"", key, "\" in its metadata");
  return it->second;
}

// A plain decimal step count, or an Error naming the file.
std::size_t parse_step(const std::string& text, const std::string& path) {
  const std::optional<std::uint64_t> v = cli::parse_decimal(text);
  if (!v || *v > kMaxSteps)
    fail("train_lm: checkpoint '", path, "' has step \"", text.substr(0, 40), "\", which is not a whole number up to ",
         kMaxSteps);
  return static_cast<std::size_t>(*v);
}

template <class E>
const char* name_of(E value, const Names<E>& names) {
  for (const auto& [name, v] : names) {
    if (v == value) return name.c_str();
  }
  fail("train_lm: an option value without a name (", static_cast<int>(value), ")");
}

// The config's field `key`, or `fallback` when it is missing (a checkpoint written before train_lm
// had the field): a name of `names`, else an Error naming the key and the value.
template <class E>
E enum_field(const nlohmann::json& j, const char* key, const Names<E>& names, E fallback) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j.at(key);
  if (v.is_string()) {
    for (const auto& [name, e] : names) {
      if (v.get<std::string>() == name) return e;
    }
  }
  fail("train_lm: the checkpoint's config has ", key, " ", xgrad::detail::json_excerpt(v, 40),
       ", which this train_lm does not know");
}

}  // namespace

const Names<nn::NormKind> kNormKinds = weights::norm_kind_names();
const Names<nn::Positional> kPositionals = weights::positional_names();
const Names<nn::Activation> kActivations = weights::activation_names();
const Names<nn::Init> kInits = weights::init_names();
const std::vector<std::string> kArchs = {"classic", "gpt2", "llama"};

DataSource identify(const std::string& name, const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  // The name is only shown (a resume compares size and hash): a file name that is not UTF-8 is
  // kept with its odd bytes escaped, since the checkpoint's metadata is JSON.
  return {first_invalid_utf8(name) ? escape_bytes(name) : name, text.size(), h};
}

DataSource identify_file(const std::string& path, std::uint64_t vocab_size) {
  ReadableFile file(path, "train_lm: --tokens");
  const std::uint32_t dtype = text::token_file_dtype(vocab_size);
  std::uint64_t h = 14695981039346656037ull;
  std::vector<char> chunk(1 << 20);  // a multiple of the dtype and of the header: ids never straddle two
  std::uint64_t total = 0;
  while (const std::size_t n = file.read_some(chunk.data(), chunk.size())) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(chunk[i])) * 1099511628211ull;
    const std::size_t first = total < text::kTokenFileHeaderBytes ? text::kTokenFileHeaderBytes - total : 0;
    for (std::size_t i = first; i + dtype <= n; i += dtype) {
      const auto* p = reinterpret_cast<const unsigned char*>(chunk.data() + i);
      // Little-endian ids of 2 or 4 bytes.
      std::uint64_t id = p[0] | (std::uint64_t{p[1]} << 8);
      if (dtype == 4) id |= (std::uint64_t{p[2]} << 16) | (std::uint64_t{p[3]} << 24);
      if (id >= vocab_size)
        fail("train_lm: --tokens '", path, "': the token at position ",
             (total + i - text::kTokenFileHeaderBytes) / dtype, " (byte ", total + i, ") is ", id,
             ", outside the vocabulary [0, ", vocab_size, ") of its tokenizer; the file is damaged");
    }
    total += n;
  }
  return {first_invalid_utf8(path) ? escape_bytes(path) : path, total, h};
}

nlohmann::json DataSource::to_json() const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a));
  return {{"name", name}, {"bytes", bytes}, {"fnv1a", hex}};
}

std::string DataSource::describe() const {
  return "'" + name + "' (" + std::to_string(bytes) + " bytes, FNV-1a " + to_json()["fnv1a"].get<std::string>() + ")";
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = {{"layers", layers},
                      {"vocab_size", vocab_size},
                      {"d_model", d_model},
                      {"heads", heads},
                      {"d_ff", d_ff},
                      {"seq_len", seq_len},
                      {"dropout", dropout},
                      {"norm", norm == nn::Norm::pre ? "pre" : "post"},
                      {"arch", arch},
                      {"norm_kind", name_of(norm_kind, kNormKinds)},
                      {"norm_eps", norm_eps},
                      {"positional", name_of(positional, kPositionals)},
                      {"rope_theta", rope_theta},
                      {"rotary_dim", rotary_dim},
                      {"num_kv_heads", num_kv_heads},
                      {"qk_norm", qk_norm},
                      {"activation", name_of(activation, kActivations)},
                      {"tie_embeddings", tie_embeddings},
                      {"bias", bias},
                      {"init", name_of(init, kInits)},
                      {"freeze", freeze},
                      {"lora", lora_rank == 0 ? nlohmann::json(nullptr)
                                              : nlohmann::json{{"r", lora_rank},
                                                               {"alpha", lora_alpha},
                                                               {"dropout", lora_dropout},
                                                               {"rslora", lora_rslora},
                                                               {"targets", lora_targets}}},
                      {"grad_accum", grad_accum},
                      {"batch", batch},
                      {"steps", steps},
                      {"warmup", warmup},
                      {"lr", lr},
                      {"min_lr", min_lr},
                      {"weight_decay", weight_decay},
                      {"clip", clip},
                      {"valid_fraction", valid_fraction},
                      {"eval_interval", eval_interval},
                      {"eval_batches", eval_batches},
                      {"seed", seed}};
  if (imported) {
    j["init_from"] = init_from;
    j["model_options"] = nlohmann::json::parse(weights::to_json(*imported));
  }
  return j;
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  TrainConfig c;
  try {
    c.layers = j.at("layers");
    c.d_model = j.at("d_model");
    c.heads = j.at("heads");
    c.d_ff = j.at("d_ff");
    c.seq_len = j.at("seq_len");
    c.vocab_size = j.value("vocab_size", std::size_t{256});  // a checkpoint of a byte-level run
    c.dropout = j.at("dropout");
    c.norm = j.at("norm") == "pre" ? nn::Norm::pre : nn::Norm::post;
    // The architecture fields: a checkpoint written before they existed holds the classic model.
    const TrainConfig classic;
    c.arch = j.value("arch", classic.arch);
    if (j.contains("model_options")) {
      c.init_from = j.at("init_from");
      c.imported =
          weights::language_model_options_from_json(j.at("model_options").dump(), "train_lm: the checkpoint's config");
    }
    if (std::find(kArchs.begin(), kArchs.end(), c.arch) == kArchs.end() && !(c.imported && c.arch == "imported"))
      fail("train_lm: the checkpoint's config has arch \"", c.arch.substr(0, 40),
           "\", which this train_lm does not know");
    c.norm_kind = enum_field(j, "norm_kind", kNormKinds, classic.norm_kind);
    c.norm_eps = j.value("norm_eps", classic.norm_eps);
    c.positional = enum_field(j, "positional", kPositionals, classic.positional);
    c.rope_theta = j.value("rope_theta", classic.rope_theta);
    c.rotary_dim = j.value("rotary_dim", classic.rotary_dim);
    c.num_kv_heads = j.value("num_kv_heads", classic.num_kv_heads);
    c.qk_norm = j.value("qk_norm", classic.qk_norm);
    c.activation = enum_field(j, "activation", kActivations, classic.activation);
    c.tie_embeddings = j.value("tie_embeddings", classic.tie_embeddings);
    c.bias = j.value("bias", classic.bias);
    c.init = enum_field(j, "init", kInits, classic.init);
    c.freeze = j.value("freeze", std::vector<std::string>());
    if (j.contains("lora") && !j.at("lora").is_null()) {
      const nlohmann::json& l = j.at("lora");
      c.lora_rank = l.at("r");
      c.lora_alpha = l.at("alpha");
      c.lora_dropout = l.at("dropout");
      c.lora_rslora = l.at("rslora");
      c.lora_targets = l.at("targets").get<std::vector<std::string>>();
    }
    c.grad_accum = j.value("grad_accum", std::size_t{1});
    c.batch = j.at("batch");
    c.steps = j.at("steps");
    c.warmup = j.at("warmup");
    c.lr = j.at("lr");
    c.min_lr = j.at("min_lr");
    c.weight_decay = j.at("weight_decay");
    c.clip = j.at("clip");
    c.valid_fraction = j.at("valid_fraction");
    c.eval_interval = j.at("eval_interval");
    c.eval_batches = j.at("eval_batches");
    c.seed = j.at("seed");
  } catch (const nlohmann::json::exception& e) {
    fail("train_lm: the checkpoint's config is incomplete (", e.what(), ")");
  }
  return c;
}

void validate(const TrainConfig& c) {
  auto at_most = [](const char* flag, std::size_t v, std::size_t max) {
    if (v > max) fail(flag, " ", v, " is more than ", max);
  };
  at_most("--layers", c.layers, kMaxLayers);
  at_most("--d-model", c.d_model, kMaxWidth);
  at_most("--d-ff", c.d_ff, 4 * kMaxWidth);
  at_most("--seq-len", c.seq_len, kMaxSeqLen);
  at_most("--batch", c.batch, kMaxBatch);
  at_most("--steps", c.steps, kMaxSteps);
  at_most("--eval-batches", c.eval_batches, kMaxBatch);
  if (c.seq_len == 0) fail("--seq-len must be at least 1");
  if (c.vocab_size < 2 || c.vocab_size > kMaxVocab)
    fail("the vocabulary of ", c.vocab_size, " tokens is outside [2, ", kMaxVocab, "]");
  if (c.batch == 0) fail("--batch must be at least 1");
  if (c.grad_accum == 0) fail("--grad-accum must be at least 1");
  if (c.batch % c.grad_accum != 0)
    fail("--grad-accum ", c.grad_accum, " does not divide --batch ", c.batch, " into micro-batches of equal rows");
  if (c.lora_rank > 0) {
    lora_options(c).check("--lora");
    if (c.lora_targets.empty()) fail("--lora needs targets=...: the Linear modules to adapt");
    if (!c.freeze.empty()) fail("--freeze with --lora: --lora freezes every parameter but the adapters");
  }
  if (c.steps == 0) fail("--steps must be at least 1");
  if (!(std::isfinite(c.lr) && c.lr > 0.f)) fail("--lr ", c.lr, " must be positive and finite");
  if (!(c.min_lr >= 0.f && c.min_lr <= c.lr))
    fail("--min-lr ", c.min_lr, " must be between 0 and the learning rate ", c.lr);
  if (c.warmup >= c.steps) fail("--warmup ", c.warmup, " must be fewer than the ", c.steps, " steps of the run");
  if (!(c.weight_decay >= 0.f && std::isfinite(c.weight_decay)))
    fail("--weight-decay ", c.weight_decay, " must be >= 0 and finite");
  if (!(c.clip >= 0.f && std::isfinite(c.clip))) fail("--clip ", c.clip, " must be >= 0 and finite");
  if (!(c.valid_fraction > 0 && c.valid_fraction < 1))
    fail("--valid-fraction ", c.valid_fraction, " is outside (0, 1)");
  if (c.eval_batches == 0) fail("--eval-batches must be at least 1");
  if (std::find(kArchs.begin(), kArchs.end(), c.arch) == kArchs.end() && !(c.imported && c.arch == "imported"))
    fail("--arch '", c.arch, "' is not one of classic, gpt2, llama");
  if (c.imported) {
    if (c.seq_len > c.imported->max_len())
      fail("--seq-len ", c.seq_len, " is more than the ", c.imported->max_len(), " positions of --init-from '",
           c.init_from, "' (max_position_embeddings)");
    if (c.vocab_size > c.imported->vocab_size())
      fail("the tokenizer's ", c.vocab_size, " tokens are more than the ", c.imported->vocab_size(),
           " rows of --init-from '", c.init_from, "''s embedding; give the folder's own tokenizer");
  }
  if (!(std::isfinite(c.norm_eps) && c.norm_eps > 0.f)) fail("--norm-eps ", c.norm_eps, " must be positive and finite");
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0.f))
    fail("--rope-theta ", c.rope_theta, " must be positive and finite");
  if (c.num_kv_heads > 0 && (c.num_kv_heads > c.heads || c.heads % c.num_kv_heads != 0))
    fail("--num-kv-heads ", c.num_kv_heads, " does not divide --heads ", c.heads);
  // (--heads that does not divide --d-model: LanguageModel::check below names both.)
  if (c.positional == nn::Positional::rotary && c.heads > 0 && c.d_model % c.heads == 0) {
    const std::size_t head = c.d_model / c.heads;
    if (c.rotary_dim % 2 != 0 || c.rotary_dim > head)
      fail("--rotary-dim ", c.rotary_dim, " must be even and at most the head size ", head, " (--d-model / --heads)");
    if (c.rotary_dim == 0 && head % 2 != 0)
      fail("--positional rotary turns pairs of channels: the head size ", head,
           " (--d-model / --heads) is odd; give an even --rotary-dim below it");
  } else if (c.positional != nn::Positional::rotary && c.rotary_dim != 0) {
    fail("--rotary-dim ", c.rotary_dim, " is for --positional rotary");
  }
  nn::LanguageModel::check(model_options(c));  // --layers, --d-model with --heads, --dropout
  // Each step keeps a log row twice (the trainer's and the log file's) and a point of loss.svg.
  cli::check_memory(training_bytes(c) + cli::per_step_bytes(static_cast<double>(c.steps), 192),
                    "a training step of this model with the log of --steps " + std::to_string(c.steps));
}

double training_bytes(const TrainConfig& c) {
  if (c.imported) {
    TrainConfig sizes = c;
    const nn::LanguageModelOptions& o = *c.imported;
    sizes.imported.reset();
    sizes.layers = o.num_layers(), sizes.d_model = o.d_model(), sizes.heads = o.num_heads(), sizes.d_ff = o.d_ff();
    sizes.vocab_size = o.vocab_size(), sizes.activation = o.activation();
    return training_bytes(sizes);
  }
  cli::TransformerSize s;
  s.layers = static_cast<double>(c.layers);
  s.d_model = static_cast<double>(c.d_model);
  s.heads = static_cast<double>(c.heads);
  s.d_ff = static_cast<double>(c.d_ff ? c.d_ff : 4 * c.d_model);
  const bool gated = c.activation == nn::Activation::swiglu || c.activation == nn::Activation::geglu ||
                     c.activation == nn::Activation::geglu_tanh;
  if (gated) s.d_ff *= 1.5;  // a third projection of F, and its hidden values
  s.vocab = static_cast<double>(c.vocab_size);
  s.batch = static_cast<double>(c.batch / std::max<std::size_t>(c.grad_accum, 1));  // rows of one micro-batch
  s.seq_len = static_cast<double>(c.seq_len);
  return cli::transformer_training_bytes(s);
}

nn::LanguageModelOptions model_options(const TrainConfig& c) {
  if (c.imported) return nn::LanguageModelOptions(*c.imported).dropout(c.dropout);
  return nn::LanguageModelOptions(c.vocab_size, c.d_model, c.heads, c.layers)
      .d_ff(c.d_ff ? c.d_ff : 4 * c.d_model)
      .max_len(c.seq_len)
      .dropout(c.dropout)
      .norm(c.norm)
      .norm_kind(c.norm_kind)
      .norm_eps(c.norm_eps)
      .positional(c.positional)
      .rope_theta(c.rope_theta)
      .rotary_dim(c.rotary_dim)
      .num_kv_heads(c.num_kv_heads)
      .qk_norm(c.qk_norm)
      .activation(c.activation)
      .tie_embeddings(c.tie_embeddings)
      .bias(c.bias)
      .init(c.init);
}

void apply_arch(TrainConfig& c, const std::string& arch) {
  if (std::find(kArchs.begin(), kArchs.end(), arch) == kArchs.end())
    fail("--arch '", arch, "' is not one of classic, gpt2, llama");
  c.arch = arch;
  if (arch == "classic") {
    TrainConfig classic;
    classic.layers = c.layers, classic.d_model = c.d_model, classic.heads = c.heads, classic.arch = arch;
    copy_architecture(classic, c);
    return;
  }
  const nn::LanguageModelOptions o =
      arch == "gpt2" ? nn::LanguageModelOptions::gpt2_style(c.vocab_size, c.d_model, c.heads, c.layers)
                     : nn::LanguageModelOptions::llama_style(c.vocab_size, c.d_model, c.heads, c.layers,
                                                             c.heads % 2 == 0 ? c.heads / 2 : c.heads);
  c.d_ff = o.d_ff();
  c.norm = o.norm();
  c.norm_kind = o.norm_kind();
  c.norm_eps = o.norm_eps();
  c.positional = o.positional();
  c.rope_theta = o.rope_theta();
  c.rotary_dim = o.rotary_dim();
  c.num_kv_heads = o.num_kv_heads();
  c.qk_norm = o.qk_norm();
  c.activation = o.activation();
  c.tie_embeddings = o.tie_embeddings();
  c.bias = o.qkv_bias();
  c.init = o.init();
}

void apply_init_from(TrainConfig& c, const std::string& dir) {
  const nn::LanguageModelOptions o = weights::hf_model_options(dir);
  c.init_from = dir;
  c.imported = o;
  c.arch = "imported";
  c.layers = o.num_layers(), c.d_model = o.d_model(), c.heads = o.num_heads(), c.d_ff = o.d_ff();
}

nn::LoraOptions lora_options(const TrainConfig& c) {
  return nn::LoraOptions()
      .rank(c.lora_rank)
      .alpha(c.lora_alpha)
      .dropout(c.lora_dropout)
      .rslora(c.lora_rslora)
      .targets(c.lora_targets);
}

void parse_lora(const std::string& value, TrainConfig& c) {
  TrainConfig out = c;
  out.lora_targets.clear();
  bool rank = false, in_targets = false;
  std::size_t from = 0;
  while (from <= value.size()) {
    std::size_t comma = value.find(',', from);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(from, comma - from);
    from = comma + 1;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), v = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto number = [&](const char* what) {
      try {
        std::size_t used = 0;
        const double d = std::stod(v, &used);
        if (used == v.size()) return d;
      } catch (const std::exception&) {
      }
      fail("--lora: ", what, " '", v, "' is not a number");
    };
    if (in_targets && eq == std::string::npos) {
      if (item.empty()) fail("--lora: an empty target in '", value, "'");
      out.lora_targets.push_back(item);
    } else if (key == "targets") {
      if (v.empty()) fail("--lora: targets= names no module");
      in_targets = true;
      out.lora_targets.push_back(v);
    } else if (in_targets) {
      fail("--lora: '", item, "' after targets=: targets come last (every later item is a target)");
    } else if (key == "r") {
      const double r = number("r");
      if (!(r >= 0 && r <= 1e6 && r == std::floor(r))) fail("--lora: r ", v, " is not a count");
      out.lora_rank = static_cast<std::size_t>(r);
      rank = true;
    } else if (key == "alpha") {
      out.lora_alpha = static_cast<float>(number("alpha"));
    } else if (key == "dropout") {
      out.lora_dropout = static_cast<float>(number("dropout"));
    } else if (key == "rslora" && (v.empty() || v == "true" || v == "false")) {
      out.lora_rslora = v != "false";
    } else {
      fail("--lora: '", item, "' is not one of r=, alpha=, dropout=, rslora, targets=");
    }
  }
  if (!rank) fail("--lora: r= is missing (the adapters' rank)");
  if (out.lora_rank == 0) fail("--lora: r 0 must be at least 1");
  c = out;
}

nn::NameAliases hf_aliases(const nn::LanguageModelOptions& options) {
  try {
    return weights::hf_parameter_names(options);
  } catch (const Error&) {
    return {};  // no family describes the model: xgrad's names only
  }
}

void apply_fine_tuning(nn::LanguageModel& model, const TrainConfig& c, Generator& gen) {
  if (c.lora_rank == 0 && c.freeze.empty()) return;
  const nn::NameAliases aliases = hf_aliases(model.options());
  try {
    if (c.lora_rank > 0) nn::apply_lora(model, lora_options(c), gen, aliases);
    if (!c.freeze.empty()) nn::freeze(model, c.freeze, aliases);
  } catch (const Error& e) {
    fail(c.lora_rank > 0 ? "--lora: " : "--freeze: ", e.what());
  }
  if (model.named_trainable_parameters().empty()) fail("--freeze: every parameter is frozen: nothing would train");
}

weights::LoadedLanguageModel load_run_model(const std::string& checkpoint, const TrainConfig& c) {
  if (c.lora_rank == 0) return weights::load_language_model(checkpoint, model_options(c));
  weights::LoadedLanguageModel out;
  Generator loading = Generator::for_loading(c.seed);  // every weight is read from the file
  out.model = std::make_unique<nn::LanguageModel>(model_options(c), loading);
  apply_fine_tuning(*out.model, c, loading);
  out.checkpoint = weights::load_checkpoint(checkpoint, *out.model);
  return out;
}

void copy_architecture(const TrainConfig& from, TrainConfig& to) {
  to.init_from = from.init_from;
  to.imported = from.imported;
  to.layers = from.layers;
  to.d_model = from.d_model;
  to.heads = from.heads;
  to.d_ff = from.d_ff;
  to.norm = from.norm;
  to.arch = from.arch;
  to.norm_kind = from.norm_kind;
  to.norm_eps = from.norm_eps;
  to.positional = from.positional;
  to.rope_theta = from.rope_theta;
  to.rotary_dim = from.rotary_dim;
  to.num_kv_heads = from.num_kv_heads;
  to.qk_norm = from.qk_norm;
  to.activation = from.activation;
  to.tie_embeddings = from.tie_embeddings;
  to.bias = from.bias;
  to.init = from.init;
}

void copy_fine_tuning(const TrainConfig& from, TrainConfig& to) {
  to.freeze = from.freeze;
  to.lora_rank = from.lora_rank;
  to.lora_alpha = from.lora_alpha;
  to.lora_dropout = from.lora_dropout;
  to.lora_rslora = from.lora_rslora;
  to.lora_targets = from.lora_targets;
}

Trainer::Trainer(const TrainConfig& c, Corpus corpus, DataSource data, std::shared_ptr<Sharing> sharing)
    : config_((validate(c), c)),
      sharing_(sharing ? std::move(sharing) : std::make_shared<Sharing>()),
      schedule_steps_(c.steps),
      source_(std::move(data)),
      corpus_(std::move(corpus)),
      init_(c.seed),
      data_(c.seed + 1),
      schedule_(optim::ScheduleOptions(c.lr)
                    .warmup_steps(c.warmup)
                    .total_steps(c.steps)
                    .decay(optim::Decay::cosine)
                    .min_lr(c.min_lr)) {
  const auto ranks = static_cast<std::size_t>(sharing_->size());
  if (c.batch % ranks != 0) fail("train_lm: --batch ", c.batch, " does not divide among ", ranks, " processes");
  if ((c.batch / ranks) % c.grad_accum != 0)
    fail("train_lm: --grad-accum ", c.grad_accum, " does not divide each process's ", c.batch / ranks,
         " rows of --batch ", c.batch, " into micro-batches of equal rows");
  if (!corpus_.tokenizer || !corpus_.train || !corpus_.valid) fail("train_lm: the corpus has no tokens or tokenizer");
  // An imported model's embedding may have more rows than its tokenizer has tokens (padded).
  if (c.imported ? corpus_.tokenizer->vocab_size() > c.imported->vocab_size()
                 : corpus_.tokenizer->vocab_size() != c.vocab_size)
    fail("train_lm: the ", corpus_.tokenizer->kind(), " tokenizer has ", corpus_.tokenizer->vocab_size(),
         " tokens, the model ", c.vocab_size);
  valid_ = text::evaluation_windows(*corpus_.valid, c.batch, c.seq_len, c.eval_batches);
  if (valid_.empty())
    fail("train_lm: the validation text is shorter than one batch of ", c.batch, " x ", c.seq_len + 1, " tokens");
  valid_tokens_per_byte_ = static_cast<double>(valid_.size() * c.batch * c.seq_len) /
                           std::max(target_bytes(valid_, *corpus_.tokenizer), 1.0);
  for (text::TokenBatch& b : valid_) b = share(b);
  model_ = std::make_unique<nn::LanguageModel>(model_options(c), init_);
  apply_fine_tuning(*model_, c, init_);  // before wrap: the ranks average the trainable parameters
  sharing_->wrap(*model_);
  // The classic run decays every parameter, as it always has; a preset decays the matrices only.
  // Frozen parameters take no optimizer state.
  if (c.arch == "classic") {
    optimizer_ = std::make_unique<optim::AdamW>(model_->named_trainable_parameters(),
                                                optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(
        optim::decay_groups(nn::split_for_weight_decay(*model_), c.weight_decay), optim::AdamOptions(c.lr));
  }
}

void Trainer::load_imported_weights() {
  if (!config_.imported) fail("train_lm: the run has no --init-from folder");
  const std::shared_ptr<nn::LanguageModel> source = weights::load_hf_model(config_.init_from);
  weights::check_model_options(source->options(), model_->options(),
                               "train_lm: --init-from '" + config_.init_from + "'");
  // The folder holds the base model: LoRA adapters keep their own initial values.
  NoGradGuard no_grad;
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : model_->named_state()) state.emplace(name, t);
  for (const auto& [name, t] : source->named_state()) {
    const auto at = state.find(name);
    if (at == state.end()) fail("train_lm: --init-from '", config_.init_from, "': the model has no ", name);
    Tensor mine = at->second;
    if (mine.shape() != t.shape())
      fail("train_lm: --init-from '", config_.init_from, "': ", name, " has shape ", shape_str(t.shape()),
           ", the model ", shape_str(mine.shape()));
    mine.mutable_value() = t.value();
  }
}

text::TokenBatch Trainer::share(const text::TokenBatch& global) const {
  const std::size_t ranks = static_cast<std::size_t>(sharing_->size());
  if (ranks == 1) return global;
  const std::size_t rows = global.ids.shape()[0] / ranks, T = global.ids.shape()[1];
  const std::size_t from = static_cast<std::size_t>(sharing_->rank()) * rows;
  text::TokenBatch b{IndexArray::from_shape({rows, T}), IndexArray::from_shape({rows, T}), {}};
  std::copy_n(global.ids.data() + from * T, rows * T, b.ids.data());
  std::copy_n(global.targets.data() + from * T, rows * T, b.targets.data());
  return b;
}

float Trainer::validation_loss() {
  NoGradGuard no_grad;
  const AutocastGuard autocast(precision_);
  model_->eval();
  double total = 0;
  for (const text::TokenBatch& b : valid_) total += model_->loss(b.ids, b.targets).item();
  model_->train();
  // Every rank holds the same number of rows, so the mean of the ranks' means is the global mean.
  return static_cast<float>(sharing_->mean(total / static_cast<double>(valid_.size())));
}

double Trainer::bits_per_byte(float validation_loss) const {
  return static_cast<double>(validation_loss) * valid_tokens_per_byte_ / std::log(2.0);
}

std::string Trainer::checkpoint_note(const std::string& checkpoint) const {
  if (checkpoint.empty()) return "";
  if (!saved_step_) return " ('" + checkpoint + "' was not written by this run)";
  return " ('" + checkpoint + "' holds step " + std::to_string(*saved_step_) +
         ", the last state whose next forward pass gave a finite loss: its weights are finite, though weights this"
         " large may still give non-finite logits on other text, which --sample then names; --resume with the same"
         " settings takes the same steps again and stops the same way)";
}

void Trainer::run(std::size_t until, const std::function<void(const LogEntry&)>& on_step, const std::string& checkpoint,
                  std::size_t checkpoint_interval) {
  if (until > config_.steps) fail("train_lm: cannot train to step ", until, " of a ", config_.steps, "-step schedule");
  model_->train();
  const auto start = std::chrono::steady_clock::now();
  // A checkpoint due after step K is written once the weights of step K have given a finite loss
  // (step K + 1's training loss, or step K's validation loss): never weights that already diverged.
  bool pending = false;
  while (step_ < until) {
    const std::string data_state = pending ? data_.state() : std::string();
    const text::TokenBatch b =
        text::random_windows(*corpus_.train, config_.seq_len, config_.batch, data_,
                             static_cast<std::size_t>(sharing_->rank()), static_cast<std::size_t>(sharing_->size()));
    // Dropout masks: the model's streams seeded from (seed, rank, step), so ranks draw different
    // masks and a resumed run draws the same ones as an uninterrupted one.
    nn::seed_dropout(*model_, config_.seed * 0x9E3779B97F4A7C15ull +
                                  static_cast<std::uint64_t>(sharing_->rank()) * 1000003ull + step_);
    float loss = 0;
    try {
      AutocastGuard autocast(precision_);  // forward, loss and backward; closed before the step
      optimizer_->zero_grad();
      // grad_accum micro-batches of equal rows, each weighted by its share of the targets
      const std::size_t n = config_.grad_accum, rows = b.ids.shape()[0] / n, T = b.ids.shape()[1];
      const double local = optim::accumulate_gradients(std::vector<std::size_t>(n, rows * T), [&](std::size_t k) {
        if (n == 1) return model_->loss(b.ids, b.targets);
        const auto part = [&](const IndexArray& a) {
          return IndexArray(xt::view(a, xt::range(k * rows, (k + 1) * rows), xt::all()));
        };
        return model_->loss(part(b.ids), part(b.targets));
      });
      autocast.close();
      loss = static_cast<float>(sharing_->mean(local));
      optim::check_finite(step_ + 1, loss, optimizer_->params());
    } catch (const Error& e) {
      const std::string what = e.what();  // check_finite's message names the step already; anomaly's does not
      fail("train_lm: ", what.rfind("step ", 0) == 0 ? "" : "step " + std::to_string(step_ + 1) + ": ", what,
           "; training stopped before this step's update", checkpoint_note(checkpoint),
           anomaly_enabled() ? "" : "; --detect-anomaly names the op that made it");
    }
    if (pending) {
      save(checkpoint, data_state);  // the weights and optimizer state are still step_'s
      pending = false;
    }
    if (config_.clip > 0.f) optim::clip_grad_norm(optimizer_->params(), config_.clip);
    const float lr = schedule_.lr(step_);
    optimizer_->set_lr(lr);
    optimizer_->step();
    ++step_;
    LogEntry e;
    e.step = step_;
    e.train_loss = loss;
    e.lr = lr;
    if ((config_.eval_interval && step_ % config_.eval_interval == 0) || step_ == config_.steps) {
      e.valid_loss = validation_loss();
      if (!std::isfinite(*e.valid_loss)) {
        fail("train_lm: step ", step_, ": the validation loss is not finite (", *e.valid_loss, "); training stopped",
             checkpoint_note(checkpoint));
      }
    }
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    log_.push_back(e);
    if (on_step) on_step(e);
    if (!checkpoint.empty() && checkpoint_interval && step_ % checkpoint_interval == 0) {
      if (e.valid_loss) {
        save(checkpoint);
      } else {
        pending = true;
      }
    }
    if (stop_request_ && stop_request_()) {
      pending = !checkpoint.empty() && saved_step_ != step_;
      break;
    }
  }
  if (pending) {
    const float valid = validation_loss();
    if (!std::isfinite(valid)) {
      fail("train_lm: step ", step_, ": the validation loss is not finite (", valid, "); training stopped",
           checkpoint_note(checkpoint));
    }
    save(checkpoint);
  }
}

Metadata Trainer::metadata(const std::string& data_state) const {
  return {{"format", kFormat},
          {"step", std::to_string(step_)},
          {"schedule_steps", std::to_string(schedule_steps_)},
          {"data", source_.to_json().dump()},
          {"config", config_.to_json().dump()},
          {"data_rng", data_state},
          {"tokenizer", corpus_.tokenizer->to_json()}};
}

void Trainer::check_saveable() const {
  try {
    for (const auto& [key, value] : metadata(data_.state()))
      check_utf8(value, "train_lm: the checkpoint's metadata", key.c_str());
  } catch (const nlohmann::json::exception& e) {
    fail("train_lm: the checkpoint's metadata cannot be written (", e.what(), ")");
  }
}

void Trainer::save(const std::string& path) { save(path, data_.state()); }

void Trainer::save(const std::string& path, const std::string& data_state) {
  if (sharing_->rank() == 0) weights::save_checkpoint(path, *model_, optimizer_->state_dict(), metadata(data_state));
  saved_step_ = step_;  // on every rank, so each one's messages say what rank 0's file holds
}

TrainConfig checkpoint_config(const std::string& checkpoint) {
  const SafetensorsContents file = load_safetensors(checkpoint);
  auto it = file.metadata.find("format");
  if (it == file.metadata.end() || it->second != kFormat) {
    fail("train_lm: '", checkpoint, "' is not a train_lm checkpoint (no format \"", kFormat, "\" in its metadata)");
  }
  TrainConfig c;
  const nlohmann::json config = xgrad::detail::parse_json(meta_field(file.metadata, "config", checkpoint),
                                                          "train_lm: the config of '" + checkpoint + "'");
  try {
    c = TrainConfig::from_json(config);
  } catch (const nlohmann::json::exception& e) {
    fail("train_lm: '", checkpoint, "' has an unreadable config (", e.what(), ")");
  }
  try {
    validate(c);
  } catch (const Error& e) {
    fail("train_lm: '", checkpoint, "' holds a configuration that cannot be used: ", e.what());
  }
  return c;
}

std::shared_ptr<const text::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint) {
  const SafetensorsReader file(checkpoint);
  const auto it = file.metadata().find("tokenizer");
  if (it == file.metadata().end()) return std::make_shared<text::BytesTokenizer>();
  try {
    return text::tokenizer_from_json(it->second, "train_lm: the tokenizer of '" + checkpoint + "'");
  } catch (const Error& e) {
    fail(e.what());
  }
}

void Trainer::resume(const std::string& checkpoint) {
  const TrainConfig saved = checkpoint_config(checkpoint);
  nlohmann::json mine = config_.to_json(), theirs = saved.to_json();
  std::string differ;
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    if (it.key() == "steps" || theirs[it.key()] == it.value()) continue;
    std::string flag = it.key();
    std::replace(flag.begin(), flag.end(), '_', '-');
    differ += (differ.empty() ? "" : ", ") + ("--" + flag) + " " + theirs[it.key()].dump() + " in the checkpoint, " +
              it.value().dump() + " now";
  }
  if (!differ.empty()) fail("train_lm: --resume with different settings than the checkpoint's: ", differ);
  // Read everything first, so a bad file changes nothing.
  const SafetensorsContents file = load_safetensors(checkpoint);
  const Metadata& meta = file.metadata;
  const std::size_t step = parse_step(meta_field(meta, "step", checkpoint), checkpoint);
  if (step >= config_.steps) {
    fail("train_lm: checkpoint '", checkpoint, "' is at step ", step, ", not before the run's last step ",
         config_.steps, "; pass a larger --steps to train on");
  }
  const std::size_t schedule_steps =
      meta.count("schedule_steps") ? parse_step(meta.at("schedule_steps"), checkpoint) : saved.steps;
  if (schedule_steps <= config_.warmup || schedule_steps > kMaxSteps) {
    fail("train_lm: checkpoint '", checkpoint, "' has a schedule of ", schedule_steps, " steps, which cannot follow ",
         config_.warmup, " warm-up steps");
  }
  if (meta.count("data")) {
    DataSource theirs_data;
    try {
      const auto j = xgrad::detail::parse_json(meta.at("data"), "the data field");
      theirs_data.name = j.at("name").get<std::string>();
      theirs_data.bytes = j.at("bytes").get<std::uint64_t>();
      theirs_data.fnv1a = std::stoull(j.at("fnv1a").get<std::string>(), nullptr, 16);
    } catch (const std::exception& e) {
      fail("train_lm: checkpoint '", checkpoint, "' has unreadable data metadata (", e.what(), ")");
    }
    if (theirs_data.bytes != source_.bytes || theirs_data.fnv1a != source_.fnv1a) {
      fail("train_lm: --resume with other data than the checkpoint was trained on: ", theirs_data.describe(), " then, ",
           source_.describe(), " now");
    }
  }
  if (meta.count("tokenizer")) {
    const auto theirs_tokenizer = checkpoint_tokenizer(checkpoint);
    if (theirs_tokenizer->identity() != corpus_.tokenizer->identity())
      fail("train_lm: --resume with another tokenizer than the checkpoint was trained with: ",
           text::describe(theirs_tokenizer->identity()), " then, ", text::describe(corpus_.tokenizer->identity()),
           " now");
  }
  Generator data = data_;
  const std::string& data_rng = meta_field(meta, "data_rng", checkpoint);
  try {
    data.set_state(data_rng);
  } catch (const Error& e) {
    fail("train_lm: checkpoint '", checkpoint, "': the metadata field \"data_rng\" (the batch order's random state) ",
         "cannot be read: ", e.what());
  }
  const weights::Checkpoint ck = weights::load_checkpoint(checkpoint, *model_);
  optimizer_->load_state_dict(ck.optimizer_state);
  data_ = data;
  step_ = step;
  saved_step_ = step;
  schedule_steps_ = schedule_steps;
  schedule_ = optim::LrSchedule(optim::ScheduleOptions(config_.lr)
                                    .warmup_steps(config_.warmup)
                                    .total_steps(schedule_steps)
                                    .decay(optim::Decay::cosine)
                                    .min_lr(config_.min_lr));
}

}  // namespace lm
