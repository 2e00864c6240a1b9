// Modules' own dropout streams.
#include "xgrad/nn/random_stream.hpp"

#include "xgrad/core/error.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

void RandomStream::set_generator(std::shared_ptr<Generator> generator) {
  if (!generator) fail("RandomStream::set_generator: the generator is null");
  generator_ = std::move(generator);
}

void seed_dropout(Module& root, std::uint64_t seed) {
  std::uint64_t place = 0;
  for (auto& [path, m] : root.named_modules()) {
    ++place;
    auto* stream = dynamic_cast<RandomStream*>(m);
    if (!stream) continue;
    stream->generator().manual_seed(mix_seed(seed, place));
  }
}

}  // namespace xgrad::nn
