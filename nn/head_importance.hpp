// Head importance after Michel, Levy and Neubig (2019), "Are Sixteen Heads Really Better than
// One?": each head's output is multiplied by a gate equal to 1, and the head's importance is
// the expected absolute gradient of the loss with respect to its gate, I_h = E |dL/dg_h|.
#pragma once

#include <string>
#include <vector>

#include "xgrad/nn/attention.hpp"

namespace xgrad::nn {

struct HeadScore {
  std::string module;  // the MultiHeadAttention's path, e.g. "blocks.0.attn"
  std::size_t head = 0;
  double importance = 0;  // mean |dL/dgate| over the accumulated batches
};

class HeadImportance {
 public:
  // Installs a gate of ones (requiring grad) on every MultiHeadAttention under root; the gates
  // change no value. The destructor removes them.
  explicit HeadImportance(Module& root);
  ~HeadImportance();
  HeadImportance(const HeadImportance&) = delete;
  HeadImportance& operator=(const HeadImportance&) = delete;

  // Call after each backward: adds |dL/dgate| of every head and clears the gates' gradients.
  void accumulate();
  std::vector<HeadScore> scores() const;
  std::size_t batches() const { return batches_; }

 private:
  struct Gate {
    std::string path;
    MultiHeadAttention* module;
    Tensor gate;
    std::vector<double> sum;
  };
  std::vector<Gate> gates_;
  std::size_t batches_ = 0;
};

}  // namespace xgrad::nn
