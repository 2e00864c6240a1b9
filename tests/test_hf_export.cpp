// weights/hf_export: every Hugging Face family fixture (make_hf_family_fixtures.py) written back by
// save_hf_model and read again by load_hf_model, bit for bit and under its own model_type; models
// built in xgrad exported to the family that describes them; and what the exporter refuses.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "hf_families.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/model_options_json.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using nlohmann::json;
using testing::folder;

namespace {

std::string model_type_of(const std::string& dir) {
  return json::parse(testing::read_bytes(dir + "/config.json")).value("model_type", std::string("llama"));
}

// The model and its export read back agree: options and every parameter, bit for bit.
void check_round_trip(const nn::LanguageModel& model, const std::string& dir) {
  const auto back = weights::load_hf_model(dir);
  for (const weights::OptionsDifference& d : weights::architecture_differences(back->options(), model.options())) {
    CHECK(d.field == "init");  // the loader's is GPT-2's
  }
  const auto want = model.named_parameters(), got = back->named_parameters();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    REQUIRE(got[i].first == want[i].first);
    CHECK(got[i].second.value() == want[i].second.value());
  }
}

}  // namespace

TEST_CASE("hf export: every family's folder is written back under its own model_type and loads bit for bit",
          "[hf_families][hf_export]") {
  for (const char* name : {"qwen2", "qwen2_tied", "qwen3", "phi3", "phi3_window", "gpt_neox", "gpt_neox_sequential",
                           "mistral", "llama_rope_llama3", "llama_rope_linear", "llama_rope_dynamic", "gpt2",
                           "gpt2_bare", "gemma2", "gemma3", "gemma3_scaled", "qwen2_window"}) {
    SECTION(name) {
      const auto model = weights::load_hf_model(folder(name));
      testing::TempDir dir("xgrad_hf_export");
      weights::save_hf_model(*model, dir.path);
      CHECK(model_type_of(dir.path) == model_type_of(folder(name)));
      check_round_trip(*model, dir.path);
      // what hf_config_json says is the file written
      CHECK(json::parse(weights::hf_config_json(model->options())) ==
            json::parse(testing::read_bytes(dir.file("config.json"))));
    }
  }
}

TEST_CASE("hf export: models built in xgrad go to the family that describes them", "[hf_families][hf_export]") {
  struct Case {
    const char* family;
    nn::LanguageModelOptions options;
  };
  const Case cases[] = {
      {"llama", nn::LanguageModelOptions::llama_style(29, 16, 4, 2, 2).max_len(32)},
      {"gpt2", nn::LanguageModelOptions::gpt2_style(29, 16, 4, 2).max_len(32)},
      {"qwen2", nn::LanguageModelOptions::llama_style(29, 16, 4, 2, 2).max_len(32).qkv_bias(true)},
      {"gemma3_text", nn::LanguageModelOptions::llama_style(29, 16, 4, 3, 2)
                          .max_len(32)
                          .norm(nn::Norm::sandwich)
                          .norm_unit_offset(true)
                          .activation(nn::Activation::geglu_tanh)
                          .qk_norm(true)
                          .tie_embeddings(true)
                          .embed_scale(4.f)
                          .sliding_window(5)
                          .full_attention_layers({2})
                          .rope_local_theta(1000.f)},
  };
  for (const Case& c : cases) {
    SECTION(c.family) {
      Generator gen(7);
      nn::LanguageModel model(c.options, gen);
      testing::TempDir dir("xgrad_hf_export");
      weights::save_hf_model(model, dir.path);
      CHECK(model_type_of(dir.path) == c.family);
      check_round_trip(model, dir.path);
    }
  }
}

TEST_CASE("hf export: what no family describes, an unknown model_type and tokenizer files are refused by name",
          "[hf_families][hf_export][bad_input]") {
  Generator gen(8);
  nn::LanguageModel post(nn::LanguageModelOptions::llama_style(29, 16, 4, 2, 2).max_len(32).norm(nn::Norm::post), gen);
  testing::TempDir dir("xgrad_hf_export");
  CHECK_THROWS_WITH(weights::save_hf_model(post, dir.path),
                    Contains("save_hf_model: no Hugging Face family describes this model; the closest, llama, would "
                             "read it with norm \"post\" in the model, \"pre\""));
  const auto qwen2 = weights::load_hf_model(folder("qwen2"));
  weights::HfExportOptions as_llama;
  as_llama.model_type = "llama";
  CHECK_THROWS_WITH(weights::save_hf_model(*qwen2, dir.path, as_llama),
                    Contains("save_hf_model: model_type llama, would read it with out_bias false in the model, true"));
  as_llama.model_type = "bert";
  CHECK_THROWS_WITH(weights::hf_config_json(qwen2->options(), as_llama),
                    Contains("hf_config_json: model_type \"bert\" is not one of llama, qwen2, qwen3, mistral, phi3, "
                             "gpt_neox, gpt2, gemma2, gemma3_text"));
  CHECK(std::filesystem::is_empty(dir.path));  // nothing was written

  // Tokenizer files: copied when present; none, not a folder, or the export's own files: refused
  // before anything is written.
  testing::TempDir tokenizer("xgrad_hf_tokenizer");
  weights::HfExportOptions with;
  with.tokenizer_dir = tokenizer.path;
  CHECK_THROWS_WITH(weights::save_hf_model(*qwen2, dir.path, with),
                    Contains("save_hf_model: tokenizer_dir '" + tokenizer.path + "' holds none of tokenizer.json"));
  CHECK(std::filesystem::is_empty(dir.path));
  testing::write_bytes(tokenizer.file("tokenizer.json"), "{\"model\": {}}");
  testing::write_bytes(tokenizer.file("tokenizer_config.json"), "{}");
  weights::save_hf_model(*qwen2, dir.path, with);
  CHECK(testing::read_bytes(dir.file("tokenizer.json")) == "{\"model\": {}}");
  CHECK(testing::read_bytes(dir.file("tokenizer_config.json")) == "{}");
  check_round_trip(*qwen2, dir.path);
  with.tokenizer_dir = dir.path;  // the export's own folder
  CHECK_THROWS_WITH(weights::save_hf_model(*qwen2, dir.path, with), Contains("tokenizer_dir's tokenizer.json"));
  with.tokenizer_dir = dir.file("config.json");
  CHECK_THROWS_WITH(weights::save_hf_model(*qwen2, dir.path, with), Contains("' is not a folder"));
  // a file where the folder should be
  testing::write_bytes(dir.file("plain"), "x");
  CHECK_THROWS_WITH(weights::save_hf_model(*qwen2, dir.file("plain")), Contains("save_hf_model"));
}
