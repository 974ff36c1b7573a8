/* simde_avx512.h - AVX-512 on any x86: GCC's intrinsics header first, then SIMDe's portable
 * AVX-512 (Debian's libsimde-dev) with its native aliases, so that the _mm512_* names a kernel uses
 * run lane by lane on a CPU without AVX-512. Included first by the tests' *_simde.c builds
 * (quant_simde.c, cpu_kernels_simde.c), which check the AVX-512 paths' logic here; the real
 * instructions are checked where the CPU has them.
 *
 * SIMDe 0.7.4 (Debian 12) lacks five of the intrinsics the kernels use; they are written out here
 * lane by lane, as Intel's guide defines them (the reduction's order is GCC's: halves, then
 * quarters, then pairs; a half converts exactly, through F16C). */
#ifndef INGOT_TESTS_SIMDE_AVX512_H
#define INGOT_TESTS_SIMDE_AVX512_H
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
static inline simde__m512i sim_cvtepu16_epi32(__m256i a) {
    uint16_t b[16];
    int32_t r[16];
    simde__m512i v;
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) r[i] = b[i];
    memcpy(&v, r, sizeof v);
    return v;
}
static inline simde__m512 sim_cvtph_ps(__m256i a) {
    uint16_t b[16];
    float r[16];
    simde__m512 v;
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) r[i] = _cvtsh_ss(b[i]);
    memcpy(&v, r, sizeof v);
    return v;
}
#define _mm512_cvtepu16_epi32(a) sim_cvtepu16_epi32(a)
#define _mm512_cvtph_ps(a) sim_cvtph_ps(a)

#endif
