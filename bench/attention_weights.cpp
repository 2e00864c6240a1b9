// Would a flag to skip returning the attention weights make inference faster? Every path forms
// the weights (attend reads them); returning them only keeps them alive until the caller drops
// the output. This times LanguageModel::forward (which returns every block's weights) against
// the same blocks run by hand, dropping each block's weights as soon as it is done, in eval mode
// without recording. The two alternate; the table quotes medians.
//     build/bench/bench_attention_weights [--reps 21] [--threads 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

int main(int argc, char** argv) {
  std::size_t reps = 21, threads = 1;
  CLI::App app{"LanguageModel::forward keeping the attention weights against dropping them", "bench_attention_weights"};
  app.add_option("--reps", reps, "runs of each")->transform(cli::count(1, 10000))->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")->transform(cli::count(1, 256))->capture_default_str();
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_attention_weights", [&] {
    set_num_threads(threads);
    std::printf("%-24s %10s %10s %8s\n", "B x T (d_model 128, 4 heads, 2 layers)", "keep ms", "drop ms", "ratio");
    for (std::size_t T : {64, 256, 512}) {
      Generator gen(0);
      nn::LanguageModel lm(nn::LanguageModelOptions(256, 128, 4, 2).max_len(T).dropout(0.f), gen);
      lm.eval();
      NoGradGuard no_grad;
      const std::size_t B = 8;
      IndexArray ids = IndexArray::from_shape({B, T});
      for (std::size_t i = 0; i < ids.size(); ++i) ids.data()[i] = static_cast<std::int64_t>((i * 37) % 256);
      std::vector<double> keep, drop, ratio;
      for (std::size_t r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        { const nn::LanguageModelOutput out = lm.forward(ids); }
        const auto t1 = std::chrono::steady_clock::now();
        {
          Tensor h = lm.tok_emb->forward(ids) + lm.pos_emb->forward(T);
          nn::AttentionMask causal;
          causal.causal = true;
          for (const auto& block : lm.blocks) h = block->forward(h, causal).output;
          const Tensor logits = lm.head->forward(lm.final_norm->forward(h));
        }
        const auto t2 = std::chrono::steady_clock::now();
        keep.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        drop.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        ratio.push_back(keep.back() / drop.back());
      }
      for (auto* v : {&keep, &drop, &ratio}) std::sort(v->begin(), v->end());
      std::printf("%zu x %-22zu %10.2f %10.2f %8.3f\n", B, T, keep[reps / 2], drop[reps / 2], ratio[reps / 2]);
    }
  });
}
