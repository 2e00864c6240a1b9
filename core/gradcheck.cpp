// Central finite differences with Richardson extrapolation, against one backward pass.
#include "xgrad/core/gradcheck.hpp"

#include <cmath>
#include <sstream>

#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/core/tape.hpp"

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

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  if (!(opt.eps > 0)) fail("gradcheck: eps must be positive, got ", opt.eps);
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    leaves.push_back(t.defined() ? Tensor(t.value(), t.requires_grad()) : Tensor());
  }

  Tensor out = fn(leaves);
  if (!out.defined()) fail("gradcheck: the function returned an undefined tensor");
  Generator gen(opt.seed);
  const Array r = gen.uniform(out.shape(), -1.f, 1.f);
  bool any = false;
  for (const Tensor& t : leaves) any = any || (t.defined() && t.requires_grad());
  if (!any) fail("gradcheck: no input requires grad");
  if (!out.requires_grad()) fail("gradcheck: the output does not depend on any input that requires grad");
  out.backward(r);

  auto f = [&]() {
    NoGradGuard no_grad;
    Tensor y = fn(leaves);
    if (y.shape() != r.shape()) fail("gradcheck: output shape changed between calls");
    return project(y.value(), r);
  };

  GradcheckResult res;
  const double h = opt.eps;
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    Tensor& x = leaves[k];
    if (!x.defined() || !x.requires_grad()) continue;
    const Array zero = xt::zeros<float>(x.shape());
    const Array& analytic = x.has_grad() ? x.grad() : zero;
    Array& v = x.mutable_value();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float x0 = v.data()[i];
      auto at = [&](double dx) {
        v.data()[i] = static_cast<float>(x0 + dx);
        const double y = f();
        v.data()[i] = x0;
        return y;
      };
      const double fp = at(h), fm = at(-h), fp2 = at(h / 2), fm2 = at(-h / 2);
      // The float32 step actually taken can differ from h; divide by the real one.
      const double hr = static_cast<double>(static_cast<float>(x0 + h)) - x0;
      const double hr2 = static_cast<double>(static_cast<float>(x0 + h / 2)) - x0;
      const double d1 = (fp - fm) / (2 * hr);
      const double d2 = (fp2 - fm2) / (2 * hr2);
      const double numeric = (4 * d2 - d1) / 3;
      if (opt.skip_kinks) {
        const double f0 = at(0);
        const double fwd = (fp - f0) / hr, bwd = (f0 - fm) / hr;
        if (std::abs(fwd - bwd) > opt.kink_threshold * (1 + std::abs(numeric))) {
          ++res.skipped;
          continue;
        }
      }
      const double a = analytic.data()[i];
      const double err = std::abs(a - numeric);
      ++res.checked;
      res.max_abs_error = std::max(res.max_abs_error, err);
      const double tol = opt.atol + opt.rtol * std::abs(numeric);
      if (!(err <= tol) && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os << "gradcheck: input " << k << " element " << index_str(x.shape(), i) << ": analytic " << a
           << ", numeric " << numeric << ", |difference| " << err << " > tolerance " << tol;
        res.report = os.str();
      }
    }
  }
  if (res.ok) {
    std::ostringstream os;
    os << "gradcheck: " << res.checked << " elements agree (max |difference| " << res.max_abs_error << ", "
       << res.skipped << " skipped at kinks)";
    res.report = os.str();
  }
  return res;
}

}  // namespace xgrad
