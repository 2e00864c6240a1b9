// Checkpoints: the safetensors format (layout, round trip, every kind of corrupt input as a clear
// xgrad::Error), atomic saving, and weights::save_checkpoint / load_checkpoint with a model and an
// optimizer (exact resume; all-or-nothing loading; formats 1 and 2; buffers; strict(false);
// stored LanguageModel options and load_language_model). Agreement with PyTorch lives elsewhere.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/model_options_json.hpp"

#include "fixture.hpp"
#include "peak_memory.hpp"
#include "safetensors_bytes.hpp"
#include "small_models.hpp"
#include "test_files.hpp"

using namespace xgrad;
using Catch::Contains;
using testing::f32_le;
using testing::read_bytes;
using testing::read_u64_le;
using testing::small_lm;
using testing::TempDir;
using testing::u64_le;
using testing::write_bytes;
namespace fs = std::filesystem;

namespace {

std::string zeros_bytes(std::size_t n) { return std::string(n, '\0'); }

// A safetensors byte string from a header text (used as is, no padding) and the data bytes.
std::string st_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

Array filled(const Shape& shape, float scale, float offset = 0.f) {
  Array a = Array::from_shape(shape);
  for (std::size_t i = 0; i < a.size(); ++i)
    a.data()[i] = offset + scale * static_cast<float>(i + 1) * (i % 2 ? -1.f : 1.f);
  return a;
}

bool bit_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

IndexArray batch_ids() { return IndexArray{{1, 4, 2, 7, 3}, {9, 0, 5, 5, 10}}; }
IndexArray batch_targets() { return IndexArray{{4, 2, 7, 3, 8}, {0, 5, 5, 10, 1}}; }

void train_step(nn::LanguageModel& model, optim::Optimizer& opt) {
  opt.zero_grad();
  Tensor loss = model.loss(batch_ids(), batch_targets());
  loss.backward();
  opt.step();
}

// Every parameter of `model` equals `snapshot` (same names, same order, same bits).
void require_params_equal(const nn::Module& model, const NamedArrays& snapshot) {
  const NamedTensors params = model.named_parameters();
  REQUIRE(params.size() == snapshot.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << params[i].first);
    REQUIRE(params[i].first == snapshot[i].first);
    REQUIRE(bit_equal(params[i].second.value(), snapshot[i].second));
  }
}

bool any_param_differs(const nn::Module& model, const NamedArrays& snapshot) {
  const NamedTensors params = model.named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!bit_equal(params[i].second.value(), snapshot[i].second)) return true;
  }
  return false;
}

// A module with a child named "optimizer" (parameters "optimizer.weight", "optimizer.bias": the
// names a format-1 file gave optimizer state) and a buffer.
struct WithOptimizerChild : nn::Module {
  explicit WithOptimizerChild(Generator& gen) {
    optimizer = register_module("optimizer", std::make_shared<nn::Linear>(3, 2, true, gen));
    scale = register_parameter("scale", Tensor(gen.uniform({2}, 0.5f, 1.5f)));
    updates = register_buffer("updates", Array(0.f));
  }
  Tensor loss() const {
    const Tensor y = optimizer->forward(Tensor(Array{{1.f, -2.f, 0.5f}, {0.3f, 0.1f, -1.f}})) * scale;  // (2, 2)
    return sum(y * y);
  }
  std::shared_ptr<nn::Linear> optimizer;
  Tensor scale, updates;
};

void train_step(WithOptimizerChild& m, optim::Optimizer& opt) {
  opt.zero_grad();
  m.loss().backward();
  opt.step();
  m.updates.mutable_value() += 1.f;
}

std::vector<std::string> names_of(const NamedArrays& state) {
  std::vector<std::string> out;
  for (const auto& [name, a] : state) out.push_back(name);
  return out;
}

// A copy of `state` without the named entries.
NamedArrays without(NamedArrays state, const std::set<std::string>& names) {
  state.erase(std::remove_if(state.begin(), state.end(), [&](const auto& e) { return names.count(e.first) != 0; }),
              state.end());
  return state;
}

// parse_safetensors on bytes must fail with an xgrad::Error (a different exception type
// escapes and fails the test; a crash fails the run).
void parse_or_error(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "fuzz");
  } catch (const Error&) {
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Round trip and layout
// ----------------------------------------------------------------------------------------------

TEST_CASE("safetensors round trip keeps names, shapes, bits and metadata", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("t.safetensors");

  Array a = filled({2, 3}, 0.25f);
  // Special values must survive bit for bit.
  a.data()[0] = -0.f;
  a.data()[1] = std::numeric_limits<float>::denorm_min();
  a.data()[2] = std::numeric_limits<float>::infinity();
  a.data()[3] = -std::numeric_limits<float>::max();
  a.data()[4] = std::nextafter(1.f, 2.f);
  std::uint32_t nan_bits = 0x7fc01234u;  // a NaN with a payload
  std::memcpy(&a.data()[5], &nan_bits, 4);
  Array scalar(3.5f);  // 0-d
  Array empty = Array::from_shape({0, 4});
  Array cube = filled({2, 2, 2}, 1e-3f, 7.f);
  Array vec = filled({5}, 1e6f);

  const NamedArrays tensors = {{"layer.weight", a}, {"scalar", scalar}, {"empty", empty}, {"cube", cube}, {"vec", vec}};
  const Metadata metadata = {{"format", "pt"}, {"step", "12"}, {"note", "quotes \" and unicode \xc3\xa9"}};
  save_safetensors(path, tensors, metadata);

  SafetensorsContents back = load_safetensors(path);
  REQUIRE(back.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << tensors[i].first);
    CHECK(back.tensors[i].first == tensors[i].first);  // file order is the order saved
    CHECK(back.tensors[i].second.shape() == tensors[i].second.shape());
    CHECK(back.tensors[i].second.dimension() == tensors[i].second.dimension());
    CHECK(bit_equal(back.tensors[i].second, tensors[i].second));
  }
  CHECK(back.tensors[1].second.dimension() == 0);
  CHECK(back.tensors[1].second.size() == 1);
  CHECK(back.tensors[1].second() == 3.5f);
  CHECK(back.tensors[2].second.size() == 0);
  CHECK(back.metadata == metadata);

  // The in-memory parser reads the same bytes the same way.
  SafetensorsContents mem = parse_safetensors(read_bytes(path));
  REQUIRE(mem.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) CHECK(bit_equal(mem.tensors[i].second, tensors[i].second));
  CHECK(mem.metadata == metadata);
}

TEST_CASE("safetensors file layout follows the specification", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("layout.safetensors");
  const Array a = filled({2, 3}, 0.5f);
  const Array s(-2.25f);
  const Array e = Array::from_shape({3, 0});
  const Array b = filled({4}, 1.5f, -1.f);
  save_safetensors(path, {{"a", a}, {"s", s}, {"e", e}, {"b", b}}, {{"k", "v"}});

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  const std::uint64_t n = read_u64_le(bytes);
  REQUIRE(8 + n <= bytes.size());
  CHECK((8 + n) % 8 == 0);  // data 8-byte aligned
  const std::string header_text = bytes.substr(8, n);
  // Padding is spaces after the JSON text.
  const std::size_t close = header_text.find_last_of('}');
  REQUIRE(close != std::string::npos);
  for (std::size_t i = close + 1; i < header_text.size(); ++i) CHECK(header_text[i] == ' ');
  CHECK(header_text.size() - (close + 1) < 8);

  const nlohmann::json header = nlohmann::json::parse(header_text);
  REQUIRE(header.is_object());
  CHECK(header.size() == 5);  // four tensors and __metadata__
  REQUIRE(header.contains("__metadata__"));
  CHECK(header["__metadata__"] == nlohmann::json({{"k", "v"}}));

  const std::string data = bytes.substr(8 + n);
  struct Expect {
    const char* name;
    std::vector<std::uint64_t> shape;
    const Array* values;
  };
  const std::vector<Expect> expect = {{"a", {2, 3}, &a}, {"s", {}, &s}, {"e", {3, 0}, &e}, {"b", {4}, &b}};
  std::uint64_t covered = 0;
  for (const Expect& x : expect) {
    INFO("tensor " << x.name);
    REQUIRE(header.contains(x.name));
    const nlohmann::json& entry = header[x.name];
    CHECK(entry["dtype"] == "F32");
    REQUIRE(entry["shape"].is_array());
    CHECK(entry["shape"].get<std::vector<std::uint64_t>>() == x.shape);
    REQUIRE(entry["data_offsets"].is_array());
    REQUIRE(entry["data_offsets"].size() == 2);
    const std::uint64_t begin = entry["data_offsets"][0].get<std::uint64_t>();
    const std::uint64_t end = entry["data_offsets"][1].get<std::uint64_t>();
    CHECK(begin == covered);  // saved contiguously in order
    CHECK(end - begin == 4 * x.values->size());
    REQUIRE(end <= data.size());
    std::vector<float> row_major(x.values->data(), x.values->data() + x.values->size());
    CHECK(data.substr(begin, end - begin) == f32_le(row_major));
    covered = end;
  }
  CHECK(covered == data.size());  // nothing after the last tensor

  // Row-major order spelled out for "a": element (1, 0) is the 4th float.
  const std::uint64_t a_begin = header["a"]["data_offsets"][0].get<std::uint64_t>();
  CHECK(data.substr(a_begin + 12, 4) == f32_le({a(1, 0)}));
}

TEST_CASE("safetensors with no tensors and no metadata", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("empty.safetensors");
  save_safetensors(path, {});
  const std::string bytes = read_bytes(path);
  const std::uint64_t n = read_u64_le(bytes);
  CHECK((8 + n) % 8 == 0);
  CHECK(bytes.size() == 8 + n);
  CHECK(nlohmann::json::parse(bytes.substr(8, n)) == nlohmann::json::object());
  SafetensorsContents back = load_safetensors(path);
  CHECK(back.tensors.empty());
  CHECK(back.metadata.empty());
}

TEST_CASE("save_safetensors rejects duplicate and reserved names", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("bad.safetensors");
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", Array(1.f)}, {"w", Array(2.f)}}),
                      Contains("save_safetensors") && Contains("'w' appears twice"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", Array(1.f)}}), Contains("invalid tensor name"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"", Array(1.f)}}), Contains("invalid tensor name"));
  CHECK(dir.entries().empty());
}

// ----------------------------------------------------------------------------------------------
// Model + optimizer checkpoints
// ----------------------------------------------------------------------------------------------

TEST_CASE("checkpoint restores a LanguageModel and AdamW exactly", "[checkpoint][gemm]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("lm.safetensors");

  Generator gen_a(1);
  nn::LanguageModel a(small_lm(), gen_a);
  optim::AdamW opt_a(a.named_parameters(), optim::AdamW::defaults(1e-2f));
  for (int i = 0; i < 2; ++i) train_step(a, opt_a);
  const NamedArrays opt_state = opt_a.state_dict();
  REQUIRE(!opt_state.empty());
  weights::save_checkpoint(path, a, opt_state, {{"step", "2"}, {"run", "test"}});

  // The file holds the parameters by name and the optimizer state under "optimizer:".
  {
    SafetensorsContents raw = load_safetensors(path);
    std::set<std::string> names;
    for (const auto& [name, v] : raw.tensors) names.insert(name);
    for (const auto& [name, p] : a.named_parameters()) CHECK(names.count(name) == 1);
    for (const auto& [name, v] : opt_state) CHECK(names.count("optimizer:" + name) == 1);
    CHECK(raw.tensors.size() == a.named_parameters().size() + opt_state.size());
  }

  Generator gen_b(2);
  nn::LanguageModel b(small_lm(), gen_b);
  const NamedArrays saved = weights::state_dict(a);
  REQUIRE(any_param_differs(b, saved));  // a different seed really gives different weights

  weights::Checkpoint ck = weights::load_checkpoint(path, b);
  require_params_equal(b, saved);
  CHECK(ck.metadata == Metadata{{"step", "2"}, {"run", "test"}});

  // The optimizer state comes back under its own names, in full.
  REQUIRE(ck.optimizer_state.size() == opt_state.size());
  std::map<std::string, const Array*> by_name;
  for (const auto& [name, v] : ck.optimizer_state) {
    CHECK(name.rfind("optimizer:", 0) == std::string::npos);
    by_name[name] = &v;
  }
  for (const auto& [name, v] : opt_state) {
    INFO("state " << name);
    REQUIRE(by_name.count(name) == 1);
    CHECK(bit_equal(*by_name[name], v));
  }

  optim::AdamW opt_b(b.named_parameters(), optim::AdamW::defaults(1e-2f));
  REQUIRE_NOTHROW(opt_b.load_state_dict(ck.optimizer_state));

  // Both runs continue identically, bit for bit.
  for (int i = 0; i < 3; ++i) {
    train_step(a, opt_a);
    train_step(b, opt_b);
    require_params_equal(b, weights::state_dict(a));
  }
  REQUIRE(any_param_differs(a, saved));  // and training really moved the weights
}

// Checkpoints written while a block's feed-forward norm was its own child, "blocks.N.ffn_norm",
// before it moved into the feed-forward residual sublayer as "blocks.N.ffn.norm".
TEST_CASE("a checkpoint with the names from before the ffn.norm rename loads and resumes exactly",
          "[checkpoint][gemm]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("old.safetensors");
  auto old_name = [](std::string n) {
    const std::size_t at = n.find("ffn.norm.");
    return at == std::string::npos ? n : n.replace(at, 9, "ffn_norm.");
  };
  Generator gen_a(1);
  nn::LanguageModel a(small_lm(), gen_a);
  optim::AdamW opt_a(a.named_parameters(), optim::AdamW::defaults(1e-2f));
  train_step(a, opt_a);
  // The file as the old layout wrote it: every tensor under its old name.
  NamedArrays all;
  std::size_t renamed = 0;
  for (const auto& [name, v] : weights::state_dict(a)) {
    all.emplace_back(old_name(name), v);
    renamed += old_name(name) != name;
  }
  for (const auto& [name, v] : opt_a.state_dict()) all.emplace_back("optimizer." + old_name(name), v);
  REQUIRE(renamed == 4);  // two blocks, weight and bias
  save_safetensors(path, all);

  Generator gen_b(2);
  nn::LanguageModel b(small_lm(), gen_b);
  const weights::Checkpoint ck = weights::load_checkpoint(path, b);
  require_params_equal(b, weights::state_dict(a));
  optim::AdamW opt_b(b.named_parameters(), optim::AdamW::defaults(1e-2f));
  REQUIRE_NOTHROW(opt_b.load_state_dict(ck.optimizer_state));
  for (int i = 0; i < 2; ++i) {
    train_step(a, opt_a);
    train_step(b, opt_b);
    require_params_equal(b, weights::state_dict(a));
  }

  // load_state_dict takes the old names too; a state holding both names keeps the strict check.
  Generator gen_c(3);
  nn::LanguageModel c(small_lm(), gen_c);
  NamedArrays old_state;
  for (const auto& [name, v] : weights::state_dict(a)) old_state.emplace_back(old_name(name), v);
  weights::load_state_dict(c, old_state);
  require_params_equal(c, weights::state_dict(a));
  NamedArrays both = weights::state_dict(a);
  both.emplace_back("blocks.0.ffn_norm.weight", both.front().second);
  REQUIRE_THROWS_WITH(weights::load_state_dict(c, both),
                      Catch::Contains("unexpected entry 'blocks.0.ffn_norm.weight'"));
}

TEST_CASE("a checkpoint without optimizer state returns an empty optimizer_state", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("m.safetensors");
  Generator g1(3), g2(4);
  nn::LanguageModel a(small_lm(), g1), b(small_lm(), g2);
  weights::save_checkpoint(path, a);
  weights::Checkpoint ck = weights::load_checkpoint(path, b);
  CHECK(ck.optimizer_state.empty());
  CHECK(ck.metadata.empty());
  require_params_equal(b, weights::state_dict(a));
}

// ----------------------------------------------------------------------------------------------
// Atomic saving
// ----------------------------------------------------------------------------------------------

TEST_CASE("saving over an existing checkpoint replaces it and leaves no temporary file", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"x", filled({3}, 1.f)}}, {{"v", "1"}});
  CHECK(dir.entries() == std::set<std::string>{"ckpt.safetensors"});
  save_safetensors(path, {{"x", filled({2, 2}, 2.f)}, {"y", Array(5.f)}}, {{"v", "2"}});
  CHECK(dir.entries() == std::set<std::string>{"ckpt.safetensors"});

  SafetensorsContents back = load_safetensors(path);
  REQUIRE(back.tensors.size() == 2);
  CHECK(bit_equal(back.tensors[0].second, filled({2, 2}, 2.f)));
  CHECK(back.tensors[1].second() == 5.f);
  CHECK(back.metadata == Metadata{{"v", "2"}});

  // The same through save_checkpoint.
  Generator g1(5), g2(6);
  nn::LanguageModel a(small_lm(), g1), b(small_lm(), g2);
  weights::save_checkpoint(path, a);
  weights::save_checkpoint(path, b);
  CHECK(dir.entries() == std::set<std::string>{"ckpt.safetensors"});
  Generator g3(7);
  nn::LanguageModel c(small_lm(), g3);
  weights::load_checkpoint(path, c);
  require_params_equal(c, weights::state_dict(b));
}

TEST_CASE("saving into a missing directory throws and creates nothing", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string missing = dir.file("no_such_dir");
  const std::string path = missing + "/ckpt.safetensors";
  REQUIRE_THROWS_AS(save_safetensors(path, {{"x", Array(1.f)}}), Error);
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"x", Array(1.f)}}),
                      Contains("save_safetensors") && Contains("no_such_dir"));
  CHECK(!fs::exists(missing));
  CHECK(dir.entries().empty());

  Generator g(8);
  nn::LanguageModel m(small_lm(), g);
  REQUIRE_THROWS_AS(weights::save_checkpoint(path, m), Error);
  CHECK(!fs::exists(missing));
  CHECK(dir.entries().empty());
}

TEST_CASE("when the rename fails the error is an xgrad::Error and earlier files are intact", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  // A good checkpoint next to the target.
  const std::string keep = dir.file("keep.safetensors");
  save_safetensors(keep, {{"x", filled({3}, 1.f)}});
  const std::string keep_bytes = read_bytes(keep);
  // The target path is a non-empty directory: the temporary file can be written but not renamed.
  const std::string target = dir.file("target");
  fs::create_directory(target);
  write_bytes(target + "/inside.txt", "hello");

  REQUIRE_THROWS_AS(save_safetensors(target, {{"x", filled({4}, 2.f)}}), Error);
  REQUIRE_THROWS_WITH(save_safetensors(target, {{"x", filled({4}, 2.f)}}),
                      Contains("save_safetensors") && Contains("target") && Contains("unchanged"));
  CHECK(fs::is_directory(target));
  CHECK(read_bytes(target + "/inside.txt") == "hello");
  CHECK(dir.entries() == std::set<std::string>{"keep.safetensors", "target"});  // no temporary left
  CHECK(read_bytes(keep) == keep_bytes);

  Generator g(9);
  nn::LanguageModel m(small_lm(), g);
  REQUIRE_THROWS_AS(weights::save_checkpoint(target, m), Error);
  CHECK(dir.entries() == std::set<std::string>{"keep.safetensors", "target"});

  // An empty directory as the target fails the same way.
  const std::string empty_target = dir.file("empty_target");
  fs::create_directory(empty_target);
  REQUIRE_THROWS_AS(save_safetensors(empty_target, {{"x", Array(1.f)}}), Error);
  CHECK(fs::is_directory(empty_target));
  CHECK(fs::is_empty(empty_target));
  CHECK(dir.entries() == std::set<std::string>{"keep.safetensors", "target", "empty_target"});
}

// ----------------------------------------------------------------------------------------------
// Corrupt inputs
// ----------------------------------------------------------------------------------------------

TEST_CASE("missing, empty and short files are clear errors", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string missing = dir.file("missing.safetensors");
  REQUIRE_THROWS_AS(load_safetensors(missing), Error);
  REQUIRE_THROWS_WITH(load_safetensors(missing),
                      Contains("load_safetensors") && Contains("cannot open") && Contains("missing.safetensors"));

  const std::string empty = dir.file("empty.safetensors");
  write_bytes(empty, "");
  REQUIRE_THROWS_AS(load_safetensors(empty), Error);
  REQUIRE_THROWS_WITH(load_safetensors(empty),
                      Contains("empty.safetensors") && Contains("truncated") && Contains("0 bytes"));

  const std::string short_file = dir.file("short.safetensors");
  write_bytes(short_file, std::string("\x10\x00\x00", 3));
  REQUIRE_THROWS_WITH(load_safetensors(short_file), Contains("short.safetensors") && Contains("3 bytes") &&
                                                        Contains("fewer than the 8-byte header length"));

  for (std::size_t k = 0; k < 8; ++k) {
    INFO("bytes " << k);
    REQUIRE_THROWS_WITH(parse_safetensors(std::string(k, '\0')), Contains("fewer than the 8-byte header length"));
  }
  // A directory is not a file.
  REQUIRE_THROWS_AS(load_safetensors(dir.path), Error);
}

TEST_CASE("header lengths that do not fit the file are errors", "[checkpoint]") {
  // Larger than the file.
  REQUIRE_THROWS_WITH(parse_safetensors(u64_le(100) + std::string(10, ' ')),
                      Contains("truncated") && Contains("header length 100") && Contains("only 10 bytes"));
  REQUIRE_THROWS_WITH(parse_safetensors(u64_le(1)), Contains("truncated") && Contains("header length 1"));
  // Huge values: no allocation, no overflow.
  REQUIRE_THROWS_WITH(parse_safetensors(u64_le(std::uint64_t(1) << 63) + "{}"),
                      Contains("header length 9223372036854775808") && Contains("limit"));
  REQUIRE_THROWS_WITH(parse_safetensors(u64_le(~std::uint64_t(0)) + "{}"),
                      Contains("header length 18446744073709551615"));
  REQUIRE_THROWS_AS(parse_safetensors(u64_le((std::uint64_t(1) << 63) - 1) + "{}"), Error);
  REQUIRE_THROWS_AS(parse_safetensors(u64_le(std::uint64_t(1) << 32) + "{}"), Error);
  // Zero-length header is not JSON.
  REQUIRE_THROWS_WITH(parse_safetensors(u64_le(0)), Contains("not valid JSON"));
}

TEST_CASE("headers that are not a JSON object are errors", "[checkpoint]") {
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("{not json", ""), "buf"),
                      Contains("load_safetensors: buf") && Contains("not valid JSON"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("{\"a\": {\"dtype\": \"F32\"", "")), Contains("not valid JSON"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("[1, 2]", "")), Contains("not a JSON object"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("42      ", "")), Contains("not a JSON object"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("\"text\"", "")), Contains("not a JSON object"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("null", "")), Contains("not a JSON object"));
}

// nlohmann::json treats a NUL byte as the end of its input, so without a check of its own the
// reader would ignore everything after a NUL in the header (serde_json, used by the reference
// implementation, rejects such trailing characters).
TEST_CASE("a header with bytes after a NUL is not valid JSON", "[checkpoint]") {
  CHECK_THROWS_WITH(parse_safetensors(st_bytes(std::string("{}\0\0\0\0\0\0", 8), "")), Contains("not valid JSON"));
  CHECK_THROWS_WITH(parse_safetensors(st_bytes(std::string("{}\0garbage", 10), "")), Contains("not valid JSON"));
  const std::string hidden =
      std::string("{}\0", 3) + R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  CHECK_THROWS_WITH(parse_safetensors(st_bytes(hidden, "")), Contains("not valid JSON"));
}

TEST_CASE("entries without dtype, shape or data_offsets are errors", "[checkpoint]") {
  const std::string data = zeros_bytes(8);
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", data)),
                      Contains("'w'") && Contains("needs dtype, shape and data_offsets"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", data)),
                      Contains("'w'") && Contains("needs dtype, shape and data_offsets"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"w": {"dtype": "F32", "shape": [2]}})", data)),
                      Contains("'w'") && Contains("needs dtype, shape and data_offsets"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"w": 5})", data)), Contains("'w'") && Contains("needs dtype"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"w": [1, 2]})", data)),
                      Contains("'w'") && Contains("needs dtype"));
}

TEST_CASE("dtypes other than F32, F16 and BF16 are errors", "[checkpoint]") {
  REQUIRE_THROWS_WITH(
      parse_safetensors(st_bytes(R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", zeros_bytes(16))),
      Contains("'w'") && Contains("\"F64\"") && Contains("F32, F16 and BF16"));
  REQUIRE_THROWS_WITH(
      parse_safetensors(st_bytes(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", zeros_bytes(8))),
      Contains("'w'") && Contains("\"I64\"") && Contains("F32, F16 and BF16"));
  REQUIRE_THROWS_WITH(
      parse_safetensors(st_bytes(R"({"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", zeros_bytes(4))),
      Contains("\"f32\""));
  REQUIRE_THROWS_WITH(
      parse_safetensors(st_bytes(R"({"w": {"dtype": 32, "shape": [1], "data_offsets": [0, 4]}})", zeros_bytes(4))),
      Contains("'w'") && Contains("dtype 32"));
}

TEST_CASE("bad shapes are errors", "[checkpoint]") {
  auto entry = [](const std::string& shape, const std::string& offsets) {
    return "{\"w\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": " + offsets + "}}";
  };
  const std::string data = zeros_bytes(8);
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[-1, 2]", "[0, 8]"), data)),
                      Contains("'w'") && Contains("shape entry -1") && Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2.5]", "[0, 8]"), data)),
                      Contains("'w'") && Contains("shape entry 2.5") && Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2.0]", "[0, 8]"), data)),
                      Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[\"2\"]", "[0, 8]"), data)),
                      Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[null]", "[0, 8]"), data)),
                      Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[1e30]", "[0, 8]"), data)),
                      Contains("not a non-negative integer"));
  // 2^64 does not fit an unsigned integer.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[18446744073709551616]", "[0, 8]"), data)),
                      Contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("2", "[0, 8]"), data)),
                      Contains("'w'") && Contains("not an array"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("{\"a\": 2}", "[0, 8]"), data)), Contains("not an array"));

  // Element counts that overflow 64 bits or exceed the file.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[4294967296, 4294967296, 16]", "[0, 8]"), data)),
                      Contains("'w'") && Contains("larger than the file"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[18446744073709551615, 2]", "[0, 8]"), data)),
                      Contains("larger than the file"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[1000]", "[0, 4000]"), data)),
                      Contains("'w'") && Contains("larger than the file"));
  // 2^62 floats would be 2^64 bytes: count * 4 must not wrap to 0.
  REQUIRE_THROWS_AS(parse_safetensors(st_bytes(entry("[4611686018427387904]", "[0, 0]"), "")), Error);
  REQUIRE_THROWS_AS(parse_safetensors(st_bytes(entry("[4611686018427387904]", "[0, 8]"), data)), Error);
}

TEST_CASE("bad data_offsets are errors", "[checkpoint]") {
  auto entry = [](const std::string& shape, const std::string& offsets) {
    return "{\"w\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": " + offsets + "}}";
  };
  const std::string data = zeros_bytes(8);
  // Reversed.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2]", "[8, 0]"), data)),
                      Contains("'w'") && Contains("data_offsets [8, 0]"));
  // Out of range.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2]", "[0, 16]"), data)),
                      Contains("'w'") && Contains("data_offsets [0, 16]") && Contains("outside the 8-byte data"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2]", "[18446744073709551608, 0]"), data)),
                      Contains("data_offsets"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[0]", "[9, 9]"), data)), Contains("outside the 8-byte data"));
  // Not matching the shape's byte count.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2]", "[0, 4]"), data)),
                      Contains("'w'") && Contains("needs 8 bytes") && Contains("span 4"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[1]", "[0, 8]"), data)),
                      Contains("needs 4 bytes") && Contains("span 8"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[]", "[0, 8]"), data)), Contains("needs 4 bytes"));
  // Not two non-negative integers.
  for (const char* bad : {"[0]", "[0, 4, 8]", "[-1, 7]", "[0.0, 8.0]", "[\"0\", \"8\"]", "8", "null", "[]"}) {
    INFO("data_offsets " << bad);
    REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(entry("[2]", bad), data)),
                        Contains("'w'") && Contains("not two non-negative integers"));
  }
}

TEST_CASE("overlaps, holes and uncovered bytes are errors", "[checkpoint]") {
  auto two = [](const std::string& off_a, const std::string& off_b) {
    return "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": " + off_a +
           "}, \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": " + off_b + "}}";
  };
  // Overlapping: b starts inside a.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(two("[0, 8]", "[4, 12]"), zeros_bytes(12))),
                      Contains("'b'") && Contains("starts at byte 4") && Contains("expected 8") && Contains("overlap"));
  // Identical ranges (aliasing).
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(two("[0, 8]", "[0, 8]"), zeros_bytes(8))), Contains("overlap"));
  // A hole between the tensors.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(two("[0, 8]", "[12, 20]"), zeros_bytes(20))),
                      Contains("'b'") && Contains("starts at byte 12") && Contains("expected 8") && Contains("hole"));
  // A hole at the start.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(two("[4, 12]", "[12, 20]"), zeros_bytes(20))),
                      Contains("'a'") && Contains("starts at byte 4") && Contains("expected 0"));
  // Trailing bytes not covered by any tensor.
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(two("[0, 8]", "[8, 16]"), zeros_bytes(20))),
                      Contains("the data has 20 bytes") && Contains("cover 16"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes("{}", zeros_bytes(4))),
                      Contains("the data has 4 bytes") && Contains("cover 0"));
  // Offsets in reverse file order are fine (and come back sorted by offset).
  SafetensorsContents ok = parse_safetensors(st_bytes(two("[8, 16]", "[0, 8]"), f32_le({1, 2, 3, 4})));
  REQUIRE(ok.tensors.size() == 2);
  CHECK(ok.tensors[0].first == "b");
  CHECK(ok.tensors[0].second(0) == 1.f);
  CHECK(ok.tensors[1].first == "a");
  CHECK(ok.tensors[1].second(1) == 4.f);
}

TEST_CASE("metadata values must be strings", "[checkpoint]") {
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"__metadata__": {"k": 1}})", "")),
                      Contains("metadata value of 'k'") && Contains("not a string"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"__metadata__": {"ok": "x", "k": {"nested": "y"}}})", "")),
                      Contains("metadata value of 'k'"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"__metadata__": {"k": null}})", "")),
                      Contains("metadata value of 'k'"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"__metadata__": "text"})", "")),
                      Contains("__metadata__ is not an object"));
  REQUIRE_THROWS_WITH(parse_safetensors(st_bytes(R"({"__metadata__": ["a"]})", "")),
                      Contains("__metadata__ is not an object"));
  SafetensorsContents ok = parse_safetensors(st_bytes(R"({"__metadata__": {"k": "v"}})", ""));
  CHECK(ok.metadata == Metadata{{"k", "v"}});
}

TEST_CASE("truncated files are errors at every cut", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("full.safetensors");
  save_safetensors(path, {{"a", filled({2, 3}, 0.5f)}, {"b", filled({7}, 2.f)}, {"c", Array(1.f)}}, {{"k", "v"}});
  const std::string full = read_bytes(path);
  const std::uint64_t n = read_u64_le(full);
  REQUIRE_NOTHROW(parse_safetensors(full));

  // A file cut in the middle of the data, on disk.
  const std::string cut = dir.file("cut.safetensors");
  const std::size_t mid = 8 + n + (full.size() - 8 - n) / 2;
  write_bytes(cut, full.substr(0, mid));
  REQUIRE_THROWS_AS(load_safetensors(cut), Error);
  REQUIRE_THROWS_WITH(
      load_safetensors(cut),
      Contains("cut.safetensors") && (Contains("outside") || Contains("larger than the file") || Contains("cover")));
  // Cut one byte short.
  write_bytes(cut, full.substr(0, full.size() - 1));
  REQUIRE_THROWS_WITH(load_safetensors(cut), Contains("cut.safetensors") && Contains("'c'"));
  // Cut inside the header.
  write_bytes(cut, full.substr(0, 8 + n / 2));
  REQUIRE_THROWS_WITH(load_safetensors(cut), Contains("cut.safetensors") && Contains("truncated"));

  // Every prefix of the file is an error, never a crash.
  for (std::size_t k = 0; k < full.size(); ++k) {
    INFO("prefix of " << k << " bytes");
    REQUIRE_THROWS_AS(parse_safetensors(full.substr(0, k)), Error);
  }
  // Extra bytes appended are an error too.
  REQUIRE_THROWS_WITH(parse_safetensors(full + "xxxx"), Contains("cover"));
}

TEST_CASE("random corruption of a header gives an Error or a valid result, never a crash", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("f.safetensors");
  save_safetensors(path, {{"a", filled({2, 3}, 0.5f)}, {"e", Array::from_shape({0, 2})}, {"c", Array(1.f)}},
                   {{"k", "v"}});
  const std::string full = read_bytes(path);
  const std::uint64_t n = read_u64_le(full);
  const char replacements[] = {'\0', '\xff', '9', '0', '-', '"', ',', '[', ']', '{', '}', ' ', '.', 'e'};
  std::size_t errors = 0, accepted = 0;
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (char r : replacements) {
      if (full[i] == r) continue;
      std::string bytes = full;
      bytes[i] = r;
      try {
        SafetensorsContents c = parse_safetensors(bytes, "fuzz");
        // Whatever was accepted is self-consistent.
        std::uint64_t total = 0;
        for (const auto& [name, a] : c.tensors) total += 4 * a.size();
        CHECK(total == full.size() - 8 - n);
        ++accepted;
      } catch (const Error&) {
        ++errors;
      }
    }
  }
  CHECK(errors > 0);
  // Some edits (e.g. inside the padding or a metadata string) are harmless.
  CHECK(accepted > 0);
}

TEST_CASE("a zero-size tensor with a huge dimension does not allocate or crash", "[checkpoint]") {
  const std::string h = R"({"z": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})";
  parse_or_error(st_bytes(h, ""));
  const std::string h2 =
      R"({"z": {"dtype": "F32", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})";
  parse_or_error(st_bytes(h2, ""));
  SUCCEED();
}

// ----------------------------------------------------------------------------------------------
// All-or-nothing loading
// ----------------------------------------------------------------------------------------------

TEST_CASE("load_checkpoint leaves the model unchanged on every error", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  Generator g_target(10), g_other(11);
  nn::LanguageModel target(small_lm(), g_target);
  nn::LanguageModel other(small_lm(), g_other);
  const NamedArrays before = weights::state_dict(target);
  const NamedArrays good = weights::state_dict(other);
  REQUIRE(good.size() >= 5);
  REQUIRE(any_param_differs(target, good));

  SECTION("a missing parameter") {
    NamedArrays state = good;
    const std::string dropped = state[state.size() / 2].first;
    state.erase(state.begin() + static_cast<std::ptrdiff_t>(state.size() / 2));
    const std::string path = dir.file("missing.safetensors");
    save_safetensors(path, state);
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("load_checkpoint") &&
                                                                    Contains("missing.safetensors") &&
                                                                    Contains("missing parameter '" + dropped + "'"));
    require_params_equal(target, before);
  }
  SECTION("an unexpected extra name") {
    NamedArrays state = good;
    state.emplace_back("extra.weight", filled({2, 2}, 1.f));
    const std::string path = dir.file("extra.safetensors");
    save_safetensors(path, state);
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target),
                        Contains("load_checkpoint") && Contains("unexpected entry 'extra.weight'"));
    require_params_equal(target, before);
  }
  SECTION("an extra name that replaces a missing one") {
    NamedArrays state = good;
    const std::string renamed = state[1].first;
    state[1].first = "renamed.weight";
    const std::string path = dir.file("renamed.safetensors");
    save_safetensors(path, state);
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("missing parameter '" + renamed + "'"));
    require_params_equal(target, before);
  }
  SECTION("a wrong shape after several good parameters") {
    NamedArrays state = good;
    // The last parameter in file order gets a wrong shape; all others would load fine.
    auto& [name, a] = state.back();
    const std::string bad_name = name;
    const std::string good_shape = shape_str(a.shape());
    a = filled({a.size() + 1}, 1.f);
    const std::string bad_shape = shape_str(a.shape());
    const std::string path = dir.file("shape.safetensors");
    save_safetensors(path, state);
    // Check the bad entry really is last in the file.
    SafetensorsContents raw = load_safetensors(path);
    REQUIRE(raw.tensors.back().first == bad_name);
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("load_checkpoint") &&
                                                                    Contains("'" + bad_name + "'") &&
                                                                    Contains(bad_shape) && Contains(good_shape));
    require_params_equal(target, before);
  }
  SECTION("a corrupted file") {
    const std::string path = dir.file("corrupt.safetensors");
    weights::save_checkpoint(path, other);
    const std::string full = read_bytes(path);
    write_bytes(path, full.substr(0, full.size() - 6));
    REQUIRE_THROWS_AS(weights::load_checkpoint(path, target), Error);
    require_params_equal(target, before);
    // Garbage in the header.
    std::string garbled = full;
    garbled[8] = 'X';
    write_bytes(path, garbled);
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("not valid JSON"));
    require_params_equal(target, before);
  }
  SECTION("a missing file") {
    REQUIRE_THROWS_WITH(weights::load_checkpoint(dir.file("nope.safetensors"), target), Contains("cannot open"));
    require_params_equal(target, before);
  }
  SECTION("a checkpoint of a model with a different shape") {
    Generator g(12);
    nn::LanguageModel bigger(nn::LanguageModelOptions(11, 8, 2, 3).d_ff(16).max_len(8).dropout(0.f), g);
    const std::string path = dir.file("bigger.safetensors");
    weights::save_checkpoint(path, bigger);
    // The stored options name the difference; a file without them, the first extra tensor.
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target),
                        Contains("load_checkpoint") && Contains("bigger.safetensors") &&
                            Contains("num_layers 3 in the file, 2 in the model"));
    require_params_equal(target, before);
    save_safetensors(path, weights::state_dict(bigger));
    REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("unexpected entry 'blocks.2."));
    require_params_equal(target, before);
  }
  // After all that, a good checkpoint still loads.
  const std::string path = dir.file("good.safetensors");
  weights::save_checkpoint(path, other);
  weights::load_checkpoint(path, target);
  require_params_equal(target, good);
}

TEST_CASE("weights::load_state_dict errors name the parameter and the shapes", "[checkpoint]") {
  Generator g1(13), g2(14);
  nn::LanguageModel m(small_lm(), g1), other(small_lm(), g2);
  const NamedArrays before = weights::state_dict(m);
  NamedArrays state = weights::state_dict(other);

  SECTION("wrong shape") {
    // "head.weight" is (V, C) = (11, 8).
    for (auto& [name, a] : state) {
      if (name == "head.weight") a = filled({8, 11}, 1.f);
    }
    REQUIRE_THROWS_WITH(weights::load_state_dict(m, state), Contains("load_state_dict") && Contains("'head.weight'") &&
                                                                Contains("(8, 11) in the state") &&
                                                                Contains("(11, 8) in the module"));
  }
  SECTION("missing") {
    state.erase(state.begin());
    REQUIRE_THROWS_WITH(weights::load_state_dict(m, state),
                        Contains("load_state_dict: missing parameter 'tok_emb.weight'"));
  }
  SECTION("unexpected") {
    state.emplace_back("ghost", Array(1.f));
    REQUIRE_THROWS_WITH(weights::load_state_dict(m, state), Contains("load_state_dict: unexpected entry 'ghost'"));
  }
  SECTION("duplicate") {
    state.push_back(state.front());
    REQUIRE_THROWS_WITH(weights::load_state_dict(m, state), Contains("'tok_emb.weight' appears twice"));
  }
  SECTION("0-d instead of a vector") {
    for (auto& [name, a] : state) {
      if (name == "head.bias") a = Array(1.f);
    }
    REQUIRE_THROWS_WITH(weights::load_state_dict(m, state),
                        Contains("'head.bias'") && Contains("() in the state") && Contains("(11) in the module"));
  }
  require_params_equal(m, before);
}

TEST_CASE("weights::load_state_dict copies values and does not alias the state", "[checkpoint]") {
  Generator g1(15), g2(16);
  nn::LanguageModel m(small_lm(), g1), other(small_lm(), g2);
  NamedArrays state = weights::state_dict(other);
  weights::load_state_dict(m, state);
  require_params_equal(m, state);
  const NamedArrays copy = state;
  state[0].second.data()[0] += 1.f;  // editing the state afterwards does not reach the module
  require_params_equal(m, copy);
}

// ----------------------------------------------------------------------------------------------
// Namespaces, formats, buffers, strict(false), stored model options
// ----------------------------------------------------------------------------------------------

TEST_CASE("a module with a child named optimizer round-trips with its optimizer's state and buffers",
          "[checkpoint][gemm]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("child.safetensors");
  Generator gen_a(21), gen_b(22);
  WithOptimizerChild a(gen_a), b(gen_b);
  optim::AdamW opt_a(a.named_parameters(), optim::AdamW::defaults(1e-2f).weight_decay(0.05f));
  for (int i = 0; i < 2; ++i) train_step(a, opt_a);
  opt_a.set_lr(0.0042f);  // as a schedule would
  CHECK(names_of(weights::state_dict(a)) ==
        std::vector<std::string>{"scale", "updates", "optimizer.weight", "optimizer.bias"});
  weights::save_checkpoint(path, a, opt_a.state_dict(), {{"step", "2"}});

  {
    const SafetensorsContents raw = load_safetensors(path);
    std::set<std::string> names;
    for (const auto& [name, v] : raw.tensors) names.insert(name);
    for (const char* n : {"optimizer.weight", "optimizer.bias", "scale", "updates", "optimizer:AdamW:lr",
                          "optimizer:optimizer.weight.exp_avg", "optimizer:scale.step"}) {
      INFO(n);
      CHECK(names.count(n) == 1);
    }
    CHECK(raw.metadata == Metadata{{"step", "2"}, {"xgrad.checkpoint", "2"}});  // no model options: not a LanguageModel
  }

  REQUIRE(b.updates.value()() == 0.f);
  const weights::Checkpoint ck = weights::load_checkpoint(path, b);
  const NamedArrays saved = weights::state_dict(a);
  const NamedArrays got = weights::state_dict(b);
  REQUIRE(names_of(got) == names_of(saved));
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(bit_equal(got[i].second, saved[i].second));
  CHECK(b.updates.value()() == 2.f);  // the buffer came back
  CHECK(!b.updates.requires_grad());
  CHECK(ck.metadata == Metadata{{"step", "2"}});
  CHECK(!ck.model_options);
  CHECK(names_of(ck.optimizer_state) == names_of(opt_a.state_dict()));

  // The resumed optimizer takes the saved hyperparameters, not its constructor's.
  optim::AdamW opt_b(b.named_parameters(), optim::AdamW::defaults(0.5f));
  opt_b.load_state_dict(ck.optimizer_state);
  CHECK(opt_b.lr() == 0.0042f);
  CHECK(opt_b.options().weight_decay() == 0.05f);
  for (int i = 0; i < 2; ++i) {
    train_step(a, opt_a);
    train_step(b, opt_b);
    require_params_equal(b, [&] {
      NamedArrays p;
      for (const auto& [name, t] : a.named_parameters()) p.emplace_back(name, t.value());
      return p;
    }());
  }
}

TEST_CASE("a format-1 checkpoint (optimizer.<name>, no marker, no options) still loads", "[checkpoint]") {
  // Written by an earlier xgrad and kept as it was: Pre-Norm, learned positions, GELU, one AdamW step.
  const std::string path = testing::fixture_path("xgrad_lm_format1.safetensors");
  const nn::LanguageModelOptions o = nn::LanguageModelOptions(11, 8, 2, 2).max_len(8).dropout(0.f);
  {
    const SafetensorsContents raw = load_safetensors(path);
    REQUIRE(raw.metadata == Metadata{{"written_by", "tests/test_torch_export.cpp"}});
    REQUIRE(raw.tensors.back().first.rfind("optimizer.", 0) == 0);
  }
  nn::LanguageModel model(o);
  const weights::Checkpoint ck = weights::load_checkpoint(path, model);
  CHECK(!ck.model_options);
  CHECK(ck.metadata == Metadata{{"written_by", "tests/test_torch_export.cpp"}});
  std::set<std::string> params;
  for (const auto& [name, p] : model.named_parameters()) params.insert(name);
  REQUIRE(ck.optimizer_state.size() == 3 * params.size());
  for (const auto& [name, a] : ck.optimizer_state) {
    INFO(name);
    CHECK(params.count(name.substr(0, name.rfind('.'))) == 1);
  }
  // Its optimizer state has no hyperparameters: the constructor's stay.
  optim::AdamW opt(model.named_parameters(), optim::AdamW::defaults(0.123f));
  opt.load_state_dict(ck.optimizer_state);
  CHECK(opt.lr() == 0.123f);
  CHECK(opt.options().weight_decay() == 0.01f);

  // load_language_model needs the options for it, and then builds the same model.
  REQUIRE_THROWS_WITH(weights::load_language_model(path),
                      Contains("load_language_model: '" + path + "'") && Contains("the file stores no model options"));
  const weights::LoadedLanguageModel loaded = weights::load_language_model(path, o);
  CHECK(loaded.checkpoint.optimizer_state.size() == ck.optimizer_state.size());
  const NamedArrays want = weights::state_dict(model);
  require_params_equal(*loaded.model, want);
}

TEST_CASE("LanguageModelOptions go through JSON and a checkpoint with every field", "[checkpoint][gemm]") {
  TempDir dir("xgrad_ckpt");
  const nn::LanguageModelOptions o = nn::LanguageModelOptions(13, 12, 3, 2)
                                         .d_ff(20)
                                         .max_len(9)
                                         .dropout(0.25f)
                                         .norm(nn::Norm::post)
                                         .activation(nn::Activation::gelu_tanh)
                                         .positional(nn::Positional::sinusoidal)
                                         .norm_eps(1e-3f);
  const std::string text = weights::to_json(o);
  for (const char* part : {"\"vocab_size\":13", "\"d_model\":12", "\"num_heads\":3", "\"num_layers\":2", "\"d_ff\":20",
                           "\"max_len\":9", "\"norm\":\"post\"", "\"activation\":\"gelu_tanh\"",
                           "\"positional\":\"sinusoidal\"", "\"dropout\":0.25", "\"norm_eps\":"}) {
    INFO(text << " holds " << part);
    CHECK(text.find(part) != std::string::npos);
  }
  auto same = [](const nn::LanguageModelOptions& x, const nn::LanguageModelOptions& y) {
    return x.vocab_size() == y.vocab_size() && x.d_model() == y.d_model() && x.num_heads() == y.num_heads() &&
           x.num_layers() == y.num_layers() && x.d_ff() == y.d_ff() && x.max_len() == y.max_len() &&
           x.dropout() == y.dropout() && x.norm() == y.norm() && x.activation() == y.activation() &&
           x.positional() == y.positional() && x.norm_eps() == y.norm_eps();
  };
  CHECK(same(weights::language_model_options_from_json(text, "test"), o));
  CHECK(weights::architecture_differences(o, o).empty());

  Generator gen(5);
  nn::LanguageModel model(o, gen);
  const std::string path = dir.file("lm.safetensors");
  weights::save_checkpoint(path, model);
  CHECK(load_safetensors(path).metadata.at("xgrad.model_options") == text);

  weights::LoadedLanguageModel loaded = weights::load_language_model(path);
  CHECK(same(loaded.model->options(), o));
  REQUIRE(loaded.checkpoint.model_options);
  CHECK(same(*loaded.checkpoint.model_options, o));
  CHECK(loaded.checkpoint.metadata.empty());
  model.eval();
  loaded.model->eval();
  const IndexArray ids{{1, 4, 12, 0}};
  NoGradGuard no_grad;
  CHECK(bit_equal(loaded.model->forward(ids).logits.value(), model.forward(ids).logits.value()));

  // The caller's dropout is a training setting, not a contradiction; the rest come from the file.
  const weights::LoadedLanguageModel no_dropout =
      weights::load_language_model(path, nn::LanguageModelOptions(o).dropout(0.f));
  CHECK(no_dropout.model->options().dropout() == 0.f);
  CHECK(no_dropout.model->options().positional() == nn::Positional::sinusoidal);
}

TEST_CASE("stored options that contradict the caller's are named field by field", "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("lm.safetensors");
  Generator gen(6);
  nn::LanguageModel saved(small_lm(), gen);
  weights::save_checkpoint(path, saved);

  const auto wrong = small_lm().num_heads(4).norm_eps(1e-3f).dropout(0.3f);
  REQUIRE_THROWS_WITH(
      weights::load_language_model(path, wrong),
      Contains("load_language_model: '" + path + "': the stored model options contradict the ones asked for: ") &&
          Contains("num_heads 2 in the file, 4 asked; norm_eps ") && !Contains("dropout"));
  Generator gen_b(7);
  nn::LanguageModel four_heads(small_lm().num_heads(4), gen_b);
  const NamedArrays before = weights::state_dict(four_heads);
  REQUIRE_THROWS_WITH(
      weights::load_checkpoint(path, four_heads),
      Contains("load_checkpoint: '" + path + "'") && Contains("num_heads 2 in the file, 4 in the model"));
  require_params_equal(four_heads, before);
  REQUIRE_THROWS_WITH(
      weights::check_model_options(small_lm(), small_lm().norm(nn::Norm::post).activation(nn::Activation::relu),
                                   "caller"),
      Contains("caller: the stored model options contradict the ones asked for: norm \"pre\" in the file, "
               "\"post\" asked; activation \"gelu\" in the file, \"relu\" asked"));
  REQUIRE_NOTHROW(weights::check_model_options(small_lm(), small_lm().dropout(0.5f), "caller"));
}

TEST_CASE("model options and checkpoint formats that cannot be read are refused naming the field", "[checkpoint]") {
  const std::string good = weights::to_json(small_lm());
  auto edited = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(good);
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return j.dump();
  };
  const nlohmann::json gone = nlohmann::json(nlohmann::json::value_t::discarded);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {edited("num_heads", gone), "who: the model options have no field \"num_heads\""},
      {edited("heads", 2), "who: unknown model option \"heads\""},
      {edited("num_heads", -2), "who: model option num_heads = -2 is not a whole number up to 2^32"},
      {edited("d_model", 2.5), "model option d_model = 2.5 is not a whole number"},
      {edited("num_layers", 1e30), "model option num_layers = 1e+30 is not a whole number"},
      {edited("norm", "sideways"), "model option norm = \"sideways\" is not one of pre, post, sandwich"},
      {edited("activation", 3), "model option activation = 3 is not one of gelu, gelu_tanh, relu"},
      {edited("dropout", "0.1"), "model option dropout = \"0.1\" is not a number"},
      {edited("norm_eps", 1e300), "model option norm_eps = 1e+300 is not a finite float"},
      {"[1, 2]", "who: the model options are not a JSON object"},
      {"{\"vocab_size\": ", "who: the model options text is not JSON"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    REQUIRE_THROWS_WITH(weights::language_model_options_from_json(text, "who"), Contains(message));
  }

  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("lm.safetensors");
  Generator gen(8);
  nn::LanguageModel model(small_lm(), gen);
  weights::save_checkpoint(path, model);
  SafetensorsContents c = load_safetensors(path);
  const std::string tampered = dir.file("tampered.safetensors");

  // Options describing a model far larger than the file: refused before anything is built.
  c.metadata["xgrad.model_options"] = edited("num_layers", 100000);
  save_safetensors(tampered, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(weights::load_language_model(tampered), Contains("load_language_model: '" + tampered + "'") &&
                                                                  Contains("describe a model of ") &&
                                                                  Contains("but the file holds"));
  REQUIRE_THROWS_WITH(weights::load_checkpoint(tampered, model),
                      Contains("num_layers 100000 in the file, 2 in the model"));
  // Options the library refuses.
  c.metadata["xgrad.model_options"] = edited("num_heads", 3);
  save_safetensors(tampered, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(weights::load_language_model(tampered),
                      Contains("load_language_model: '" + tampered + "'") && Contains("num_heads 3"));
  c.metadata["xgrad.model_options"] = "{";
  save_safetensors(tampered, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(weights::load_checkpoint(tampered, model),
                      Contains("load_checkpoint: '" + tampered + "': the model options text is not JSON"));
  // A format this xgrad does not know.
  c.metadata["xgrad.model_options"] = good;
  c.metadata["xgrad.checkpoint"] = "3";
  save_safetensors(tampered, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(
      weights::load_checkpoint(tampered, model),
      Contains("load_checkpoint: '" + tampered + "' has checkpoint format \"3\"; this xgrad reads formats 1 and 2"));
}

TEST_CASE("strict(false) loads the names both have and lists the others, as PyTorch does", "[checkpoint]") {
  Generator g1(31), g2(32);
  nn::LanguageModel m(small_lm(), g1), other(small_lm(), g2);
  const NamedArrays before = weights::state_dict(m);
  NamedArrays state = without(weights::state_dict(other), {"head.bias", "final_norm.weight"});
  state.emplace_back("ghost", Array(1.f));
  state.emplace_back("extra.w", Array{1.f, 2.f});

  REQUIRE_THROWS_WITH(weights::load_state_dict(m, state),
                      Contains("load_state_dict: missing parameter 'final_norm.weight'"));
  require_params_equal(m, before);

  const weights::LoadResult r = weights::load_state_dict(m, state, weights::LoadOptions().strict(false));
  CHECK(r.missing_keys == std::vector<std::string>{"final_norm.weight", "head.bias"});  // the module's order
  CHECK(r.unexpected_keys == std::vector<std::string>{"ghost", "extra.w"});             // the state's order
  const NamedArrays now = weights::state_dict(m), theirs = weights::state_dict(other);
  for (std::size_t i = 0; i < now.size(); ++i) {
    INFO(now[i].first);
    const bool kept = now[i].first == "head.bias" || now[i].first == "final_norm.weight";
    CHECK(bit_equal(now[i].second, kept ? before[i].second : theirs[i].second));
  }
  // A strict load of a full state reports nothing.
  const weights::LoadResult full = weights::load_state_dict(m, weights::state_dict(other));
  CHECK(full.missing_keys.empty());
  CHECK(full.unexpected_keys.empty());

  // Shapes and non-finite weights are refused either way, before anything is written.
  Generator g3(33);
  nn::LanguageModel target(small_lm(), g3);
  const NamedArrays target_before = weights::state_dict(target);
  NamedArrays misshapen = state;
  for (auto& [name, a] : misshapen) {
    if (name == "head.weight") a = filled({8, 11}, 1.f);
  }
  REQUIRE_THROWS_WITH(weights::load_state_dict(target, misshapen, weights::LoadOptions().strict(false)),
                      Contains("parameter 'head.weight' has shape (8, 11) in the state but (11, 8) in the module"));
  NamedArrays nan_state = state;
  nan_state.back().second = Array{1.f, 2.f};
  nan_state.front().second.data()[1] = std::nanf("");
  REQUIRE_THROWS_WITH(weights::load_state_dict(target, nan_state, weights::LoadOptions().strict(false)),
                      Contains("parameter '" + nan_state.front().first + "' holds nan at flat position 1"));
  require_params_equal(target, target_before);

  // Through a file.
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("partial.safetensors");
  save_safetensors(path, without(weights::state_dict(other), {"tok_emb.weight"}));
  REQUIRE_THROWS_WITH(weights::load_checkpoint(path, target), Contains("missing parameter 'tok_emb.weight'"));
  const weights::Checkpoint ck = weights::load_checkpoint(path, target, weights::LoadOptions().strict(false));
  CHECK(ck.missing_keys == std::vector<std::string>{"tok_emb.weight"});
  CHECK(ck.unexpected_keys.empty());
  CHECK(bit_equal(target.head->weight.value(), other.head->weight.value()));
}

TEST_CASE("buffers load back by name, and a missing or misshapen buffer is named as a buffer", "[checkpoint]") {
  Generator g1(41), g2(42);
  WithOptimizerChild a(g1), b(g2);
  a.updates.mutable_value() = Array(-INFINITY);  // buffers may hold any value
  weights::load_state_dict(b, weights::state_dict(a));
  CHECK(b.updates.value()() == -INFINITY);
  REQUIRE_THROWS_WITH(weights::load_state_dict(b, without(weights::state_dict(a), {"updates"})),
                      Contains("load_state_dict: missing buffer 'updates'"));
  NamedArrays misshapen = weights::state_dict(a);
  misshapen[1].second = Array{1.f, 2.f};
  REQUIRE_THROWS_WITH(weights::load_state_dict(b, misshapen),
                      Contains("load_state_dict: buffer 'updates' has shape (2) in the state but () in the module"));
  const weights::LoadResult r =
      weights::load_state_dict(b, without(weights::state_dict(a), {"updates"}), weights::LoadOptions().strict(false));
  CHECK(r.missing_keys == std::vector<std::string>{"updates"});
}

TEST_CASE("save_checkpoint refuses names and metadata that are not UTF-8, naming itself and the bytes",
          "[checkpoint]") {
  TempDir dir("xgrad_ckpt");
  const std::string path = dir.file("m.safetensors");
  Generator gen(51);
  WithOptimizerChild m(gen);
  weights::save_checkpoint(path, m, {}, {{"k", "v"}});
  const std::string good = read_bytes(path);
  const std::vector<std::pair<std::function<void()>, std::string>>
      cases =
          {
              {[&] {
    weights::save_checkpoint(path, m, {{std::string("w") + '\xff', Array(1.f)}});
               },
               "save_checkpoint: optimizer state name \"w\\xFF\" is not valid UTF-8 (byte 0xFF at offset 1)"},
              {[&] {
    weights::save_checkpoint(path, m, {}, {{std::string("k") + '\xc0', "v"}});
               },
               "save_checkpoint: metadata key \"k\\xC0\" is not valid UTF-8 (byte 0xC0 at offset 1)"},
      {[&] {
    weights::save_checkpoint(path, m, {}, {{"note", "\xe2\x82"}});
       },
       "save_checkpoint: metadata value of 'note' \"\\xE2\\x82\" is not valid UTF-8 (byte 0xE2 at offset 0)"},
      {[&] {
    weights::save_checkpoint(path, m, {}, {{"xgrad.model_options", "{}"}});
       },
       "save_checkpoint: metadata key 'xgrad.model_options' is reserved"},
      };
  for (const auto& [save, message] : cases) {
    INFO(message);
    REQUIRE_THROWS_WITH(save(), Contains(message));
    REQUIRE(read_bytes(path) == good);  // the earlier file is intact
  }
}

TEST_CASE(
    "load_language_model sizes the model from the options exactly: a long sinusoidal table loads and a tampered count "
    "is refused before building",
    "[checkpoint][bad_input][bug][gemm]") {
  TempDir dir("xgrad_ckpt");
  // The size the check computes is the state the model saves, for every placement and positional kind.
  for (const nn::Norm norm : {nn::Norm::pre, nn::Norm::post}) {
    for (const nn::Positional pos : {nn::Positional::learned, nn::Positional::sinusoidal}) {
      Generator gen(3);
      nn::LanguageModel m(nn::LanguageModelOptions(7, 6, 2, 3).d_ff(5).max_len(4).norm(norm).positional(pos), gen);
      const std::string path = dir.file("m.safetensors");
      weights::save_checkpoint(path, m);
      REQUIRE(weights::load_language_model(path).model->num_parameters() == m.num_parameters());
    }
  }
  // A sinusoidal table (max_len x d_model) is built, not saved: 65536 positions of a 131k-value
  // model were refused as "a model of about 4.3e6 values, but the file holds 1.3e5".
  {
    Generator gen(4);
    const nn::LanguageModelOptions o =
        nn::LanguageModelOptions(256, 64, 4, 2).positional(nn::Positional::sinusoidal).max_len(65536).dropout(0.f);
    nn::LanguageModel m(o, gen);
    const std::string path = dir.file("long.safetensors");
    weights::save_checkpoint(path, m);
    const weights::LoadedLanguageModel back = weights::load_language_model(path);
    REQUIRE(back.model->options().max_len() == 65536);
    m.eval();
    back.model->eval();
    NoGradGuard no_grad;
    const IndexArray ids{{3, 200, 17}};
    REQUIRE(bit_equal(back.model->forward(ids).logits.value(), m.forward(ids).logits.value()));
  }
  // 150000 blocks of d_model 1 hold few values (6 each) but 16 tensors and ~34 KiB each: they took
  // 56 s and 5 GB before "missing parameter"; now refused by the tensor count, before building.
  Generator gen(5);
  nn::LanguageModel tiny(nn::LanguageModelOptions(2, 1, 1, 1).d_ff(1).max_len(1), gen);
  SafetensorsContents c = weights::checkpoint_contents(tiny);
  nlohmann::json j = nlohmann::json::parse(c.metadata.at("xgrad.model_options"));
  j["num_layers"] = 150000;
  c.metadata["xgrad.model_options"] = j.dump();
  const std::string tampered = dir.file("layers.safetensors");
  save_safetensors(tampered, c.tensors, c.metadata);
  // What 150000 blocks hold, from real models of one and two blocks.
  Generator gen2(5);
  nn::LanguageModel two(nn::LanguageModelOptions(2, 1, 1, 2).d_ff(1).max_len(1), gen2);
  const std::size_t per_block = two.num_parameters() - tiny.num_parameters();
  const std::size_t tensors_per_block = two.named_parameters().size() - tiny.named_parameters().size();
  const std::string want = std::to_string(tiny.num_parameters() + 149999 * per_block) + " values in " +
                           std::to_string(tiny.named_parameters().size() + 149999 * tensors_per_block) +
                           " tensors, but the file holds " + std::to_string(tiny.num_parameters()) + " values in " +
                           std::to_string(tiny.named_parameters().size()) + " tensors";
  // Refused before building: the resident peak rises by far less than the 5 GB the blocks took
  // (AddressSanitizer holds freed memory back, so the bound is checked without it).
  const bool measured = !testing::kAddressSanitizer && testing::reset_peak_rss();
  const long baseline_kib = testing::status_kib("VmRSS");
  REQUIRE_THROWS_WITH(weights::load_language_model(tampered),
                      Contains("load_language_model: '" + tampered + "': its model options (") &&
                          Contains(") describe a model of " + want));
  if (measured) REQUIRE(testing::peak_rise_kib(baseline_kib) < 64 * 1024);
  // A non-positive norm_eps is named with the file (it was LayerNorm's message alone).
  j["num_layers"] = 1;
  for (const double eps : {-1.0, 0.0}) {
    j["norm_eps"] = eps;
    c.metadata["xgrad.model_options"] = j.dump();
    save_safetensors(tampered, c.tensors, c.metadata);
    REQUIRE_THROWS_WITH(weights::load_language_model(tampered),
                        Contains("load_language_model: '" + tampered + "': LanguageModel: norm_eps ") &&
                            Contains(" must be finite and > 0"));
  }
}

TEST_CASE("stored model options with a field twice or values that describe no model are refused by every reader",
          "[checkpoint][bad_input][bug]") {
  const std::string good = weights::to_json(small_lm());
  auto edited = [&](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(good);
    j.erase(key);
    std::string text = j.dump();
    return text.substr(0, text.size() - 1) + ",\"" + key + "\":" + value + "}";
  };
  // A field twice: the JSON reader kept the last ("num_heads" 2, then 4, read as 4).
  const std::string twice = good.substr(0, good.size() - 1) + ",\"num_heads\":4}";
  REQUIRE_THROWS_WITH(weights::language_model_options_from_json(twice, "who"),
                      "who: the model options hold the field \"num_heads\" twice");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {edited("dropout", "5"), "who: MultiHeadAttention: dropout 5 is outside [0, 1)"},
      {edited("dropout", "-0.5"), "who: MultiHeadAttention: dropout -0.5 is outside [0, 1)"},
      {edited("norm_eps", "-1"), "who: LanguageModel: norm_eps -1 must be finite and > 0"},
      {edited("norm_eps", "0"), "who: LanguageModel: norm_eps 0 must be finite and > 0"},
      {edited("vocab_size", "0"), "who: LanguageModel: vocab_size 0, num_layers 2 and max_len 8 must be positive"},
      {edited("d_model", "8.0"), "who: model option d_model = 8.0 is not a whole number up to 2^32"},
      {edited("dropout", "true"), "who: model option dropout = true is not a number"},
      {edited("norm", "null"), "who: model option norm = null is not one of pre, post, sandwich"},
      {edited("max_len", "1e30"), "who: model option max_len = 1e+30 is not a whole number up to 2^32"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    REQUIRE_THROWS_WITH(weights::language_model_options_from_json(text, "who"), message);
  }
  // load_checkpoint, which builds nothing, refuses them too (a stored dropout of 5 came back as options).
  TempDir dir("xgrad_ckpt");
  Generator gen(2);
  nn::Linear plain(2, 2, true, gen);
  SafetensorsContents c = weights::checkpoint_contents(plain);
  c.metadata["xgrad.model_options"] = edited("dropout", "5");
  const std::string path = dir.file("dropout.safetensors");
  save_safetensors(path, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(weights::load_checkpoint(path, plain),
                      "load_checkpoint: '" + path + "': MultiHeadAttention: dropout 5 is outside [0, 1)");
  c.metadata["xgrad.model_options"] = twice;
  save_safetensors(path, c.tensors, c.metadata);
  REQUIRE_THROWS_WITH(weights::load_language_model(path),
                      "load_language_model: '" + path + "': the model options hold the field \"num_heads\" twice");
}
