/* simde_avx512.h - AVX-512 on any x86: GCC's intrinsics header first, then SIMDe's portable
 * AVX-512 (Debian's libsimde-dev) with its native aliases, so that the _mm512_* names a kernel uses
 * run lane by lane on a CPU without AVX-512. Included first by the tests' *_simde.c builds
 * (quant_simde.c, cpu_kernels_simde.c), which check the AVX-512 paths' logic here; the real
 * instructions are checked where the CPU has them.
 *
 * SIMDe 0.7.4 (Debian 12) lacks seven of the intrinsics the kernels use, and its alias of
 * _mm512_madd_epi16 takes the masked form's four arguments (the function itself is right); they are written out here
 * lane by lane, as Intel's guide defines them (the reduction's order is GCC's: halves, then
 * quarters, then pairs; a half converts exactly, through F16C). */
#ifndef INGOT_TESTS_SIMDE_AVX512_H
#define INGOT_TESTS_SIMDE_AVX512_H
#include <immintrin.h>
#include <string.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

/* SIM_LANES(name, Out, out_t, In, in_t, conv): Out name(In a), each of a's 16 lanes of in_t converted
 * by conv into a lane of out_t */
#define SIM_LANES(name, Out, out_t, In, in_t, conv)      \
    static inline Out name(In a) {                       \
        in_t b[16];                                      \
        out_t r[16];                                     \
        Out v;                                           \
        memcpy(b, &a, sizeof b);                         \
        for (int i = 0; i < 16; i++) r[i] = conv(b[i]);  \
        memcpy(&v, r, sizeof v);                         \
        return v;                                        \
    }
#define SIM_INT32(x) ((int32_t)(x))
#define SIM_FLOAT(x) ((float)(x))
SIM_LANES(sim_cvtepi8_epi32, simde__m512i, int32_t, __m128i, int8_t, SIM_INT32)
SIM_LANES(sim_cvtepu16_epi32, simde__m512i, int32_t, __m256i, uint16_t, SIM_INT32)
SIM_LANES(sim_cvtepi32_ps, simde__m512, float, simde__m512i, int32_t, SIM_FLOAT)
SIM_LANES(sim_cvtph_ps, simde__m512, float, __m256i, uint16_t, _cvtsh_ss) /* exact, through F16C */
#define SIM_RINT32(x) ((int32_t)lrintf(x)) /* the rounding mode's (to nearest even), as the instruction */
SIM_LANES(sim_cvtps_epi32, simde__m512i, int32_t, simde__m512, float, SIM_RINT32)
static inline float sim_reduce_add_ps(simde__m512 a) {
    float r[16];
    memcpy(r, &a, sizeof r);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) r[i] = r[i] + r[i + w];
    return r[0];
}
/* _mm512_shuffle_f32x4: 128-bit quarters 0, 1 from a and 2, 3 from b, each picked by two bits of imm */
static inline simde__m512 sim_shuffle_f32x4(simde__m512 a, simde__m512 b, int imm) {
    float x[16], y[16], r[16];
    simde__m512 v;
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int q = 0; q < 4; q++) memcpy(r + 4 * q, (q < 2 ? x : y) + 4 * ((imm >> (2 * q)) & 3), 4 * sizeof(float));
    memcpy(&v, r, sizeof v);
    return v;
}
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm) sim_shuffle_f32x4(a, b, imm)
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define _mm512_cvtepi8_epi32(a) sim_cvtepi8_epi32(a)
#define _mm512_cvtepu16_epi32(a) sim_cvtepu16_epi32(a)
#define _mm512_cvtepi32_ps(a) sim_cvtepi32_ps(a)
#define _mm512_cvtph_ps(a) sim_cvtph_ps(a)
#define _mm512_cvtps_epi32(a) sim_cvtps_epi32(a)
#define _mm512_reduce_add_ps(a) sim_reduce_add_ps(a)

#endif
