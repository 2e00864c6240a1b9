// Steering vectors (steering.hpp).
#include "xgrad/inspect/steering.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/hook_names.hpp"

namespace xgrad::inspect {

namespace {

void check_vector(const SteeringVector& v, const char* who) {
  if (v.vector.dimension() != 1 || v.vector.size() == 0) {
    fail(who, ": the vector for ", quoted_name(v.point), " must be (C,) with C > 0, got ", shape_str(v.vector.shape()));
  }
  for (std::size_t i = 0; i < v.vector.size(); ++i) {
    if (!std::isfinite(v.vector(i)))
      fail(who, ": the vector for ", quoted_name(v.point), " holds ", v.vector(i), " at ", i);
  }
  if (!std::isfinite(v.scale)) fail(who, ": scale ", v.scale, " is not finite");
}

// The mean over the prompts of the point's value (B, T, C) at the last position or every one.
Array mean_activation(nn::LanguageModel& model, const std::string& point, const std::vector<IndexArray>& prompts,
                      bool last_only, const char* set) {
  const char* who = "mean_difference_vector";
  if (prompts.empty()) fail(who, ": no ", set, " prompts");
  std::vector<double> sum;
  std::size_t count = 0;
  for (const IndexArray& ids : prompts) {
    const ActivationCache cache = cache_activations(
        model, [&] { model.forward(ids); }, points_named({point}));
    const Array& a = cache.at(point);
    if (a.dimension() != 3) fail(who, ": point '", point, "' holds ", shape_str(a.shape()), ", not (B, T, C)");
    const std::size_t B = a.shape()[0], T = a.shape()[1], C = a.shape()[2];
    if (sum.empty()) sum.assign(C, 0.);
    if (C != sum.size())
      fail(who, ": point '", point, "' is ", C, " wide in one prompt and ", sum.size(), " in another");
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t t = last_only ? T - 1 : 0; t < T; ++t, ++count) {
        for (std::size_t c = 0; c < C; ++c) sum[c] += a(b, t, c);
      }
    }
  }
  Array mean = Array::from_shape({sum.size()});
  for (std::size_t c = 0; c < sum.size(); ++c) mean(c) = static_cast<float>(sum[c] / static_cast<double>(count));
  return mean;
}

}  // namespace

SteeringVector mean_difference_vector(nn::LanguageModel& model, const std::string& point,
                                      const std::vector<IndexArray>& positive, const std::vector<IndexArray>& negative,
                                      bool last_position_only) {
  SteeringVector v;
  v.point = resolve_point(model, point, "mean_difference_vector");
  const nn::EvalGuard eval(model);
  const NoGradGuard no_grad;
  const Array plus = mean_activation(model, v.point, positive, last_position_only, "positive");
  const Array minus = mean_activation(model, v.point, negative, last_position_only, "negative");
  v.vector = plus - minus;
  return v;
}

Steering::Steering(nn::Module& root, const SteeringVector& v, std::size_t from_position) {
  check_vector(v, "Steering");
  const std::string point = resolve_point(root, v.point, "Steering");
  const Array added = v.vector * v.scale;
  hook_ = root.add_forward_hook(point, [point, added, from_position](const Tensor& value) {
    const Shape& s = value.shape();
    if (s.empty() || s.back() != added.size()) {
      fail("Steering: point '", point, "' holds ", shape_str(s), ", whose last axis is not the vector's ",
           added.size());
    }
    if (from_position == 0) return value + Tensor(added);
    if (s.size() < 3) fail("Steering: point '", point, "' of shape ", shape_str(s), " has no positions");
    Array shift = xt::zeros<float>({s[1], s.back()});  // (T, C): the vector from from_position on
    for (std::size_t t = from_position; t < s[1]; ++t) {
      for (std::size_t c = 0; c < added.size(); ++c) shift(t, c) = added(c);
    }
    return value + Tensor(std::move(shift));
  });
}

void save_steering_vector(const std::string& path, const SteeringVector& v) {
  check_vector(v, "save_steering_vector");
  if (v.scale != 0 && !std::isnormal(v.scale)) {
    fail("save_steering_vector: scale ", v.scale, " is subnormal, which load_steering_vector refuses");
  }
  std::ostringstream scale;
  scale.precision(9);
  scale << v.scale;
  save_safetensors(path, {{"vector", v.vector}},
                   {{"xgrad.steering.point", v.point}, {"xgrad.steering.scale", scale.str()}});
}

SteeringVector load_steering_vector(const std::string& path) {
  const SafetensorsContents f = load_safetensors(path);
  const auto point = f.metadata.find("xgrad.steering.point");
  const auto scale = f.metadata.find("xgrad.steering.scale");
  if (f.tensors.size() != 1 || f.tensors[0].first != "vector" || point == f.metadata.end() ||
      scale == f.metadata.end()) {
    fail("load_steering_vector: '", path,
         "' is not a steering vector (one tensor \"vector\" and the metadata "
         "xgrad.steering.point and xgrad.steering.scale)");
  }
  SteeringVector v;
  v.point = point->second;
  v.vector = f.tensors[0].second;
  // Read as a float and as a double: a scale that float32 turns into 0, a subnormal or an
  // infinity is refused.
  const std::string& text = scale->second;
  char* end = nullptr;
  v.scale = std::strtof(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') {
    fail("load_steering_vector: '", path, "' has scale ", quoted_name(text), ", not a number");
  }
  if (!std::isfinite(v.scale) || (std::strtod(text.c_str(), nullptr) != 0 && !std::isnormal(v.scale))) {
    fail("load_steering_vector: '", path, "': xgrad.steering.scale ", quoted_name(text),
         " does not fit a float32 (it would be ", v.scale,
         v.scale != 0 && std::isfinite(v.scale) ? ", a subnormal)" : ")");
  }
  check_vector(v, "load_steering_vector");
  return v;
}

}  // namespace xgrad::inspect
