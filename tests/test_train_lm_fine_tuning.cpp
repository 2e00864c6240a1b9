// train_lm's fine-tuning: --freeze, --lora (PEFT adapters written and merged), --grad-accum and
// --checkpoint-activations, in the trainer (exact resume, equal updates, equal losses) and in the
// program (an imported folder tuned through adapters), and what the flags refuse.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <xtensor/xmath.hpp>

#include "fixture.hpp"
#include "run_program.hpp"
#include "test_files.hpp"
#include "trainer.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/evaluate.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/peft.hpp"

using namespace lm;
using namespace xgrad;
using testing::Outcome;
using testing::TempDir;
using xgrad::testing::require_ok;
using xgrad::testing::require_usage_error;

namespace {

TrainConfig small_config() {
  TrainConfig c;
  apply_arch(c, "llama");
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  apply_arch(c, "llama");  // the preset's widths for these sizes
  c.layers = 2;
  c.seq_len = 16;
  c.batch = 8;
  c.steps = 30;
  c.warmup = 4;
  c.lr = 1e-2f;
  c.min_lr = 1e-3f;
  c.eval_interval = 10;
  c.eval_batches = 2;
  c.dropout = 0.f;
  return c;
}

const std::string& corpus_text() {
  static const std::string t = grammar_text(30000, 5);
  return t;
}

Outcome train_lm(const TempDir& dir, std::vector<std::string> args) {
  for (const char* a : {"--seq-len", "16", "--batch", "4", "--text-bytes", "20000", "--dropout", "0", "--warmup", "1",
                        "--eval-batches", "2", "--eval-interval", "10", "--quiet"})
    args.push_back(a);
  return testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", args);
}

double final_loss(const Outcome& o) {
  const std::size_t at = o.out.find("validation loss ");
  REQUIRE(at != std::string::npos);
  return std::stod(o.out.substr(at + 16));
}

}  // namespace

TEST_CASE("train_lm LoRA: a resumed run continues with exactly the losses of an uninterrupted one", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 20;
  c.dropout = 0.1f;
  parse_lora("r=4,alpha=8,dropout=0.1,targets=w_q,w_v,linear2", c);
  CHECK(c.lora_rank == 4);
  CHECK(c.lora_targets == std::vector<std::string>{"w_q", "w_v", "linear2"});
  TempDir dir("xgrad_lora_resume");
  const std::string path = dir.file("ck.safetensors");
  Trainer straight(c, split(corpus_text(), 0.1, c.seq_len));
  straight.run(c.steps);
  Trainer first(c, split(corpus_text(), 0.1, c.seq_len));
  first.run(10);
  first.save(path);
  TrainConfig plain = c;
  plain.lora_rank = 0;
  Trainer other(plain, split(corpus_text(), 0.1, c.seq_len));
  CHECK_THROWS_WITH(other.resume(path), Catch::Contains("--lora"));
  Trainer second(c, split(corpus_text(), 0.1, c.seq_len));
  second.resume(path);
  second.run(c.steps);
  const auto &a = straight.log(), &b = second.log();
  REQUIRE(b.size() == 10);
  for (std::size_t i = 0; i < b.size(); ++i) {
    INFO("step " << b[i].step);
    CHECK(b[i].train_loss == a[10 + i].train_loss);  // bitwise
  }
  const auto pa = straight.model().named_state(), pb = second.model().named_state();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].second.value() == pb[i].second.value());
  // Only the adapters trained, and only they hold optimizer state.
  std::size_t trained = 0;
  for (const auto& [n, p] : straight.model().named_trainable_parameters()) {
    CHECK(n.find(".lora.") != std::string::npos);
    trained += p.size();
  }
  CHECK(straight.optimizer().state_bytes() == 8 * trained);
  CHECK(trained * 10 < straight.model().num_parameters());
  Trainer fresh(c, split(corpus_text(), 0.1, c.seq_len));
  CHECK(fresh.model().parameter("blocks.0.ffn.gate.weight").value() ==
        straight.model().parameter("blocks.0.ffn.gate.weight").value());  // frozen: as drawn
}

TEST_CASE("train_lm --grad-accum: 4 micro-batches take the steps of the whole batch, to rounding", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 10;
  Trainer whole(c, split(corpus_text(), 0.1, c.seq_len));
  whole.run(c.steps);
  c.grad_accum = 4;
  Trainer parts(c, split(corpus_text(), 0.1, c.seq_len));
  parts.run(c.steps);
  for (std::size_t i = 0; i < c.steps; ++i) {
    INFO("step " << i + 1);
    CHECK(parts.log()[i].train_loss == Approx(whole.log()[i].train_loss).epsilon(1e-4));
  }
  const auto pa = whole.model().named_parameters(), pb = parts.model().named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(xt::amax(xt::abs(pa[i].second.value() - pb[i].second.value()))() < 1e-3f);
  }
  c.grad_accum = 3;
  CHECK_THROWS_WITH(validate(c), Catch::Contains("--grad-accum 3 does not divide --batch 8"));
}

TEST_CASE("train_lm --checkpoint-activations: the same losses bit for bit, dropout included", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 6;
  c.dropout = 0.1f;
  float losses[2][6];
  for (int k = 0; k < 2; ++k) {
    Trainer t(c, split(corpus_text(), 0.1, c.seq_len));
    t.set_checkpoint_activations(k == 1);
    t.run(c.steps);
    for (std::size_t i = 0; i < c.steps; ++i) losses[k][i] = t.log()[i].train_loss;
  }
  for (std::size_t i = 0; i < c.steps; ++i) CHECK(losses[0][i] == losses[1][i]);
}

TEST_CASE("train_lm --freeze leaves the parameters it names as drawn and gives them no optimizer state", "[gemm]") {
  TrainConfig c = small_config();
  c.steps = 4;
  c.warmup = 1;
  c.freeze = {"blocks.0.*", "model.embed_tokens.weight"};  // xgrad's and Hugging Face's names
  Trainer t(c, split(corpus_text(), 0.1, c.seq_len));
  TrainConfig plain = small_config();
  Trainer drawn(plain, split(corpus_text(), 0.1, c.seq_len));
  t.run(c.steps);
  std::size_t trained = 0;
  for (const auto& [n, p] : t.model().named_parameters()) {
    INFO(n);
    const bool frozen = n.rfind("blocks.0.", 0) == 0 || n == "tok_emb.weight";
    CHECK((p.value() == drawn.model().parameter(n).value()) == frozen);
    if (!frozen) trained += p.size();
  }
  CHECK(t.optimizer().state_bytes() == 8 * trained);
  c.freeze = {"decoder.*"};
  CHECK_THROWS_WITH(Trainer(c, split(corpus_text(), 0.1, c.seq_len)),
                    Catch::Contains("--freeze: freeze: pattern 'decoder.*' matches no parameter"));
}

TEST_CASE(
    "train_lm --lora tunes an imported folder through adapters PEFT reads, and --merge-lora writes the whole "
    "model",
    "[examples][gemm]") {
  TempDir dir("xgrad_train_lm_lora");
  Generator gen(3);
  nn::LanguageModel model(nn::LanguageModelOptions::llama_style(256, 32, 4, 2, 2).max_len(64), gen);
  weights::save_hf_model(model, dir.file("random"));
  // The base: a random model trained in full for 40 steps (a frozen random head could not learn).
  const std::string init = dir.file("init");
  const Outcome before = train_lm(dir, {"--init-from", dir.file("random"), "--tokenizer", "bytes", "--steps", "40",
                                        "--lr", "1e-2", "--save-hf", init, "--out", dir.file("o0")});
  require_ok(before);
  const std::string ck = dir.file("ck.safetensors");
  const std::vector<std::string> lora = {"--init-from",
                                         init,
                                         "--tokenizer",
                                         "bytes",
                                         "--lora",
                                         "r=8,alpha=16,targets=q_proj,v_proj,o_proj,down_proj",
                                         "--steps",
                                         "60",
                                         "--lr",
                                         "3e-2",
                                         "--grad-accum",
                                         "2",
                                         "--checkpoint-activations"};
  std::vector<std::string> adapter_run = lora;
  adapter_run.insert(adapter_run.end(),
                     {"--checkpoint", ck, "--save-hf", dir.file("adapter"), "--out", dir.file("o1")});
  const Outcome tuned = train_lm(dir, adapter_run);
  require_ok(tuned);
  CHECK_THAT(tuned.out, Catch::Contains("LoRA adapters; optimizer state"));
  CHECK(final_loss(tuned) < final_loss(before) - 0.05);  // 2.751 to 2.635 when written
  const nlohmann::json config = nlohmann::json::parse(testing::read_bytes(dir.file("adapter/adapter_config.json")));
  CHECK(config.at("target_modules") == nlohmann::json({"down_proj", "o_proj", "q_proj", "v_proj"}));
  CHECK(config.at("base_model_name_or_path") == init);

  // The adapter folder on the base model computes what the checkpoint's model computes.
  auto peft = weights::load_hf_model(init);
  weights::load_peft_adapter(*peft, dir.file("adapter"));
  const TrainConfig saved = checkpoint_config(ck);
  const auto run_model = load_run_model(ck, saved);
  const IndexArray ids({{72, 101, 108, 108, 111, 32}});
  Array want;
  {
    NoGradGuard no_grad;
    want = run_model.model->forward(ids).logits.value();
    CHECK(testing::rel_error(peft->forward(ids).logits.value(), want) < 1e-6);
  }
  // --eval-only: the checkpoint's model (adapters included) on a text, as nn::evaluate gives it.
  const std::string text = "the cat sat on the mat, and the dog sat on the log by the door.";
  testing::write_bytes(dir.file("eval.txt"), text);
  const Outcome evaluated = testing::run_program(
      dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm",
      {dir.file("eval.txt"), "--eval-only", "--checkpoint", ck, "--seq-len", "16", "--batch", "2"});
  require_ok(evaluated);
  std::vector<std::int64_t> bytes(text.begin(), text.end());
  const nn::Evaluation e = nn::evaluate(
      *run_model.model, bytes.size(),
      [&](std::size_t at, std::size_t n, std::int64_t* out) { std::copy_n(bytes.begin() + at, n, out); }, {16, 3});
  char want_line[160];
  std::snprintf(want_line, sizeof want_line, "eval: %zu tokens predicted in windows of 16, %.4f nats/token", e.tokens,
                e.nats_per_token());
  CHECK_THAT(evaluated.out, Catch::Contains(want_line));
  CHECK(e.tokens == text.size() - 1);
  require_usage_error(
      testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", {dir.file("eval.txt"), "--eval-only"}),
      {"--eval-only evaluates the model of --checkpoint or of --init-from: give one"});
  require_usage_error(
      testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm", {"--eval-only", "--checkpoint", ck}),
      {"--eval-only reads the text file or --tokens: give one"});

  // --sample reads the adapters from the checkpoint.
  require_ok(testing::run_program(dir, std::string(XGRAD_EXAMPLES_DIR) + "/train_lm",
                                  {"--checkpoint", ck, "--sample", "8", "--temperature", "0"}));

  // --merge-lora: the whole model, whose logits are the adapters' (to rounding).
  std::vector<std::string> merged_run = lora;
  merged_run.insert(merged_run.end(), {"--save-hf", dir.file("merged"), "--merge-lora", "--out", dir.file("o2")});
  require_ok(train_lm(dir, merged_run));
  auto merged = weights::load_hf_model(dir.file("merged"));
  NoGradGuard no_grad;
  CHECK(testing::rel_error(merged->forward(ids).logits.value(), want) < 1e-5);
}

TEST_CASE("train_lm refuses bad --lora, --freeze, --grad-accum and --merge-lora values by name, before any work",
          "[examples][bad_input][gemm]") {
  TempDir dir("xgrad_train_lm_lora_bad");
  auto refused = [&](std::vector<std::string> args, const std::vector<std::string>& says) {
    args.insert(args.end(), {"--out", dir.file("out"), "--steps", "2"});
    require_usage_error(train_lm(dir, args), says);
    CHECK_FALSE(std::filesystem::exists(dir.file("out/log.csv")));
  };
  refused({"--grad-accum", "0"}, {"--grad-accum"});
  refused({"--grad-accum", "3"}, {"--grad-accum 3 does not divide --batch 4"});
  refused({"--lora", "r=0,targets=w_q"}, {"--lora: r 0 must be at least 1"});
  refused({"--lora", "alpha=4,targets=w_q"}, {"--lora: r= is missing"});
  refused({"--lora", "r=4,alpha=nan,targets=w_q"}, {"--lora", "alpha nan"});
  refused({"--lora", "r=4,targets=w_q,alpha=2"}, {"--lora", "targets come last"});
  refused({"--lora", "r=4,size=2,targets=w_q"}, {"--lora: 'size=2' is not one of"});
  refused({"--lora", "r=4"}, {"--lora needs targets="});
  refused({"--lora", "r=4,targets=decoder"}, {"--lora", "LoRA target 'decoder' matches no module"});
  refused({"--lora", "r=4,targets=blocks.0.attn.norm"}, {"LoRA target module 'blocks.0.attn.norm' is not a Linear"});
  refused({"--lora", "r=999,targets=w_q"}, {"LoRA rank 999 is larger than 'blocks.0.attn.w_q'"});
  refused({"--freeze", "decoder.*"}, {"--freeze", "'decoder.*' matches no parameter"});
  refused({"--freeze", "*"}, {"every parameter is frozen"});
  refused({"--freeze", "tok_emb.*", "--lora", "r=2,targets=w_q"}, {"--freeze with --lora"});
  refused({"--merge-lora"}, {"--merge-lora folds --lora's adapters into the model --save-hf writes"});
  refused({"--resume", "--checkpoint", dir.file("ck"), "--lora", "r=2,targets=w_q"},
          {"--lora does not apply to --resume"});
}
