// Terminal grids and SVG heatmaps of the attention over the sentence.
#include "report.hpp"

#include <algorithm>
#include <sstream>

#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/inspect/attention_viewer.hpp"
#include "xgrad/inspect/svg.hpp"

namespace zh {

std::size_t display_width(const std::string& utf8) {
  std::size_t width = 0;
  for (std::size_t i = 0; i < utf8.size();) {
    const auto lead = static_cast<unsigned char>(utf8[i]);
    const std::size_t bytes = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    std::uint32_t code = bytes == 1 ? lead : lead & (0x7F >> bytes);
    for (std::size_t k = 1; k < bytes && i + k < utf8.size(); ++k)
      code = (code << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3F);
    width += code >= 0x2E80 && code <= 0xFFDC ? 2 : 1;  // CJK radicals .. fullwidth forms
    i += bytes;
  }
  return width;
}

std::string attention_grid(const xgrad::Array& weights, std::size_t head, const std::vector<std::string>& labels) {
  static const char* shades[] = {" ", "\u2591", "\u2592", "\u2593", "\u2588"};
  const std::size_t T = weights.shape()[1];
  std::size_t label_width = 0;
  for (const std::string& l : labels) label_width = std::max(label_width, display_width(l));
  std::ostringstream os;
  for (std::size_t t = 0; t < T; ++t) {
    os << std::string(label_width - display_width(labels[t]), ' ') << labels[t] << " |";
    for (std::size_t s = 0; s < T; ++s) {
      const int level = std::clamp(static_cast<int>(weights(head, t, s) * 4.0 + 0.5), 0, 4);
      os << shades[level] << shades[level] << shades[level];
    }
    os << "|\n";
  }
  return os.str();
}

std::vector<std::string> write_heatmaps(const std::string& folder, const std::vector<xgrad::Array>& attention,
                                        const std::vector<HeadReading>& readings,
                                        const std::vector<std::string>& labels) {
  std::vector<xgrad::inspect::Heatmap> maps;
  std::vector<std::string> written;
  for (const HeadReading& r : readings) {
    const xgrad::Array& w = attention[r.layer];
    xgrad::inspect::Heatmap m;
    m.title = "layer " + std::to_string(r.layer) + " head " + std::to_string(r.head) +
              (r.pattern == "mixed" ? "" : ": " + r.pattern);
    m.row_labels = labels;
    m.col_labels = labels;
    for (std::size_t t = 0; t < labels.size(); ++t) {
      std::vector<double> row;
      for (std::size_t s = 0; s < labels.size(); ++s) row.push_back(w(r.head, t, s));
      m.values.push_back(row);
    }
    const std::string path = folder + "/head_l" + std::to_string(r.layer) + "_h" + std::to_string(r.head) + ".svg";
    xgrad::inspect::write_text_file(path, xgrad::inspect::heatmap_svg(m));
    written.push_back(path);
    maps.push_back(std::move(m));
  }
  const std::size_t heads = attention.empty() ? 1 : attention[0].shape()[0];
  const std::string overview = folder + "/heads.svg";
  xgrad::inspect::write_text_file(overview, xgrad::inspect::heatmap_grid_svg(maps, heads));
  written.insert(written.begin(), overview);
  return written;
}

void write_viewer(const std::string& path, xgrad::nn::LanguageModel& model, const Vocabulary& vocab,
                  const Sentence& words) {
  xgrad::NoGradGuard no_grad;
  const xgrad::IndexArray ids = model_input(vocab, words);
  const xgrad::inspect::ActivationCache cache = xgrad::inspect::cache_activations(
      model, [&] { model.forward(ids); }, xgrad::inspect::points_ending_with({".pattern"}));
  xgrad::write_file_atomically(path,
                               xgrad::inspect::attention_viewer_html(cache, token_labels(words), 0, join_words(words)),
                               "chinese_attention: the attention viewer");
}

}  // namespace zh
