/// @file
/// A run of token ids that can be read a window at a time: an owned vector (TokenVector) or a
/// token file read a window at a time (TokenFile, in token_file.hpp). The batch samplers read through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "xgrad/text/tokenizer.hpp"

namespace xgrad::text {

/// Token ids at positions [0, size()), read by range. Implementations are immutable once built,
/// so several threads may read one source at once.
class TokenSource {
 public:
  virtual ~TokenSource();
  /// How many tokens the source holds.
  virtual std::size_t size() const = 0;
  /// Copies the tokens [offset, offset + n) into out[0, n). A range past size() is an Error
  /// naming the range and the size, before anything is written to out.
  virtual void read(std::size_t offset, std::size_t n, std::int64_t* out) const = 0;
  /// The tokens [offset, offset + n) as a vector (read() into a new vector).
  TokenIds read_ids(std::size_t offset, std::size_t n) const;

 protected:
  /// Throws the Error of read() for a range past size(); `who` starts the message.
  void check_range(std::size_t offset, std::size_t n, const std::string& who) const;
};

/// A TokenSource over ids held in memory.
class TokenVector : public TokenSource {
 public:
  explicit TokenVector(TokenIds ids);  ///< takes the ids
  std::size_t size() const override { return ids_.size(); }
  void read(std::size_t offset, std::size_t n, std::int64_t* out) const override;
  /// The ids themselves.
  const TokenIds& ids() const { return ids_; }

 private:
  TokenIds ids_;
};

}  // namespace xgrad::text
