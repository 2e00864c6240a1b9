// The article_claims example: parameter counts of xgrad's modules against the closed forms, the
// FLOP and activation-memory formulas against numbers worked out by hand (and the memory formula
// against the bytes a forward really keeps), a reduced head-count run (deterministic, and it
// learns), and the program's command line.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "configs.hpp"
#include "heads.hpp"
#include "report.hpp"
#include "run_program.hpp"
#include "sizes.hpp"
#include "test_files.hpp"

using namespace claims;
using xgrad::testing::Outcome;
using xgrad::testing::TempDir;

namespace {

Outcome run(const TempDir& dir, const std::vector<std::string>& args) {
  return xgrad::testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/article_claims", args);
}

// Exit code 2 and a first stderr line that names `option` (and every part of `more`).
void require_usage_error(const Outcome& o, const std::string& option, const std::vector<std::string>& more = {}) {
  INFO(o);
  REQUIRE(o.exited);
  REQUIRE(o.code == 2);
  const std::string first_line = o.err.substr(0, o.err.find('\n'));
  REQUIRE_THAT(first_line, Catch::StartsWith("article_claims"));
  REQUIRE_THAT(first_line, Catch::Contains(option));
  for (const std::string& part : more) REQUIRE_THAT(first_line, Catch::Contains(part));
}

// A run of seconds: 2 relations, 64 training sequences.
HeadsConfig tiny_heads() {
  HeadsConfig c;
  c.d_model = 16;
  c.head_counts = {1, 4};
  c.task = tasks::ShiftTask{8, 8, {1, 2}};
  c.train_size = 64;
  c.val_size = 64;
  c.steps = 120;
  c.batch = 16;
  c.lr = 1e-2f;
  c.seeds = {7};
  return c;
}

}  // namespace

TEST_CASE("parameter counts of xgrad's modules equal the closed forms") {
  for (const BlockSize& s :
       std::vector<BlockSize>{{8, 2, 0}, {16, 4, 24}, {64, 1, 0}, {96, 3, 0}, {256, 4, 0}, {512, 8, 0}}) {
    INFO("d_model " << s.d_model << ", heads " << s.heads << ", d_ff " << s.ffn_width());
    const ModuleCounts c = count_module_params(s);
    CHECK(static_cast<double>(c.attention) == attention_params(s));
    CHECK(c.attention_one_head == c.attention);  // the article's "same parameters as one big head"
    CHECK(static_cast<double>(c.qkv_weights) == qkv_weight_params(s));
    CHECK(c.qkv_weights == 3 * s.d_model * s.d_model);
    CHECK(static_cast<double>(c.block) == block_params(s));
  }
  // Worked out by hand: 4 * 512^2 + 6 * 512, and 12 * 512^2 + 13 * 512.
  CHECK(attention_params({512, 8, 0}) == 1051648.0);
  CHECK(block_params({512, 8, 0}) == 3152384.0);
  CHECK(block_params({8, 2, 32}) == 12 * 64 + 13 * 8);
}

TEST_CASE("FLOP shares of a small block, worked out by hand") {
  // C 8, H 2, F 32, B 1, T 4: projections 8*4*64 = 2048, scores+context 4*16*8 = 512,
  // FFN 4*4*8*32 = 4096, total 6656.
  const BlockFlops f = block_flops({8, 2, 32}, 1, 4);
  CHECK(f.projections == 2048.0);
  CHECK(f.scores_context == 512.0);
  CHECK(f.feed_forward == 4096.0);
  CHECK(f.total() == 6656.0);
  CHECK(f.attention_share() == Approx(2560.0 / 6656.0).epsilon(1e-12));
  CHECK(f.scores_context_share() == Approx(512.0 / 6656.0).epsilon(1e-12));
  // Heads split the head size, not the work; the batch scales every term.
  const BlockFlops one_head = block_flops({8, 1, 32}, 1, 4), batch3 = block_flops({8, 2, 32}, 3, 4);
  CHECK(one_head.total() == f.total());
  CHECK(batch3.total() == 3 * f.total());
  CHECK(batch3.attention_share() == Approx(f.attention_share()));
  // At T = 2C the score and context products cost as much as the projections: 4 T^2 C = 8 T C^2.
  const BlockFlops long_t = block_flops({8, 2, 32}, 1, 16);
  CHECK(long_t.scores_context == long_t.projections);
}

TEST_CASE("activation-memory shares of a small block, worked out by hand") {
  // C 8, H 2, F 32, B 1, T 4 with dropout: weights 9*2*16 = 288 bytes; rest 4*(32*8 + 9*32) = 2176.
  const BlockActivations a = block_activation_bytes({8, 2, 32}, 1, 4, true);
  CHECK(a.attention_weights == 288.0);
  CHECK(a.rest == 2176.0);
  CHECK(a.attention_weight_share() == Approx(288.0 / 2464.0).epsilon(1e-12));
  // Without dropout: P alone, 4*2*16 = 128; rest 4*(256 + 256) = 2048.
  const BlockActivations plain = block_activation_bytes({8, 2, 32}, 1, 4, false);
  CHECK(plain.attention_weights == 128.0);
  CHECK(plain.rest == 2048.0);
  // Unlike the FLOPs, the weights grow with H.
  CHECK(block_activation_bytes({8, 1, 32}, 1, 4, true).attention_weights == 144.0);
  // What grows with H, from two measurements: 4 (1000 - 400) / 3.
  CHECK(measured_attention_weight_bytes(1000, 400, 4) == Approx(800.0));
  CHECK(measured_attention_weight_bytes(1000, 1000, 1) == 0.0);
}

TEST_CASE("the memory formula matches the bytes a block's forward keeps", "[gemm]") {
  if (xgrad::testing::kAddressSanitizer) {
    WARN("not measured: AddressSanitizer's allocator does not report through glibc's mallinfo2");
    return;
  }
  StepOptions o;
  o.batch = 2;
  o.seq_len = 64;
  for (const BlockSize& s : std::vector<BlockSize>{{64, 4, 0}, {64, 1, 0}}) {
    INFO("heads " << s.heads);
    const double measured = measured_activation_bytes(s, o);
    const double formula = block_activation_bytes(s, 2, 64, true).total();
    CHECK(measured == Approx(formula).epsilon(0.02));
  }
}

TEST_CASE("the timed steps of a block and of its one-head twin give medians of real steps", "[gemm]") {
  StepOptions o;
  o.batch = 2;
  o.seq_len = 16;
  o.steps = 3;
  const auto [many, one] = time_block_steps({32, 4, 0}, o);
  CHECK(many.forward_backward_ms > 0);
  CHECK(one.forward_backward_ms > 0);
  CHECK(many.optimizer_ms > 0);
  CHECK(many.forward_backward_ms < 10000);
}

TEST_CASE("a reduced head-count run is deterministic and learns", "[gemm]") {
  const HeadsConfig c = tiny_heads();
  validate(c);
  const std::vector<HeadsRun> a = run_head_sweep(c), b = run_head_sweep(c);
  REQUIRE(a.size() == 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("heads " << a[i].heads);
    CHECK(a[i].losses == b[i].losses);
    CHECK(a[i].train_loss == b[i].train_loss);
    CHECK(a[i].val_accuracy == b[i].val_accuracy);
    CHECK(a[i].head_size == 16 / a[i].heads);
    // Chance is ln 8 = 2.08; the first step starts near it.
    CHECK(a[i].losses.front() > 1.8);
    CHECK(a[i].train_loss < 0.5 * a[i].losses.front());
    CHECK(a[i].epochs == Approx(120.0 * 16 / 64));
  }
  // Same parameters for every head count.
  CHECK(a[0].params == a[1].params);
  const nlohmann::json j = heads_json(a, c);
  CHECK(j["runs"].size() == 2);
  CHECK(j["runs"][1]["heads"] == 4);
  CHECK(j["runs"][1]["gap"].get<double>() == Approx(a[1].val_loss - a[1].train_loss));
}

TEST_CASE("impossible head-count settings are refused, naming the option") {
  HeadsConfig c = tiny_heads();
  c.head_counts = {1, 3};
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("--heads 3 does not divide --d-model 16"));
  c = tiny_heads();
  c.batch = 65;
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("--batch 65"));
  c = tiny_heads();
  c.task.offsets = {1, 2, 3, 4, 5, 6, 7, 8};
  REQUIRE_THROWS_WITH(validate(c), Catch::Contains("--offsets 8 must be less than --seq-len 8"));
}

TEST_CASE("article_claims prints its tables and fails well on bad options", "[gemm]") {
  TempDir dir("xgrad_article_claims");
  const Outcome heads =
      run(dir, {"heads", "--d-model", "16", "--heads",      "1,2",      "--offsets",       "2",  "--vocab",
                "8",     "--seq-len", "8",  "--train-size", "32",       "--val-size",      "32", "--steps",
                "20",    "--batch",   "8",  "--quiet",      "--report", dir.file("r.json")});
  INFO(heads);
  REQUIRE(heads.code == 0);
  CHECK_THAT(heads.out, Catch::Contains("train loss") && Catch::Contains("val acc"));
  CHECK(nlohmann::json::parse(xgrad::testing::read_bytes(dir.file("r.json")))["runs"].size() == 2);

  require_usage_error(run(dir, {}), "configs");  // a subcommand is required
  require_usage_error(run(dir, {"heads", "--heads", "3"}), "--heads", {"--d-model 64"});
  require_usage_error(run(dir, {"heads", "--heads", "0"}), "--heads");
  require_usage_error(run(dir, {"heads", "--steps", "-1"}), "--steps");
  require_usage_error(run(dir, {"heads", "--seeds", "1,-2"}), "--seeds");
  require_usage_error(run(dir, {"heads", "--lr", "nan"}), "--lr");
  require_usage_error(run(dir, {"heads", "--batch", "600"}), "--batch", {"--train-size"});
  require_usage_error(run(dir, {"heads", "--offsets", "16"}), "--offsets", {"--seq-len 16"});
  require_usage_error(run(dir, {"heads", "--report", dir.file("missing/r.json")}), "--report");
  require_usage_error(run(dir, {"configs", "--share-lengths", "128,0"}), "--share-lengths");
  require_usage_error(run(dir, {"configs", "--dropout", "1"}), "--dropout");
  require_usage_error(run(dir, {"configs", "--threads", "0"}), "--threads");
  require_usage_error(run(dir, {"configs", "--seq-len", "65536", "--batch", "4096"}), "--batch 4096", {"memory"});
  require_usage_error(run(dir, {"configs", "--share-lengths", "65536"}), "--share-lengths 65536", {"memory"});
}
