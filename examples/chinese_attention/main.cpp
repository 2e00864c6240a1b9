// Trains a small word-level language model on built-in Chinese sentences, then shows what each
// attention head of each layer does on 我 昨天 去 了 北京 出差: terminal grids, SVG heatmaps, and
// a one-line reading per head computed from its weights, the logit lens and an HTML viewer.
#include <algorithm>
#include <cstdio>

#include "command_line.hpp"
#include "common/cli.hpp"
#include "common/terminal.hpp"
#include "head_reading.hpp"
#include "lens.hpp"
#include "report.hpp"
#include "xgrad/core/kernels/parallel.hpp"

using namespace zh;

int main(int argc, char** argv) {
  CLI::App app{"xgrad chinese_attention: per-head attention over 我 昨天 去 了 北京 出差, from a trained model.",
               "chinese_attention"};
  CommandLine c;
  add_options(app, c);
  if (const auto code = cli::parse(app, argc, argv)) return *code;

  return cli::run("chinese_attention", [&] {
    check_before_run(c);
    xgrad::set_num_threads(c.threads);
    const CorpusSplit corpus = builtin_corpus();
    const Sentence& sentence = probe_sentence();
    std::printf("corpus: %zu training and %zu held-out sentences from the built-in grammar\n", corpus.train.size(),
                corpus.held_out.size());

    viz::ProgressLine line(c.quiet, std::max<std::size_t>(c.train.steps / 5, 1));
    const TrainResult r = train(c.train, corpus, [&](std::size_t step, std::size_t steps, float loss) {
      char text[120];
      std::snprintf(text, sizeof text, "step %5zu/%zu  loss %.3f", step, steps, static_cast<double>(loss));
      line.update(step, steps, text);
    });
    line.finish();
    std::printf(
        "model: %zu layers, d_model %zu, %zu heads, vocabulary %zu words, %zu parameters; %zu steps of %zu sentences, "
        "%s\n",
        c.train.layers, c.train.d_model, c.train.heads, r.vocab.size(), r.model->num_parameters(), c.train.steps,
        c.train.batch, viz::duration(r.seconds).c_str());
    std::printf("loss (nats per word): held-out %.3f (untrained %.3f), training %.3f; unigram baseline %.3f\n",
                r.losses.held_out, r.losses.held_out_before, r.losses.train, r.losses.unigram);

    bool seen = false;
    for (const Sentence& s : corpus.train) seen = seen || s == sentence;
    std::printf("\nsentence: %s (%s the training sentences)\n", join_words(sentence).c_str(),
                seen ? "one of" : "not among");
    const std::vector<xgrad::Array> attention = attention_on(*r.model, r.vocab, sentence);
    const std::vector<std::string> labels = token_labels(sentence);
    const std::vector<HeadReading> readings = read_heads(attention);
    std::string keys;
    for (const std::string& l : labels) keys += " " + l;
    std::printf(
        "per head: mean weight on the previous token, the first token (<s>) and itself over the queries %s .. %s;\n"
        "then each query -> the key it attends to most\n",
        labels[2].c_str(), labels.back().c_str());
    for (const HeadReading& h : readings) {
      if (!c.quiet)
        std::printf("\nlayer %zu head %zu (rows: queries; columns: keys%s)\n%s", h.layer, h.head, keys.c_str(),
                    attention_grid(attention[h.layer], h.head, labels).c_str());
      std::printf("layer %zu head %zu  %s\n", h.layer, h.head, describe(h, labels).c_str());
    }
    std::printf("\nlogit lens: the likeliest next word after each position, read out after each block\n%s",
                lens_table(*r.model, r.vocab, sentence).c_str());
    const std::vector<std::string> written = write_heatmaps(c.out, attention, readings, labels);
    const std::string viewer = c.out + "/attention.html";
    write_viewer(viewer, *r.model, r.vocab, sentence);
    std::printf("\nimages: %s (all heads) and one heatmap per head in %s/; attention viewer %s\n",
                written.front().c_str(), c.out.c_str(), viewer.c_str());
  });
}
