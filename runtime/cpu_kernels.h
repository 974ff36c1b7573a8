/* cpu_kernels.h - the CPU decode step's kernel bodies: dot products over bf16/fp16/fp32 weights,
 * fp16 conversions, RMSNorm, RoPE and single-head attention over an fp16 or an 8-bit KV cache
 * (--kv-cache q8: its quantizer and attention, as docs/architecture.md, "The KV cache", fixes them).
 *
 * Header-only and static inline so that the generated forward pass, which calls them with its
 * MODEL_* constants, gets loops with constant trip counts: the compiler unrolls them exactly and
 * drops tails that cannot happen. Each kernel has a plain scalar twin (*_ref) that
 * tests/test_cpu_kernels.c checks it against. AVX-512 when the build machine has it (-march=native),
 * else AVX2 + FMA + F16C, else scalar. */
#ifndef INGOT_CPU_KERNELS_H
#define INGOT_CPU_KERNELS_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The weights a row's product will read PREFETCH_BYTES on, asked for ahead (software prefetch, every
 * 64-byte line of a step's bytes): the hardware prefetcher alone left one thread's row at 83-94% of
 * the read probe and two threads' at 66-76% on an AVX-512 VM (tests/bench/quant_dot.c), the block
 * formats' at 60-74%; 4 KiB ahead brought them to 100-105%, 82-92% and 97-106% (D140, D141). A
 * prefetch never faults, so reaching past a matrix's end is harmless. */
#define PREFETCH_BYTES 4096
#define PREFETCH_AHEAD(p, bytes)                                                                    \
    do {                                                                                            \
        for (int l_ = 0; l_ < (int)(bytes); l_ += 64) __builtin_prefetch((const char *)(p) + PREFETCH_BYTES + l_); \
    } while (0)

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* Kernels are always inlined: the generated caller passes constant lengths, and only an inlined
 * copy turns them into exact trip counts (gcc otherwise clones a generic body, 2x slower here). */
#define KERNEL static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions */

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Portable IEEE half <-> float, the reference for the F16C instructions. */
static inline float f16_to_f32_ref(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0x1F) u = sign | 0x7F800000u | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { /* subnormal: renormalize */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        u = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as the KV cache store needs. */
static inline uint16_t f32_to_f16_ref(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7FFFFFFF;
    if (a > 0x7F800000) return (uint16_t)(sign | 0x7E00);  /* NaN stays NaN (quiet) */
    if (a >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* rounds past 65504: infinity */
    if (a < 0x38800000) {                                  /* fp16 subnormal or zero */
        float af;
        memcpy(&af, &a, sizeof af);
        return (uint16_t)(sign | (uint32_t)lrintf(af * 16777216.0f)); /* af / 2^-24, ties to even */
    }
    uint32_t r = a - 0x38000000 + 0xFFF + ((a >> 13) & 1); /* rebias 127 -> 15, round to even */
    return (uint16_t)(sign | (r >> 13));
}

static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_f32_ref(h);
#endif
}

static inline uint16_t f32_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    return f32_to_f16_ref(f);
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Dot products: weights row w (n) in its storage dtype, activations x (n) fp32, fp32 sums */

static inline float dot_f32_ref(const float *w, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}
static inline float dot_bf16_ref(const uint16_t *w, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}
static inline float dot_f16_ref(const uint16_t *w, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += f16_to_f32_ref(w[i]) * x[i];
    return s;
}

#if defined(__AVX512F__)
/* 16 weights at p as 16 fp32 lanes */
static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 load16_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_i8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }

/* The sum of v's 16 lanes in one tree, written out so that hsum512_x16 can take sixteen at once in
 * the same tree: lanes j + 8 to j, then j + 4 to j, then j + 2 to j, then lane 1 to lane 0 (GCC's
 * _mm512_reduce_add_ps sums in this tree too). */
static inline float hsum512(__m512 v) {
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* hsum512 of v[0..16) at once, lane 4 (k % 4) + k / 4 of the result holding hsum512(v[k]) (v[4 p + r]
 * lands in lane 4 r + p): the same adds in the same tree, each step taking two vectors' halves
 * side by side (15 adds and 30 shuffles for 16 sums, where 16 hsum512s take 64 and 64). */
static inline __m512 hsum512_x16(const __m512 v[16]) {
    __m512 w[8], z[4], u[2];
    for (int i = 0; i < 8; i++) /* lanes j + 8 to j: v[2i]'s eight sums, then v[2i + 1]'s */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* j + 4 to j: a 128-bit lane each for four vectors */
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* j + 2 to j */
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Every dense dot product sums in one order, whichever kernel computes it (a decode step's one row,
 * four rows at once, a prompt batch's rows against several tokens, tests/test_cpu_kernels.c checks
 * them bit for bit): two partial vectors a and b of W lanes (16 with AVX-512, 8 with AVX2) over 2W
 * elements a step, a taking the first W and b the next; a whole W left over goes into a; then
 * reduce(a + b), plus the scalar twin over the last n mod W elements. Two chains per dot keep the
 * decode step's loads streaming (its rows are memory bound), and two are what lets the prompt's
 * GEMM (cpu_gemm.h) hold a 4-row x 3-token tile of them in 24 registers: with four, only 2 x 3. */
#define DOT_AVX512(LOAD, w, x, n, tail_ref)                                                         \
    do {                                                                                            \
        __m512 a = _mm512_setzero_ps(), b = a;                                                      \
        int i = 0;                                                                                  \
        for (; i + 32 <= (n); i += 32) {                                                            \
            PREFETCH_AHEAD((w) + i, 32 * sizeof *(w));                                              \
            a = _mm512_fmadd_ps(LOAD((w) + i), _mm512_loadu_ps((x) + i), a);                       \
            b = _mm512_fmadd_ps(LOAD((w) + i + 16), _mm512_loadu_ps((x) + i + 16), b);             \
        }                                                                                           \
        if (i + 16 <= (n)) { a = _mm512_fmadd_ps(LOAD((w) + i), _mm512_loadu_ps((x) + i), a); i += 16; } \
        const float s = hsum512(_mm512_add_ps(a, b));                                               \
        return (n) > i ? s + tail_ref((w) + i, (x) + i, (n) - i) : s;                               \
    } while (0)

KERNEL float dot_bf16(const uint16_t *w, const float *x, int n) { DOT_AVX512(load16_bf16, w, x, n, dot_bf16_ref); }
KERNEL float dot_f16(const uint16_t *w, const float *x, int n) { DOT_AVX512(load16_f16, w, x, n, dot_f16_ref); }
KERNEL float dot_f32(const float *w, const float *x, int n) { DOT_AVX512(load16_f32, w, x, n, dot_f32_ref); }

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_i8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define DOT_AVX2(LOAD, w, x, n, tail_ref)                                                           \
    do {                                                                                            \
        __m256 a = _mm256_setzero_ps(), b = a;                                                      \
        int i = 0;                                                                                  \
        for (; i + 16 <= (n); i += 16) {                                                            \
            PREFETCH_AHEAD((w) + i, 16 * sizeof *(w));                                              \
            a = _mm256_fmadd_ps(LOAD((w) + i), _mm256_loadu_ps((x) + i), a);                        \
            b = _mm256_fmadd_ps(LOAD((w) + i + 8), _mm256_loadu_ps((x) + i + 8), b);               \
        }                                                                                           \
        if (i + 8 <= (n)) { a = _mm256_fmadd_ps(LOAD((w) + i), _mm256_loadu_ps((x) + i), a); i += 8; } \
        const float s = hsum256(_mm256_add_ps(a, b));                                               \
        return (n) > i ? s + tail_ref((w) + i, (x) + i, (n) - i) : s;                               \
    } while (0)

KERNEL float dot_bf16(const uint16_t *w, const float *x, int n) { DOT_AVX2(load8_bf16, w, x, n, dot_bf16_ref); }
KERNEL float dot_f16(const uint16_t *w, const float *x, int n) { DOT_AVX2(load8_f16, w, x, n, dot_f16_ref); }
KERNEL float dot_f32(const float *w, const float *x, int n) { DOT_AVX2(load8_f32, w, x, n, dot_f32_ref); }

#else
KERNEL float dot_bf16(const uint16_t *w, const float *x, int n) { return dot_bf16_ref(w, x, n); }
KERNEL float dot_f16(const uint16_t *w, const float *x, int n) { return dot_f16_ref(w, x, n); }
KERNEL float dot_f32(const float *w, const float *x, int n) { return dot_f32_ref(w, x, n); }
#endif

/* One weight row (n) against four inputs x, x + x_stride, ... at once (a prefill batch's tokens, four
 * queries of a head): each weight vector is loaded and converted once for the four, where four dot
 * products would convert it four times; each token's sums are dot_w's, in its order (the same bits).
 * AVX-512 only: AVX2's 16 registers cannot hold the 8 accumulators, the weights and the inputs, so
 * there, and in scalar builds, it is four dot products. */
#if defined(__AVX512F__)
/* DOT_X4_AVX512's accumulation: v[t] = a + b of token t over its first i elements (every whole 16) */
#define DOT_X4_VECS_AVX512(LOAD, w, x, xs, n, v, i)                                                      \
    do {                                                                                                 \
        __m512 a[4], b[4];                                                                               \
        for (int t = 0; t < 4; t++) a[t] = b[t] = _mm512_setzero_ps();                                   \
        (i) = 0;                                                                                         \
        for (; (i) + 32 <= (n); (i) += 32) {                                                             \
            const __m512 w0 = LOAD((w) + (i)), w1 = LOAD((w) + (i) + 16);                                \
            for (int t = 0; t < 4; t++) {                                                                \
                const float *xt = (x) + (size_t)t * (xs) + (i);                                          \
                a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), a[t]);                                   \
                b[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), b[t]);                              \
            }                                                                                            \
        }                                                                                                \
        if ((i) + 16 <= (n)) {                                                                           \
            const __m512 w0 = LOAD((w) + (i));                                                           \
            for (int t = 0; t < 4; t++) a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps((x) + (size_t)t * (xs) + (i)), a[t]); \
            (i) += 16;                                                                                   \
        }                                                                                                \
        for (int t = 0; t < 4; t++) (v)[t] = _mm512_add_ps(a[t], b[t]);                                  \
    } while (0)
#define DOT_X4_AVX512(LOAD, w, x, xs, n, out, tail_ref)                                                  \
    do {                                                                                                 \
        __m512 v_[4];                                                                                    \
        int i_;                                                                                          \
        DOT_X4_VECS_AVX512(LOAD, w, x, xs, n, v_, i_);                                                   \
        for (int t = 0; t < 4; t++) {                                                                    \
            const float s = hsum512(v_[t]);                                                              \
            (out)[t] = (n) > i_ ? s + tail_ref((w) + i_, (x) + (size_t)t * (xs) + i_, (n) - i_) : s;     \
        }                                                                                                \
    } while (0)
KERNEL void dot_x4_bf16(const uint16_t *w, const float *x, size_t xs, int n, float out[4]) { DOT_X4_AVX512(load16_bf16, w, x, xs, n, out, dot_bf16_ref); }
KERNEL void dot_x4_f16(const uint16_t *w, const float *x, size_t xs, int n, float out[4]) { DOT_X4_AVX512(load16_f16, w, x, xs, n, out, dot_f16_ref); }
KERNEL void dot_x4_f32(const float *w, const float *x, size_t xs, int n, float out[4]) { DOT_X4_AVX512(load16_f32, w, x, xs, n, out, dot_f32_ref); }
#else
KERNEL void dot_x4_bf16(const uint16_t *w, const float *x, size_t xs, int n, float out[4]) { for (int t = 0; t < 4; t++) out[t] = dot_bf16(w, x + (size_t)t * xs, n); }
KERNEL void dot_x4_f16(const uint16_t *w, const float *x, size_t xs, int n, float out[4]) { for (int t = 0; t < 4; t++) out[t] = dot_f16(w, x + (size_t)t * xs, n); }
KERNEL void dot_x4_f32(const float *w, const float *x, size_t xs, int n, float out[4]) { for (int t = 0; t < 4; t++) out[t] = dot_f32(w, x + (size_t)t * xs, n); }
#endif

/* Four dot products against one x at once: w[0..3] are four weight rows (n). Four rows stream
 * side by side, which keeps more cache-line requests in flight per core than one row at a time
 * (on a 16-core Emerald Rapids slice, reading with four streams per thread moved 142 GB/s against
 * 118 with one: tests/bench/cpu_read.c), and each x vector load serves four rows. Each row's sums are
 * dot_w's, in its order (the same bits). */
/* The vector width the dot products run at, for kernels written once for AVX-512 and AVX2 (dot4_w
 * below, the prompt's GEMM in cpu_gemm.h): VW lanes, an unaligned and an aligned load and store, the
 * fused multiply-add, V_SUM(a, b) = dot_w's reduction of a + b, and each weight dtype's load. */
#if defined(__AVX512F__)
#define VW 16
typedef __m512 vecf;
#define V_ZERO() _mm512_setzero_ps()
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_LOAD(p) _mm512_load_ps(p)
#define V_STORE(p, v) _mm512_store_ps(p, v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_SUM(a, b) hsum512(_mm512_add_ps(a, b))
#define V_LOAD_BF16 load16_bf16
#define V_LOAD_F16 load16_f16
#define V_LOAD_F32 load16_f32
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VW 8
typedef __m256 vecf;
#define V_ZERO() _mm256_setzero_ps()
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_LOAD(p) _mm256_load_ps(p)
#define V_STORE(p, v) _mm256_store_ps(p, v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_SUM(a, b) hsum256(_mm256_add_ps(a, b))
#define V_LOAD_BF16 load8_bf16
#define V_LOAD_F16 load8_f16
#define V_LOAD_F32 load8_f32
#endif

#if defined(VW)
#define DOT4_SIMD(T, LOAD, w, x, n, out, tail_ref)                                                  \
    do {                                                                                            \
        vecf a0 = V_ZERO(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;          \
        const T *w0 = (w)[0], *w1 = (w)[1], *w2 = (w)[2], *w3 = (w)[3];                             \
        int i = 0;                                                                                  \
        for (; i + 2 * VW <= (n); i += 2 * VW) {                                                    \
            PREFETCH_AHEAD(w0 + i, 2 * VW * sizeof(T));                                             \
            PREFETCH_AHEAD(w1 + i, 2 * VW * sizeof(T));                                             \
            PREFETCH_AHEAD(w2 + i, 2 * VW * sizeof(T));                                             \
            PREFETCH_AHEAD(w3 + i, 2 * VW * sizeof(T));                                             \
            const vecf x0 = V_LOADU((x) + i), x1 = V_LOADU((x) + i + VW);                           \
            a0 = V_FMA(LOAD(w0 + i), x0, a0);                                                       \
            a1 = V_FMA(LOAD(w1 + i), x0, a1);                                                       \
            a2 = V_FMA(LOAD(w2 + i), x0, a2);                                                       \
            a3 = V_FMA(LOAD(w3 + i), x0, a3);                                                       \
            b0 = V_FMA(LOAD(w0 + i + VW), x1, b0);                                                  \
            b1 = V_FMA(LOAD(w1 + i + VW), x1, b1);                                                  \
            b2 = V_FMA(LOAD(w2 + i + VW), x1, b2);                                                  \
            b3 = V_FMA(LOAD(w3 + i + VW), x1, b3);                                                  \
        }                                                                                           \
        if (i + VW <= (n)) { /* a whole vector left: into a, as dot_w */                            \
            const vecf x0 = V_LOADU((x) + i);                                                       \
            a0 = V_FMA(LOAD(w0 + i), x0, a0);                                                       \
            a1 = V_FMA(LOAD(w1 + i), x0, a1);                                                       \
            a2 = V_FMA(LOAD(w2 + i), x0, a2);                                                       \
            a3 = V_FMA(LOAD(w3 + i), x0, a3);                                                       \
            i += VW;                                                                                \
        }                                                                                           \
        const float s_[4] = {V_SUM(a0, b0), V_SUM(a1, b1), V_SUM(a2, b2), V_SUM(a3, b3)};           \
        for (int r = 0; r < 4; r++) (out)[r] = (n) > i ? s_[r] + tail_ref((w)[r] + i, (x) + i, (n) - i) : s_[r]; \
    } while (0)
KERNEL void dot4_bf16(const uint16_t *const w[4], const float *x, int n, float out[4]) { DOT4_SIMD(uint16_t, V_LOAD_BF16, w, x, n, out, dot_bf16_ref); }
KERNEL void dot4_f16(const uint16_t *const w[4], const float *x, int n, float out[4]) { DOT4_SIMD(uint16_t, V_LOAD_F16, w, x, n, out, dot_f16_ref); }
KERNEL void dot4_f32(const float *const w[4], const float *x, int n, float out[4]) { DOT4_SIMD(float, V_LOAD_F32, w, x, n, out, dot_f32_ref); }
#else
KERNEL void dot4_bf16(const uint16_t *const w[4], const float *x, int n, float out[4]) { for (int r = 0; r < 4; r++) out[r] = dot_bf16(w[r], x, n); }
KERNEL void dot4_f16(const uint16_t *const w[4], const float *x, int n, float out[4]) { for (int r = 0; r < 4; r++) out[r] = dot_f16(w[r], x, n); }
KERNEL void dot4_f32(const float *const w[4], const float *x, int n, float out[4]) { for (int r = 0; r < 4; r++) out[r] = dot_f32(w[r], x, n); }
#endif
#if defined(__AVX512F__)
/* dot4 for two inputs x and x + xs at once: each weight vector loaded and converted once for both;
 * each sum dot_w's, in its order (the same bits). */
#define DOT4_X2_AVX512(T, LOAD, w, x, xs, n, out, tail_ref)                                              \
    do {                                                                                                 \
        __m512 a[2][4], b[2][4];                                                                         \
        for (int t = 0; t < 2; t++)                                                                      \
            for (int r = 0; r < 4; r++) a[t][r] = b[t][r] = _mm512_setzero_ps();                         \
        const T *w0 = (w)[0], *w1 = (w)[1], *w2 = (w)[2], *w3 = (w)[3];                                  \
        int i = 0;                                                                                       \
        for (; i + 32 <= (n); i += 32) {                                                                 \
            const __m512 wa[4] = {LOAD(w0 + i), LOAD(w1 + i), LOAD(w2 + i), LOAD(w3 + i)};              \
            const __m512 wb[4] = {LOAD(w0 + i + 16), LOAD(w1 + i + 16), LOAD(w2 + i + 16), LOAD(w3 + i + 16)}; \
            for (int t = 0; t < 2; t++) {                                                                \
                const __m512 x0 = _mm512_loadu_ps((x) + (size_t)t * (xs) + i), x1 = _mm512_loadu_ps((x) + (size_t)t * (xs) + i + 16); \
                for (int r = 0; r < 4; r++) {                                                            \
                    a[t][r] = _mm512_fmadd_ps(wa[r], x0, a[t][r]);                                       \
                    b[t][r] = _mm512_fmadd_ps(wb[r], x1, b[t][r]);                                       \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        const int whole = i + 16 <= (n); /* a whole 16 left: into a, as dot_w */                         \
        if (whole) {                                                                                     \
            const __m512 wa[4] = {LOAD(w0 + i), LOAD(w1 + i), LOAD(w2 + i), LOAD(w3 + i)};              \
            for (int t = 0; t < 2; t++) {                                                                \
                const __m512 x0 = _mm512_loadu_ps((x) + (size_t)t * (xs) + i);                          \
                for (int r = 0; r < 4; r++) a[t][r] = _mm512_fmadd_ps(wa[r], x0, a[t][r]);               \
            }                                                                                            \
            i += 16;                                                                                     \
        }                                                                                                \
        for (int t = 0; t < 2; t++)                                                                      \
            for (int r = 0; r < 4; r++) {                                                                \
                const float s_ = hsum512(_mm512_add_ps(a[t][r], b[t][r]));                                \
                (out)[t][r] = (n) > i ? s_ + tail_ref((w)[r] + i, (x) + (size_t)t * (xs) + i, (n) - i) : s_; \
            }                                                                                            \
    } while (0)
KERNEL void dot4_x2_bf16(const uint16_t *const w[4], const float *x, size_t xs, int n, float out[2][4]) { DOT4_X2_AVX512(uint16_t, load16_bf16, w, x, xs, n, out, dot_bf16_ref); }
KERNEL void dot4_x2_f16(const uint16_t *const w[4], const float *x, size_t xs, int n, float out[2][4]) { DOT4_X2_AVX512(uint16_t, load16_f16, w, x, xs, n, out, dot_f16_ref); }
KERNEL void dot4_x2_f32(const float *const w[4], const float *x, size_t xs, int n, float out[2][4]) { DOT4_X2_AVX512(float, load16_f32, w, x, xs, n, out, dot_f32_ref); }
#endif
#if !defined(__AVX512F__)
/* dot4 for two inputs: two dot4s (AVX2 has 16 registers, not the 16 accumulators and 8 weights) */
KERNEL void dot4_x2_bf16(const uint16_t *const w[4], const float *x, size_t xs, int n, float out[2][4]) { for (int t = 0; t < 2; t++) dot4_bf16(w, x + (size_t)t * xs, n, out[t]); }
KERNEL void dot4_x2_f16(const uint16_t *const w[4], const float *x, size_t xs, int n, float out[2][4]) { for (int t = 0; t < 2; t++) dot4_f16(w, x + (size_t)t * xs, n, out[t]); }
KERNEL void dot4_x2_f32(const float *const w[4], const float *x, size_t xs, int n, float out[2][4]) { for (int t = 0; t < 2; t++) dot4_f32(w, x + (size_t)t * xs, n, out[t]); }
#endif

/* out (n) += a * v (n), v in fp16: the attention's weighted sum of values. */
static inline void axpy_f16_ref(float *out, float a, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) out[i] += a * f16_to_f32_ref(v[i]);
}
/* out[i..) += a * v[i..) 16 (AVX-512) or 8 (AVX2) values at a time while whole, v's elements by
 * LOAD16 / LOAD8; i left at the first not done (the scalar twin's) */
#if defined(__AVX512F__)
#define AXPY_SIMD(LOAD16, LOAD8, out, a, v, n, i)                                                       \
    do {                                                                                               \
        const __m512 va_ = _mm512_set1_ps(a);                                                          \
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_fmadd_ps(va_, LOAD16(v + i), _mm512_loadu_ps(out + i))); \
    } while (0)
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AXPY_SIMD(LOAD16, LOAD8, out, a, v, n, i)                                                       \
    do {                                                                                               \
        const __m256 va_ = _mm256_set1_ps(a);                                                          \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va_, LOAD8(v + i), _mm256_loadu_ps(out + i))); \
    } while (0)
#else
#define AXPY_SIMD(LOAD16, LOAD8, out, a, v, n, i) ((void)0)
#endif
static inline void axpy_f16(float *out, float a, const uint16_t *v, int n) {
    int i = 0;
    AXPY_SIMD(load16_f16, load8_f16, out, a, v, n, i);
    if (i < n) axpy_f16_ref(out + i, a, v + i, n - i);
}

/* ---------------------------------------------------------------------------------------------
 * Layer pieces */

/* 1 / sqrt(mean(x^2) + eps), HF's LlamaRMSNorm scale, accumulated in fp32. */
static inline float rms_scale(const float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}


/* Rotates the pair (a, b) = (x[i], x[i + head_dim/2]) by angle pos * inv_freq[i]. */
static inline void rope_rotate(float *a, float *b, int pos, float inv_freq) {
    float angle = (float)pos * inv_freq;
    float c = cosf(angle), s = sinf(angle);
    float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x1 * c + x0 * s;
}

/* exp(x) for the attention's softmax, one sequence of fp32 operations that the scalar form and the
 * vector forms (16 lanes with AVX-512, 8 with AVX2) run alike, so that a score gets the same bits
 * whichever path exponentiates it (the decode step, a prompt batch; test_cpu_kernels checks them
 * against each other): x = n ln2 + r, n = round(x log2(e)), ln2 in two parts (Cody and Waite);
 * e^r by Cephes's expf polynomial on |r| <= ln2 / 2; times 2^n. Under 1 ulp from exp on [-87, 88]
 * (test_cpu_kernels); 0 below -87 (a weight under 1e-38 of its row's largest, where expf is
 * subnormal), +inf above 88, NaN for NaN. The softmax takes x <= 0. glibc's expf a score at a time
 * was 28% of the CPU prompt's attention (SmolLM2 at depth 1025, docs/performance.md, D132). */
#define EXP_MIN (-87.0f)
#define EXP_MAX 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
static inline float exp_softmax(float x) {
    if (x != x) return x;
    if (x < EXP_MIN) return 0.0f;
    if (x > EXP_MAX) return INFINITY;
    const float n = rintf(x * EXP_LOG2E);
    const float r = fmaf(n, -EXP_LN2_LO, fmaf(n, -EXP_LN2_HI, x));
    float y = fmaf(EXP_P0, r, EXP_P1);
    y = fmaf(y, r, EXP_P2);
    y = fmaf(y, r, EXP_P3);
    y = fmaf(y, r, EXP_P4);
    y = fmaf(y, r, EXP_P5);
    y = fmaf(y, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
}
/* exp_softmax's vector form, written once over E_W lanes (16 with AVX-512, 8 with AVX2) */
#if defined(__AVX512F__)
typedef __m512 exp_vec;
#define E_W 16
#define E_SET1 _mm512_set1_ps
#define E_LOADU _mm512_loadu_ps
#define E_STOREU _mm512_storeu_ps
#define E_MUL _mm512_mul_ps
#define E_ADD _mm512_add_ps
#define E_SUB _mm512_sub_ps
#define E_DIV _mm512_div_ps
#define E_FMA _mm512_fmadd_ps
#define E_RINT(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define E_POW2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define E_WHERE(x, cmp, c, v, then) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, c, cmp), v, then) /* then where x cmp c */
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 exp_vec;
#define E_W 8
#define E_SET1 _mm256_set1_ps
#define E_LOADU _mm256_loadu_ps
#define E_STOREU _mm256_storeu_ps
#define E_MUL _mm256_mul_ps
#define E_ADD _mm256_add_ps
#define E_SUB _mm256_sub_ps
#define E_DIV _mm256_div_ps
#define E_FMA _mm256_fmadd_ps
#define E_RINT(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define E_POW2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define E_WHERE(x, cmp, c, v, then) _mm256_blendv_ps(v, then, _mm256_cmp_ps(x, c, cmp))
#endif
#ifdef E_W
static inline exp_vec exp_softmax_v(exp_vec x) {
    const exp_vec n = E_RINT(E_MUL(x, E_SET1(EXP_LOG2E)));
    const exp_vec r = E_FMA(n, E_SET1(-EXP_LN2_LO), E_FMA(n, E_SET1(-EXP_LN2_HI), x));
    exp_vec y = E_FMA(E_SET1(EXP_P0), r, E_SET1(EXP_P1));
    y = E_FMA(y, r, E_SET1(EXP_P2));
    y = E_FMA(y, r, E_SET1(EXP_P3));
    y = E_FMA(y, r, E_SET1(EXP_P4));
    y = E_FMA(y, r, E_SET1(EXP_P5));
    y = E_ADD(E_FMA(y, E_MUL(r, r), r), E_SET1(1.0f));
    exp_vec e = E_MUL(y, E_POW2(n));
    e = E_WHERE(x, _CMP_LT_OQ, E_SET1(EXP_MIN), e, E_SET1(0.0f));
    e = E_WHERE(x, _CMP_GT_OQ, E_SET1(EXP_MAX), e, E_SET1(INFINITY));
    return E_WHERE(x, _CMP_UNORD_Q, x, e, x);
}
#endif

/* a[t] = exp_softmax(a[t] - max) for t < n: E_W at a time in vectors, the rest one by one */
static inline void exp_shifted(float *a, int n, float max) {
    int t = 0;
#ifdef E_W
    for (; t + E_W <= n; t += E_W) E_STOREU(a + t, exp_softmax_v(E_SUB(E_LOADU(a + t), E_SET1(max))));
#endif
    for (; t < n; t++) a[t] = exp_softmax(a[t] - max);
}
/* SiLU, x / (1 + e^-x), with e^-x by exp_softmax (its scalar and vector forms give the same bits, so
 * the decode step's scalar SiLU and a prompt batch's vectors agree): glibc's expf a value at a time
 * was ~10% of the default model's gate/up prompt stage. Under 1 ulp from exp (exp_softmax), +-0 and
 * NaN kept; below -87 the exponent is +inf and silu -0. */
static inline float silu(float x) { return x / (1.0f + exp_softmax(-x)); }

/* h[i] = silu(g[i]) * h[i] for i < n: E_W at a time in vectors, the rest one by one */
static inline void silu_mul(float *h, const float *g, int n) {
    int i = 0;
#ifdef E_W
    for (; i + E_W <= n; i += E_W) {
        const exp_vec x = E_LOADU(g + i);
        const exp_vec e = exp_softmax_v(E_SUB(E_SET1(-0.0f), x)); /* -0 - x: -x exactly, zeros' signs too */
        E_STOREU(h + i, E_MUL(E_DIV(x, E_ADD(E_SET1(1.0f), e)), E_LOADU(h + i)));
    }
#endif
    for (; i < n; i++) h[i] = silu(g[i]) * h[i];
}
#undef E_W
#undef E_SET1
#undef E_LOADU
#undef E_STOREU
#undef E_MUL
#undef E_ADD
#undef E_SUB
#undef E_DIV
#undef E_FMA
#undef E_RINT
#undef E_POW2
#undef E_WHERE

/* One query head over positions 0..n_pos-1 of one KV head:
 *   out (head_dim) = softmax(q . k_t / sqrt(head_dim)) . v_t
 * k, v: the KV head's first position; position t lies t * stride elements further.
 * att (n_pos): scratch for the scores. */
static inline void attention_head(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                                  size_t stride, int n_pos, int head_dim, float *att) {
    float scale = 1.0f / sqrtf((float)head_dim), max = -INFINITY;
    for (int t = 0; t < n_pos; t++) {
        att[t] = dot_f16(k + (size_t)t * stride, q, head_dim) * scale;
        if (att[t] > max) max = att[t];
    }
    float sum = 0.0f;
    exp_shifted(att, n_pos, max);
    for (int t = 0; t < n_pos; t++) sum += att[t];
    float inv = 1.0f / sum;
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int t = 0; t < n_pos; t++) axpy_f16(out, att[t] * inv, v + (size_t)t * stride, head_dim);
}

/* attention_heads_x4's softmax: each row r of att over its n_pos[r] scores exponentiated (less its
 * max[r]) in place, inv[r] one over their sum, out's rows zeroed for the weighted values */
static inline void softmax_x4(float *att, size_t att_stride, const int n_pos[4], const float max[4], float inv[4], float *out,
                              size_t out_stride, int head_dim) {
    for (int r = 0; r < 4; r++) {
        float *a = att + r * att_stride, sum = 0.0f;
        exp_shifted(a, n_pos[r], max[r]);
        for (int t = 0; t < n_pos[r]; t++) sum += a[t];
        inv[r] = 1.0f / sum;
        for (int i = 0; i < head_dim; i++) out[r * out_stride + i] = 0.0f;
    }
}

#if defined(__AVX512F__)
/* attention_heads_x4's (and _q8's) weighted sums of values where head_dim is a multiple of 64: the
 * four rows' 64 outputs at a time in 16 registers over positions [0, n_max), from zero, row r adding
 * P(r, t) times position t's values (LOAD16: 16 of them widened) while t < n_pos[r]. The same
 * multiply-adds, in the same order, as storing each row's outputs back after every position. */
#define WEIGHTED_SUM_X4_REGS(LOAD16, P)                                                                   \
    for (int i = 0; i < head_dim; i += 64) {                                                             \
        __m512 o[4][4];                                                                                   \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int c = 0; c < 4; c++) o[r][c] = _mm512_setzero_ps();                                    \
        for (int t = 0; t < n_max; t++) {                                                                 \
            const size_t at = (size_t)t * stride + i;                                                     \
            const __m512 v0 = LOAD16(v + at), v1 = LOAD16(v + at + 16), v2 = LOAD16(v + at + 32), v3 = LOAD16(v + at + 48); \
            for (int r = 0; r < 4; r++)                                                                   \
                if (t < n_pos[r]) {                                                                       \
                    const __m512 p = _mm512_set1_ps(P(r, t));                                             \
                    o[r][0] = _mm512_fmadd_ps(p, v0, o[r][0]);                                            \
                    o[r][1] = _mm512_fmadd_ps(p, v1, o[r][1]);                                            \
                    o[r][2] = _mm512_fmadd_ps(p, v2, o[r][2]);                                            \
                    o[r][3] = _mm512_fmadd_ps(p, v3, o[r][3]);                                            \
                }                                                                                         \
        }                                                                                                 \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(out + r * out_stride + i + 16 * c, o[r][c]);     \
    }
#endif

#if defined(__AVX512F__)
/* attention_heads_x4's (and _q8's) scores from position t on, four positions at a time where
 * head_dim is a multiple of 16: their 16 dot products' vectors summed by one hsum512_x16 (each the
 * tree its hsum512 alone takes: the same bits), each scaled by SCORE(s, position) into att and the
 * rows' maxima, row by row in position order as the loop a position at a time does after it. */
#define SCORES_X4_AVX512(LOAD, SCORE)                                                                    \
    for (; t + 4 <= n_max && head_dim % 16 == 0; t += 4) {                                               \
        __m512 v[16];                                                                                    \
        for (int p = 0; p < 4; p++) {                                                                    \
            int i_;                                                                                      \
            DOT_X4_VECS_AVX512(LOAD, k + (size_t)(t + p) * stride, q, q_stride, head_dim, v + 4 * p, i_); \
            (void)i_;                                                                                    \
        }                                                                                                \
        float s16[16]; /* row r's four at 4 r */                                                         \
        _mm512_storeu_ps(s16, hsum512_x16(v));                                                           \
        for (int r = 0; r < 4; r++)                                                                      \
            for (int p = 0; p < 4 && t + p < n_pos[r]; p++) {                                            \
                float *a = att + r * att_stride + t + p;                                                 \
                *a = SCORE(s16[4 * r + p], t + p);                                                       \
                if (*a > max[r]) max[r] = *a;                                                            \
            }                                                                                            \
    }
#endif

/* attention_head for four queries of one KV head at once (a prefill batch's four tokens, one query
 * head): q rows q_stride apart, out rows out_stride apart, query r over positions [0, n_pos[r]);
 * att holds four rows of att_stride scores. Each key and value is converted once for the four
 * (dot_x4_f16; the weighted sum's 16 values at a time), and each row's sums are attention_head's,
 * in its order: the same bits. */
static inline void attention_heads_x4(float *out, size_t out_stride, const float *q, size_t q_stride, const uint16_t *k,
                                      const uint16_t *v, size_t stride, const int n_pos[4], int head_dim, float *att,
                                      size_t att_stride) {
    const float scale = 1.0f / sqrtf((float)head_dim);
    int n_max = 0;
    for (int r = 0; r < 4; r++) n_max = n_pos[r] > n_max ? n_pos[r] : n_max;
    float max[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, inv[4];
    int t = 0;
#if defined(__AVX512F__)
#define SCORE_F16(s, pos) ((s) * scale)
    SCORES_X4_AVX512(load16_f16, SCORE_F16);
#undef SCORE_F16
#endif
    for (; t < n_max; t++) {
        float s[4];
        dot_x4_f16(k + (size_t)t * stride, q, q_stride, head_dim, s);
        for (int r = 0; r < 4; r++)
            if (t < n_pos[r]) {
                float *a = att + r * att_stride;
                a[t] = s[r] * scale;
                if (a[t] > max[r]) max[r] = a[t];
            }
    }
    softmax_x4(att, att_stride, n_pos, max, inv, out, out_stride, head_dim);
#if defined(__AVX512F__)
    if (head_dim % 64 == 0) {
#define P_F16(r, t) (att[(r) * att_stride + (t)] * inv[r])
        WEIGHTED_SUM_X4_REGS(load16_f16, P_F16);
#undef P_F16
        return;
    }
    if (head_dim % 16 == 0) {
        for (int t = 0; t < n_max; t++)
            for (int i = 0; i < head_dim; i += 16) {
                const __m512 vv = load16_f16(v + (size_t)t * stride + i);
                for (int r = 0; r < 4; r++)
                    if (t < n_pos[r]) {
                        float *o = out + r * out_stride + i;
                        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(att[r * att_stride + t] * inv[r]), vv, _mm512_loadu_ps(o)));
                    }
            }
        return;
    }
#endif
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < n_pos[r]; t++)
            axpy_f16(out + r * out_stride, att[r * att_stride + t] * inv[r], v + (size_t)t * stride, head_dim);
}

/* ---------------------------------------------------------------------------------------------
 * The 8-bit KV cache (--kv-cache q8). Each position's key or value vector of a KV head is stored as
 * head_dim int8 and one fp32 scale d, by the rules of docs/architecture.md ("The KV cache"), which the GPU and the
 * NumPy reference (tests/reference.py) follow to the same bits. Attention never dequantizes an
 * element: the key's d multiplies the score, the value's d the probability. */

/* q (n) = x (n) as int8 and the scale d it returns: d = max|x| / 127, q_i = rint(x_i * 127 / max|x|)
 * (fp32 divisions and product, ties to even). A vector holding NaN or infinity gets d = NaN (NaN in
 * every score and output that reads it), an all-zero one d = 0; both store q = 0. */
/* Below this largest magnitude a vector is stored as zeros (d = 0): 127 / m would overflow near
 * 1e-37 (docs/architecture.md, "The KV cache"; runtime/cuda_kv.cuh's the same) */
#define KV_Q8_TINY 0x1p-100f
static inline float kv_quantize_q8(int8_t *q, const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        m = (a > m || a != a) ? a : m; /* NaN-propagating max */
    }
    if (!(m <= FLT_MAX) || m < KV_Q8_TINY) {
        for (int i = 0; i < n; i++) q[i] = 0; /* a loop: memset((size_t)n) of an n read at run time trips -Wstringop-overflow */
        return m < KV_Q8_TINY ? 0.0f : NAN;
    }
    const float id = 127.0f / m;
    for (int i = 0; i < n; i++) q[i] = (int8_t)rintf(x[i] * id);
    return m / 127.0f;
}

/* k (n) int8 . x (n) fp32, the sum of a score before its scales: dot_w's loop (four accumulators,
 * then the tail) over int8 elements, and four queries at once as dot_x4_w (the same bits). */
static inline float dot_i8_ref(const int8_t *k, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += (float)k[i] * x[i];
    return s;
}
#if defined(__AVX512F__)
KERNEL float dot_i8(const int8_t *k, const float *x, int n) { DOT_AVX512(load16_i8, k, x, n, dot_i8_ref); }
KERNEL void dot_x4_i8(const int8_t *k, const float *x, size_t xs, int n, float out[4]) { DOT_X4_AVX512(load16_i8, k, x, xs, n, out, dot_i8_ref); }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
KERNEL float dot_i8(const int8_t *k, const float *x, int n) { DOT_AVX2(load8_i8, k, x, n, dot_i8_ref); }
KERNEL void dot_x4_i8(const int8_t *k, const float *x, size_t xs, int n, float out[4]) { for (int t = 0; t < 4; t++) out[t] = dot_i8(k, x + (size_t)t * xs, n); }
#else
KERNEL float dot_i8(const int8_t *k, const float *x, int n) { return dot_i8_ref(k, x, n); }
KERNEL void dot_x4_i8(const int8_t *k, const float *x, size_t xs, int n, float out[4]) { for (int t = 0; t < 4; t++) out[t] = dot_i8(k, x + (size_t)t * xs, n); }
#endif

/* out (n) += a * v (n), v int8: the weighted sum of values, a = probability * the value's d. */
static inline void axpy_i8_ref(float *out, float a, const int8_t *v, int n) {
    for (int i = 0; i < n; i++) out[i] += a * (float)v[i];
}
static inline void axpy_i8(float *out, float a, const int8_t *v, int n) {
    int i = 0;
    AXPY_SIMD(load16_i8, load8_i8, out, a, v, n, i);
    if (i < n) axpy_i8_ref(out + i, a, v + i, n - i);
}

/* attention_head over an 8-bit cache: k, v the KV head's first position's int8 vectors (position t
 * t * stride elements further), kd, vd their scales (position t's t * d_stride floats further):
 *   out (head_dim) = sum_t p_t * vd_t * v_t / sum_t p_t,  p_t = exp(s_t - max),  s_t = (q . k_t) * kd_t / sqrt(head_dim)
 * att (n_pos): scratch for the scores. */
static inline void attention_head_q8(float *out, const float *q, const int8_t *k, const int8_t *v, const float *kd, const float *vd,
                                     size_t stride, size_t d_stride, int n_pos, int head_dim, float *att) {
    float scale = 1.0f / sqrtf((float)head_dim), max = -INFINITY;
    for (int t = 0; t < n_pos; t++) {
        att[t] = dot_i8(k + (size_t)t * stride, q, head_dim) * kd[(size_t)t * d_stride] * scale;
        if (att[t] > max) max = att[t];
    }
    float sum = 0.0f;
    exp_shifted(att, n_pos, max);
    for (int t = 0; t < n_pos; t++) sum += att[t];
    float inv = 1.0f / sum;
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int t = 0; t < n_pos; t++) axpy_i8(out, att[t] * inv * vd[(size_t)t * d_stride], v + (size_t)t * stride, head_dim);
}

/* attention_heads_x4 over an 8-bit cache: four queries of one KV head at once, each key and value
 * converted once for the four, each row's sums attention_head_q8's in its order (the same bits). */
static inline void attention_heads_x4_q8(float *out, size_t out_stride, const float *q, size_t q_stride, const int8_t *k,
                                         const int8_t *v, const float *kd, const float *vd, size_t stride, size_t d_stride,
                                         const int n_pos[4], int head_dim, float *att, size_t att_stride) {
    const float scale = 1.0f / sqrtf((float)head_dim);
    int n_max = 0;
    for (int r = 0; r < 4; r++) n_max = n_pos[r] > n_max ? n_pos[r] : n_max;
    float max[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, inv[4];
    int t = 0;
#if defined(__AVX512F__)
#define SCORE_I8(s, pos) ((s) * kd[(size_t)(pos) * d_stride] * scale)
    SCORES_X4_AVX512(load16_i8, SCORE_I8);
#undef SCORE_I8
#endif
    for (; t < n_max; t++) {
        float s[4];
        dot_x4_i8(k + (size_t)t * stride, q, q_stride, head_dim, s);
        for (int r = 0; r < 4; r++)
            if (t < n_pos[r]) {
                float *a = att + r * att_stride;
                a[t] = s[r] * kd[(size_t)t * d_stride] * scale;
                if (a[t] > max[r]) max[r] = a[t];
            }
    }
    softmax_x4(att, att_stride, n_pos, max, inv, out, out_stride, head_dim);
#if defined(__AVX512F__)
    if (head_dim % 64 == 0) {
#define P_I8(r, t) (att[(r) * att_stride + (t)] * inv[r] * vd[(size_t)(t) * d_stride])
        WEIGHTED_SUM_X4_REGS(load16_i8, P_I8);
#undef P_I8
        return;
    }
    if (head_dim % 16 == 0) {
        for (int t = 0; t < n_max; t++)
            for (int i = 0; i < head_dim; i += 16) {
                const __m512 vv = load16_i8(v + (size_t)t * stride + i);
                for (int r = 0; r < 4; r++)
                    if (t < n_pos[r]) {
                        float *o = out + r * out_stride + i;
                        const float p = att[r * att_stride + t] * inv[r] * vd[(size_t)t * d_stride];
                        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(p), vv, _mm512_loadu_ps(o)));
                    }
            }
        return;
    }
#endif
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < n_pos[r]; t++)
            axpy_i8(out + r * out_stride, att[r * att_stride + t] * inv[r] * vd[(size_t)t * d_stride], v + (size_t)t * stride, head_dim);
}

/* ---------------------------------------------------------------------------------------------
 * Weight-dtype dispatch for a generated model: MODEL_WEIGHT_DTYPE_* comes from model_config.h. */
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define dot_w dot_bf16
#define dot4_w dot4_bf16
#define dot_x4_w dot_x4_bf16
#define dot4_x2_w dot4_x2_bf16
#define w_to_f32 bf16_to_f32
#elif defined(MODEL_WEIGHT_DTYPE_F16)
#define dot_w dot_f16
#define dot4_w dot4_f16
#define dot_x4_w dot_x4_f16
#define dot4_x2_w dot4_x2_f16
#define w_to_f32 f16_to_f32
#elif defined(MODEL_WEIGHT_DTYPE_F32)
#define dot_w dot_f32
#define dot4_w dot4_f32
#define dot_x4_w dot_x4_f32
#define dot4_x2_w dot4_x2_f32
#define w_to_f32(x) (x)
#endif

#endif
