// Activation checkpointing: core's checkpoint op (gradients through a recomputed function) and
// LanguageModel's per-block checkpointing, whose gradients are the plain run's bit for bit, with
// dropout masks regenerated in backward.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "error_of.hpp"
#include "module_gradcheck.hpp"
#include "require_gradcheck.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/nn/lora.hpp"
#include "xgrad/nn/transformer.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;
using testing::error_of;

namespace {

// Every parameter's gradient after one backward of the model's loss, by name.
std::vector<std::pair<std::string, Array>> gradients(nn::LanguageModel& model, const IndexArray& ids, float* loss) {
  model.zero_grad();
  nn::seed_dropout(model, 42);
  const Tensor l = model.loss(ids, ids);
  *loss = l.item();
  l.backward();
  std::vector<std::pair<std::string, Array>> out;
  for (const auto& [n, p] : model.named_trainable_parameters()) out.emplace_back(n, p.grad());
  return out;
}

IndexArray ids() { return IndexArray({{1, 5, 7, 2, 9, 3, 0, 4}, {4, 4, 0, 18, 6, 11, 12, 13}}); }

}  // namespace

TEST_CASE("checkpoint: gradients through the recomputed function, to activations and parameters", "[gemm]") {
  const Tensor x = testing::randn({3, 4}, 1), w = testing::randn({4, 5}, 2), b = testing::randn({5}, 3);
  auto fn = [](const std::vector<Tensor>& in) { return tanh(matmul(in[0], in[1]) + in[2]); };
  REQUIRE_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
    return checkpoint(fn, {in[0] * 2.f, in[1], in[2]});
      },
      {x, w, b});
  // Only the inputs and the output stay on the tape: one entry for the whole function.
  const std::size_t before = tape_size();
  const Tensor y = checkpoint(fn, {x * 2.f, w, b});
  CHECK(tape_size() == before + 2);  // x * 2 and the checkpoint
  CHECK(y.value() == fn({x * 2.f, w, b}).value());
}

TEST_CASE("checkpoint: a tensor the function reads that requires grad and is not an input is named in backward",
          "[gemm]") {
  const Tensor x = testing::randn({2, 3}, 1), hidden = testing::randn({3, 3}, 2);
  hidden.node()->name = "hidden_weight";
  const Tensor y = checkpoint([&](const std::vector<Tensor>& in) { return matmul(in[0], hidden); }, {x});
  CHECK_THAT(error_of([&] { sum(y).backward(); }),
             Contains("checkpoint: the function read 'hidden_weight'") && Contains("not among its inputs"));
  // Under NoGradGuard it is the function itself.
  NoGradGuard no_grad;
  CHECK_FALSE(checkpoint([&](const std::vector<Tensor>& in) { return matmul(in[0], hidden); }, {x}).requires_grad());
}

TEST_CASE("checkpointing blocks gives the plain run's loss and gradients bit for bit, dropout included", "[gemm]") {
  for (const std::string arch : {"gpt2", "llama_lora"}) {
    INFO(arch);
    auto options = arch == "gpt2" ? nn::LanguageModelOptions::gpt2_style(19, 16, 4, 3).max_len(16).dropout(0.2f)
                                  : nn::LanguageModelOptions::llama_style(19, 16, 4, 3, 2).max_len(16).dropout(0.2f);
    Generator gen(5);
    nn::LanguageModel model(options, gen);
    if (arch != "gpt2") {
      nn::apply_lora(model, nn::LoraOptions().rank(2).dropout(0.3f).targets({"w_q", "w_v", "linear1"}), gen);
      for (auto& [n, l] : nn::lora_layers(model)) l->lora->B.mutable_value() = gen.normal(l->lora->B.shape(), 0.f, 1.f);
    }
    model.train();
    float plain_loss = 0, recomputed_loss = 0, other_seed_loss = 0;
    const auto plain = gradients(model, ids(), &plain_loss);
    model.set_checkpoint_activations(true);
    CHECK(model.checkpoint_activations());
    const std::size_t before = tape_size();
    {
      nn::seed_dropout(model, 42);
      const Tensor l = model.loss(ids(), ids());
      // The embedding, one entry per block, the final norm, the head and the loss (plus a few small ops).
      CHECK(tape_size() - before < 12);
    }
    const auto recomputed = gradients(model, ids(), &recomputed_loss);
    CHECK(recomputed_loss == plain_loss);
    REQUIRE(recomputed.size() == plain.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      INFO(plain[i].first);
      CHECK(recomputed[i].second == plain[i].second);
    }
    // The masks matter: another seed gives another loss.
    model.zero_grad();
    nn::seed_dropout(model, 43);
    other_seed_loss = model.loss(ids(), ids()).item();
    CHECK(other_seed_loss != plain_loss);
  }
}

TEST_CASE("checkpointing recomputes at the forward's bf16 precision, also when the guard closed before backward",
          "[gemm][bf16]") {
  Generator gen(5);
  nn::LanguageModel model(nn::LanguageModelOptions::llama_style(19, 16, 4, 2, 2).max_len(16).dropout(0.f), gen);
  std::vector<Array> grads[2];
  for (int k = 0; k < 2; ++k) {
    model.set_checkpoint_activations(k == 1);
    model.zero_grad();
    Tensor loss;
    {
      const AutocastGuard bf16(Precision::bf16);
      loss = model.loss(ids(), ids());
    }
    loss.backward();  // outside the guard
    for (const auto& [n, p] : model.named_parameters()) grads[k].push_back(p.grad());
  }
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    const bool same = grads[1][i] == grads[0][i];
    CHECK(same);
  }
}
