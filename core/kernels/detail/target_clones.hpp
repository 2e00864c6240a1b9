// XGRAD_CLONES marks a hot loop that GCC compiles once per target (AVX-512 as x86-64-v4, AVX2
// with FMA as x86-64-v3, the baseline) and resolves once, at load time, from the CPU's features (see
// core/kernels/vector_kernels.cpp for the measurements). tests/test_kernel_targets.cpp compiles the
// files that use it once per target, each copy in a namespace of its own (XGRAD_KERNELS_NS,
// XGRAD_KERNELS_ONLY_<target>), and checks that the copies give the same bits.
// A helper that such a function calls is marked XGRAD_KERNEL_INLINE: left out of line, it is
// compiled for the baseline alone, and at -O1 (the sanitizer build) the helpers of the vector
// kernels then called the C library's fmaf and took 78% of a training run; at -O3 one sum32 of
// masked_softmax_row stayed out of line.
#pragma once

#if defined(XGRAD_KERNELS_ONLY_AVX512)
#define XGRAD_CLONES __attribute__((target("arch=x86-64-v4")))
#elif defined(XGRAD_KERNELS_ONLY_AVX2)
#define XGRAD_CLONES __attribute__((target("arch=x86-64-v3")))
#elif defined(XGRAD_KERNELS_ONLY_BASELINE)
#define XGRAD_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XGRAD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define XGRAD_CLONES
#endif

// The tests compile a copy per target in a namespace of its own; everyone else uses kernels.
#ifndef XGRAD_KERNELS_NS
#define XGRAD_KERNELS_NS kernels
#endif

#define XGRAD_KERNEL_INLINE __attribute__((always_inline)) inline
