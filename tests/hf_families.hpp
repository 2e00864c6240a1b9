// The Hugging Face family fixtures (tests/fixtures/hf_families/, make_hf_family_fixtures.py) for
// test_hf_families.cpp and test_hf_gemma.cpp: the folders, the mirror's expected values, the
// agreement check, and a copy of a folder to break.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>

#include "fixture.hpp"
#include "test_files.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/weights/hf_import.hpp"

namespace xgrad::testing {

using nlohmann::json;
namespace fs = std::filesystem;

inline constexpr double kLogitTol = 1e-5, kGradTol = 1e-4;  // max |got - want| / max |want|

inline std::string folder(const std::string& name) { return testing::fixture_path("hf_families/" + name); }

inline std::map<std::string, Array> expected(const std::string& name) {
  std::map<std::string, Array> out;
  for (auto& [n, a] : load_safetensors(folder(name) + "/expected.safetensors").tensors) out.emplace(n, a);
  return out;
}

inline IndexArray as_ids(const Array& a) {
  IndexArray out = IndexArray::from_shape(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) out.data()[i] = static_cast<std::int64_t>(a.data()[i]);
  return out;
}

// A copy of a fixture folder to break.
struct BrokenFolder {
  explicit BrokenFolder(const std::string& name) : dir("xgrad_hf_family") {
    for (const auto& e : fs::directory_iterator(folder(name)))
      fs::copy(e.path(), dir.path + "/" + e.path().filename().string());
  }
  void edit(const std::string& field, const json& value) const {
    json j = json::parse(testing::read_bytes(dir.file("config.json")));
    j[field] = value;
    testing::write_bytes(dir.file("config.json"), j.dump(2));
  }
  std::string error() const {
    try {
      weights::load_hf_model(dir.path);
    } catch (const Error& e) {
      return e.what();
    }
    return "(loaded)";
  }
  testing::TempDir dir;
};

// The folder's model against the mirror: logits, loss, and every parameter's gradient after one
// backward (fused tensors split as xgrad holds them).
inline void check_agreement(const std::string& name, nn::LanguageModel& model) {
  std::map<std::string, Array> e = expected(name);
  const IndexArray ids = as_ids(e.at("ids")), targets = as_ids(e.at("targets"));
  {
    NoGradGuard no_grad;
    const double err = testing::rel_error(model.forward(ids).logits.value(), e.at("logits"));
    CAPTURE(err);
    CHECK(err <= kLogitTol);
  }
  model.zero_grad();
  const Tensor loss = model.loss(ids, targets);
  CHECK(loss.value()() == Approx(e.at("loss")()).epsilon(1e-5));
  loss.backward();
  std::size_t compared = 0;
  for (const auto& [pname, p] : model.named_parameters()) {
    const auto want = e.find("grad." + pname);
    INFO(pname);
    REQUIRE(want != e.end());
    REQUIRE(p.grad().shape() == want->second.shape());
    const double largest = xt::amax(xt::abs(want->second))();
    if (largest < 1e-10) {
      // Zero in exact arithmetic (GPT-2's key bias: the softmax ignores a shift common to a row of
      // scores): float32 rounding is all either side holds.
      CHECK(double(xt::amax(xt::abs(p.grad()))()) <= 1e-5);
    } else {
      const double err = testing::rel_error(p.grad(), want->second);
      CAPTURE(err);
      CHECK(err <= kGradTol);
    }
    ++compared;
  }
  std::size_t grads = 0;
  for (const auto& [n, a] : e) grads += n.rfind("grad.", 0) == 0;
  CHECK(compared == grads);
}

}  // namespace xgrad::testing
