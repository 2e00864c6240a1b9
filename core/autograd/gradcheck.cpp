// Central finite differences with Richardson extrapolation, against one backward pass.
#include "xgrad/core/autograd/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

namespace xgrad {

namespace {

// <out, r> accumulated in double, so the projection adds no float32 noise of its own.
double project(const Array& out, const Array& r) {
  double acc = 0;
  for (std::size_t i = 0; i < out.size(); ++i) acc += static_cast<double>(out.data()[i]) * r.data()[i];
  return acc;
}

std::string index_str(const Shape& shape, std::size_t flat) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return shape_str(idx);
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& opt) {
  return gradcheck(fn, inputs, NamedTensors{}, opt);
}

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const NamedTensors& params,
                          const GradcheckOptions& opt) {
  // Products of bf16-rounded operands are flat between roundings: finite differences would see 0.
  if (autocast_precision() != Precision::fp32) {
    fail("gradcheck: an AutocastGuard(Precision::", precision_name(autocast_precision()),
         ") is open on this thread, so the products round their operands and finite differences cannot check "
         "gradients; check in fp32 (close the guard, or open AutocastGuard(Precision::fp32) around gradcheck)");
  }
  if (!(opt.eps > 0) || !std::isfinite(opt.eps))
    fail("gradcheck: GradcheckOptions::eps must be finite and > 0, got ", opt.eps);
  const std::pair<const char*, double> at_least_zero[] = {
      {"atol", opt.atol}, {"rtol", opt.rtol}, {"kink_threshold", opt.kink_threshold}};
  for (const auto& [name, v] : at_least_zero) {
    if (!(v >= 0) || !std::isfinite(v))
      fail("gradcheck: GradcheckOptions::", name, " must be finite and >= 0, got ", v);
  }
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    leaves.push_back(t.defined() ? Tensor(t.value(), t.requires_grad()) : Tensor());
  }
  // The parameters' own gradients are set aside and put back at the end.
  struct Saved {
    Tensor t;
    bool had;
    Array grad;
  };
  std::vector<Saved> saved;
  for (const auto& [name, p] : params) {
    if (!p.defined()) fail("gradcheck: parameter '", name, "' is undefined");
    saved.push_back({p, p.has_grad(), p.has_grad() ? p.grad() : Array()});
    Tensor(p).zero_grad();
  }
  struct Restore {
    std::vector<Saved>& saved;
    ~Restore() {
      for (Saved& s : saved) {
        Node& n = *s.t.node();
        n.grad = s.had ? std::move(s.grad) : Array();
        n.has_grad = s.had;
      }
    }
  } restore{saved};

  GradcheckResult res;
  auto failure = [&res](const std::string& why) {
    if (res.ok) res.report = why;
    res.ok = false;
  };

  Tensor out = fn(leaves);
  if (!out.defined()) fail("gradcheck: the function returned an undefined tensor");
  bool any = false;
  for (const Tensor& t : leaves) any = any || (t.defined() && t.requires_grad());
  for (const auto& [name, p] : params) any = any || p.requires_grad();
  if (!any) fail("gradcheck: no input requires grad (and no parameter)");
  if (!out.requires_grad()) fail("gradcheck: the output does not depend on any input that requires grad");
  if (first_non_finite(out.value()) < out.size()) failure("gradcheck: the output is not finite");
  Generator gen(opt.seed);
  const Array r = gen.uniform(out.shape(), -1.f, 1.f);
  out.backward(r);

  struct Target {
    std::string name;
    Tensor t;
    Array analytic;
  };
  std::vector<Target> targets;
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    const Tensor& t = leaves[k];
    if (!t.defined() || !t.requires_grad()) continue;
    targets.push_back({"input " + std::to_string(k), t, t.has_grad() ? t.grad() : Array(xt::zeros<float>(t.shape()))});
  }
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    targets.push_back({"parameter '" + name + "'", p, p.has_grad() ? p.grad() : Array(xt::zeros<float>(p.shape()))});
  }
  for (const Target& tg : targets) {
    if (first_non_finite(tg.analytic) < tg.analytic.size())
      failure("gradcheck: the gradient of " + tg.name + " is not finite");
  }

  auto f = [&]() {
    NoGradGuard no_grad;
    Tensor y = fn(leaves);
    if (y.shape() != r.shape()) fail("gradcheck: output shape changed between calls");
    return project(y.value(), r);
  };

  const double h = opt.eps;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    Target& tg = targets[k];
    ++res.tensors;
    Array& v = tg.t.mutable_value();
    std::vector<std::size_t> which(v.size());
    for (std::size_t i = 0; i < which.size(); ++i) which[i] = i;
    if (opt.max_elements != 0 && which.size() > opt.max_elements) {
      Generator pick(opt.seed * 1000003 + 17 + k);  // a fixed subset: partial Fisher-Yates
      for (std::size_t i = 0; i < opt.max_elements; ++i) std::swap(which[i], which[i + pick.below(which.size() - i)]);
      which.resize(opt.max_elements);
    }
    for (std::size_t i : which) {
      const float x0 = v.data()[i];
      auto at = [&](double dx) {
        v.data()[i] = static_cast<float>(x0 + dx);
        const double y = f();
        v.data()[i] = x0;
        return y;
      };
      // The float32 steps actually taken can differ from h; divide by the real ones.
      const double hr = static_cast<double>(static_cast<float>(x0 + h)) - x0;
      const double hr2 = static_cast<double>(static_cast<float>(x0 + h / 2)) - x0;
      if (!(hr2 > 0) || !std::isfinite(hr)) {
        fail("gradcheck: eps ", h, " is no float32 step at ", tg.name, " element ", index_str(v.shape(), i), " (value ",
             x0, "): x + eps/2 is ", static_cast<float>(x0 + h / 2), " and x + eps is ", static_cast<float>(x0 + h));
      }
      const double fp = at(h), fm = at(-h), fp2 = at(h / 2), fm2 = at(-h / 2);
      const double d1 = (fp - fm) / (2 * hr);
      const double d2 = (fp2 - fm2) / (2 * hr2);
      const double numeric = (4 * d2 - d1) / 3;
      const double tol = opt.atol + opt.rtol * std::abs(numeric);
      if (opt.skip_kinks) {
        // jump(s) = forward slope - backward slope = (f(x+s) - 2 f(x) + f(x-s)) / s: curvature gives
        // f'' s, so 2 jump(h/2) - jump(h) is O(h^3) where f is smooth, and the slopes' jump at a kink.
        const double f0 = at(0);
        const double jump = std::abs(2 * (fp2 - 2 * f0 + fm2) / hr2 - (fp - 2 * f0 + fm) / hr);
        const double slope = std::max(std::abs(fp - f0), std::abs(f0 - fm)) / hr;
        // That jump vanishes for a kink a third of h from x (and is small past 0.9 h), where the
        // estimate is still off. Where f is smooth, the central differences of steps s follow
        // d(s) = f' + c s^2 + O(s^4); with a third step h/4 the gaps d1 - d2 and d2 - d4 keep that
        // law's ratio (4 for exact halvings) up to O(h^4), while a kink within h of x that the jump
        // misses breaks it by at least 3 times the error it causes: skipped when that break exceeds 3
        // times the tolerance, so what is compared is off by at most the tolerance.
        const double hr4 = static_cast<double>(static_cast<float>(x0 + h / 4)) - x0;
        const double d4 = hr4 > 0 ? (at(h / 4) - at(-h / 4)) / (2 * hr4) : d2;
        const double irregular = std::abs((d1 - d2) - (hr * hr - hr2 * hr2) / (hr2 * hr2 - hr4 * hr4) * (d2 - d4));
        if ((jump > opt.kink_threshold * slope && jump > opt.atol) || (hr4 > 0 && irregular > 3 * tol)) {
          ++res.skipped;
          continue;
        }
      }
      const double a = tg.analytic.data()[i];
      const double err = std::abs(a - numeric);
      ++res.checked;
      res.max_abs_error = std::max(res.max_abs_error, err);
      if (!(err <= tol)) {
        std::ostringstream os;
        os << "gradcheck: " << tg.name << " element " << index_str(v.shape(), i) << ": analytic " << a << ", numeric "
           << numeric << ", |difference| " << err << " > tolerance " << tol;
        failure(os.str());
      }
    }
  }
  if (res.ok) {
    std::ostringstream os;
    os << "gradcheck: " << res.checked << " elements of " << res.tensors << " tensors agree (max |difference| "
       << res.max_abs_error << ", " << res.skipped << " skipped at kinks)";
    res.report = os.str();
  }
  return res;
}

}  // namespace xgrad
