// Evaluation only: the summed next-token loss over windows of a long run of tokens.
#include "xgrad/nn/evaluate.hpp"

#include <algorithm>
#include <cmath>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::nn {

double Evaluation::perplexity() const { return std::exp(nats_per_token()); }

double Evaluation::bits_per_byte(double bytes) const {
  if (!(bytes > 0)) fail("Evaluation::bits_per_byte: bytes ", bytes, " must be positive");
  return nats / std::log(2.0) / bytes;
}

Evaluation evaluate(LanguageModel& model, std::size_t num_tokens,
                    const std::function<void(std::size_t, std::size_t, std::int64_t*)>& read,
                    const EvaluateOptions& options) {
  const std::size_t max_len = model.options().max_len();
  const std::size_t L = options.seq_len ? options.seq_len : max_len;
  if (L > max_len) fail("evaluate: seq_len ", L, " is more than the model's max_len ", max_len);
  if (options.batch == 0) fail("evaluate: batch must be at least 1");
  if (num_tokens < 2) fail("evaluate: ", num_tokens, " tokens: at least 2 are needed (one to predict from)");
  const EvalGuard eval(model);
  const NoGradGuard no_grad;
  Evaluation out;
  const std::size_t predicted = num_tokens - 1, windows = (predicted + L - 1) / L;
  // Window w: ids [w L, w L + T), targets [w L + 1, w L + T + 1), T = L but for a shorter last one.
  for (std::size_t w = 0; w < windows;) {
    const std::size_t T = std::min(L, predicted - w * L);
    std::size_t B = 1;
    while (B < options.batch && w + B < windows && predicted - (w + B) * L >= L && T == L) ++B;
    IndexArray ids = IndexArray::from_shape({B, T}), targets = IndexArray::from_shape({B, T});
    std::vector<std::int64_t> row(T + 1);
    for (std::size_t b = 0; b < B; ++b) {
      read((w + b) * L, T + 1, row.data());
      std::copy_n(row.begin(), T, ids.data() + b * T);
      std::copy_n(row.begin() + 1, T, targets.data() + b * T);
    }
    out.nats += static_cast<double>(model.loss(ids, targets).item()) * static_cast<double>(B * T);
    out.tokens += B * T;
    w += B;
  }
  return out;
}

}  // namespace xgrad::nn
