// Attention over a sentence and what each head does with it.
#include "head_reading.hpp"

#include <cstdio>

#include <xtensor/xview.hpp>

#include "xgrad/core/autograd/tape.hpp"

namespace zh {

std::vector<xgrad::Array> attention_on(const xgrad::nn::LanguageModel& model, const Vocabulary& vocab,
                                       const Sentence& words) {
  xgrad::NoGradGuard no_grad;
  const xgrad::nn::LanguageModelOutput out = model.forward(model_input(vocab, words));
  std::vector<xgrad::Array> layers;
  for (const xgrad::Tensor& a : out.attentions) {  // (1, H, T, T)
    layers.push_back(xt::view(a.value(), 0, xt::all(), xt::all(), xt::all()));
  }
  return layers;
}

std::vector<std::string> token_labels(const Sentence& words) {
  std::vector<std::string> labels = {"<s>"};
  labels.insert(labels.end(), words.begin(), words.end());
  return labels;
}

std::vector<HeadReading> read_heads(const std::vector<xgrad::Array>& attention) {
  std::vector<HeadReading> readings;
  for (std::size_t l = 0; l < attention.size(); ++l) {
    const xgrad::Array& w = attention[l];
    const std::size_t H = w.shape()[0], T = w.shape()[1];
    for (std::size_t h = 0; h < H; ++h) {
      HeadReading r;
      r.layer = l;
      r.head = h;
      for (std::size_t t = 0; t < T; ++t) {
        std::size_t best = 0;
        for (std::size_t s = 1; s <= t; ++s) {  // keys after t have weight 0
          if (w(h, t, s) > w(h, t, best)) best = s;
        }
        r.strongest_key.push_back(best);
        r.strongest_weight.push_back(w(h, t, best));
        if (t < 2) continue;
        r.previous += w(h, t, t - 1);
        r.first += w(h, t, 0);
        r.self += w(h, t, t);
      }
      const double queries = T > 2 ? static_cast<double>(T - 2) : 1.0;
      r.previous /= queries;
      r.first /= queries;
      r.self /= queries;
      r.pattern = r.previous >= 0.7 ? "previous token"
                  : r.first >= 0.7  ? "first token"
                  : r.self >= 0.7   ? "itself"
                                    : "mixed";
      readings.push_back(r);
    }
  }
  return readings;
}

std::string describe(const HeadReading& r, const std::vector<std::string>& labels) {
  char head[160];
  std::snprintf(head, sizeof head, "previous %.2f  first %.2f  self %.2f  %-14s", r.previous, r.first, r.self,
                r.pattern.c_str());
  std::string text = head;
  for (std::size_t t = 1; t < r.strongest_key.size(); ++t) {
    char weight[16];
    std::snprintf(weight, sizeof weight, " %.2f", r.strongest_weight[t]);
    text += "  " + labels[t] + "→" + labels[r.strongest_key[t]] + weight;
  }
  return text;
}

}  // namespace zh
