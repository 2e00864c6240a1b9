// Hugging Face folders into a LanguageModel: config.json read field by field by its family
// (weights/hf_<family>.cpp), the files' headers checked against the tensors it implies, then each
// tensor read once into its parameter.
#include "xgrad/weights/hf_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/io/detail/json_file.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights {

// The families by model_type; a config.json without one is Llama's.
const std::vector<detail::Family>& detail::families() {
  static const std::vector<Family> all = {
      {"llama", llama_layout, llama_config},        {"qwen2", qwen2_layout, qwen2_config},
      {"qwen3", qwen3_layout, qwen3_config},        {"mistral", mistral_layout, mistral_config},
      {"phi3", phi3_layout, phi3_config},           {"gpt_neox", gpt_neox_layout, gpt_neox_config},
      {"gpt2", gpt2_layout, gpt2_config},           {"gemma2", gemma2_layout, gemma2_config},
      {"gemma3_text", gemma3_layout, gemma3_config}};
  return all;
}

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::uint64_t kMaxJsonBytes = std::uint64_t{64} << 20;  // config.json, the index

using xgrad::detail::json_excerpt;

json read_json_object(const std::string& path, const char* who) {
  return xgrad::detail::read_json_object(path, who, kMaxJsonBytes);
}

using detail::ConfigReader;
using detail::HfLayout;
using detail::TensorMap;

using detail::Family;

}  // namespace

HfLayout detail::read_layout(const ConfigReader& r, const char* only) {
  const char* who = r.who();
  const std::string type = r.text("model_type", "llama");
  const Family* family = nullptr;
  std::string known;
  for (const Family& f : detail::families()) {
    if (type == f.model_type) family = &f;
    known += (known.empty() ? "\"" : ", \"") + std::string(f.model_type) + "\"";
  }
  if (!family)
    r.fail_field("model_type " + json_excerpt(json(type)) + " is not implemented (this xgrad loads " + known + ")");
  if (only && type != only) {
    r.fail_field("model_type " + json_excerpt(json(type)) + " is not \"" + only +
                 "\"; load_hf_model and hf_model_options read every family");
  }
  HfLayout layout = family->layout(r);
  r.refuse_unread();
  try {
    nn::LanguageModel::check(layout.options);
  } catch (const Error& e) {
    fail(who, ": '", r.path(), "' describes a model xgrad refuses: ", e.what());
  }
  return layout;
}

namespace {

// config.json, read and checked: the model's options and where its parameters are. `only`, when
// given, is the one model_type taken.
HfLayout read_config(const std::string& directory, const char* who, const char* only = nullptr) {
  HfLayout layout = detail::read_layout(ConfigReader(who, (fs::path(directory) / "config.json").string()), only);
  return layout;
}

// Every tensor of the first `layers` layers, in order: before, the layers, after; without the
// layout's optional prefix when `bare`.
std::vector<TensorMap> expected_tensors(const HfLayout& l, std::size_t layers, bool bare) {
  std::vector<TensorMap> ex = l.before;
  for (std::size_t n = 0; n < layers; ++n) {
    for (TensorMap& t : l.layer(n)) ex.push_back(std::move(t));
  }
  ex.insert(ex.end(), l.after.begin(), l.after.end());
  const std::string& prefix = l.optional_prefix;
  if (bare) {
    for (TensorMap& t : ex) {
      if (t.hf.compare(0, prefix.size(), prefix) == 0) t.hf.erase(0, prefix.size());
    }
  }
  return ex;
}

// Where a tensor is: which file, and its index in that file's header.
struct Location {
  std::size_t file, index;
};

// The checkpoint's files, opened (headers read and checked), and every tensor they hold.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, Location> tensors;
  std::string source;  // model.safetensors or the index, for "missing" errors

  const TensorInfo& info(const Location& at) const { return files[at.file]->tensors()[at.index]; }
  const std::string& path(const Location& at) const { return files[at.file]->path(); }
};

// A shard's name from the index: a plain file name in the checkpoint's folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

Checkpoint open_checkpoint(const std::string& directory, const char* who) {
  Checkpoint ck;
  const fs::path dir(directory);
  const std::string single = (dir / "model.safetensors").string();
  const std::string index_path = (dir / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(single, ec)) {
    ck.source = single;
    ck.files.push_back(std::make_unique<SafetensorsReader>(single));
    const auto& t = ck.files[0]->tensors();
    for (std::size_t i = 0; i < t.size(); ++i) ck.tensors.emplace(t[i].name, Location{0, i});
    return ck;
  }
  if (!fs::exists(index_path, ec)) {
    const bool bin = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
    fail(who, ": '", directory, "' holds neither model.safetensors nor model.safetensors.index.json",
         bin ? " (pytorch_model.bin files are not read: convert them to safetensors)" : "");
  }
  ck.source = index_path;
  const json index = read_json_object(index_path, who);
  const auto wm = index.find("weight_map");
  if (wm == index.end()) fail(who, ": '", index_path, "': missing field \"weight_map\"");
  if (!wm->is_object()) {
    fail(who, ": '", index_path, "': field \"weight_map\" must be an object (tensor name -> shard file), got ",
         json_excerpt(*wm));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::map<std::string, std::string> shards;      // shard -> the first tensor it is named for
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string() || !is_plain_file_name(shard.get<std::string>())) {
      fail(who, ": '", index_path, "': weight_map[\"", tensor, "\"] must be the name of a file in '", directory,
           "', got ", json_excerpt(shard));
    }
    weight_map[tensor] = shard.get<std::string>();
    shards.emplace(shard.get<std::string>(), tensor);
  }
  std::map<std::string, std::size_t> file_of;  // shard -> index in ck.files
  for (const auto& [shard, tensor] : shards) {
    const std::string path = (dir / shard).string();
    if (!fs::exists(path, ec)) {
      fail(who, ": '", index_path, "' puts tensor '", tensor, "' in shard '", shard, "', but '", path,
           "' does not exist");
    }
    file_of[shard] = ck.files.size();
    ck.files.push_back(std::make_unique<SafetensorsReader>(path));
  }
  for (std::size_t f = 0; f < ck.files.size(); ++f) {
    const auto& t = ck.files[f]->tensors();
    for (std::size_t i = 0; i < t.size(); ++i) {
      const auto [it, fresh] = ck.tensors.emplace(t[i].name, Location{f, i});
      if (!fresh) {
        fail(who, ": tensor '", t[i].name, "' is in two shards, '", ck.path(it->second), "' and '", ck.files[f]->path(),
             "'");
      }
    }
  }
  for (const auto& [name, at] : ck.tensors) {
    const auto named = weight_map.find(name);
    if (named == weight_map.end()) {
      fail(who, ": shard '", ck.path(at), "' holds tensor '", name, "', which the weight_map of '", index_path,
           "' does not name");
    }
    if (file_of.at(named->second) != at.file) {
      fail(who, ": '", index_path, "' puts tensor '", name, "' in shard '", named->second, "', but it is in '",
           ck.path(at), "'");
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ck.tensors.count(name)) {
      fail(who, ": '", index_path, "' puts tensor '", name, "' in shard '", shard, "', which does not hold it");
    }
  }
  return ck;
}

// Every expected tensor present with its shape, and nothing else (but the skipped buffers and, when
// tied, a head of the embedding's shape, compared later).
// `more`, when not empty, replaces the count of the other missing tensors (ex is then cut short).
void check_tensors(const Checkpoint& ck, const std::vector<TensorMap>& ex, const HfLayout& l, const char* who,
                   const std::string& more = "") {
  std::set<std::string> missing;
  const TensorMap* first_missing = nullptr;
  for (const TensorMap& e : ex) {
    if (!ck.tensors.count(e.hf) && missing.insert(e.hf).second && !first_missing) first_missing = &e;
  }
  if (first_missing) {
    const TensorMap& e = *first_missing;
    fail(who, ": '", ck.source, "' lacks tensor '", e.hf, "' ", shape_str(e.file_shape()), " (xgrad's ", e.xgrad, ")",
         !more.empty()        ? more
         : missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more tensors the model needs"
                              : "");
  }
  std::set<std::string> wanted;
  for (const TensorMap& e : ex) wanted.insert(e.hf);
  const nn::LanguageModelOptions& o = l.options;
  for (const auto& [name, at] : ck.tensors) {
    if (wanted.count(name) || l.buffer(name)) continue;
    if (o.tie_embeddings() && name == l.head) {
      const Shape want{o.vocab_size(), o.d_model()};
      if (ck.info(at).shape != want) {
        fail(who, ": tensor '", name, "' in '", ck.path(at), "' has shape ", shape_str(ck.info(at).shape),
             "; tied to tok_emb.weight (tie_word_embeddings), it must be a copy of it, ", shape_str(want));
      }
      continue;
    }
    fail(who, ": tensor '", name, "' ", shape_str(ck.info(at).shape), " in '", ck.path(at),
         "' is not part of the model config.json describes (no xgrad parameter takes it)");
  }
  for (const TensorMap& e : ex) {
    const Location& at = ck.tensors.at(e.hf);
    if (ck.info(at).shape != e.file_shape()) {
      fail(who, ": tensor '", e.hf, "' in '", ck.path(at), "' has shape ", shape_str(ck.info(at).shape), "; xgrad's ",
           e.xgrad, " needs ", shape_str(e.file_shape()));
    }
  }
}

// The parameter (rows, R) from the columns of a transposed source (R, K), read a block of source
// rows at a time (about 1 MiB).
void read_transposed(const Checkpoint& ck, const TensorMap& e, Array& dst) {
  const Location& at = ck.tensors.at(e.hf);
  const std::size_t R = e.file_shape()[0], K = e.file_shape()[1];
  const std::vector<detail::Rows> columns = e.rows.empty() ? std::vector<detail::Rows>{{0, K}} : e.rows;
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{1} << 18) / std::max<std::size_t>(1, K));
  std::vector<float> buffer(std::min(block, R) * K);
  float* out = dst.data();
  for (std::size_t r0 = 0; r0 < R; r0 += block) {
    const std::size_t n = std::min(block, R - r0);
    ck.files[at.file]->read(at.index, r0 * K, n * K, buffer.data());
    std::size_t row = 0;  // the parameter's row: the source's column
    for (const detail::Rows& c : columns) {
      for (std::size_t j = c.first; j < c.first + c.count; ++j, ++row) {
        for (std::size_t i = 0; i < n; ++i) out[row * R + r0 + i] = buffer[i * K + j];
      }
    }
  }
}

// The parameter's values from its tensor: all of it, or its rows in order.
void read_tensor(const Checkpoint& ck, const TensorMap& e, Array& dst) {
  const Location& at = ck.tensors.at(e.hf);
  if (e.transposed) return read_transposed(ck, e, dst);
  if (e.rows.empty()) {
    ck.files[at.file]->read(at.index, 0, dst.size(), dst.data());
    return;
  }
  const Shape& source = e.file_shape();
  const std::size_t width = source.size() > 1 ? source.back() : 1;
  std::size_t done = 0;
  for (const detail::Rows& rows : e.rows) {
    ck.files[at.file]->read(at.index, rows.first * width, rows.count * width, dst.data() + done);
    done += rows.count * width;
  }
}

std::shared_ptr<nn::LanguageModel> load(const std::string& directory, const char* who, const char* only,
                                        const HfLoadOptions& options) {
  const HfLayout l = read_config(directory, who, only);
  const nn::LanguageModelOptions& o = l.options;
  Checkpoint ck = open_checkpoint(directory, who);
  const std::string& prefix = l.optional_prefix;
  const bool bare = !prefix.empty() && std::none_of(ck.tensors.begin(), ck.tensors.end(), [&](const auto& t) {
    return t.first.compare(0, prefix.size(), prefix) == 0;
  });
  // More layers than the files have tensors for: the first missing one is among the layers they
  // could hold, so the list of every expected tensor (which could be vast) is never built.
  std::set<std::string> layer0;
  for (const TensorMap& t : l.layer(0)) layer0.insert(t.hf);
  const std::size_t per_layer = layer0.size(), layers_held = ck.tensors.size() / per_layer + 1;
  if (o.num_layers() > layers_held) {
    check_tensors(ck, expected_tensors(l, layers_held, bare), l, who,
                  "; num_hidden_layers " + std::to_string(o.num_layers()) + " needs " + std::to_string(per_layer) +
                      " tensors per layer, and the checkpoint holds " + std::to_string(ck.tensors.size()) +
                      " tensors in all");
  }
  const std::vector<TensorMap> ex = expected_tensors(l, o.num_layers(), bare);
  check_tensors(ck, ex, l, who);

  // The model's own memory, checked before it is built; each block's modules and tensors take
  // some memory of their own besides the parameters.
  constexpr std::size_t kChunk = std::size_t{1} << 18;  // floats compared at a time for a tied head
  double values = 0;
  for (const TensorMap& e : ex) {
    double n = 1;
    for (const std::size_t d : e.shape) n *= static_cast<double>(d);
    values += n;
  }
  check_available_memory(
      values * sizeof(float) + 2.0 * kChunk * sizeof(float) + static_cast<double>(o.num_layers()) * 64 * 1024, who,
      "the model in '" + directory + "' (" + std::to_string(static_cast<std::uint64_t>(values)) +
          " float32 parameters in " + std::to_string(o.num_layers()) + " blocks)");

  Generator init = Generator::for_loading(0);  // every parameter is read from the file below
  auto model = std::make_shared<nn::LanguageModel>(o, init);
  std::map<std::string, Array*> params;
  for (auto& [name, t] : model->named_parameters()) params[name] = &t.mutable_value();
  if (params.size() != ex.size()) {
    fail(who, ": the LanguageModel has ", params.size(), " parameters, but ", ex.size(),
         " tensors were expected for it (xgrad's layout and this importer disagree)");
  }
  for (const TensorMap& e : ex) {
    const auto it = params.find(e.xgrad);
    if (it == params.end() || it->second->shape() != e.shape) {
      fail(who, ": the LanguageModel has no parameter '", e.xgrad, "' ", shape_str(e.shape),
           " (xgrad's layout and this importer disagree)");
    }
    Array& dst = *it->second;
    std::optional<Array> mapped;
    if (options.map_file() && !e.transposed && e.rows.empty()) {
      const Location& at = ck.tensors.at(e.hf);
      mapped = ck.files[at.file]->map_f32(at.index);
    }
    if (mapped) {
      dst = std::move(*mapped);
    } else {
      read_tensor(ck, e, dst);
    }
    if (const std::size_t i = first_non_finite(dst); i < dst.size()) {
      fail(who, ": tensor '", e.hf, "' in '", ck.path(ck.tensors.at(e.hf)), "' holds ", dst.data()[i], " (in ", e.xgrad,
           " at flat position ", i, "); refusing non-finite weights");
    }
  }
  // A tied model's head, when the file has one, must be the embedding itself.
  const auto head = ck.tensors.find(l.head);
  if (o.tie_embeddings() && head != ck.tensors.end()) {
    const Array& emb = *params.at("tok_emb.weight");
    const std::string& embedding = l.before.front().hf;
    std::vector<float> chunk(std::min(kChunk, emb.size()));
    for (std::size_t first = 0; first < emb.size(); first += chunk.size()) {
      const std::size_t n = std::min(chunk.size(), emb.size() - first);
      ck.files[head->second.file]->read(head->second.index, first, n, chunk.data());
      for (std::size_t i = 0; i < n; ++i) {
        const float e = emb.data()[first + i], h = chunk[i];
        if (e != h) {
          fail(who, ": tie_word_embeddings is true, but '", l.head, "' in '", ck.path(head->second), "' differs from '",
               embedding, "' at flat position ", first + i, " (", h, " against ", e,
               "); a tied model has one matrix: set tie_word_embeddings false to use ", l.head, " as the head");
        }
      }
    }
  }
  model->eval();
  return model;
}

}  // namespace

nn::LanguageModelOptions llama_options(const std::string& directory) {
  return read_config(directory, "llama_options", "llama").options;
}

std::shared_ptr<nn::LanguageModel> load_llama(const std::string& directory, const HfLoadOptions& options) {
  return load(directory, "load_llama", "llama", options);
}

nn::LanguageModelOptions hf_model_options(const std::string& directory) {
  return read_config(directory, "hf_model_options").options;
}

std::shared_ptr<nn::LanguageModel> load_hf_model(const std::string& directory, const HfLoadOptions& options) {
  return load(directory, "load_hf_model", nullptr, options);
}

std::vector<std::string> hf_model_types() {
  std::vector<std::string> out;
  for (const Family& f : detail::families()) out.emplace_back(f.model_type);
  return out;
}

}  // namespace xgrad::weights
