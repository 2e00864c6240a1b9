// random_windows and evaluation_windows against the sample_batch, share() and eval_batches that
// train_lm had before it took its batches from the library (kept here as they were), on the same
// bytes and generator: bit-identical batches, so train_lm trains on what it trained on before.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "corpus.hpp"
#include "test_files.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/token_batches.hpp"
#include "xgrad/text/token_file.hpp"

using namespace xgrad::text;

namespace {

bool same(const xgrad::IndexArray& a, const xgrad::IndexArray& b) {
  return a.shape() == b.shape() && std::equal(a.begin(), a.end(), b.begin());
}

// train_lm's Trainer::share: rows [rank * rows, (rank + 1) * rows) of the global batch.
xgrad::IndexArray share(const xgrad::IndexArray& global, std::size_t rank, std::size_t ranks) {
  const std::size_t rows = global.shape()[0] / ranks, T = global.shape()[1];
  xgrad::IndexArray out = xgrad::IndexArray::from_shape({rows, T});
  std::copy_n(global.data() + rank * rows * T, rows * T, out.data());
  return out;
}

// train_lm's batches before the library, as they were written.
struct Batch {
  xgrad::IndexArray ids, targets;
};

Batch sample_batch(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                   xgrad::Generator& gen) {
  Batch b{xgrad::IndexArray::from_shape({batch, seq_len}), xgrad::IndexArray::from_shape({batch, seq_len})};
  for (std::size_t s = 0; s < batch; ++s) {
    const std::size_t at = gen.below(data.size() - seq_len);
    for (std::size_t t = 0; t < seq_len; ++t) {
      b.ids(s, t) = data[at + t];
      b.targets(s, t) = data[at + t + 1];
    }
  }
  return b;
}

std::vector<Batch> eval_batches(const std::vector<std::uint8_t>& data, std::size_t batch, std::size_t seq_len,
                                std::size_t max_batches) {
  std::vector<Batch> out;
  std::size_t at = 0;
  while (out.size() < max_batches && at + batch * seq_len + 1 <= data.size()) {
    Batch b{xgrad::IndexArray::from_shape({batch, seq_len}), xgrad::IndexArray::from_shape({batch, seq_len})};
    for (std::size_t s = 0; s < batch; ++s, at += seq_len) {
      for (std::size_t t = 0; t < seq_len; ++t) {
        b.ids(s, t) = data[at + t];
        b.targets(s, t) = data[at + t + 1];
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

TEST_CASE("random_windows gives train_lm's sample_batch, bit for bit, from a vector and from a token file",
          "[text][batches][train_lm]") {
  const std::string text = lm::grammar_text(20000, 3);
  const lm::Corpus corpus = lm::split(text, 0.1, 32);
  const TokenIds ids = corpus.train->read_ids(0, corpus.train->size());
  const std::vector<std::uint8_t> train(ids.begin(), ids.end());
  REQUIRE(std::string(train.begin(), train.end()) == text.substr(0, train.size()));  // bytes: the ids are the text
  xgrad::testing::TempDir dir("xgrad_tokbatch");
  write_token_file(dir.file("train.bin"), ids, BytesTokenizer().identity());
  const TokenVector vec(ids);
  const TokenFile file(dir.file("train.bin"));
  for (const TokenSource* source : std::vector<const TokenSource*>{&vec, &file}) {
    xgrad::Generator theirs(8), ours(8);
    for (int step = 0; step < 20; ++step) {
      const Batch want = sample_batch(train, 8, 32, theirs);
      const TokenBatch got = random_windows(*source, 32, 8, ours);
      REQUIRE(same(got.ids, want.ids));
      REQUIRE(same(got.targets, want.targets));
    }
    CHECK(theirs.state() == ours.state());
    // Four ranks: each rank's rows are share() of train_lm's global batch.
    for (std::size_t rank = 0; rank < 4; ++rank) {
      xgrad::Generator g_theirs(21), g_ours(21);
      for (int step = 0; step < 5; ++step) {
        const Batch want = sample_batch(train, 8, 32, g_theirs);
        const TokenBatch got = random_windows(*source, 32, 8, g_ours, rank, 4);
        REQUIRE(same(got.ids, share(want.ids, rank, 4)));
        REQUIRE(same(got.targets, share(want.targets, rank, 4)));
      }
      CHECK(g_theirs.state() == g_ours.state());
    }
  }
}

TEST_CASE("evaluation_windows gives train_lm's eval_batches, bit for bit", "[text][batches][train_lm]") {
  const std::string text = lm::grammar_text(5000, 4);
  const std::vector<std::uint8_t> bytes(text.begin(), text.end());
  const TokenVector vec(TokenIds(bytes.begin(), bytes.end()));
  for (std::size_t max_batches : {1, 3, 100}) {
    const std::vector<Batch> want = eval_batches(bytes, 6, 16, max_batches);
    const std::vector<TokenBatch> got = evaluation_windows(vec, 6, 16, max_batches);
    REQUIRE(got.size() == want.size());
    for (std::size_t b = 0; b < got.size(); ++b) {
      CHECK(same(got[b].ids, want[b].ids));
      CHECK(same(got[b].targets, want[b].targets));
    }
    const std::vector<TokenBatch> rank1 = evaluation_windows(vec, 6, 16, max_batches, 1, 2);
    for (std::size_t b = 0; b < got.size(); ++b) CHECK(same(rank1[b].ids, share(want[b].ids, 1, 2)));
  }
}
