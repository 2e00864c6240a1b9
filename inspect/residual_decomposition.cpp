// Residual-stream decomposition and direct logit attribution (residual_decomposition.hpp). The
// sums run in double; results are stored as float32.
#include "xgrad/inspect/residual_decomposition.hpp"

#include <cmath>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/layers.hpp"

namespace xgrad::inspect {

namespace {

const Array& need(const ActivationCache& cache, const std::string& point, const char* who) {
  if (!cache.has(point)) {
    fail(who, ": the cache holds no point '", point, "' (cache the forward with inspect::residual_points())");
  }
  return cache.at(point);
}

std::string block(std::size_t l) { return "blocks." + std::to_string(l); }

// The cached final stream, (B, T, C): the last block's output.
const Array& final_stream(const nn::LanguageModel& model, const ActivationCache& cache, const char* who) {
  return need(cache, block(model.blocks.size() - 1) + ".stream_out", who);
}

void check_pre_norm(const nn::LanguageModel& model, const char* who) {
  if (model.options().norm() == nn::Norm::post) {
    fail(who,
         ": a Post-Norm model normalizes its stream after every sublayer, so the stream is not a sum of its "
         "components; decomposition needs a Pre-Norm model (or one without norms)");
  }
  if (model.options().norm() == nn::Norm::sandwich) {
    fail(who,
         ": a sandwich-norm model (Gemma) normalizes each sublayer's output before adding it, so the attention's and "
         "the feed-forward's out points are not what the stream receives; decomposition needs a Pre-Norm model");
  }
}

// `value` (B, T, C), or (T, C) shared by the batch, as (B, T, C) into entry n of `stack`.
void put(Array& stack, std::size_t n, const Array& value, const Shape& btc, const std::string& point) {
  const std::size_t B = btc[0], T = btc[1], C = btc[2], per = B * T * C;
  float* out = stack.data() + n * per;
  if (value.shape() == btc) {
    std::copy(value.data(), value.data() + per, out);
  } else if (value.shape() == Shape{T, C}) {
    for (std::size_t b = 0; b < B; ++b) std::copy(value.data(), value.data() + T * C, out + b * T * C);
  } else {
    fail("decompose_residual: point '", point, "' has shape ", shape_str(value.shape()), ", not ", shape_str(btc),
         " or (T, C)");
  }
}

ResidualStack make_stack(const std::vector<std::string>& labels, const Shape& btc) {
  ResidualStack s;
  s.labels = labels;
  s.stack = Array::from_shape({labels.size(), btc[0], btc[1], btc[2]});
  return s;
}

}  // namespace

PointFilter residual_points() {
  return [](const std::string& name) {
    using nn::point_ends_with;
    return name == "tok_embed" || name == "pos_embed" || name == "normalized" || point_ends_with(name, ".stream_in") ||
           point_ends_with(name, ".stream_mid") || point_ends_with(name, ".stream_out") ||
           point_ends_with(name, ".attn.out") || point_ends_with(name, ".ffn.out") ||
           point_ends_with(name, ".attn.context");
  };
}

ResidualStack accumulated_residual(const nn::LanguageModel& model, const ActivationCache& cache, bool incl_mid) {
  const char* who = "accumulated_residual";
  std::vector<std::string> points;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    points.push_back(block(l) + ".stream_in");
    if (incl_mid) points.push_back(block(l) + ".stream_mid");
  }
  points.push_back(block(model.blocks.size() - 1) + ".stream_out");
  const Shape btc = final_stream(model, cache, who).shape();
  ResidualStack s = make_stack(points, btc);
  for (std::size_t n = 0; n < points.size(); ++n) put(s.stack, n, need(cache, points[n], who), btc, points[n]);
  return s;
}

ResidualStack decompose_residual(const nn::LanguageModel& model, const ActivationCache& cache, bool by_head) {
  const char* who = "decompose_residual";
  check_pre_norm(model, who);
  const Shape btc = final_stream(model, cache, who).shape();
  const std::size_t B = btc[0], T = btc[1], C = btc[2], H = model.options().num_heads();

  std::vector<std::string> labels = {"tok_embed"};
  if (model.pos_emb || model.pos_table) labels.push_back("pos_embed");
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    if (by_head) {
      for (std::size_t h = 0; h < H; ++h) labels.push_back(block(l) + ".attn.head." + std::to_string(h));
      if (model.blocks[l]->attn->w_o->bias.defined()) labels.push_back(block(l) + ".attn.bias");
    } else {
      labels.push_back(block(l) + ".attn");
    }
    labels.push_back(block(l) + ".ffn");
  }
  ResidualStack s = make_stack(labels, btc);
  std::size_t n = 0;
  put(s.stack, n++, need(cache, "tok_embed", who), btc, "tok_embed");
  if (model.pos_emb || model.pos_table) put(s.stack, n++, need(cache, "pos_embed", who), btc, "pos_embed");
  const std::size_t per = B * T * C;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) {
    if (by_head) {
      // head h: z_h W_o[:, hD .. (h+1)D]^T, from the context (B, T, H D) whose channels hD .. are z_h
      const std::size_t D = model.blocks[l]->attn->options().head_dim(), HD = H * D;
      const Array& context = need(cache, block(l) + ".attn.context", who);
      if (context.shape() != Shape{B, T, HD})
        fail(who, ": the context of block ", l, " has shape ", shape_str(context.shape()));
      const nn::Linear& w_o = *model.blocks[l]->attn->w_o;
      const Tensor w_eff = [&] {
        NoGradGuard no_grad;
        return w_o.effective_weight();  // W, or W + s B A with a LoRA adapter
      }();
      const Array& w = w_eff.value();  // (C, H D): out x in
      for (std::size_t h = 0; h < H; ++h, ++n) {
        float* out = s.stack.data() + n * per;
        for (std::size_t r = 0; r < B * T; ++r) {
          const float* z = context.data() + r * HD + h * D;
          for (std::size_t j = 0; j < C; ++j) {
            const float* wj = w.data() + j * HD + h * D;
            double acc = 0;
            for (std::size_t d = 0; d < D; ++d) acc += static_cast<double>(z[d]) * wj[d];
            out[r * C + j] = static_cast<float>(acc);
          }
        }
      }
      if (w_o.bias.defined()) {
        const Array& bias = w_o.bias.value();
        float* out = s.stack.data() + n++ * per;
        for (std::size_t r = 0; r < B * T; ++r) std::copy(bias.data(), bias.data() + C, out + r * C);
      }
    } else {
      put(s.stack, n++, need(cache, block(l) + ".attn.out", who), btc, block(l) + ".attn.out");
    }
    put(s.stack, n++, need(cache, block(l) + ".ffn.out", who), btc, block(l) + ".ffn.out");
  }
  return s;
}

Array apply_final_norm_to_stack(const nn::LanguageModel& model, const ActivationCache& cache, const Array& stack) {
  const char* who = "apply_final_norm_to_stack";
  const Array& x = final_stream(model, cache, who);
  const Shape& btc = x.shape();
  if (stack.dimension() != 4 || stack.shape()[1] != btc[0] || stack.shape()[2] != btc[1] ||
      stack.shape()[3] != btc[2]) {
    fail(who, ": the stack has shape ", shape_str(stack.shape()), ", not (N, ", btc[0], ", ", btc[1], ", ", btc[2],
         ") as the cached stream");
  }
  Array out = stack;
  if (!model.final_norm) return out;
  const bool centered = dynamic_cast<const nn::LayerNorm*>(model.final_norm.get()) != nullptr;
  const std::size_t N = stack.shape()[0], rows = btc[0] * btc[1], C = btc[2];
  const double eps = model.final_norm->eps();
  for (std::size_t r = 0; r < rows; ++r) {
    // the norm's scale s at this position, from the whole stream
    const float* xr = x.data() + r * C;
    double mean = 0, square = 0;
    for (std::size_t c = 0; c < C; ++c) mean += xr[c];
    mean /= static_cast<double>(C);
    for (std::size_t c = 0; c < C; ++c) {
      const double d = centered ? xr[c] - mean : xr[c];
      square += d * d;
    }
    const double s = std::sqrt(square / static_cast<double>(C) + eps);
    for (std::size_t n = 0; n < N; ++n) {
      float* e = out.data() + (n * rows + r) * C;
      double m = 0;
      if (centered) {
        for (std::size_t c = 0; c < C; ++c) m += e[c];
        m /= static_cast<double>(C);
      }
      for (std::size_t c = 0; c < C; ++c) e[c] = static_cast<float>((e[c] - m) / s);
    }
  }
  return out;
}

LogitAttribution direct_logit_attribution(const nn::LanguageModel& model, const ActivationCache& cache,
                                          const ResidualStack& stack, const IndexArray& tokens,
                                          const std::optional<IndexArray>& other) {
  const char* who = "direct_logit_attribution";
  check_pre_norm(model, who);
  if (model.options().final_softcap() > 0.f) {
    fail(who, ": the logits pass final_softcap ", model.options().final_softcap(),
         " (a tanh), so they are not a sum of the stream's components");
  }
  if (stack.labels.size() != (stack.stack.dimension() == 4 ? stack.stack.shape()[0] : 0)) {
    fail(who, ": the stack has ", stack.labels.size(), " labels for an array of shape ", shape_str(stack.stack.shape()),
         " (expected (N, B, T, C) with N labels)");
  }
  const Array scaled = apply_final_norm_to_stack(model, cache, stack.stack);
  const std::size_t N = scaled.shape()[0], B = scaled.shape()[1], T = scaled.shape()[2], C = scaled.shape()[3];
  const std::size_t V = model.options().vocab_size();
  auto check_ids = [&](const IndexArray& ids, const char* what) {
    if (ids.shape() != Shape{B, T}) {
      fail(who, ": ", what, " of shape ", shape_str(ids.shape()), " do not match the stack's (B, T) = (", B, ", ", T,
           ")");
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int64_t id = ids.data()[i];
      if (id < 0 || id >= static_cast<std::int64_t>(V)) {
        fail(who, ": ", what, " id ", id, " at flat position ", i, " is outside the vocabulary [0, ", V, ")");
      }
    }
  };
  check_ids(tokens, "tokens");
  if (other) check_ids(*other, "other tokens");

  const Tensor head_weight = [&] {
    NoGradGuard no_grad;
    return model.head->effective_weight();  // W, or W + s B A with a LoRA adapter on the head
  }();
  const Array& w = head_weight.value();  // (V, C)
  const float* head_bias = model.head->bias.defined() ? model.head->bias.value().data() : nullptr;
  const nn::NormLayer* norm = model.final_norm.get();
  const float* gamma = norm && norm->weight.defined() ? norm->weight.value().data() : nullptr;
  const auto* rms = dynamic_cast<const nn::RMSNorm*>(norm);
  const float offset = rms && rms->unit_offset() ? 1.f : 0.f;  // the scale is 1 + weight
  const float* beta = norm && norm->bias.defined() ? norm->bias.value().data() : nullptr;

  LogitAttribution a;
  a.labels = stack.labels;
  a.labels.push_back("bias");
  a.values = Array::from_shape({N + 1, B, T});
  std::vector<double> direction(C);
  for (std::size_t r = 0; r < B * T; ++r) {
    // the logit's direction in the scaled stream: W_U[v] times the norm's weight (minus other's)
    const auto v = static_cast<std::size_t>(tokens.data()[r]);
    double bias_logit = head_bias ? head_bias[v] : 0.;
    for (std::size_t c = 0; c < C; ++c) {
      direction[c] = static_cast<double>(w.data()[v * C + c]) * (gamma ? gamma[c] + offset : 1.f);
      if (beta) bias_logit += static_cast<double>(beta[c]) * w.data()[v * C + c];
    }
    if (other) {
      const auto u = static_cast<std::size_t>(other->data()[r]);
      if (head_bias) bias_logit -= head_bias[u];
      for (std::size_t c = 0; c < C; ++c) {
        direction[c] -= static_cast<double>(w.data()[u * C + c]) * (gamma ? gamma[c] + offset : 1.f);
        if (beta) bias_logit -= static_cast<double>(beta[c]) * w.data()[u * C + c];
      }
    }
    for (std::size_t n = 0; n < N; ++n) {
      const float* e = scaled.data() + (n * B * T + r) * C;
      double acc = 0;
      for (std::size_t c = 0; c < C; ++c) acc += e[c] * direction[c];
      a.values.data()[n * B * T + r] = static_cast<float>(acc);
    }
    a.values.data()[N * B * T + r] = static_cast<float>(bias_logit);
  }
  return a;
}

}  // namespace xgrad::inspect
