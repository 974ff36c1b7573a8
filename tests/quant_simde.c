/* quant_simde.c - runtime/quant.c with its AVX-512 kernels compiled on SIMDe's portable AVX-512
 * intrinsics (tests/simde_avx512.h), so that tests/test_quant.py checks the AVX-512 path's logic on a
 * CPU without AVX-512 (Makefile: build/tests/quant_cli_avx512_sim). The real instructions are
 * checked by build/tests/quant_cli_avx512 where the CPU has them. */
#include "simde_avx512.h"

#define QUANT_SIMD_AVX512 1
#include "../runtime/quant.c"
