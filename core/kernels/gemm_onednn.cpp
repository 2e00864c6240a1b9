// oneDNN's sgemm (its AVX-512 kernels on CPUs that have them). Built only when CMake finds
// oneDNN. Debian's oneDNN runs on OpenMP: a call would start a team of OMP_NUM_THREADS (else
// every core) threads, on top of xgrad's own kernel threads, and leave them spinning. So each
// call runs with the calling thread's OpenMP thread count at 1 (restored afterwards), and
// xgrad's pool does the splitting as it does for OpenBLAS.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>

#include "xgrad/core/error.hpp"
#include "xgrad/core/kernels/detail/gemm_engines.hpp"

namespace xgrad::blas::detail {

OnednnOnThisThread::OnednnOnThisThread() : outer_(omp_get_max_threads()) {
  if (outer_ != 1) omp_set_num_threads(1);
}

OnednnOnThisThread::~OnednnOnThisThread() {
  if (outer_ != 1) omp_set_num_threads(outer_);
}

void onednn_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                  std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  dnnl_status_t status;
  {
    const OnednnOnThisThread serial;
    // dnnl_sgemm is row-major (oneDNN 1.0 and later); leading dimensions must be >= 1.
    status =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m), static_cast<dnnl_dim_t>(n),
                   static_cast<dnnl_dim_t>(k), alpha, a, static_cast<dnnl_dim_t>(std::max<std::size_t>(lda, 1)), b,
                   static_cast<dnnl_dim_t>(std::max<std::size_t>(ldb, 1)), beta, c,
                   static_cast<dnnl_dim_t>(std::max<std::size_t>(ldc, 1)));
  }
  if (status != dnnl_success)
    fail("blas::sgemm: oneDNN's sgemm failed with status ", static_cast<int>(status), " on ", m, " x ", n, " x ", k);
}

}  // namespace xgrad::blas::detail
