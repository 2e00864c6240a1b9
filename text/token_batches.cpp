// Random, sequential, evaluation, padded and packed batches over a TokenSource.
#include "xgrad/text/token_batches.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/memory.hpp"

namespace xgrad::text {

namespace {

void check_sharding(std::size_t global_batch, std::size_t rank, std::size_t world, const char* who) {
  if (global_batch == 0) fail(who, ": the batch size is 0");
  if (world == 0) fail(who, ": world 0: there must be at least one process");
  if (rank >= world) fail(who, ": rank ", rank, " is not below world ", world);
  if (global_batch % world != 0)
    fail(who, ": the batch of ", global_batch, " rows does not divide among ", world, " processes");
}

// Refuses `count` batches of (rows, seq_len) ids, targets and mask, plus `extra` bytes, that cannot fit
// in memory, before anything is allocated.
void check_memory(double count, double rows, double seq_len, double extra, const char* who) {
  const double bytes = count * rows * seq_len * (2 * sizeof(std::int64_t) + sizeof(bool)) + extra;
  check_available_memory(
      bytes, who,
      "a batch of " + std::to_string(static_cast<unsigned long long>(rows)) + " x " +
          std::to_string(static_cast<unsigned long long>(seq_len)) +
          (count > 1 ? " (" + std::to_string(static_cast<unsigned long long>(count)) + " of them)" : std::string()));
}

// Fills row `row` of b from the window of seq_len + 1 tokens starting at `window`.
void fill_row(TokenBatch& b, std::size_t row, const std::int64_t* window, std::size_t seq_len) {
  std::copy_n(window, seq_len, b.ids.data() + row * seq_len);
  std::copy_n(window + 1, seq_len, b.targets.data() + row * seq_len);
}

TokenBatch empty_batch(std::size_t rows, std::size_t seq_len) {
  return TokenBatch{IndexArray::from_shape({rows, seq_len}), IndexArray::from_shape({rows, seq_len})};
}

}  // namespace

std::uint64_t draw_below(Generator& gen, std::uint64_t n) {
  if (n == 0) fail("draw_below: the range [0, 0) is empty");
  if (n <= (std::uint64_t{1} << 32)) return gen.below(n);
  // Unbiased: reject the lowest 2^64 mod n values, so that what is left is a multiple of n.
  const std::uint64_t reject_below = (0 - n) % n;
  for (;;) {
    const std::uint64_t x = gen.next_u64();
    if (x >= reject_below) return x % n;
  }
}

TokenBatch random_windows(const TokenSource& data, std::size_t seq_len, std::size_t global_batch, Generator& gen,
                          std::size_t rank, std::size_t world) {
  const char* who = "random_windows";
  check_sharding(global_batch, rank, world, who);
  if (seq_len == 0) fail(who, ": seq_len is 0");
  if (data.size() <= seq_len)
    fail(who, ": windows of ", seq_len, " + 1 tokens do not fit in the ", data.size(), " tokens of the data");
  const std::size_t rows = global_batch / world, first = rank * rows;
  check_memory(1, static_cast<double>(rows), static_cast<double>(seq_len),
               static_cast<double>(global_batch) * sizeof(std::size_t), who);
  std::vector<std::size_t> offsets(global_batch);
  for (std::size_t& at : offsets) at = static_cast<std::size_t>(draw_below(gen, data.size() - seq_len));
  TokenBatch b = empty_batch(rows, seq_len);
  std::vector<std::int64_t> window(seq_len + 1);
  for (std::size_t r = 0; r < rows; ++r) {
    data.read(offsets[first + r], seq_len + 1, window.data());
    fill_row(b, r, window.data(), seq_len);
  }
  return b;
}

std::vector<TokenBatch> evaluation_windows(const TokenSource& data, std::size_t batch, std::size_t seq_len,
                                           std::size_t max_batches, std::size_t rank, std::size_t world) {
  const char* who = "evaluation_windows";
  check_sharding(batch, rank, world, who);
  if (seq_len == 0) fail(who, ": seq_len is 0");
  const std::size_t rows = batch / world, first = rank * rows;
  const double per_batch = static_cast<double>(batch) * static_cast<double>(seq_len);
  if (per_batch + 1 > static_cast<double>(data.size())) return {};
  const double batches = std::min(static_cast<double>(max_batches), static_cast<double>(data.size() - 1) / per_batch);
  check_memory(std::floor(batches), static_cast<double>(rows), static_cast<double>(seq_len),
               (per_batch + 1) * sizeof(std::int64_t), who);
  std::vector<TokenBatch> out;
  std::vector<std::int64_t> tokens(batch * seq_len + 1);
  std::size_t at = 0;
  while (out.size() < max_batches && at + batch * seq_len + 1 <= data.size()) {
    data.read(at, tokens.size(), tokens.data());
    TokenBatch b = empty_batch(rows, seq_len);
    for (std::size_t r = 0; r < rows; ++r) fill_row(b, r, tokens.data() + (first + r) * seq_len, seq_len);
    out.push_back(std::move(b));
    at += batch * seq_len;
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// Sequential windows

SequentialWindows::SequentialWindows(const TokenSource& data, std::size_t seq_len, std::uint64_t seed)
    : data_(&data), seq_len_(seq_len), windows_(0), seed_(seed) {
  if (seq_len == 0) fail("SequentialWindows: seq_len is 0");
  windows_ = data.size() == 0 ? 0 : (data.size() - 1) / seq_len;
  if (windows_ == 0)
    fail("SequentialWindows: the data's ", data.size(), " tokens hold no window of ", seq_len, " + 1 tokens");
  check_available_memory(static_cast<double>(windows_) * 2 * sizeof(std::size_t), "SequentialWindows",
                         "the visiting order of " + std::to_string(windows_) + " windows");
  order_ = epoch_order(0);
}

std::vector<std::size_t> SequentialWindows::epoch_order(std::size_t epoch) const {
  std::vector<std::size_t> order(windows_);
  for (std::size_t k = 0; k < windows_; ++k) order[k] = k * seq_len_;
  Generator gen(mix_seed(seed_, epoch));
  for (std::size_t i = windows_ - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(draw_below(gen, i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

TokenBatch SequentialWindows::next(std::size_t global_batch, std::size_t rank, std::size_t world) {
  const char* who = "SequentialWindows::next";
  if (world > windows_) fail(who, ": ", world, " processes are more than the ", windows_, " windows of the data");
  check_sharding(global_batch, rank, world, who);
  if (global_batch > windows_)
    fail(who, ": a batch of ", global_batch, " windows is more than the ", windows_, " windows of an epoch");
  const std::size_t rows = global_batch / world, first = rank * rows;
  check_memory(1, static_cast<double>(rows), static_cast<double>(seq_len_), 0, who);
  TokenBatch b = empty_batch(rows, seq_len_);
  std::vector<std::int64_t> window(seq_len_ + 1);
  // Read first, then move: an Error from the data leaves the position unchanged.
  std::size_t epoch = epoch_, position = position_;
  std::vector<std::size_t> next_order;
  const std::vector<std::size_t>* order = &order_;
  for (std::size_t i = 0; i < global_batch; ++i) {
    if (position == windows_) {
      next_order = epoch_order(++epoch);
      order = &next_order;
      position = 0;
    }
    if (i >= first && i < first + rows) {
      data_->read((*order)[position], seq_len_ + 1, window.data());
      fill_row(b, i - first, window.data(), seq_len_);
    }
    ++position;
  }
  if (position == windows_) {
    next_order = epoch_order(++epoch);
    order = &next_order;
    position = 0;
  }
  if (epoch != epoch_) order_ = std::move(next_order);
  epoch_ = epoch;
  position_ = position;
  return b;
}

std::string SequentialWindows::state() const {
  std::ostringstream os;
  os << "sequential_windows 1 seed " << seed_ << " seq_len " << seq_len_ << " windows " << windows_ << " epoch "
     << epoch_ << " position " << position_;
  return os.str();
}

void SequentialWindows::set_state(const std::string& state) {
  const char* who = "SequentialWindows::set_state";
  std::istringstream is(state);
  std::string tag, version;
  is >> tag >> version;
  if (tag != "sequential_windows" || version != "1")
    fail(who, ": \"", readable_bytes(state.substr(0, 60)), "\" is not a SequentialWindows state");
  auto field = [&](const char* name) {
    std::string key, value;
    is >> key >> value;
    std::uint64_t v = 0;
    std::size_t used = 0;
    bool ok = key == name && !value.empty() && value[0] != '-';
    if (ok) {
      try {
        v = std::stoull(value, &used);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || used != value.size()) fail(who, ": the state's field ", name, " is missing or not a number");
    return v;
  };
  const std::uint64_t seed = field("seed"), seq_len = field("seq_len"), windows = field("windows"),
                      epoch = field("epoch"), position = field("position");
  std::string rest;
  if (is >> rest) fail(who, ": the state has \"", readable_bytes(rest), "\" after its fields");
  if (seed != seed_) fail(who, ": the state is of seed ", seed, ", this sampler's is ", seed_);
  if (seq_len != seq_len_) fail(who, ": the state is of seq_len ", seq_len, ", this sampler's is ", seq_len_);
  if (windows != windows_)
    fail(who, ": the state is of data with ", windows, " windows, this sampler's data has ", windows_);
  if (position >= windows_) fail(who, ": position ", position, " is not below the ", windows_, " windows");
  order_ = epoch_order(static_cast<std::size_t>(epoch));
  epoch_ = static_cast<std::size_t>(epoch);
  position_ = static_cast<std::size_t>(position);
}

// ----------------------------------------------------------------------------------------------
// Documents

std::vector<std::pair<std::size_t, std::size_t>> document_ranges(const TokenSource& data, std::int64_t eos) {
  if (eos < 0) fail("document_ranges: eos id ", eos, " is negative");
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (data.size() == 0) return out;
  std::vector<std::int64_t> chunk(std::size_t{1} << 16);
  std::size_t begin = 0;
  for (std::size_t at = 0; at < data.size(); at += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), data.size() - at);
    data.read(at, n, chunk.data());
    for (std::size_t i = 0; i < n; ++i) {
      if (chunk[i] == eos) {
        out.emplace_back(begin, at + i);
        begin = at + i + 1;
      }
    }
  }
  out.emplace_back(begin, data.size());
  return out;
}

TokenBatch padded_batch(const std::vector<TokenIds>& documents, std::int64_t pad_id, std::size_t max_len) {
  const char* who = "padded_batch";
  if (documents.empty()) fail(who, ": no documents");
  if (pad_id < 0) fail(who, ": pad id ", pad_id, " is negative");
  std::size_t width = 0;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    if (documents[d].empty()) fail(who, ": document ", d, " is empty");
    width = std::max(width, max_len > 0 ? std::min(max_len, documents[d].size()) : documents[d].size());
  }
  const std::size_t rows = documents.size();
  check_memory(1, static_cast<double>(rows), static_cast<double>(width), 0, who);
  TokenBatch b{IndexArray::from_shape({rows, width}), IndexArray::from_shape({rows, width}),
               Mask::from_shape({rows, width})};
  for (std::size_t d = 0; d < rows; ++d) {
    const TokenIds& doc = documents[d];
    const std::size_t kept = std::min(width, doc.size());
    for (std::size_t t = 0; t < width; ++t) {
      const bool real = t < kept;
      b.ids(d, t) = real ? doc[t] : pad_id;
      b.targets(d, t) = real && t + 1 < doc.size() ? doc[t + 1] : kIgnoreIndex;
      b.key_padding_mask(d, t) = !real;
    }
  }
  return b;
}

TokenBatch packed_batch(const std::vector<TokenIds>& documents, std::size_t seq_len, std::int64_t eos) {
  const char* who = "packed_batch";
  if (seq_len == 0) fail(who, ": seq_len is 0");
  if (eos < 0) fail(who, ": eos id ", eos, " is negative");
  TokenIds stream;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    if (d > 0) stream.push_back(eos);
    stream.insert(stream.end(), documents[d].begin(), documents[d].end());
  }
  if (stream.size() < 2)
    fail(who, ": the documents joined hold ", stream.size(), " tokens, fewer than the 2 one target needs");
  const std::size_t positions = stream.size() - 1, rows = (positions + seq_len - 1) / seq_len;
  const bool padded = positions % seq_len != 0;
  check_memory(1, static_cast<double>(rows), static_cast<double>(seq_len), 0, who);
  TokenBatch b = empty_batch(rows, seq_len);
  if (padded) b.key_padding_mask = Mask::from_shape({rows, seq_len});
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t t = 0; t < seq_len; ++t) {
      const std::size_t at = r * seq_len + t;
      const bool real = at < positions;
      b.ids(r, t) = real ? stream[at] : eos;
      b.targets(r, t) = real ? stream[at + 1] : kIgnoreIndex;
      if (padded) b.key_padding_mask(r, t) = !real;
    }
  }
  return b;
}

}  // namespace xgrad::text
