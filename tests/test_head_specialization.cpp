// The head-specialization experiment in small: heads must specialize, one per offset, and
// the one-head model of the same width must stay far below; plus the example's command line.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "engine_label.hpp"
#include "experiment.hpp"

using namespace headspec;

namespace {

// Fewer steps and a shorter sequence than the example's defaults, so the test takes seconds.
ExperimentConfig reduced(xgrad::nn::Norm norm, std::uint64_t seed) {
  ExperimentConfig c;
  c.task.seq_len = 12;
  c.task.offsets = {1, 2, 3};
  c.heads = 3;
  c.d_model = 48;
  c.norm = norm;
  c.seed = seed;
  c.train.steps = 400;
  c.train.batch = 32;
  c.eval_batches = 4;
  return c;
}

void require_specialized(const ExperimentResult& r, const ExperimentConfig& c) {
  INFO("accuracy " << r.accuracy.overall << ", single head " << r.single_accuracy.overall);
  REQUIRE(r.accuracy.overall >= 0.99);
  REQUIRE(r.every_offset_owned);
  for (const HeadStats& s : r.heads) {
    INFO("head " << s.head << " dominant " << s.dominant_offset << " argmax fraction " << s.argmax_fraction);
    REQUIRE(s.specialized);
    // Ablating the head that owns an offset must hurt that offset most.
    for (std::size_t k = 0; k < c.task.offsets.size(); ++k) {
      if (c.task.offsets[k] == s.dominant_offset) REQUIRE(s.ablated.per_offset[k] < 0.5);
    }
  }
  // The library's fixed-offset detector finds each offset's head on its own.
  for (std::size_t k = 0; k < c.task.offsets.size(); ++k) {
    std::size_t found = 0;
    for (const HeadStats& s : r.heads) {
      UNSCOPED_INFO("head " << s.head << " detected t-" << s.detected_offset << " score " << s.offset_score);
      found += s.detected_offset == c.task.offsets[k] && s.offset_score > 0.5;  // most of the weight
    }
    INFO("offset " << c.task.offsets[k]);
    REQUIRE(found == 1);
  }
  // Patching: with the token at p corrupted, restoring one head from the clean run restores the
  // prediction of offset o at p + o exactly when the head owns o.
  REQUIRE(r.patching.corrupted == std::vector<double>(c.task.offsets.size(), 0.0));
  REQUIRE(r.each_offset_restored);
  // Attribution patching: the first-order estimate ranks heads and positions as the real sweep does.
  INFO("attribution correlation " << r.attribution.correlation);
  REQUIRE(r.attribution.correlation > 0.9);
  // One head of the same width can follow one offset, not three: chance is 1/16 for the rest.
  REQUIRE(r.single_accuracy.overall < 0.6);
}

int run(const std::string& args) {
  const std::string cmd = std::string(XGRAD_EXAMPLES_DIR) + "/head_specialization " + args + " > /dev/null 2>&1";
  xgrad::testing::note_child_process();  // std::system does not fork
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("Pre-Norm heads specialize, one offset each", "[gemm][long]") {
  const ExperimentConfig c = reduced(xgrad::nn::Norm::pre, 0);
  require_specialized(run_experiment(c), c);
}

TEST_CASE("Post-Norm heads specialize, one offset each", "[gemm][long]") {
  const ExperimentConfig c = reduced(xgrad::nn::Norm::post, 1);
  require_specialized(run_experiment(c), c);
}

TEST_CASE("with bf16 products the heads still specialize, one offset each", "[bf16][gemm][long]") {
  ExperimentConfig c = reduced(xgrad::nn::Norm::pre, 0);
  c.train.precision = xgrad::Precision::bf16;  // training steps and the measurements
  require_specialized(run_experiment(c), c);
}

TEST_CASE("the two entropies tell a sharp offset head from a diffuse one", "[gemm][long]") {
  const ExperimentConfig c = reduced(xgrad::nn::Norm::pre, 2);
  const ExperimentResult r = run_experiment(c);
  for (const HeadStats& s : r.heads) {
    // Each query row is sharp, but the rows point at different keys, so the query-averaged
    // distribution is spread out.
    REQUIRE(s.query_entropy < 0.6);
    REQUIRE(s.entropy > 1.5);
  }
}

TEST_CASE("same seed, same result", "[gemm]") {
  ExperimentConfig c = reduced(xgrad::nn::Norm::pre, 3);
  c.train.steps = 20;
  c.single_head = false;
  const ExperimentResult a = run_experiment(c), b = run_experiment(c);
  REQUIRE(a.training.losses == b.training.losses);
  REQUIRE(a.accuracy.overall == b.accuracy.overall);
}

TEST_CASE("impossible settings are rejected") {
  ExperimentConfig c = reduced(xgrad::nn::Norm::pre, 0);
  c.d_model = 50;
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("MultiHeadAttention: d_model 50 is not divisible by num_heads 3"));
  c = reduced(xgrad::nn::Norm::pre, 0);
  c.task.offsets = {1, 12};
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("offset 12"));
  c = reduced(xgrad::nn::Norm::pre, 0);
  c.train.steps = 0;
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("steps"));
}

TEST_CASE("the example's command line rejects bad input with a non-zero exit", "[gemm]") {
  CHECK(run("--help") == 0);
  CHECK(run("--no-such-flag") != 0);
  CHECK(run("--d-model 50 --heads 4") != 0);
  CHECK(run("--offsets 1,16 --seq-len 16") != 0);
  CHECK(run("--steps 0") != 0);
  CHECK(run("--norm sideways") != 0);
  CHECK(run("--precision fp16") == 2);  // a usage error (the message is checked in test_examples_fail_well)
  CHECK(run("--precision bf16 --steps 2 --eval-batches 1 --quiet --out " +
            (std::filesystem::temp_directory_path() / "xgrad_test_head_specialization_bf16").string()) == 0);
}

TEST_CASE("two runs of the example with the same seed and one thread write identical reports", "[gemm][long]") {
  const auto dir = std::filesystem::temp_directory_path() / "xgrad_test_head_specialization";
  std::filesystem::create_directories(dir);
  nlohmann::json reports[2];
  for (int i = 0; i < 2; ++i) {
    const std::string report = (dir / ("report" + std::to_string(i) + ".json")).string();
    REQUIRE(run("--steps 60 --seed 5 --threads 1 --quiet --out " + (dir / "images").string() + " --report " + report) ==
            0);
    std::ifstream in(report);
    reports[i] = nlohmann::json::parse(in);
    // Wall-clock times are the only fields allowed to differ.
    reports[i].erase("seconds");
    reports[i].erase("single_head_seconds");
  }
  // The viewer page shows the patching sweep and its attribution estimate below the attention.
  std::ifstream page(dir / "images" / "attention.html");
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  CHECK(html.find("activation patching, every head at every position") != std::string::npos);
  CHECK(html.find("attribution patching: the same table to first order") != std::string::npos);
  std::filesystem::remove_all(dir);
  REQUIRE(reports[0].contains("heads"));
  REQUIRE(reports[0] == reports[1]);
}
