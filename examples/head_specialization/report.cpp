// Tables, images and the JSON report of the head-specialization example.
#include "report.hpp"

#include <cstdio>
#include <sstream>

#include "xgrad/inspect/svg.hpp"
#include "../common/terminal.hpp"

namespace headspec {

std::string norm_name(xgrad::nn::Norm norm) {
  return norm == xgrad::nn::Norm::pre ? "pre" : norm == xgrad::nn::Norm::post ? "post" : "none";
}

std::string head_table(const ExperimentConfig& c, const ExperimentResult& r) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%5s %4s %8s %8s %6s %6s %8s %9s %11s %12s\n", "layer", "head", "dominant", "argmax",
                "mass", "conf", "entropy", "query ent", "specialized", "ablated drop");
  os << line;
  for (const HeadStats& s : r.heads) {
    // The drop on the head's own offset, if it is one of the task's, else overall.
    double drop = r.accuracy.overall - s.ablated.overall;
    std::string where = "all";
    for (std::size_t k = 0; k < c.task.offsets.size(); ++k) {
      if (c.task.offsets[k] == s.dominant_offset) {
        drop = r.accuracy.per_offset[k] - s.ablated.per_offset[k];
        where = "t-" + std::to_string(s.dominant_offset);
      }
    }
    std::snprintf(line, sizeof line, "%5zu %4zu %8s %8.3f %6.3f %6.3f %8.2f %9.2f %11s %6.3f (%s)\n", s.layer, s.head,
                  ("t-" + std::to_string(s.dominant_offset)).c_str(), s.argmax_fraction, s.dominant_mass, s.confidence,
                  s.entropy, s.query_entropy, s.specialized ? "yes" : "no", drop, where.c_str());
    os << line;
  }
  return os.str();
}

std::string head_grids(const ExperimentResult& r) {
  std::ostringstream os;
  for (const HeadStats& s : r.heads) {
    os << "layer " << s.layer << " head " << s.head << " (dominant offset " << s.dominant_offset
       << "): rows are queries, columns keys\n";
    os << viz::shaded_grid(s.pattern, r.position_labels);
  }
  return os.str();
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "%6s %9s %12s %12s %14s\n", "heads", "accuracy", "specialized", "train time", "offsets owned");
  os << line;
  for (const SweepRow& s : rows) {
    std::snprintf(line, sizeof line, "%6zu %9.3f %12zu %12s %14s\n", s.heads, s.accuracy, s.specialized,
                  viz::duration(s.seconds).c_str(), s.every_offset_owned ? "all" : "not all");
    os << line;
  }
  return os.str();
}

namespace {

xgrad::inspect::Heatmap head_map(const HeadStats& s, const std::vector<std::string>& labels) {
  xgrad::inspect::Heatmap m;
  m.title = "layer " + std::to_string(s.layer) + " head " + std::to_string(s.head) + ": t-" + std::to_string(s.dominant_offset) +
            (s.specialized ? "" : " (not specialized)");
  m.values = s.pattern;
  m.row_labels = labels;
  m.col_labels = labels;
  return m;
}

std::vector<double> steps_axis(std::size_t n) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i + 1);
  return x;
}

}  // namespace

std::vector<std::string> write_images(const std::string& folder, const ExperimentConfig& c, const ExperimentResult& r) {
  std::vector<std::string> written;
  std::vector<xgrad::inspect::Heatmap> maps;
  for (const HeadStats& s : r.heads) {
    maps.push_back(head_map(s, r.position_labels));
    const std::string path = folder + "/head_l" + std::to_string(s.layer) + "_h" + std::to_string(s.head) + ".svg";
    xgrad::inspect::write_text_file(path, xgrad::inspect::heatmap_svg(maps.back()));
    written.push_back(path);
  }
  const std::string overview = folder + "/heads.svg";
  xgrad::inspect::write_text_file(overview, xgrad::inspect::heatmap_grid_svg(maps, c.heads));
  written.push_back(overview);

  xgrad::inspect::LinePlot loss;
  loss.title = "training loss (cross-entropy, mean over offsets)";
  loss.x_label = "step";
  loss.y_label = "loss";
  loss.log_y = true;
  const auto& l = r.training.losses;
  loss.series.push_back({std::to_string(c.heads) + " heads", steps_axis(l.size()), std::vector<double>(l.begin(), l.end())});
  if (!r.single_training.losses.empty() && c.heads != 1) {
    const auto& s = r.single_training.losses;
    loss.series.push_back({"1 head", steps_axis(s.size()), std::vector<double>(s.begin(), s.end())});
  }
  const std::string curve = folder + "/loss.svg";
  xgrad::inspect::write_text_file(curve, xgrad::inspect::line_plot_svg(loss));
  written.push_back(curve);
  return written;
}

std::string write_sweep_plot(const std::string& folder, const std::vector<SweepRow>& rows) {
  xgrad::inspect::LinePlot p;
  p.title = "held-out accuracy and training time against the number of heads";
  p.x_label = "heads (same d_model)";
  p.y_label = "accuracy / training seconds (scaled to the slowest)";
  p.markers = true;
  xgrad::inspect::Series acc{"accuracy", {}, {}}, time{"training time / slowest", {}, {}};
  double slowest = 0;
  for (const SweepRow& s : rows) slowest = std::max(slowest, s.seconds);
  for (const SweepRow& s : rows) {
    acc.x.push_back(static_cast<double>(s.heads));
    acc.y.push_back(s.accuracy);
    time.x.push_back(static_cast<double>(s.heads));
    time.y.push_back(slowest > 0 ? s.seconds / slowest : 0);
  }
  p.series = {acc, time};
  const std::string path = folder + "/sweep_heads.svg";
  xgrad::inspect::write_text_file(path, xgrad::inspect::line_plot_svg(p));
  return path;
}

nlohmann::json config_json(const ExperimentConfig& c) {
  return {{"vocab", c.task.vocab},          {"seq_len", c.task.seq_len},   {"offsets", c.task.offsets},
          {"d_model", c.d_model},           {"heads", c.heads},            {"layers", c.layers},
          {"norm", norm_name(c.norm)},      {"dropout", c.dropout},        {"steps", c.train.steps},
          {"batch", c.train.batch},         {"lr", c.train.lr},            {"weight_decay", c.train.weight_decay},
          {"warmup", c.train.warmup},       {"seed", c.seed},              {"eval_batches", c.eval_batches},
          {"single_head", c.single_head}};
}

namespace {
nlohmann::json per_offset(const ExperimentConfig& c, const Accuracy& a) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t k = 0; k < c.task.offsets.size() && k < a.per_offset.size(); ++k) {
    j[std::to_string(c.task.offsets[k])] = a.per_offset[k];
  }
  return j;
}
}  // namespace

nlohmann::json report_json(const ExperimentConfig& c, const ExperimentResult& r) {
  nlohmann::json heads = nlohmann::json::array();
  for (const HeadStats& s : r.heads) {
    heads.push_back({{"layer", s.layer},
                     {"head", s.head},
                     {"dominant_offset", s.dominant_offset},
                     {"argmax_fraction", s.argmax_fraction},
                     {"offset_mass", s.dominant_mass},
                     {"offset_mass_by_offset", s.offset_mass},
                     {"confidence", s.confidence},
                     {"entropy", s.entropy},
                     {"query_entropy", s.query_entropy},
                     {"specialized", s.specialized},
                     {"ablated_accuracy", s.ablated.overall},
                     {"ablated_accuracy_per_offset", per_offset(c, s.ablated)}});
  }
  nlohmann::json j = {{"accuracy", r.accuracy.overall},
                      {"accuracy_per_offset", per_offset(c, r.accuracy)},
                      {"every_offset_owned", r.every_offset_owned},
                      {"seconds", r.training.seconds},
                      {"config", config_json(c)},
                      {"heads", heads},
                      {"final_loss", r.training.losses.empty() ? 0.f : r.training.losses.back()}};
  if (!r.single_training.losses.empty()) {
    j["single_head_accuracy"] = r.single_accuracy.overall;
    j["single_head_accuracy_per_offset"] = per_offset(c, r.single_accuracy);
    j["single_head_seconds"] = r.single_training.seconds;
  } else {
    j["single_head_accuracy"] = nullptr;
  }
  return j;
}

nlohmann::json sweep_json(const std::vector<SweepRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const SweepRow& s : rows) {
    j.push_back({{"heads", s.heads},
                 {"accuracy", s.accuracy},
                 {"specialized_heads", s.specialized},
                 {"every_offset_owned", s.every_offset_owned},
                 {"seconds", s.seconds}});
  }
  return j;
}

}  // namespace headspec
