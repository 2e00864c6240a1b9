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
    // SplitMix64 of (seed, place): nearby seeds and places give unrelated streams.
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * place;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    stream->generator().manual_seed(z ^ (z >> 31));
  }
}

}  // namespace xgrad::nn
