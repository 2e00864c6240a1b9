// The walkthrough of the article xgrad grew from, in C++: one MultiHeadAttention with d_model
// 512 and 8 heads (dropout 0.1, Pre-Norm with residual) applied to a random (2, 6, 512) input;
// shapes, per-head size, attention entropies, standard deviations, the parameter count, and a
// heatmap of head 0 over a six-token sentence.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "common/files.hpp"
#include "xgrad/inspect/svg.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

double stddev(const Array& a) {  // unbiased, as torch.std
  double mean = 0;
  for (float v : a) mean += v;
  mean /= static_cast<double>(a.size());
  double sq = 0;
  for (float v : a) sq += (v - mean) * (v - mean);
  return std::sqrt(sq / static_cast<double>(a.size() - 1));
}

void walkthrough(std::uint64_t seed, const std::string& out) {
  cli::as_usage([&] { prepare_output_dir(out, "seed_walkthrough: --out"); });
  cli::check_output_files({{"--out's head0.svg", out + "/head0.svg"}});

  const std::size_t B = 2, T = 6, C = 512, H = 8;
  Generator gen(seed);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(C, H).dropout(0.1f).norm(nn::Norm::pre), gen);
  const Tensor x(gen.normal({B, T, C}, 0.f, 1.f));
  const nn::AttentionOutput result = mha.forward(x);  // training mode, as the article: dropout on the weights
  const Array& w = result.weights.value();            // (B, H, T, S), before dropout

  std::printf("=== Multi-Head Attention ===\n");
  std::printf("input shape:             %s\n", shape_str(x.shape()).c_str());
  std::printf("output shape:            %s\n", shape_str(result.output.shape()).c_str());
  std::printf("attention weights shape: %s\n", shape_str(result.weights.shape()).c_str());
  std::printf("size of each head:       %zu\n", C / H);
  for (std::size_t h = 0; h < 3; ++h) {
    // The article's entropy: head h of the first sequence, averaged over queries, then
    // -sum p log(p + 1e-9).
    double entropy = 0;
    for (std::size_t s = 0; s < T; ++s) {
      double p = 0;
      for (std::size_t t = 0; t < T; ++t) p += w(0, h, t, s) / static_cast<double>(T);
      entropy -= p * std::log(p + 1e-9);
    }
    std::printf("head %zu attention entropy: %.2f  (uniform over %zu keys: %.2f)\n", h, entropy, T,
                std::log(static_cast<double>(T)));
  }
  std::printf("\ninput std:  %.4f\n", stddev(x.value()));
  std::printf("output std: %.4f\n", stddev(result.output.value()));

  const std::size_t projections = 4 * C * C;
  std::printf("\nparameters: %zu in all\n", mha.num_parameters());
  std::printf("  Q, K, V projections: %zu heads x 3 x %zu x %zu = %zu = 3 x %zu^2, as one head with d_k = %zu\n", H, C,
              C / H, H * 3 * C * (C / H), C, C);
  std::printf("  output projection:   %zu x %zu = %zu\n", C, C, C * C);
  std::printf("  biases %zu, LayerNorm %zu\n", 4 * C, 2 * C);
  std::printf("  check: %zu + %zu + %zu = %zu\n", projections, 4 * C, 2 * C, projections + 6 * C);

  const std::vector<std::string> tokens = {"我", "昨天", "去", "了", "北京", "出差"};
  xgrad::inspect::Heatmap map;
  map.title = "head 0, sequence 0 (random weights)";
  map.row_labels = map.col_labels = tokens;
  for (std::size_t t = 0; t < T; ++t) {
    map.values.emplace_back();
    for (std::size_t s = 0; s < T; ++s) map.values.back().push_back(w(0, 0, t, s));
  }
  const std::string path = out + "/head0.svg";
  double vmax = 0;
  for (const auto& row : map.values)
    for (double v : row) vmax = std::max(vmax, v);
  xgrad::inspect::write_text_file(path,
                                  xgrad::inspect::heatmap_svg(map, vmax));  // colours scaled to the largest weight
  std::printf("\nheatmap of head 0: %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The seed article's MultiHeadAttention walkthrough, in xgrad.", "seed_walkthrough"};
  std::uint64_t seed = 42;
  std::string out = "seed_walkthrough_out";
  app.add_option("--seed", seed, "seed for weights and input")->transform(cli::seed())->capture_default_str();
  app.add_option("--out", out, "folder for the heatmap")->capture_default_str();
  int threads = 1;
  cli::add_threads(app, threads);
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("seed_walkthrough", [&] {
    xgrad::set_num_threads(threads);
    walkthrough(seed, out);
  });
}
