// The closed forms of sizes.hpp.
#include "sizes.hpp"

namespace claims {

double attention_params(const BlockSize& s) {
  const double C = static_cast<double>(s.d_model);
  return 4 * C * C + 4 * C + 2 * C;
}

double qkv_weight_params(const BlockSize& s) {
  return 3.0 * static_cast<double>(s.d_model) * static_cast<double>(s.head_size()) * static_cast<double>(s.heads);
}

double block_params(const BlockSize& s) {
  const double C = static_cast<double>(s.d_model), F = static_cast<double>(s.ffn_width());
  return attention_params(s) + (C * F + F) + (F * C + C) + 2 * C;
}

BlockFlops block_flops(const BlockSize& s, double B, double T) {
  const double C = static_cast<double>(s.d_model), F = static_cast<double>(s.ffn_width());
  BlockFlops f;
  f.projections = 8 * B * T * C * C;
  f.scores_context = 4 * B * T * T * C;
  f.feed_forward = 4 * B * T * C * F;
  return f;
}

BlockActivations block_activation_bytes(const BlockSize& s, double B, double T, bool dropout) {
  const double C = static_cast<double>(s.d_model), F = static_cast<double>(s.ffn_width());
  const double H = static_cast<double>(s.heads);
  BlockActivations a;
  a.attention_weights = (dropout ? 9.0 : 4.0) * B * H * T * T;
  a.rest = B * T * (32 * C + (dropout ? 9.0 : 8.0) * F);
  return a;
}

}  // namespace claims
