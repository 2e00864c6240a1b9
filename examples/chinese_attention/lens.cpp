// The logit-lens table over the sentence.
#include "lens.hpp"

#include <algorithm>
#include <cstdio>

#include "report.hpp"
#include "xgrad/inspect/logit_lens.hpp"

namespace zh {

std::string lens_table(xgrad::nn::LanguageModel& model, const Vocabulary& vocab, const Sentence& words) {
  const xgrad::IndexArray ids = model_input(vocab, words);
  const Batch next = make_batch(vocab, {&words});  // targets: w1 .. wn </s>
  const std::vector<xgrad::inspect::LensLayer> lens = xgrad::inspect::logit_lens(model, ids, next.targets, 1);
  const auto cell = [](const std::string& text, std::size_t width) {
    return text + std::string(width - std::min(width, display_width(text)), ' ');
  };
  constexpr std::size_t kPoint = 21, kCell = 13;
  std::string out = cell("after", kPoint) + cell("loss", 7);
  out += cell("<s>", kCell);
  for (const std::string& w : words) out += cell(w, kCell);
  const auto end_row = [&out] {
    out.erase(out.find_last_not_of(' ') + 1);
    out += "\n";
  };
  end_row();
  for (const auto& layer : lens) {
    char loss[16];
    std::snprintf(loss, sizeof loss, "%.2f", layer.loss);
    out += cell(layer.point, kPoint) + cell(loss, 7);
    for (std::size_t t = 0; t < ids.shape()[1]; ++t) {
      char p[16];
      std::snprintf(p, sizeof p, " %.2f", static_cast<double>(layer.top_prob(0, t, 0)));
      out += cell(vocab.word(layer.top(0, t, 0)) + p, kCell);
    }
    end_row();
  }
  return out;
}

}  // namespace zh
