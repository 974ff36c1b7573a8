/* quant.c - GGUF's block formats (quant.h): the table, the scalar dequantizer and dot product that
 * are the reference, and the SIMD dot products that are the CPU matvec's inner kernel.
 *
 * The dequantizer must give the gguf package's bits, so each weight is computed with the same
 * operations as its NumPy code (and ggml's dequantize_row_*): the block scale times the integer,
 * then plus or minus the offset. Every product there is exact in fp32 (an fp16 scale has 11
 * significant bits, a K sub-block scale at most 7, the integer at most 5: 23 <= 24), so the one
 * rounding is the offset's add: a fused multiply-add, or any order of the products, gives the same
 * bits. The GPU's dequantization can rely on that too.
 *
 * The SIMD dot products sum q * x over each (sub-)block in fp32 with the integers q exact, then
 * scale the block's sum once: (d * sc) * sum(q * x) - (dmin * m) * sum(x), as llama.cpp's kernels
 * do, so a block costs one multiply per weight. The byte unpacking is written once on 16-byte SSE
 * vectors; V_* below are the only lines that differ between AVX-512 (one 16-lane vector per 16
 * weights) and AVX2 (two 8-lane halves into one 8-lane accumulator). */
#include "quant.h"

#include <string.h>

#include "cpu_kernels.h"

/* ---------------------------------------------------------------------------------------------
 * The table */

static const quant_format formats[] = {
    [QUANT_F32] = {"F32", 1, 4},       [QUANT_F16] = {"F16", 1, 2},
    [QUANT_Q4_0] = {"Q4_0", 32, 18},   [QUANT_Q4_1] = {"Q4_1", 32, 20},
    [QUANT_Q8_0] = {"Q8_0", 32, 34},   [QUANT_Q4_K] = {"Q4_K", QUANT_K, 144},
    [QUANT_Q5_K] = {"Q5_K", QUANT_K, 176}, [QUANT_Q6_K] = {"Q6_K", QUANT_K, 210},
    [QUANT_BF16] = {"BF16", 1, 2},
};

/* Every ggml_type id GGUF defines, for messages about the ones this file does not implement. */
static const char *const type_names[] = {
    [0] = "F32",      [1] = "F16",      [2] = "Q4_0",    [3] = "Q4_1",    [6] = "Q5_0",    [7] = "Q5_1",
    [8] = "Q8_0",     [9] = "Q8_1",     [10] = "Q2_K",   [11] = "Q3_K",   [12] = "Q4_K",   [13] = "Q5_K",
    [14] = "Q6_K",    [15] = "Q8_K",    [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
    [20] = "IQ4_NL",  [21] = "IQ3_S",   [22] = "IQ2_S",  [23] = "IQ4_XS", [24] = "I8",     [25] = "I16",
    [26] = "I32",     [27] = "I64",     [28] = "F64",    [29] = "IQ1_M",  [30] = "BF16",   [34] = "TQ1_0",
    [35] = "TQ2_0",   [39] = "MXFP4",   [40] = "NVFP4",  [41] = "Q1_0",
};

const quant_format *quant_format_of(int type) {
    if (type < 0 || type >= (int)(sizeof formats / sizeof formats[0]) || !formats[type].name) return NULL;
    return &formats[type];
}

const char *quant_type_name(int type) {
    if (type < 0 || type >= (int)(sizeof type_names / sizeof type_names[0])) return NULL;
    return type_names[type];
}

err_code quant_row_bytes(int type, int64_t n, size_t *bytes) {
    const quant_format *f = quant_format_of(type);
    if (!f) {
        const char *name = quant_type_name(type);
        return err_set(ERR_QUANT, "ggml type %d (%s) is not supported; expected one of F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K",
                       type, name ? name : "not a GGUF type");
    }
    if (n <= 0 || n % f->block)
        return err_set(ERR_QUANT, "a row of %lld weights of type %s: expected a positive multiple of its block of %d",
                       (long long)n, f->name, f->block);
    if (n > INT32_MAX) return err_set(ERR_QUANT, "a row of %lld weights of type %s: expected at most %d", (long long)n, f->name, INT32_MAX);
    *bytes = (size_t)(n / f->block) * (size_t)f->bytes;
    return ERR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Scalar dequantizer: one block of each format into y (its block of weights) */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

size_t quant_first_nonfinite_block(int type, const void *blocks, size_t bytes, int *is_nan) {
    /* each format's fp16 fields: their offsets in its block (-1: none) */
    int at[2] = {0, -1};
    if (type == QUANT_Q4_1 || type == QUANT_Q4_K || type == QUANT_Q5_K) at[1] = 2;
    if (type == QUANT_Q6_K) at[0] = 208;
    const quant_format *f = quant_format_of(type);
    const size_t n = bytes / (size_t)f->bytes;
    const uint8_t *b = blocks;
    for (size_t i = 0; i < n; i++, b += f->bytes)
        for (int k = 0; k < 2; k++)
            if (at[k] >= 0 && (rd16(b + at[k]) & 0x7C00) == 0x7C00) {
                *is_nan = (rd16(b + at[k]) & 0x03FF) != 0;
                return i;
            }
    return n;
}
static inline float rd_f16(const uint8_t *p) { return f16_to_f32_ref(rd16(p)); }

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (ggml's get_scale_min_k4):
 * bytes 0-3 hold scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4
 * bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top 2 bits
 * of bytes 0-3 (scales) and 4-7 (mins). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void dequant_q8_0(const uint8_t *b, float *y) {
    const float d = rd_f16(b);
    for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
}

static void dequant_q4_0(const uint8_t *b, float *y) {
    const float d = rd_f16(b);
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((qs[i] & 0xF) - 8);
        y[i + 16] = d * (float)((qs[i] >> 4) - 8);
    }
}

static void dequant_q4_1(const uint8_t *b, float *y) {
    const float d = rd_f16(b), m = rd_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)(qs[i] & 0xF) + m;
        y[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]; each 32 bytes of qs are two sub-blocks (low nibbles, then
 * high). Q5_K adds qh[32] before qs: sub-block s takes bit s of qh[l] as its weight l's 5th bit. */
static void dequant_q45_k(const uint8_t *b, float *y, int five) {
    const float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int j = 0; j < 4; j++) {
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * j, scales, &sc0, &m0);
        scale_min_k4(2 * j + 1, scales, &sc1, &m1);
        const float d0 = d * (float)sc0, dm0 = dmin * (float)m0, d1 = d * (float)sc1, dm1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            const int h0 = five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0, h1 = five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
            y[64 * j + l] = d0 * (float)((qs[32 * j + l] & 0xF) | h0) - dm0;
            y[64 * j + 32 + l] = d1 * (float)((qs[32 * j + l] >> 4) | h1) - dm1;
        }
    }
}

/* Q6_K: ql[128], qh[64], scales[16], d. Each half of 128 weights takes 64 bytes of ql and 32 of
 * qh: weight l + 32 * k (k = 0..3) is the low (k = 0, 1) or high (k = 2, 3) nibble of
 * ql[l + 32 * (k & 1)] with bits 2k, 2k+1 of qh[l] on top, minus 32; one scale per 16 weights. */
static void dequant_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = rd_f16(b + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const int lo = k < 2 ? ql[l + 32 * k] & 0xF : ql[l + 32 * (k - 2)] >> 4;
                const int q = (lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
                y[32 * k + l] = d * (float)sc[2 * k + l / 16] * (float)q;
            }
}

/* The weights of block i of row into y (the format's block of floats). */
static inline void dequant_block(int type, const uint8_t *row, int64_t i, float *y) {
    switch (type) {
    case QUANT_F32: memcpy(y, row + 4 * i, 4); break;
    case QUANT_F16: y[0] = rd_f16(row + 2 * i); break;
    case QUANT_BF16: y[0] = bf16_to_f32(rd16(row + 2 * i)); break;
    case QUANT_Q8_0: dequant_q8_0(row + 34 * i, y); break;
    case QUANT_Q4_0: dequant_q4_0(row + 18 * i, y); break;
    case QUANT_Q4_1: dequant_q4_1(row + 20 * i, y); break;
    case QUANT_Q4_K: dequant_q45_k(row + 144 * i, y, 0); break;
    case QUANT_Q5_K: dequant_q45_k(row + 176 * i, y, 1); break;
    case QUANT_Q6_K: dequant_q6_k(row + 210 * i, y); break;
    }
}

void quant_dequantize_row(int type, const void *row, float *y, int n) {
    const int block = formats[type].block;
    for (int i = 0; i < n / block; i++) dequant_block(type, row, i, y + (int64_t)i * block);
}

float quant_dot_ref(int type, const void *row, const float *x, int n) {
    const int block = formats[type].block;
    float w[QUANT_K], s = 0.0f;
    for (int i = 0; i < n / block; i++) {
        dequant_block(type, row, i, w);
        for (int j = 0; j < block; j++) s += w[j] * x[(int64_t)i * block + j];
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * SIMD dot products
 *
 * vec: the accumulator (16 lanes on AVX-512, 8 on AVX2). wide16: 16 weights as floats, W16(q)
 * the 16 int8 in q (an __m128i) widened, W16_MEM(p) those at p; V_FMAW(w, x, acc): acc += w times
 * x[0..16), so that weights widened once serve several tokens' inputs. V_XSUM16(x, xs): xs += x[0..16). V_SCALE(f, a, acc): acc += f * a. V_ADD(a, b): a + b.
 * V_HSUM(acc): the sum of its lanes. QV_ZERO(): a zero vec (not cpu_kernels.h's V_ZERO, which is of that
 * header's width: AVX2's where this file is built on SIMDe's AVX-512, tests/quant_simde.c). */
#if !defined(QUANT_SIMD_AVX512) && !defined(QUANT_SIMD_AVX2)
#if defined(__AVX512F__)
#define QUANT_SIMD_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_SIMD_AVX2 1
#endif
#endif

#if defined(QUANT_SIMD_AVX512)
typedef __m512 vec;
typedef struct { __m512 v; } wide16; /* 16 int8 weights as floats */
#define QV_ZERO() _mm512_setzero_ps()
#define W16(q) ((wide16){_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))})
#define W16_MEM(p) W16(ld16(p))
#define V_FMAW(w, x, acc) _mm512_fmadd_ps((w).v, _mm512_loadu_ps(x), (acc))
#define V_XSUM16(x, xs) _mm512_add_ps(_mm512_loadu_ps(x), (xs))
#define V_SCALE(f, a, acc) _mm512_fmadd_ps(_mm512_set1_ps(f), (a), (acc))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_HSUM(acc) _mm512_reduce_add_ps(acc)
#define QUANT_ISA "avx512"
#elif defined(QUANT_SIMD_AVX2)
typedef __m256 vec;
typedef struct { __m256 lo, hi; } wide16; /* 16 int8 weights as floats, 8 and 8 */
#define QV_ZERO() _mm256_setzero_ps()
#define W16(q)                                                                                          \
    ((wide16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128((q), 8)))})
/* from memory, each 8 bytes widened by the load itself (no shift to reach the high half) */
#define W16_MEM(p)                                                                                      \
    ((wide16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))),           \
              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((p) + 8))))})
#define V_FMAW(w, x, acc) _mm256_fmadd_ps((w).hi, _mm256_loadu_ps((x) + 8), _mm256_fmadd_ps((w).lo, _mm256_loadu_ps(x), (acc)))
#define V_XSUM16(x, xs) _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps((x) + 8)), (xs))
#define V_SCALE(f, a, acc) _mm256_fmadd_ps(_mm256_set1_ps(f), (a), (acc))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_HSUM(acc) hsum256(acc)
#define QUANT_ISA "avx2"
#endif

#if defined(QUANT_SIMD_AVX512) || defined(QUANT_SIMD_AVX2)
static inline __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline float ld_f16(const uint8_t *p) { return f16_to_f32(rd16(p)); }

/* x[0..32)'s sum, in the order every kernel below takes it (quant_block_sums stores these) */
static inline float block_sum32(const float *x) { return V_HSUM(V_XSUM16(x + 16, V_XSUM16(x, QV_ZERO()))); }

void quant_block_sums(const float *x, int n, float *sums) {
    for (int i = 0; i < n / 32; i++) sums[i] = block_sum32(x + 32 * (size_t)i);
}

/* Each format's kernel is written once for T tokens' inputs (x + t xs, T at most QT): the weights
 * are unpacked and widened once for all T, and each token's sum takes the same instructions in the
 * same order as it would alone, so quant_dot_x4's four sums are quant_dot's bits (a prompt batch
 * then equals the decode step; tests/quant_cli.c checks it on every path). Always inlined with T a
 * constant, so T = 1 (quant_dot) compiles to the one-token loop.
 *
 * The formats with an offset a block (Q4_1's m, the K formats' mins) add offset times the sum of
 * the block's 32 inputs. Those sums are the input's, the same for every row, so a matrix product
 * takes them from quant_block_sums, computed once per input (sums + t ss: token t's); NULL: each
 * computed here (block_sum32, the same bits). Their products are summed in scalar fp32, two chains
 * (even and odd blocks or sub-blocks), so that no chain of dependent multiply-adds sets the pace. */
#define QT 4
#define INLINE static inline __attribute__((always_inline))

/* Q8_0 and Q4_0: two blocks a step into two accumulators, so that consecutive blocks' scaling
 * multiply-adds do not wait on each other (the K formats keep four, one per scale of a step). */
INLINE void q8_0_block(const uint8_t *b, const float *x, size_t xs, int T, vec *acc) {
    const wide16 w0 = W16_MEM(b + 2), w1 = W16_MEM(b + 18);
    const float d = ld_f16(b);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * xs;
        acc[t] = V_SCALE(d, V_FMAW(w1, xt + 16, V_FMAW(w0, xt, QV_ZERO())), acc[t]);
    }
}

INLINE void q4_0_block(const uint8_t *b, const float *x, size_t xs, int T, vec *acc) {
    const __m128i m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8), q = ld16(b + 2);
    const wide16 w0 = W16(_mm_sub_epi8(_mm_and_si128(q, m4), eight)), w1 = W16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight));
    const float d = ld_f16(b);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * xs;
        acc[t] = V_SCALE(d, V_FMAW(w1, xt + 16, V_FMAW(w0, xt, QV_ZERO())), acc[t]);
    }
}

#define TWO_BLOCK_DOT(NAME, BLOCK, BYTES)                                                                \
    INLINE void NAME(const uint8_t *b, const float *x, size_t xs, int nb, int T, float *o) {              \
        vec a0[QT], a1[QT];                                                                               \
        for (int t = 0; t < T; t++) a0[t] = a1[t] = QV_ZERO();                                             \
        int i = 0;                                                                                        \
        for (; i + 2 <= nb; i += 2) {                                                                     \
            BLOCK(b + (BYTES) * i, x + 32 * i, xs, T, a0);                                                \
            BLOCK(b + (BYTES) * (i + 1), x + 32 * (i + 1), xs, T, a1);                                    \
        }                                                                                                 \
        if (i < nb) BLOCK(b + (BYTES) * i, x + 32 * i, xs, T, a0);                                        \
        for (int t = 0; t < T; t++) o[t] = V_HSUM(V_ADD(a0[t], a1[t]));                                   \
    }
TWO_BLOCK_DOT(dot_q8_0, q8_0_block, 34)
TWO_BLOCK_DOT(dot_q4_0, q4_0_block, 18)

INLINE void dot_q4_1(const uint8_t *b, const float *x, size_t xs, const float *sums, size_t ss, int nb, int T, float *o) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    vec acc[QT];
    float accm[QT][2];
    for (int t = 0; t < T; t++) acc[t] = QV_ZERO(), accm[t][0] = accm[t][1] = 0.0f;
    for (int i = 0; i < nb; i++, b += 20, x += 32) {
        const __m128i q = ld16(b + 4);
        const wide16 lo = W16(_mm_and_si128(q, m4)), hi = W16(_mm_and_si128(_mm_srli_epi16(q, 4), m4));
        const float d = ld_f16(b), m = ld_f16(b + 2);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * xs;
            const vec s = V_FMAW(hi, xt + 16, V_FMAW(lo, xt, QV_ZERO()));
            acc[t] = V_SCALE(d, s, acc[t]);
            accm[t][i % 2] = fmaf(m, sums ? sums[(size_t)t * ss + i] : block_sum32(xt), accm[t][i % 2]);
        }
    }
    for (int t = 0; t < T; t++) o[t] = V_HSUM(acc[t]) + (accm[t][0] + accm[t][1]);
}

/* Q4_K and Q5_K: per 64 weights, two sub-blocks from 32 bytes of qs (low nibbles, high nibbles),
 * each OR'd with its bit of qh (Q5_K: bit 2j of each qh byte for sub-block 2j, 2j+1 for the next;
 * qh is shifted right by 2 per j, and a 16-bit shift only moves bits across bytes above the one
 * bit masked). */
INLINE void dot_q45_k(const uint8_t *b, const float *x, size_t xs, const float *sums, size_t ss, int nb, int five, int T,
                      float *o) {
    const __m128i m4 = _mm_set1_epi8(0xF), one = _mm_set1_epi8(1);
    const int bytes = five ? 176 : 144;
    vec acc[QT][2];
    float mins[QT][2];
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = QV_ZERO(), mins[t][0] = mins[t][1] = 0.0f;
    for (int i = 0; i < nb; i++, b += bytes) {
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        const uint8_t *scales = b + 4, *qs = b + (five ? 48 : 16);
        __m128i h0 = five ? ld16(b + 16) : _mm_setzero_si128(), h1 = five ? ld16(b + 32) : _mm_setzero_si128();
        /* The sub-blocks' scales as floats, read back by broadcasts from memory (a load each,
         * where a broadcast from a register takes the shuffle unit that widening needs). */
        float dsc[8], dmn[8];
        for (int s = 0; s < 8; s++) {
            int sc, m;
            scale_min_k4(s, scales, &sc, &m);
            dsc[s] = d * (float)sc;
            dmn[s] = -(dmin * (float)m);
        }
        for (int t = 0; t < T; t++)
            for (int s = 0; s < 8; s++) {
                const float *xt = x + (size_t)t * xs + 256 * (size_t)i + 32 * s;
                mins[t][s % 2] = fmaf(dmn[s], sums ? sums[(size_t)t * ss + 8 * (size_t)i + s] : block_sum32(xt), mins[t][s % 2]);
            }
        for (int j = 0; j < 4; j++, qs += 32) {
            const __m128i a0 = ld16(qs), a1 = ld16(qs + 16);
            __m128i lo0 = _mm_and_si128(a0, m4), lo1 = _mm_and_si128(a1, m4);
            __m128i hi0 = _mm_and_si128(_mm_srli_epi16(a0, 4), m4), hi1 = _mm_and_si128(_mm_srli_epi16(a1, 4), m4);
            if (five) {
                lo0 = _mm_or_si128(lo0, _mm_slli_epi16(_mm_and_si128(h0, one), 4));
                lo1 = _mm_or_si128(lo1, _mm_slli_epi16(_mm_and_si128(h1, one), 4));
                hi0 = _mm_or_si128(hi0, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h0, 1), one), 4));
                hi1 = _mm_or_si128(hi1, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h1, 1), one), 4));
                h0 = _mm_srli_epi16(h0, 2);
                h1 = _mm_srli_epi16(h1, 2);
            }
            const wide16 wl0 = W16(lo0), wl1 = W16(lo1), wh0 = W16(hi0), wh1 = W16(hi1);
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * xs + 256 * (size_t)i + 64 * j;
                const vec s0 = V_FMAW(wl1, xt + 16, V_FMAW(wl0, xt, QV_ZERO()));
                const vec s1 = V_FMAW(wh1, xt + 48, V_FMAW(wh0, xt + 32, QV_ZERO()));
                acc[t][0] = V_SCALE(dsc[2 * j], s0, acc[t][0]);
                acc[t][1] = V_SCALE(dsc[2 * j + 1], s1, acc[t][1]);
            }
        }
    }
    for (int t = 0; t < T; t++) o[t] = V_HSUM(V_ADD(acc[t][0], acc[t][1])) + (mins[t][0] + mins[t][1]);
}

/* Q6_K: per half of 128 weights, four groups of 32 (see dequant_q6_k), each two groups of 16 with
 * a scale of their own. */
INLINE void dot_q6_k(const uint8_t *b, const float *x, size_t xs, int nb, int T, float *o) {
    const __m128i m4 = _mm_set1_epi8(0xF), m2 = _mm_set1_epi8(3), c32 = _mm_set1_epi8(32);
    vec acc[QT][4];
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = QV_ZERO();
    for (int i = 0; i < nb; i++, b += 210) {
        const float d = ld_f16(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        float dsc[16]; /* as in dot_q45_k: broadcast from memory */
        for (int s = 0; s < 16; s++) dsc[s] = d * (float)(int8_t)b[192 + s];
        const float *sc = dsc;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8) {
            const __m128i l[4] = {ld16(ql), ld16(ql + 16), ld16(ql + 32), ld16(ql + 48)};
            __m128i h[2] = {ld16(qh), ld16(qh + 16)};
            for (int k = 0; k < 4; k++) {
                for (int p = 0; p < 2; p++) { /* weights 32k + 16p .. + 16 */
                    const __m128i lb = l[2 * (k & 1) + p];
                    const __m128i lo = k < 2 ? _mm_and_si128(lb, m4) : _mm_and_si128(_mm_srli_epi16(lb, 4), m4);
                    const wide16 w = W16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(h[p], m2), 4)), c32));
                    for (int t = 0; t < T; t++) {
                        const float *xt = x + (size_t)t * xs + 256 * (size_t)i + 128 * half + 32 * k + 16 * p;
                        acc[t][2 * (k & 1) + p] = V_SCALE(sc[2 * k + p], V_FMAW(w, xt, QV_ZERO()), acc[t][2 * (k & 1) + p]);
                    }
                }
                h[0] = _mm_srli_epi16(h[0], 2);
                h[1] = _mm_srli_epi16(h[1], 2);
            }
        }
    }
    for (int t = 0; t < T; t++) o[t] = V_HSUM(V_ADD(V_ADD(acc[t][0], acc[t][1]), V_ADD(acc[t][2], acc[t][3])));
}

/* The block formats' T-token dot; the dense types one token at a time (the CPU forward's dense rows
 * take cpu_kernels.h's kernels, not these). */
INLINE void quant_dot_t(int type, const void *row, const float *x, size_t xs, const float *sums, size_t ss, int n, int T,
                        float *o) {
    const uint8_t *b = row;
    switch (type) {
    case QUANT_Q8_0: dot_q8_0(b, x, xs, n / 32, T, o); return;
    case QUANT_Q4_0: dot_q4_0(b, x, xs, n / 32, T, o); return;
    case QUANT_Q4_1: dot_q4_1(b, x, xs, sums, ss, n / 32, T, o); return;
    case QUANT_Q4_K: dot_q45_k(b, x, xs, sums, ss, n / QUANT_K, 0, T, o); return;
    case QUANT_Q5_K: dot_q45_k(b, x, xs, sums, ss, n / QUANT_K, 1, T, o); return;
    case QUANT_Q6_K: dot_q6_k(b, x, xs, n / QUANT_K, T, o); return;
    }
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * xs;
        o[t] = type == QUANT_F32 ? dot_f32(row, xt, n) : type == QUANT_F16 ? dot_f16(row, xt, n) : type == QUANT_BF16 ? dot_bf16(row, xt, n) : 0.0f;
    }
}

float quant_dot(int type, const void *row, const float *x, int n) {
    float o;
    quant_dot_t(type, row, x, 0, NULL, 0, n, 1, &o);
    return o;
}

float quant_dot_s(int type, const void *row, const float *x, const float *sums, int n) {
    float o;
    quant_dot_t(type, row, x, 0, sums, 0, n, 1, &o);
    return o;
}

void quant_dot_x4(int type, const void *row, const float *x, size_t xs, int n, float o[4]) {
    quant_dot_t(type, row, x, xs, NULL, 0, n, 4, o);
}

void quant_dot_x4_s(int type, const void *row, const float *x, size_t xs, const float *sums, size_t ss, int n, float o[4]) {
    quant_dot_t(type, row, x, xs, sums, ss, n, 4, o);
}
#else
#define QUANT_ISA "scalar"
void quant_block_sums(const float *x, int n, float *sums) {
    for (int i = 0; i < n / 32; i++) {
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += x[32 * (size_t)i + j];
        sums[i] = s;
    }
}
float quant_dot(int type, const void *row, const float *x, int n) { return quant_dot_ref(type, row, x, n); }
float quant_dot_s(int type, const void *row, const float *x, const float *sums, int n) {
    (void)sums; /* the scalar twin sums each block's weights times its inputs as they come */
    return quant_dot_ref(type, row, x, n);
}
void quant_dot_x4(int type, const void *row, const float *x, size_t xs, int n, float o[4]) {
    for (int t = 0; t < 4; t++) o[t] = quant_dot_ref(type, row, x + (size_t)t * xs, n);
}
void quant_dot_x4_s(int type, const void *row, const float *x, size_t xs, const float *sums, size_t ss, int n, float o[4]) {
    (void)sums, (void)ss;
    quant_dot_x4(type, row, x, xs, n, o);
}
#endif

const char *quant_dot_isa(void) { return QUANT_ISA; }
