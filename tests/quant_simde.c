/* quant_simde.c - runtime/quant.c with its AVX-512 kernels compiled on SIMDe's portable AVX-512
 * intrinsics (Debian's libsimde-dev), so that tests/test_quant.py checks the AVX-512 path's logic
 * on a CPU without AVX-512 (Makefile: build/tests/quant_cli_avx512_sim). The real instructions are
 * checked by build/tests/quant_cli_avx512 where the CPU has them.
 *
 * SIMDe 0.7.4 (Debian 12) lacks three of the intrinsics the kernels use; they are written out here
 * lane by lane, as Intel's guide defines them (the reduction's order is GCC's: halves, then
 * quarters, then pairs). */
#include <immintrin.h>
#include <string.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

static inline simde__m512i sim_cvtepi8_epi32(__m128i a) {
    int8_t b[16];
    int32_t r[16];
    simde__m512i v;
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) r[i] = b[i];
    memcpy(&v, r, sizeof v);
    return v;
}
static inline simde__m512 sim_cvtepi32_ps(simde__m512i a) {
    int32_t b[16];
    float r[16];
    simde__m512 v;
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) r[i] = (float)b[i];
    memcpy(&v, r, sizeof v);
    return v;
}
static inline float sim_reduce_add_ps(simde__m512 a) {
    float r[16];
    memcpy(r, &a, sizeof r);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) r[i] = r[i] + r[i + w];
    return r[0];
}
#define _mm512_cvtepi8_epi32(a) sim_cvtepi8_epi32(a)
#define _mm512_cvtepi32_ps(a) sim_cvtepi32_ps(a)
#define _mm512_reduce_add_ps(a) sim_reduce_add_ps(a)

#define QUANT_SIMD_AVX512 1
#include "../runtime/quant.c"
