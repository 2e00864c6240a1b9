// The random stream a module draws its dropout masks from (Attention, FeedForward). By default
// the module's own generator, spawned from the one given at construction (Generator::spawn
// draws nothing from it, so the weights initialized afterwards are unchanged); set_generator
// replaces it, e.g. with one generator shared by several modules. Masks so depend only on the
// module's stream, never on which thread runs forward.
#pragma once

#include <cstdint>
#include <memory>

#include "xgrad/core/random.hpp"

namespace xgrad::nn {

class Module;

/// The generator a module draws its dropout masks from: its own, spawned from the one given at
/// construction, until set_generator replaces it.
class RandomStream {
 public:
  /// A stream of its own, spawned from `from` (which draws nothing).
  explicit RandomStream(Generator& from) : generator_(std::make_shared<Generator>(from.spawn())) {}
  /// The generator the masks come from.
  Generator& generator() const { return *generator_; }
  /// Replaces the generator (with one shared by several modules, for example); a null one throws.
  /// Not while a forward pass runs on this module.
  void set_generator(std::shared_ptr<Generator> generator);

 private:
  std::shared_ptr<Generator> generator_;
};

/// Seeds every random stream under root, each from the seed and its module's place in the tree
/// (depth first): the same seed gives the same masks in every run.
void seed_dropout(Module& root, std::uint64_t seed);

}  // namespace xgrad::nn
