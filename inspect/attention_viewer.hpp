// A self-contained HTML attention viewer: one file, no network, no other file. Tokens label both
// axes; the reader picks a layer and a head, and hovering a cell shows the query, the key and
// the weight; a colour legend gives the scale. The page opens on layer L, head H when its address
// ends with "#layer=L&head=H". Below the attention it can show patching and attribution tables
// (SweepResult) as heatmaps on a diverging scale, each with its own legend.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "xgrad/core/arg.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/patching_sweep.hpp"

namespace xgrad::inspect {

/// A table the viewer shows below the attention, under its name.
struct ViewerTable {
  /// The heading, e.g.\ "activation patching, every head".
  std::string name;
  /// A patching_sweep or attribution_patching result (or one built by hand): effect (rows, columns).
  SweepResult result;
};

/// What attention_viewer_html draws besides the attention patterns, with chainable setters:
/// `AttentionViewerOptions().title("run 3").table("patching", sweep).table("attribution", estimate)`.
struct AttentionViewerOptions {
  XGRAD_ARG(std::size_t, batch, 0);                 ///< the sequence of the cache shown
  XGRAD_ARG(std::string, title, "attention");       ///< the page's title and heading (any text)
  XGRAD_ARG(std::vector<ViewerTable>, tables, {});  ///< tables below the attention, in order

 public:
  /// Appends a table: its name is the heading, its effect is drawn with a red (positive) to white
  /// (0) to blue (negative) scale symmetric about 0, its ends at plus and minus the largest |effect|
  /// (1 when every effect is 0).
  AttentionViewerOptions& table(const std::string& name, const SweepResult& result) {
    tables_.push_back({name, result});
    return *this;
  }
};

/// The page for sequence options.batch() of every "*.pattern" point in the cache (one layer each,
/// in the cache's order), with tokens (T labels, any UTF-8) on both axes, a legend of the weights'
/// colours (0 to 1), and options.tables() below: each a heatmap with its own legend, the clean and
/// corrupted metrics, and a cell's row, column, effect (and the fraction restored, when clean and
/// corrupted differ) on hover. Throws, naming the point or table, before building anything when the
/// cache has no pattern, a pattern is not (B, H, T, T) with T = tokens.size() or holds a weight that
/// is not finite, batch >= B, or a table has no cells, an effect whose shape is not (rows, columns)
/// of its labels, or an effect or metric that is not finite.
std::string attention_viewer_html(const ActivationCache& cache, const std::vector<std::string>& tokens,
                                  const AttentionViewerOptions& options);

/// The page with no tables: AttentionViewerOptions().batch(batch).title(title).
std::string attention_viewer_html(const ActivationCache& cache, const std::vector<std::string>& tokens,
                                  std::size_t batch = 0, const std::string& title = "attention");

}  // namespace xgrad::inspect
