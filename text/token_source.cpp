#include "xgrad/text/token_source.hpp"

#include <algorithm>

#include "xgrad/core/error.hpp"

namespace xgrad::text {

TokenSource::~TokenSource() = default;

void TokenSource::check_range(std::size_t offset, std::size_t n, const std::string& who) const {
  const std::size_t total = size();
  if (offset > total || n > total - offset) {
    fail(who, ": tokens [", offset, ", ", offset, " + ", n, ") pass the end of the source's ", total, " tokens");
  }
}

TokenIds TokenSource::read_ids(std::size_t offset, std::size_t n) const {
  check_range(offset, n, "TokenSource::read_ids");
  TokenIds ids(n);
  read(offset, n, ids.data());
  return ids;
}

TokenVector::TokenVector(TokenIds ids) : ids_(std::move(ids)) {}

void TokenVector::read(std::size_t offset, std::size_t n, std::int64_t* out) const {
  check_range(offset, n, "TokenVector::read");
  std::copy_n(ids_.data() + offset, n, out);
}

}  // namespace xgrad::text
