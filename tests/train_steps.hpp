// Three AdamW steps of a small language model, for the tests that compare training runs across
// thread counts and GEMM engines (test_parallel, test_gemm_engines).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"

namespace xgrad::testing {

struct StepResult {
  std::vector<float> losses;
  std::vector<std::pair<std::string, Array>> params;
};

// Three AdamW steps of a model large enough that every kernel splits across two threads
// (B T C = 65536 activations, GEMMs of 2^25 multiply-adds, B H = 64 attention products).
inline StepResult train_steps(int threads) {
  set_num_threads(threads);
  constexpr std::size_t B = 16, T = 32, C = 128, H = 4, F = 512, V = 64;
  Generator init(7), data(8);
  manual_seed(9);
  nn::LanguageModel model(nn::LanguageModelOptions(V, C, H, 2).d_ff(F).max_len(T).dropout(0.1f).norm(nn::Norm::pre),
                          init);
  model.train();
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(1e-3f).weight_decay(0.01f));
  StepResult r;
  for (int step = 0; step < 3; ++step) {
    IndexArray ids = IndexArray::from_shape({B, T}), targets = IndexArray::from_shape({B, T});
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids.data()[i] = static_cast<std::int64_t>(data.below(V));
      targets.data()[i] = static_cast<std::int64_t>(data.below(V));
    }
    const Tensor loss = model.loss(ids, targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item());
  }
  for (const auto& [name, p] : model.named_parameters()) r.params.emplace_back(name, p.value());
  set_num_threads(1);
  return r;
}

}  // namespace xgrad::testing
