// The one reader of file-sourced JSON (core/io/detail/json_file.hpp) and every loader that uses it:
// nesting is bounded before a value is built, so no message or comparison recurses without bound,
// and values are quoted as bounded excerpts.
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fixture.hpp"
#include "test_files.hpp"
#include "trainer.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/inspect/sparse_autoencoder.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/tokenizer.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/hf_import.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using xgrad::detail::json_excerpt;
using xgrad::detail::json_too_deep_at;
using xgrad::detail::kMaxJsonDepth;
using xgrad::detail::parse_json;

namespace {

// An array nested `depth` levels around 1.
std::string nested(std::size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// 300,000 levels: 600 KB, under every reader's size limit, and far past any stack.
const std::size_t kDeep = 300000;

std::string too_deep(const std::string& source) {
  return source + " nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels";
}

}  // namespace

TEST_CASE("json_too_deep_at counts the brackets outside strings", "[json]") {
  CHECK(json_too_deep_at(nested(3), 3) == std::string::npos);
  CHECK(json_too_deep_at(nested(4), 3) == 3);
  CHECK(json_too_deep_at("{\"a\": [{}]}", 2) == 7);
  // Brackets in strings, escaped quotes and backslashes do not count.
  CHECK(json_too_deep_at("[\"[[[[\", \"\\\"[[[\", \"\\\\\", 1]", 1) == std::string::npos);
  CHECK(json_too_deep_at("[\"\\\\\", [1]]", 1) == 7);
  // A closing bracket with nothing open does not make room for more.
  CHECK(json_too_deep_at("]]][[", 1) == 4);
}

TEST_CASE("parse_json refuses nesting past the limit before building the value", "[json]") {
  CHECK(parse_json(nested(kMaxJsonDepth), "test") != nlohmann::json());
  CHECK_THROWS_WITH(parse_json(nested(kMaxJsonDepth + 1), "test: 'f'"),
                    too_deep("test: 'f'") + " (byte " + std::to_string(kMaxJsonDepth) + ")");
  CHECK_THROWS_WITH(parse_json(nested(kDeep), "test: 'f'"), Contains(too_deep("test: 'f'")));
  // A syntax error quotes nlohmann's words, without its tag, cut, with bytes that are not text escaped.
  const std::string digits = "[" + std::string(20000, '7') + "x]";
  CHECK_THROWS_WITH(parse_json(digits, "test"),
                    Catch::StartsWith("test is not JSON: ") && Contains("...") && !Contains("[json."));
  try {
    parse_json("[\"\xff\"]", "test");
    FAIL("no error");
  } catch (const xgrad::Error& e) {
    CHECK(xgrad::first_invalid_utf8(e.what()) == std::nullopt);
  }
}

TEST_CASE("json_excerpt is bounded for any value", "[json]") {
  CHECK(json_excerpt(nlohmann::json{{"a", 1}}) == "{\"a\":1}");
  CHECK(json_excerpt(nlohmann::json::array({1, 2, 3}), 4) == "[1,2...");
  nlohmann::json many = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) many.push_back(i);
  CHECK(json_excerpt(many) == "an array of 5000 elements");
  // Deep: built at the limit a reader allows, quoted by kind.
  const nlohmann::json deep = parse_json("{\"x\": " + nested(kMaxJsonDepth - 1) + "}", "test");
  CHECK(json_excerpt(deep) == "an object of 1 fields");
  // Bytes that are not UTF-8 are replaced, not thrown; a cut does not split a character.
  CHECK(json_excerpt(std::string("a\xff")) == "\"a\xEF\xBF\xBD\"");
  CHECK(json_excerpt(std::string("\"\xC3\xA9\xC3\xA9"), 5) == "\"\\\"\xC3\xA9...");
  CHECK(json_excerpt(std::string("\"\xC3\xA9\xC3\xA9"), 4) == "\"\\\"...");
}

// Each loader that read a deep value used to quote it with nlohmann's dump(), which recursed once
// per level and ended the process.
TEST_CASE("every loader refuses deep JSON in its files by name", "[json][bad_input]") {
  using testing::TempDir;
  using testing::write_bytes;
  TempDir dir("xgrad_json");

  SECTION("a field of a Llama folder's config.json") {
    const std::string cfg = dir.file("config.json");
    write_bytes(cfg, "{\"hidden_size\": " + nested(kDeep) + "}");
    CHECK_THROWS_WITH(xgrad::weights::load_llama(dir.path), Contains(too_deep("load_llama: '" + cfg + "'")));
  }
  SECTION("a weight-map value of a sharded Llama folder's index") {
    for (const char* file : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
      const std::string from = testing::fixture_path(std::string("llama/sharded/") + file);
      write_bytes(dir.file(file), testing::read_bytes(from));
    }
    const std::string index = dir.file("model.safetensors.index.json");
    write_bytes(index, "{\"weight_map\": {\"model.norm.weight\": " + nested(kDeep) + "}}");
    CHECK_THROWS_WITH(xgrad::weights::load_llama(dir.path), Contains(too_deep("load_llama: '" + index + "'")));
  }
  SECTION("a field of an SAE's cfg.json") {
    const std::string cfg = dir.file("cfg.json");
    write_bytes(cfg, "{\"d_in\": " + nested(kDeep) + "}");
    CHECK_THROWS_WITH(xgrad::inspect::load_sae(dir.path), Contains(too_deep("load_sae: '" + cfg + "'")));
  }
  SECTION("a checkpoint's model options") {
    const std::string path = dir.file("model.safetensors");
    xgrad::save_safetensors(
        path, {{"w", xt::xarray<float>{1.f}}},
        {{"xgrad.checkpoint", "2"}, {"xgrad.model_options", "{\"d_model\": " + nested(kDeep) + "}"}});
    CHECK_THROWS_WITH(xgrad::weights::load_language_model(path),
                      Contains(too_deep("load_language_model: '" + path + "': the model options text")));
  }
  SECTION("train_lm's stored config (read by --sample and --resume)") {
    const std::string path = dir.file("ckpt.safetensors");
    xgrad::save_safetensors(path, {{"w", xt::xarray<float>{1.f}}},
                            {{"format", "xgrad-train-lm-1"}, {"config", "{\"norm_kind\": " + nested(kDeep) + "}"}});
    CHECK_THROWS_WITH(lm::checkpoint_config(path), Contains(too_deep("train_lm: the config of '" + path + "'")));
  }
  SECTION("tokenizer documents and vocab.json") {
    CHECK_THROWS_WITH(xgrad::text::tokenizer_from_json("{\"kind\": " + nested(kDeep) + "}", "reader"),
                      Contains(too_deep("reader: the tokenizer document")));
    const std::string vocab = dir.file("vocab.json"), merges = dir.file("merges.txt");
    write_bytes(vocab, "{\"a\": " + nested(kDeep) + "}");
    write_bytes(merges, "#version: 0.2\n");
    CHECK_THROWS_WITH(xgrad::text::load_gpt2_vocabulary(vocab, merges),
                      Contains(too_deep("load_gpt2_vocabulary: '" + vocab + "'")));
    const std::string hf = dir.file("tokenizer.json");
    write_bytes(hf, "{\"model\": {\"vocab\": " + nested(kDeep) + "}}");
    CHECK_THROWS_WITH(xgrad::text::load_hf_tokenizer_json(hf),
                      Contains(too_deep("load_hf_tokenizer_json: '" + hf + "'")));
  }
}
