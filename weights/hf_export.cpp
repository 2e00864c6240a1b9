// A LanguageModel as a Hugging Face folder: its family's config.json (checked by reading it back
// with the family's reader), the parameters under the family's names (the loader's TensorMaps,
// inverted), and the tokenizer files of another folder.
#include "xgrad/weights/hf_export.hpp"

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/detail/hf_config.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/model_options_json.hpp"

namespace xgrad::weights {

namespace {

namespace fs = std::filesystem;
using detail::HfLayout;
using detail::TensorMap;
using nlohmann::json;

constexpr std::uint64_t kMaxTokenizerBytes = std::uint64_t{1} << 30;

// A family's config.json for the options, and the layout its reader gives back from it.
struct Described {
  json config;
  HfLayout layout;
};

// The fields in which the model `config` describes (read back by its family's reader) differs
// from `o`: none when the config is exact. A config the reader refuses is one difference.
std::vector<OptionsDifference> differences(const json& config, const nn::LanguageModelOptions& o, HfLayout& layout,
                                           const char* who) {
  try {
    layout = detail::read_layout(detail::ConfigReader(who, "config.json", config));
  } catch (const Error& e) {
    return {{"config.json", e.what(), ""}};
  }
  std::vector<OptionsDifference> out;
  for (OptionsDifference& d : architecture_differences(layout.options, o)) {
    if (d.field != "init") out.push_back(std::move(d));  // how to draw weights, not what they compute
  }
  return out;
}

Described describe(const nn::LanguageModelOptions& o, const std::string& model_type, const char* who) {
  std::string closest, report;
  std::size_t fewest = std::numeric_limits<std::size_t>::max();
  for (const detail::Family& f : detail::families()) {
    if (!model_type.empty() && model_type != f.model_type) continue;
    Described d{f.config(o), {}};
    const std::vector<OptionsDifference> diff = differences(d.config, o, d.layout, who);
    if (diff.empty()) return d;
    if (diff.size() < fewest) {
      fewest = diff.size(), closest = f.model_type, report.clear();
      for (const OptionsDifference& x : diff) {
        report += (report.empty() ? "" : "; ") +
                  (x.field == "config.json" ? x.stored : x.field + " " + x.given + " in the model, " + x.stored);
      }
    }
  }
  if (closest.empty()) {
    std::string known;
    for (const std::string& t : hf_model_types()) known += (known.empty() ? "" : ", ") + t;
    fail(who, ": model_type \"", model_type, "\" is not one of ", known);
  }
  fail(who, ": ", model_type.empty() ? "no Hugging Face family describes this model; the closest, " : "model_type ",
       closest, ", would read it with ", report);
}

}  // namespace

detail::HfLayout detail::describe_layout(const nn::LanguageModelOptions& options, const std::string& model_type,
                                         const char* who) {
  return describe(options, model_type, who).layout;
}

std::vector<TensorMap> detail::layout_maps(const HfLayout& l, std::size_t num_layers) {
  std::vector<TensorMap> maps = l.before;
  for (std::size_t n = 0; n < num_layers; ++n) {
    for (TensorMap& t : l.layer(n)) maps.push_back(std::move(t));
  }
  maps.insert(maps.end(), l.after.begin(), l.after.end());
  return maps;
}

namespace {

// The parameters under the layout's names: each parameter copied to its place in its file tensor
// (rows of a fused tensor; columns of a transposed one), every element of every file tensor once.
NamedArrays file_tensors(const nn::LanguageModel& model, const HfLayout& l, const char* who) {
  const std::vector<TensorMap> maps = detail::layout_maps(l, model.blocks.size());
  NamedArrays out;
  std::map<std::string, std::size_t> index, filled;
  std::set<std::string> written;
  for (const TensorMap& t : maps) {
    const Array& p = model.parameter(t.xgrad).value();
    if (p.shape() != t.shape)
      fail(who, ": parameter ", t.xgrad, " has shape ", shape_str(p.shape()), ", the layout ", shape_str(t.shape));
    auto [at, fresh] = index.emplace(t.hf, out.size());
    if (fresh) out.emplace_back(t.hf, Array(xt::zeros<float>(t.file_shape())));
    Array& dst = out[at->second].second;
    const std::size_t width = p.dimension() == 2 ? p.shape()[1] : 1;  // a parameter row's values
    const std::size_t cols = dst.dimension() == 2 ? dst.shape()[1] : 1;
    std::vector<detail::Rows> spans = t.rows;
    if (spans.empty()) spans = {{0, p.shape()[0]}};
    std::size_t r = 0;  // the parameter's next row
    for (const detail::Rows& span : spans) {
      for (std::size_t k = 0; k < span.count; ++k, ++r) {
        const float* row = p.data() + r * width;
        if (t.transposed) {  // parameter row r is column span.first + k of the (in, out) tensor
          for (std::size_t i = 0; i < width; ++i) dst.data()[i * cols + span.first + k] = row[i];
        } else {
          std::copy(row, row + width, dst.data() + (span.first + k) * width);
        }
      }
    }
    filled[t.hf] += p.size();
    written.insert(t.xgrad);
  }
  for (const auto& [name, a] : out) {
    if (filled[name] != a.size())
      fail(who, ": the layout fills ", filled[name], " of the ", a.size(), " values of ", name);
  }
  for (const auto& [name, p] : model.named_parameters()) {
    if (!written.count(name)) fail(who, ": parameter ", name, " has no place in the family's files");
  }
  return out;
}

// The tokenizer files of `from` and where they go, checked before anything is written: none
// present, or one that is already its own output, is an Error.
std::vector<std::pair<std::string, std::string>> tokenizer_files(const std::string& from, const std::string& directory,
                                                                 const char* who) {
  std::error_code ec;
  if (!fs::is_directory(from, ec)) fail(who, ": tokenizer_dir '", from, "' is not a folder");
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model"}) {
    const std::string src = (fs::path(from) / name).string(), dst = (fs::path(directory) / name).string();
    if (!fs::exists(src, ec)) continue;
    check_run_paths({{std::string("tokenizer_dir's ") + name, src}}, {{std::string("the export's ") + name, dst}}, who);
    out.emplace_back(src, dst);
  }
  if (out.empty()) {
    fail(who, ": tokenizer_dir '", from,
         "' holds none of tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt, "
         "tokenizer.model");
  }
  return out;
}

}  // namespace

std::string hf_config_json(const nn::LanguageModelOptions& options, const HfExportOptions& export_options) {
  return describe(options, export_options.model_type, "hf_config_json").config.dump(2) + "\n";
}

nn::NameAliases hf_parameter_names(const nn::LanguageModelOptions& options, const std::string& model_type) {
  nn::NameAliases out;
  const HfLayout l = describe(options, model_type, "hf_parameter_names").layout;
  for (const TensorMap& t : detail::layout_maps(l, options.num_layers())) out.emplace(t.xgrad, t.hf);
  return out;
}

void save_hf_model(const nn::LanguageModel& model, const std::string& directory, const HfExportOptions& options) {
  const char* who = "save_hf_model";
  for (const auto& [name, p] : model.named_parameters()) {
    const std::string suffix = ".lora.A";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      fail(who, ": '", name.substr(0, name.size() - 2),
           "' is a LoRA adapter: fold the adapters into the weights first (nn::merge_lora), or save them alone "
           "(save_peft_adapter)");
  }
  const Described d = describe(model.options(), options.model_type, who);
  const NamedArrays tensors = file_tensors(model, d.layout, who);
  prepare_output_dir(directory, who);
  std::vector<std::pair<std::string, std::string>> copies;
  if (!options.tokenizer_dir.empty()) copies = tokenizer_files(options.tokenizer_dir, directory, who);
  std::vector<std::string> texts;  // read before anything is written
  for (const auto& [src, dst] : copies) texts.push_back(read_file(src, who, kMaxTokenizerBytes));
  save_safetensors((fs::path(directory) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomically((fs::path(directory) / "config.json").string(), d.config.dump(2) + "\n", who);
  for (std::size_t i = 0; i < copies.size(); ++i) write_file_atomically(copies[i].second, texts[i], who);
}

}  // namespace xgrad::weights
