// Patching sweeps and attribution patching (patching_sweep.hpp).
#include "xgrad/inspect/patching_sweep.hpp"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/detail/regions.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/inspect/probe.hpp"
#include "xgrad/inspect/svg.hpp"

namespace xgrad::inspect {

namespace {

// The weights (B, T, V) that pick, at `position`, weight[b] times the entry ids[b], over B.
Tensor picking(const Shape& logits, std::size_t position, const std::vector<std::int64_t>& ids,
               const std::vector<std::int64_t>* minus, const char* who) {
  if (logits.size() != 3) fail(who, ": expects logits (B, T, V), got ", shape_str(logits));
  const std::size_t B = logits[0], T = logits[1], V = logits[2];
  if (position >= T) fail(who, ": position ", position, " is outside a length of ", T);
  auto check = [&](const std::vector<std::int64_t>& v, const char* what) {
    if (v.size() != B) fail(who, ": ", v.size(), " ", what, " for a batch of ", B);
    for (std::int64_t id : v) {
      if (id < 0 || id >= static_cast<std::int64_t>(V)) {
        fail(who, ": ", what, " id ", id, " is outside the vocabulary [0, ", V, ")");
      }
    }
  };
  check(ids, "tokens");
  if (minus) check(*minus, "wrong tokens");
  Array w = xt::zeros<float>(logits);
  const float share = 1.f / static_cast<float>(B);
  for (std::size_t b = 0; b < B; ++b) {
    w(b, position, static_cast<std::size_t>(ids[b])) += share;
    if (minus) w(b, position, static_cast<std::size_t>((*minus)[b])) -= share;
  }
  return Tensor(std::move(w));
}

// A metric's value as a finite number; `during` says which run, for the message.
double finite_scalar(const Tensor& m, const char* who, const std::string& during) {
  if (!m.defined() || m.size() != 1) {
    fail(who, ": the metric must return one number, got ", m.defined() ? shape_str(m.shape()) : "nothing", " on ",
         during);
  }
  const double v = m.item();
  if (!std::isfinite(v)) fail(who, ": the metric is ", v, " on ", during);
  return v;
}

double measure(const Metric& metric, const Tensor& output, const char* who, const std::string& during) {
  return finite_scalar(metric(output), who, during);
}

// One patch of a sweep: a point, and a head and a position of it when split.
struct Cell {
  std::string point;
  detail::Layout layout;
  std::size_t heads = 0;
  detail::Region region;
  std::size_t row = 0, column = 0;
};

// The rows, columns and cells of `spec`, from the clean activations' shapes.
std::vector<Cell> layout_cells(nn::Module& root, const SweepSpec& spec, const std::vector<std::string>& points,
                               const ActivationCache& clean, SweepResult& r, const char* who) {
  std::vector<Cell> cells;
  std::size_t positions = 0;
  for (const std::string& point : points) {
    const detail::Layout layout = detail::layout_of(point);
    const std::size_t heads = spec.by_head ? detail::heads_of(root, point, who) : 0;
    const Shape& shape = clean.at(point).shape();
    const std::size_t axis = detail::position_axis(layout);
    if (spec.by_position) {
      if (shape.size() <= axis) fail(who, ": point '", point, "' of shape ", shape_str(shape), " has no positions");
      if (positions && shape[axis] != positions) {
        fail(who, ": point '", point, "' has ", shape[axis], " positions and an earlier point ", positions);
      }
      positions = shape[axis];
    }
    for (std::size_t h = 0; h < (spec.by_head ? heads : 1); ++h) {
      const std::size_t row = r.rows.size();
      r.rows.push_back(spec.by_head ? point + " head " + std::to_string(h) : point);
      for (std::size_t p = 0; p < (spec.by_position ? positions : 1); ++p) {
        Cell c{point, layout, heads, {}, row, p};
        if (spec.by_head) c.region.head = h;
        if (spec.by_position) c.region.position = p;
        cells.push_back(c);
      }
    }
  }
  if (spec.by_position) {
    for (std::size_t p = 0; p < positions; ++p) r.columns.push_back(std::to_string(p));
  } else {
    r.columns.push_back("all");
  }
  r.effect = xt::zeros<float>({r.rows.size(), r.columns.size()});
  return cells;
}

// The resolved points of `spec`, and the clean run's cache of them, after the checks every sweep
// makes; `clean` and `corrupted` get the metric's values.
struct Prepared {
  std::vector<std::string> points;
  ActivationCache cache;
};

Prepared prepare(nn::Module& root, const std::function<Tensor()>& clean_run, const Metric& metric,
                 const SweepSpec& spec, SweepResult& r, const char* who) {
  if (spec.points.empty()) fail(who, ": no points to patch");
  if (!clean_run || !metric) fail(who, ": no ", !clean_run ? "run" : "metric", " given");
  Prepared p;
  for (const std::string& name : spec.points) p.points.push_back(resolve_point(root, name, who));
  Tensor out;
  p.cache = cache_activations(
      root, [&] { out = clean_run(); }, points_named(p.points));
  r.clean = measure(metric, out, who, "the clean run");
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Keeps the parameters' gradients of `root` and puts them back when it ends.
class KeptGradients {
 public:
  explicit KeptGradients(nn::Module& root) {
    for (auto& [name, p] : root.named_parameters()) {
      kept_.push_back({p, p.has_grad(), p.has_grad() ? p.grad() : Array()});
    }
  }
  ~KeptGradients() {
    for (auto& k : kept_) {
      if (k.had) {
        k.tensor.mutable_grad() = k.grad;
      } else {
        k.tensor.zero_grad();
      }
    }
  }
  KeptGradients(const KeptGradients&) = delete;
  KeptGradients& operator=(const KeptGradients&) = delete;

 private:
  struct Kept {
    Tensor tensor;
    bool had;
    Array grad;
  };
  std::vector<Kept> kept_;
};

class GradMode {
 public:
  explicit GradMode(bool on) : previous_(grad_enabled()) { set_grad_enabled(on); }
  ~GradMode() { set_grad_enabled(previous_); }
  GradMode(const GradMode&) = delete;
  GradMode& operator=(const GradMode&) = delete;

 private:
  bool previous_;
};

}  // namespace

Metric logit_difference(std::size_t position, std::vector<std::int64_t> answer, std::vector<std::int64_t> wrong) {
  return [position, answer = std::move(answer), wrong = std::move(wrong)](const Tensor& logits) {
    return sum(logits * picking(logits.shape(), position, answer, &wrong, "logit_difference"));
  };
}

Metric token_probability(std::size_t position, std::vector<std::int64_t> tokens) {
  return [position, tokens = std::move(tokens)](const Tensor& logits) {
    const Tensor pick = picking(logits.shape(), position, tokens, nullptr, "token_probability");
    return sum(softmax(logits, -1) * pick);
  };
}

Metric negative_loss(IndexArray targets) {
  return [targets = std::move(targets)](const Tensor& logits) { return neg(cross_entropy(logits, targets)); };
}

SweepSpec every_layer_position(const nn::LanguageModel& model) {
  SweepSpec s;
  for (std::size_t l = 0; l < model.blocks.size(); ++l)
    s.points.push_back("blocks." + std::to_string(l) + ".stream_in");
  s.by_position = true;
  return s;
}

SweepSpec every_head(const nn::LanguageModel& model) {
  SweepSpec s;
  for (std::size_t l = 0; l < model.blocks.size(); ++l) s.points.push_back("blocks." + std::to_string(l) + ".attn.z");
  s.by_head = true;
  return s;
}

SweepSpec every_head_position(const nn::LanguageModel& model) {
  SweepSpec s = every_head(model);
  s.by_position = true;
  return s;
}

Array SweepResult::restored() const {
  Array out = effect;
  const double range = clean - corrupted;
  for (float& v : out) v = range != 0 ? static_cast<float>(v / range) : 0.f;
  return out;
}

SweepResult patching_sweep(nn::Module& root, const std::function<Tensor()>& clean_run,
                           const std::function<Tensor()>& corrupted_run, const Metric& metric, const SweepSpec& spec) {
  const char* who = "patching_sweep";
  const auto start = std::chrono::steady_clock::now();
  if (!corrupted_run) fail(who, ": no corrupted run given");
  const nn::EvalGuard eval(root);
  const NoGradGuard no_grad;
  SweepResult r;
  const Prepared p = prepare(root, clean_run, metric, spec, r, who);
  const std::vector<Cell> cells = layout_cells(root, spec, p.points, p.cache, r, who);
  // Each patched run holds a mask and a copy of one point besides the model's own activations.
  check_available_memory(2. * static_cast<double>(p.cache.bytes()), who, "the clean activations of the sweep");
  r.corrupted = measure(metric, corrupted_run(), who, "the corrupted run");
  for (const Cell& c : cells) {
    const PatchSet patch(root, p.cache, {{c.point, c.region.head, c.region.position}});
    std::ostringstream during;
    during << "the corrupted run with '" << r.rows[c.row] << "' patched at position " << r.columns[c.column];
    r.effect(c.row, c.column) = static_cast<float>(measure(metric, corrupted_run(), who, during.str()) - r.corrupted);
  }
  r.seconds = seconds_since(start);
  return r;
}

SweepResult attribution_patching(nn::Module& root, const std::function<Tensor()>& clean_run,
                                 const std::function<Tensor()>& corrupted_run, const Metric& metric,
                                 const SweepSpec& spec) {
  const char* who = "attribution_patching";
  const auto start = std::chrono::steady_clock::now();
  if (!corrupted_run) fail(who, ": no corrupted run given");
  const nn::EvalGuard eval(root);
  SweepResult r;
  Prepared p;
  {
    const NoGradGuard no_grad;
    p = prepare(root, clean_run, metric, spec, r, who);
  }
  const std::vector<Cell> cells = layout_cells(root, spec, p.points, p.cache, r, who);
  // The probes hold each point's corrupted activation and gradient.
  check_available_memory(3. * static_cast<double>(p.cache.bytes()), who, "the activations and gradients it reads");
  const KeptGradients kept(root);
  const GradMode grad_on(true);
  const std::set<std::string> wanted(p.points.begin(), p.points.end());
  ProbeSet probes(root, [&wanted](const std::string& name) { return wanted.count(name) != 0; });
  const Tensor m = metric(corrupted_run());
  r.corrupted = finite_scalar(m, who, "the corrupted run");
  m.backward();
  for (const std::string& point : p.points) {
    const Array& clean = p.cache.at(point);
    const Array corrupt = probes.activation(point), grad = probes.gradient(point);
    if (corrupt.shape() != clean.shape()) {
      fail(who, ": point '", point, "' has shape ", shape_str(corrupt.shape()), " in the corrupted run but ",
           shape_str(clean.shape()), " in the clean run");
    }
    for (const Cell& c : cells) {
      if (c.point != point) continue;
      const Mask in = detail::region_mask(point, c.layout, c.heads, {c.region}, clean.shape(), who);
      double estimate = 0;
      for (std::size_t i = 0; i < clean.size(); ++i) {
        if (in.data()[i]) estimate += (static_cast<double>(clean.data()[i]) - corrupt.data()[i]) * grad.data()[i];
      }
      r.effect(c.row, c.column) = static_cast<float>(estimate);
    }
  }
  r.seconds = seconds_since(start);
  return r;
}

double effect_correlation(const SweepResult& a, const SweepResult& b) {
  if (a.rows != b.rows || a.columns != b.columns) {
    fail("effect_correlation: the tables differ in rows or columns (", a.rows.size(), " x ", a.columns.size(), " and ",
         b.rows.size(), " x ", b.columns.size(), ")");
  }
  const std::size_t n = a.effect.size();
  double ma = 0, mb = 0;
  for (std::size_t i = 0; i < n; ++i) ma += a.effect.data()[i], mb += b.effect.data()[i];
  ma /= static_cast<double>(n);
  mb /= static_cast<double>(n);
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double da = a.effect.data()[i] - ma, db = b.effect.data()[i] - mb;
    sab += da * db, saa += da * da, sbb += db * db;
  }
  if (saa == 0 || sbb == 0) fail("effect_correlation: a table whose effects are all equal has no correlation");
  return sab / std::sqrt(saa * sbb);
}

std::string sweep_svg(const SweepResult& result, const std::string& title) {
  Heatmap map;
  map.title = title;
  map.row_labels = result.rows;
  map.col_labels = result.columns;
  map.row_axis = "patched";
  map.col_axis = "position";
  const Array restored = result.restored();
  for (std::size_t i = 0; i < result.rows.size(); ++i) {
    std::vector<double> row;
    for (std::size_t j = 0; j < result.columns.size(); ++j) row.push_back(restored(i, j));
    map.values.push_back(std::move(row));
  }
  return heatmap_svg(map, 1.0);
}

std::string sweep_tsv(const SweepResult& result) {
  std::ostringstream os;
  os << std::setprecision(6) << "patched";
  for (const std::string& c : result.columns) os << '\t' << c;
  os << '\n';
  for (std::size_t i = 0; i < result.rows.size(); ++i) {
    os << result.rows[i];
    for (std::size_t j = 0; j < result.columns.size(); ++j) os << '\t' << result.effect(i, j);
    os << '\n';
  }
  return os.str();
}

}  // namespace xgrad::inspect
