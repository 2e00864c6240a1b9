/// @file
/// Batches of next-token prediction from a TokenSource: random windows (nanoGPT's get_batch),
/// non-overlapping windows in a shuffled order per epoch, consecutive windows for evaluation,
/// and batches of whole documents, padded or packed.
///
/// Sharding: the samplers that take (rank, world) draw or visit the whole global batch on every
/// rank, and return rows [rank * B / world, (rank + 1) * B / world) of it, so the ranks' rows
/// concatenated are the batch of one process, and every rank's state stays in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/token_source.hpp"

namespace xgrad::text {

/// One batch: ids (B, T), their targets (B, T) (the next token, or kIgnoreIndex where there is
/// none to predict), and a key_padding_mask (B, T), true at padding, that is empty (shape (0))
/// unless the batch is padded.
struct TokenBatch {
  IndexArray ids;                                 ///< (B, T)
  IndexArray targets;                             ///< (B, T): the next id, or kIgnoreIndex
  Mask key_padding_mask = Mask::from_shape({0});  ///< (B, T), true at padding; shape (0) unless padded
  /// Whether key_padding_mask is set: give it to LanguageModel::loss then.
  bool padded() const { return key_padding_mask.size() > 0; }
};

/// A uniform draw in [0, n) for any n >= 1: Generator::below(n) for n <= 2^32 (so every source
/// of that size gives the batches train_lm always drew), else rejection sampling on next_u64().
std::uint64_t draw_below(Generator& gen, std::uint64_t n);

/// `global_batch` windows of seq_len + 1 tokens at offsets draw_below(gen, size - seq_len),
/// drawn in row order (ids: the first seq_len tokens, targets: the last seq_len), of which this
/// rank's rows are returned (see Sharding in the file comment); all global_batch offsets are drawn on every rank.
/// seq_len 0, global_batch 0, world 0, rank >= world, a global_batch world does not divide, or a
/// source of seq_len tokens or fewer is an Error naming the values.
TokenBatch random_windows(const TokenSource& data, std::size_t seq_len, std::size_t global_batch, Generator& gen,
                          std::size_t rank = 0, std::size_t world = 1);

/// Consecutive windows from the start of the data, as train_lm evaluates: batch b, row s is the
/// window at (b * batch + s) * seq_len; as many whole batches as fit, at most max_batches
/// (none when not one fits). With (rank, world): this rank's rows of each batch.
std::vector<TokenBatch> evaluation_windows(const TokenSource& data, std::size_t batch, std::size_t seq_len,
                                           std::size_t max_batches, std::size_t rank = 0, std::size_t world = 1);

/// Non-overlapping windows at offsets k * seq_len, k in [0, (size - 1) / seq_len), each once per
/// epoch in an order shuffled by Fisher-Yates with a Generator seeded mix_seed(seed, epoch) (the
/// same on every platform). Batches follow one another through the epochs: a batch that takes
/// the last windows of an epoch continues with the first of the next. Holds a reference to the
/// data, which must outlive it.
class SequentialWindows {
 public:
  /// seq_len 0 or a source with no window (fewer than seq_len + 1 tokens) is an Error.
  SequentialWindows(const TokenSource& data, std::size_t seq_len, std::uint64_t seed);

  /// The next global_batch windows; this rank's rows of them. global_batch 0 or more than the
  /// windows of an epoch, world 0 or more than the windows, rank >= world, or a global_batch that
  /// world does not divide is an Error, and the position is unchanged.
  TokenBatch next(std::size_t global_batch, std::size_t rank = 0, std::size_t world = 1);
  /// The epoch of the next window (0 first).
  std::size_t epoch() const { return epoch_; }
  /// The next window's place in its epoch's order.
  std::size_t position() const { return position_; }
  /// Windows per epoch.
  std::size_t windows() const { return windows_; }
  /// The window offsets of an epoch, in their visiting order.
  std::vector<std::size_t> epoch_order(std::size_t epoch) const;

  /// The position as text ("sequential_windows 1 seed S seq_len T windows W epoch E position P"),
  /// to store in a checkpoint.
  std::string state() const;
  /// Restores a state(); text that is no state, or one of another seed, seq_len or window count,
  /// is an Error naming the field, and nothing changes.
  void set_state(const std::string& state);

 private:
  const TokenSource* data_;
  std::size_t seq_len_, windows_;
  std::uint64_t seed_;
  std::size_t epoch_ = 0, position_ = 0;
  std::vector<std::size_t> order_;  // epoch_'s order
};

/// [begin, end) of each document: the spans between eos separators (one eos between two
/// documents, as token files hold them). n separators give n + 1 documents, empty ones
/// included; an empty source has none. eos < 0 is an Error.
std::vector<std::pair<std::size_t, std::size_t>> document_ranges(const TokenSource& data, std::int64_t eos);

/// One row per document, padded on the right with pad_id to the longest (after truncation to
/// max_len tokens when max_len > 0). targets: the next token of the document; kIgnoreIndex at
/// padding and at each document's last token (a document cut by max_len keeps the target of its
/// last kept token: the token after it). key_padding_mask: true at padding. No documents, an
/// empty document or pad_id < 0 is an Error.
TokenBatch padded_batch(const std::vector<TokenIds>& documents, std::int64_t pad_id, std::size_t max_len = 0);

/// The documents joined into one stream with an eos between each two, cut into rows of seq_len
/// positions with next-token targets (as training on a token file sees them). A row may cross
/// documents: its positions attend to the tokens of the earlier document before the eos (there
/// is no per-document attention mask), the token before an eos predicts the eos and the eos
/// predicts the next document's first token. The last row is padded with eos where the stream
/// ends (targets kIgnoreIndex, key_padding_mask true there; the mask is empty when no row is
/// padded). Fewer than 2 tokens in the stream, seq_len 0 or eos < 0 is an Error.
TokenBatch packed_batch(const std::vector<TokenIds>& documents, std::size_t seq_len, std::int64_t eos);

}  // namespace xgrad::text
