// Memory estimates and the machine's limit.
#include "memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include "cli.hpp"

namespace cli {

double transformer_training_bytes(const TransformerSize& s) {
  const double C = s.d_model, F = s.d_ff, L = s.layers, T = s.seq_len, B = s.batch, H = s.heads, V = s.vocab;
  const double params = V * C + T * C + L * (4 * C * C + 2 * C * F);
  const double activations = B * T * (L * (12 * C + 3 * H * T + 3 * F) + 3 * V * s.outputs_per_position);
  return 4.0 * (4 * params + 2 * activations);
}

double memory_limit_bytes() {
  double limit = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    limit = std::min(limit, static_cast<double>(rl.rlim_cur));
  return limit;
}

void check_memory(double bytes, const std::string& what) {
  const double limit = memory_limit_bytes();
  if (!(bytes <= limit)) {
    usage_error(what, " needs about ", bytes_str(bytes), " of memory, more than the ", bytes_str(limit),
                " this process may use; choose smaller sizes");
  }
}

}  // namespace cli
