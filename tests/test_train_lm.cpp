// The language-model example in small: validation loss falls well below the text's unigram
// entropy, and a run resumed from a checkpoint continues with exactly the same losses.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "trainer.hpp"
#include "xgrad/core/io/safetensors.hpp"

using namespace lm;

namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.layers = 1;
  c.d_model = 64;
  c.heads = 4;
  c.seq_len = 32;
  c.batch = 8;
  c.steps = 500;
  c.warmup = 40;
  c.lr = 5e-3f;
  c.min_lr = 5e-4f;
  c.eval_interval = 100;
  c.eval_batches = 4;
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("xgrad_test_train_lm_" + name)).string();
}

}  // namespace

TEST_CASE("the byte-level model learns the built-in text well below its unigram entropy") {
  const std::string text = grammar_text(60000, 7);
  const double unigram = unigram_entropy(text);
  REQUIRE(unigram > 2.5);  // the bar is meaningful: about 20 distinct letters in use
  Trainer trainer(small_config(), split(text, 0.1, 32));
  const float before = trainer.validation_loss();
  CHECK(before > 0.9 * std::log(256.0));  // an untrained model is near uniform over bytes
  trainer.run(trainer.config().steps);
  const float after = trainer.validation_loss();
  INFO("validation loss " << after << ", unigram entropy " << unigram);
  REQUIRE(after < 0.5 * unigram);
}

TEST_CASE("a resumed run continues with exactly the losses of an uninterrupted one") {
  TrainConfig c = small_config();
  c.steps = 40;
  c.warmup = 10;
  c.eval_interval = 10;
  c.dropout = 0.1f;  // the dropout generator's state must be restored too
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("resume.safetensors");

  Trainer straight(c, split(text, 0.1, c.seq_len));
  straight.run(c.steps);

  Trainer first(c, split(text, 0.1, c.seq_len));
  first.run(20);
  first.save(path);
  Trainer second(c, split(text, 0.1, c.seq_len));
  second.resume(path);
  REQUIRE(second.step() == 20);
  second.run(c.steps);
  std::filesystem::remove(path);

  const auto& a = straight.log();
  const auto& b = second.log();
  REQUIRE(a.size() == 40);
  REQUIRE(b.size() == 20);
  for (std::size_t i = 0; i < b.size(); ++i) {
    INFO("step " << b[i].step);
    REQUIRE(b[i].step == a[20 + i].step);
    REQUIRE(b[i].train_loss == a[20 + i].train_loss);  // bitwise
    REQUIRE(b[i].valid_loss == a[20 + i].valid_loss);
  }
  const auto pa = straight.model().named_parameters(), pb = second.model().named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i].second.value() == pb[i].second.value());
}

TEST_CASE("resume refuses a checkpoint with other settings and a file that is not one") {
  TrainConfig c = small_config();
  c.steps = 5;
  c.warmup = 1;
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("settings.safetensors");
  Trainer a(c, split(text, 0.1, c.seq_len));
  a.run(2);
  a.save(path);
  TrainConfig other = c;
  other.d_model = 32;
  Trainer b(other, split(text, 0.1, c.seq_len));
  REQUIRE_THROWS_WITH(b.resume(path), Catch::Contains("different settings"));
  REQUIRE(b.step() == 0);
  xgrad::save_safetensors(path, {{"w", xgrad::Array({1.f})}});
  REQUIRE_THROWS_WITH(a.resume(path), Catch::Contains("not a train_lm checkpoint"));
  std::filesystem::remove(path);
}

TEST_CASE("a resumed run may extend --steps: the schedule it started with goes on at min_lr") {
  TrainConfig c = small_config();
  c.steps = 12;
  c.warmup = 2;
  c.eval_interval = 0;
  const std::string text = grammar_text(30000, 3);
  const std::string path = temp_path("extend.safetensors");
  Trainer first(c, split(text, 0.1, c.seq_len), identify("grammar", text));
  first.run(c.steps);
  first.save(path);

  TrainConfig longer = c;
  longer.steps = 20;
  Trainer second(longer, split(text, 0.1, c.seq_len), identify("grammar", text));
  second.resume(path);
  REQUIRE(second.step() == 12);
  second.run(longer.steps);
  REQUIRE(second.log().size() == 8);
  for (const LogEntry& e : second.log()) REQUIRE(e.lr == c.min_lr);
  REQUIRE(second.log().back().valid_loss.has_value());  // the last step validates

  // Other data is refused, naming both.
  const std::string other = grammar_text(30000, 4);
  Trainer third(longer, split(other, 0.1, c.seq_len), identify("other", other));
  REQUIRE_THROWS_WITH(third.resume(path),
                      Catch::Contains("other data") && Catch::Contains("'grammar'") && Catch::Contains("'other'"));
  REQUIRE(third.step() == 0);
  std::filesystem::remove(path);
}

TEST_CASE("a NaN loss stops the run before the update, naming the step") {
  TrainConfig c = small_config();
  c.steps = 60;
  c.warmup = 1;
  c.lr = 1e4f;
  c.clip = 0;
  c.eval_interval = 0;
  Trainer trainer(c, split(grammar_text(30000, 3), 0.1, c.seq_len));
  REQUIRE_THROWS_WITH(trainer.run(c.steps), Catch::Contains("train_lm: step ") && Catch::Contains("training stopped"));
  REQUIRE(trainer.step() < c.steps);
  // The weights are those after the last good step: finite.
  for (const auto& [name, p] : trainer.model().named_parameters()) {
    for (float v : p.value()) REQUIRE(std::isfinite(v));
  }
}
