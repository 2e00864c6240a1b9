// What the example shows: each head's attention as a terminal grid (CJK labels aligned by their
// display width) and as SVG heatmaps.
#pragma once

#include <string>
#include <vector>

#include "head_reading.hpp"

namespace zh {

// Columns a terminal gives the text: 2 for CJK characters, 1 for the others.
std::size_t display_width(const std::string& utf8);

// Rows are queries, columns keys; shades ' ', '░', '▒', '▓', '█' for weights 0 .. 1.
std::string attention_grid(const xgrad::Array& weights, std::size_t head, const std::vector<std::string>& labels);

// Writes heads.svg (every head of every layer, one row per layer) and head_l<L>_h<H>.svg into
// `folder`; returns the paths written.
std::vector<std::string> write_heatmaps(const std::string& folder, const std::vector<xgrad::Array>& attention,
                                        const std::vector<HeadReading>& readings,
                                        const std::vector<std::string>& labels);

// The self-contained HTML attention viewer of the model over the sentence.
void write_viewer(const std::string& path, xgrad::nn::LanguageModel& model, const Vocabulary& vocab,
                  const Sentence& words);

}  // namespace zh
