// glibc malloc tuning (see allocator.hpp).
#include "xgrad/core/allocator.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace xgrad {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's upper limit on 64-bit
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace xgrad
