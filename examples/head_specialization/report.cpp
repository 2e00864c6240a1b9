// Tables, images and the JSON report of the head-specialization example.
#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "../common/terminal.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/inspect/attention_viewer.hpp"
#include "xgrad/inspect/svg.hpp"

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

namespace {
std::string offset_label(std::size_t offset) { return "t-" + std::to_string(offset); }
}  // namespace

std::string patching_table(const ExperimentConfig& c, const ExperimentResult& r) {
  const PatchingTable& p = r.patching;
  std::ostringstream os;
  char cell[64];
  os << "token at t" << p.position << " corrupted; share of its predictions (offset o, read at t" << p.position
     << " + o) restored by the head patched from the clean run:\n";
  os << "layer head  owns ";
  for (std::size_t o : c.task.offsets) {
    std::snprintf(cell, sizeof cell, "%7s", offset_label(o).c_str());
    os << cell;
  }
  os << "\n";
  const auto row = [&](const std::string& label, const std::vector<double>& values) {
    os << label;
    for (double v : values) {
      std::snprintf(cell, sizeof cell, "%7.3f", v);
      os << cell;
    }
    os << "\n";
  };
  for (std::size_t i = 0; i < r.heads.size(); ++i) {
    const HeadStats& s = r.heads[i];
    std::snprintf(cell, sizeof cell, "%5zu %4zu %5s ", s.layer, s.head,
                  s.specialized ? offset_label(s.dominant_offset).c_str() : "-");
    row(cell, p.restored[i]);
  }
  row("no patch (corrupted) ", p.corrupted);
  row("clean run            ", p.clean);
  return os.str();
}

SweepRow sweep_row(std::size_t heads, const ExperimentResult& r) {
  SweepRow row{heads, r.accuracy.overall, r.training.seconds, 0, r.every_offset_owned};
  row.ablated_worst = row.ablated_worst_offset = 1.0;
  for (const HeadStats& s : r.heads) {
    row.specialized += s.specialized;
    row.ablated_mean += s.ablated.overall / static_cast<double>(r.heads.size());
    row.ablated_worst = std::min(row.ablated_worst, s.ablated.overall);
    for (double a : s.ablated.per_offset) row.ablated_worst_offset = std::min(row.ablated_worst_offset, a);
  }
  return row;
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line, "%6s %9s %12s %12s %14s   %s\n", "heads", "accuracy", "specialized", "train time",
                "offsets owned", "one head ablated: mean  worst  worst offset");
  os << line;
  for (const SweepRow& s : rows) {
    std::snprintf(line, sizeof line, "%6zu %9.3f %12zu %12s %14s   %23.3f %6.3f %13.3f\n", s.heads, s.accuracy,
                  s.specialized, viz::duration(s.seconds).c_str(), s.every_offset_owned ? "all" : "not all",
                  s.ablated_mean, s.ablated_worst, s.ablated_worst_offset);
    os << line;
  }
  return os.str();
}

namespace {

xgrad::inspect::Heatmap head_map(const HeadStats& s, const std::vector<std::string>& labels) {
  xgrad::inspect::Heatmap m;
  m.title = "layer " + std::to_string(s.layer) + " head " + std::to_string(s.head) + ": t-" +
            std::to_string(s.dominant_offset) + (s.specialized ? "" : " (not specialized)");
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

std::vector<std::string> image_names(const ExperimentConfig& c, bool sweep) {
  if (sweep) return {"sweep_heads.svg"};
  std::vector<std::string> names;
  for (std::size_t l = 0; l < c.layers; ++l) {
    for (std::size_t h = 0; h < c.heads; ++h)
      names.push_back("head_l" + std::to_string(l) + "_h" + std::to_string(h) + ".svg");
  }
  for (const char* name : {"heads.svg", "attention.html", "patching.svg", "loss.svg"}) names.push_back(name);
  return names;
}

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

  xgrad::inspect::Heatmap patched;
  patched.title = "restored by patching one head (token at t" + std::to_string(r.patching.position) + " corrupted)";
  patched.values = r.patching.restored;
  for (const HeadStats& s : r.heads)
    patched.row_labels.push_back("L" + std::to_string(s.layer) + "H" + std::to_string(s.head));
  for (std::size_t o : c.task.offsets) patched.col_labels.push_back(offset_label(o));
  patched.row_axis = "patched head";
  patched.col_axis = "prediction";
  const std::string viewer = folder + "/attention.html";
  xgrad::write_file_atomically(
      viewer,
      xgrad::inspect::attention_viewer_html(
          r.first_sequence, r.first_tokens,
          xgrad::inspect::AttentionViewerOptions()
              .title("head specialization: first held-out sequence")
              .table("activation patching, every head at every position (one held-out batch)", r.attribution.sweep)
              .table("attribution patching: the same table to first order", r.attribution.estimate)),
      "head_specialization: the attention viewer");
  written.push_back(viewer);
  const std::string patching = folder + "/patching.svg";
  xgrad::inspect::write_text_file(patching, xgrad::inspect::heatmap_svg(patched));
  written.push_back(patching);

  xgrad::inspect::LinePlot loss;
  loss.title = "training loss (cross-entropy, mean over offsets)";
  loss.x_label = "step";
  loss.y_label = "loss";
  loss.log_y = true;
  const auto& l = r.training.losses;
  loss.series.push_back(
      {std::to_string(c.heads) + " heads", steps_axis(l.size()), std::vector<double>(l.begin(), l.end())});
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
  return {{"vocab", c.task.vocab},
          {"seq_len", c.task.seq_len},
          {"offsets", c.task.offsets},
          {"d_model", c.d_model},
          {"heads", c.heads},
          {"layers", c.layers},
          {"norm", norm_name(c.norm)},
          {"dropout", c.dropout},
          {"steps", c.train.steps},
          {"batch", c.train.batch},
          {"lr", c.train.lr},
          {"weight_decay", c.train.weight_decay},
          {"warmup", c.train.warmup},
          {"seed", c.seed},
          {"eval_batches", c.eval_batches},
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
                     {"detected_offset", s.detected_offset},
                     {"offset_score", s.offset_score},
                     {"ablated_accuracy", s.ablated.overall},
                     {"ablated_accuracy_per_offset", per_offset(c, s.ablated)}});
  }
  nlohmann::json j = {{"accuracy", r.accuracy.overall},
                      {"accuracy_per_offset", per_offset(c, r.accuracy)},
                      {"every_offset_owned", r.every_offset_owned},
                      {"patching",
                       {{"position", r.patching.position},
                        {"restored_by_head", r.patching.restored},
                        {"corrupted", r.patching.corrupted},
                        {"clean", r.patching.clean},
                        {"each_offset_restored_by_its_own_head", r.each_offset_restored},
                        {"attribution_correlation", r.attribution.correlation}}},
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
                 {"ablated_accuracy_mean", s.ablated_mean},
                 {"ablated_accuracy_worst", s.ablated_worst},
                 {"ablated_accuracy_worst_offset", s.ablated_worst_offset},
                 {"seconds", s.seconds}});
  }
  return j;
}

}  // namespace headspec
