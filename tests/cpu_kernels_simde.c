/* cpu_kernels_simde.c - tests/test_cpu_kernels.c with runtime/cpu_kernels.h's AVX-512 paths compiled
 * on SIMDe's portable AVX-512 intrinsics (tests/simde_avx512.h), so that their logic (the int8 KV
 * cache's attention among them) is checked on a CPU without AVX-512 (Makefile:
 * build/tests/test_cpu_kernels_avx512_sim, run by tests/test_c_units.py where SIMDe's headers are).
 * __AVX512F__ is defined after GCC's intrinsics header has been read, so only cpu_kernels.h's own
 * choices see it. */
#include "simde_avx512.h"

#define __AVX512F__ 1
#include "test_cpu_kernels.c"
