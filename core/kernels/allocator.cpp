// glibc malloc tuning (see allocator.hpp).
#include "xgrad/core/kernels/detail/allocator.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace xgrad {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's upper limit on 64-bit
  // Buffers above that limit (attention weights at T 1024 are 32 MiB per layer) would still be
  // mapped and unmapped every step; with no mmap at all they come from the heap too. Threads
  // other than the main one still fall back to mmap when their arena cannot hold a request.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace xgrad
