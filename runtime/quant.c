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
 * The block formats' dot products take the input quantized to 16-bit integers, once per input
 * vector (quant_input, issue 59: the GPU takes the same), so that a block's products are integer
 * multiply-adds (a pair of blocks, 64 weights, in two vpmaddwd, or vpmaddwd and vpdpwssd, on
 * AVX-512; for one token on AVX512-VNNI two vpdpbusd on the weights as bytes) instead of each
 * weight widened to fp32 and multiplied there, which bound the matvec by
 * the unpacking rather than by memory (7B Q4_0 decode read 47% of the bandwidth on 16 cores). Each block's integer sum is exact and scaled
 * once; the fp32 order of those block results (block_terms) is written once in the scalar twin and
 * every SIMD path keeps it bit for bit (tests/quant_cli.c fails on any difference). */
#include "quant.h"

#include <float.h>
#include <math.h>
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

/* ---------------------------------------------------------------------------------------------
 * The quantized input
 *
 * Block i of x (x[32 i .. 32 i + 32)) becomes 32 int16 x16 and a scale dx (quant.h has the rule),
 * and s = dx * (float)S, S = sum of its x16, the one product the offset formats (Q4_1's m, the K
 * formats' mins) take of it. A buffer of QUANT_INPUT_BYTES(n) holds, for nb8 = n / 32 rounded up to
 * a multiple of 8 (a group of 8 blocks is what a SIMD step sums; the blocks past n / 32 are zeros):
 *
 *   int16 q[nb8 * 32]   in pairs of blocks: pair p is x16 of block 2p [0..16), of 2p+1 [0..16),
 *                       of 2p [16..32), of 2p+1 [16..32), so that one 32-lane int16 vector holds
 *                       16 weights of each of two blocks and a multiply-add of pairs leaves each
 *                       block's sums in its own 8 int32 lanes (half the reduction a block's own
 *                       16 lanes would take)
 *   float d[nb8]        dx
 *   float s[nb8]        dx * (float)S
 *   uint8 lo[nb8 * 32]  x16 & 0xFF, blocks in order (so x16 = 256 hi + lo): the bytes AVX512-VNNI's
 *   int8 hi[nb8 * 32]   x16 >> 8    vpdpbusd multiplies with a pair of blocks' weights as bytes,
 *                                   without widening them to int16 (wts_dot's bytes path)
 *   int32 sv[nb8]       S
 *   int32 hv[nb8]       the sum of the block's hi
 *
 * x16 = the nearest integer to x * inv, ties to even: fmaf(x, inv, 1.5 * 2^23) rounds the exact
 * product once, into [2^23, 2^24) where the ulp is 1 (|x * inv| <= 32767 * (1 + 2^-24)), and
 * 1.5 * 2^23 is even, so the tie goes to the even integer; its bits less 1.5 * 2^23's are x16. The
 * scalar twin (quant_dot_ref) takes the other route the rule allows, nearbyint of the double
 * product, and the tests hold the two to the same bits. */

typedef struct {
    int16_t *q;
    float *d, *s;
    uint8_t *lo;
    int8_t *hi;
    int32_t *sv, *hv;
} qx_view;

static inline qx_view qx_at(const void *xq, int n) {
    const size_t nb8 = (size_t)(n / 32 + 7) / 8 * 8;
    int16_t *q = (int16_t *)xq;
    float *d = (float *)(q + nb8 * 32);
    uint8_t *lo = (uint8_t *)(d + 2 * nb8);
    int32_t *sv = (int32_t *)(lo + 2 * nb8 * 32);
    return (qx_view){q, d, d + nb8, lo, (int8_t *)(lo + nb8 * 32), sv, sv + nb8};
}

/* x16 of one block of x into v, its dx and s, and S into sum. */
static inline void x16_block(const float *x, int16_t v[32], float *dx, float *s, int32_t *sum_) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < 32; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
        finite &= a <= FLT_MAX; /* 0 for NaN and infinity */
    }
    int32_t sum = 0;
    if (finite && amax >= 0x1p-100f) {
        const float inv = 32767.0f / amax;
        for (int i = 0; i < 32; i++) {
            const float r = fmaf(x[i], inv, 0x1.8p23f);
            int32_t bits;
            memcpy(&bits, &r, sizeof bits);
            v[i] = (int16_t)(bits - 0x4B400000);
        }
        for (int i = 0; i < 32; i++) sum += v[i];
        *dx = amax / 32767.0f;
    } else {
        memset(v, 0, 32 * sizeof *v);
        *dx = finite ? 0.0f : NAN;
    }
    *s = *dx * (float)sum;
    *sum_ = sum;
}

/* One group's view of the buffer (qx_view's arrays at the group: q 256 int16, d, s 8 each, lo, hi
 * 256 each, sv, hv 8 each), token t's t ts bytes past token 0's. */
typedef struct {
    const int16_t *q;
    const float *d, *s;
    const uint8_t *lo;
    const int8_t *hi;
    const int32_t *sv, *hv;
} xgroup;

static inline xgroup xgroup_at(qx_view v, int g) {
    const size_t o = 8 * (size_t)g;
    return (xgroup){v.q + 32 * o, v.d + o, v.s + o, v.lo + 32 * o, v.hi + 32 * o, v.sv + o, v.hv + o};
}

/* Blocks [0, cnt) of x (cnt <= 8) as group g of the buffer v; the blocks from cnt on zero. */
static void x16_group(const float *x, int cnt, qx_view v, int g) {
    const size_t o = 8 * (size_t)g;
    for (int i = 0; i < 8; i++) {
        int16_t b[32];
        float *d = v.d + o + i, *s = v.s + o + i;
        int32_t *sv = v.sv + o + i, hsum = 0;
        if (i < cnt) x16_block(x + 32 * i, b, d, s, sv);
        else memset(b, 0, sizeof b), *d = *s = 0.0f, *sv = 0;
        int16_t *p = v.q + 32 * o + 64 * (i / 2) + 16 * (i % 2);
        memcpy(p, b, 16 * sizeof *b);
        memcpy(p + 32, b + 16, 16 * sizeof *b);
        for (int l = 0; l < 32; l++) {
            const int8_t h = (int8_t)((b[l] - (b[l] & 0xFF)) / 256); /* b = 256 h + (b & 0xFF) */
            v.lo[32 * (o + i) + l] = (uint8_t)(b[l] & 0xFF);
            v.hi[32 * (o + i) + l] = h;
            hsum += h;
        }
        v.hv[o + i] = hsum;
    }
}

void quant_input(const float *x, int n, void *xq) {
    const qx_view v = qx_at(xq, n);
    const int nb = n / 32;
    for (int g = 0; g * 8 < nb; g++) x16_group(x + 256 * (size_t)g, nb - 8 * g < 8 ? nb - 8 * g : 8, v, g);
}

/* ---------------------------------------------------------------------------------------------
 * The scalar twin
 *
 * Each block's integer weights q and scales, as dequant_* reads them: Q8_0 q, Q4_0 nibble - 8,
 * Q6_K q - 32 (so their sums need no S), the others' nibbles (and Q5_K's 5th bit) as stored. c[0]
 * scales weights [0..16), c[1] [16..32) (they differ only in Q6_K, one scale a 16); o is the
 * offset (Q4_1's m, the K formats' -(dmin * m); 0 for the rest). Block i is the 32 weights from
 * 32 i of a row. */
static void block_ints(int type, const uint8_t *row, int64_t i, int q[32], float c[2], float *o) {
    *o = c[0] = c[1] = 0.0f;
    switch (type) {
    case QUANT_Q8_0: {
        const uint8_t *b = row + 34 * i;
        for (int l = 0; l < 32; l++) q[l] = (int8_t)b[2 + l];
        c[0] = c[1] = rd_f16(b);
        return;
    }
    case QUANT_Q4_0: case QUANT_Q4_1: {
        const int one = type == QUANT_Q4_1;
        const uint8_t *b = row + (one ? 20 : 18) * i, *qs = b + (one ? 4 : 2);
        for (int l = 0; l < 16; l++) q[l] = (qs[l] & 0xF) - (one ? 0 : 8), q[l + 16] = (qs[l] >> 4) - (one ? 0 : 8);
        c[0] = c[1] = rd_f16(b);
        if (one) *o = rd_f16(b + 2);
        return;
    }
    case QUANT_Q4_K: case QUANT_Q5_K: {
        const int five = type == QUANT_Q5_K, s = (int)(i % 8), j = s / 2;
        const uint8_t *b = row + (five ? 176 : 144) * (i / 8), *qh = b + 16, *qs = b + (five ? 48 : 16) + 32 * j;
        int sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        for (int l = 0; l < 32; l++)
            q[l] = (s % 2 ? qs[l] >> 4 : qs[l] & 0xF) | (five ? ((qh[l] >> s) & 1) << 4 : 0);
        c[0] = c[1] = rd_f16(b) * (float)sc;
        *o = -(rd_f16(b + 2) * (float)m);
        return;
    }
    case QUANT_Q6_K: {
        const int half = (int)(i % 8) / 4, k = (int)(i % 4);
        const uint8_t *b = row + 210 * (i / 8), *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * half);
        for (int l = 0; l < 32; l++) {
            const int lo = k < 2 ? ql[l + 32 * k] & 0xF : ql[l + 32 * (k - 2)] >> 4;
            q[l] = (lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
        }
        const float d = rd_f16(b + 208);
        c[0] = d * (float)sc[2 * k];
        c[1] = d * (float)sc[2 * k + 1];
        return;
    }
    }
}

/* Block i's terms into the 8 fp32 lanes acc. The order, which every path keeps: a block (or Q6_K's
 * half-block "unit" of 16) with integer sum I and scale c, of the input's block with dx and s, is
 * acc[j % 8] = fmaf(c * dx, (float)I, acc[j % 8]), j the block's index (Q6_K: the unit's, 2 i and
 * 2 i + 1); then, where the format has an offset o, acc[i % 8] = fmaf(o, s, acc[i % 8]). */
static void block_terms(int type, const uint8_t *row, int64_t i, const int16_t v[32], float dx, float s, float acc[8]) {
    int q[32];
    float c[2], o;
    block_ints(type, row, i, q, c, &o);
    if (type == QUANT_Q6_K) {
        for (int h = 0; h < 2; h++) {
            int32_t sum = 0;
            for (int l = 16 * h; l < 16 * h + 16; l++) sum += q[l] * v[l];
            const int j = (int)((2 * i + h) % 8);
            acc[j] = fmaf(c[h] * dx, (float)sum, acc[j]);
        }
        return;
    }
    int32_t sum = 0;
    for (int l = 0; l < 32; l++) sum += q[l] * v[l];
    acc[i % 8] = fmaf(c[0] * dx, (float)sum, acc[i % 8]);
    if (type == QUANT_Q4_1 || type == QUANT_Q4_K || type == QUANT_Q5_K) acc[i % 8] = fmaf(o, s, acc[i % 8]);
}

/* The lanes' sum, in the order of an 8-lane vector's halves, then quarters, then pairs */
static inline float sum8(const float a[8]) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

float quant_dot_ref(int type, const void *row, const float *x, int n) {
    const int block = formats[type].block;
    if (block == 1) { /* the dense types: each weight in fp32 times x, summed in order */
        const uint8_t *r = row;
        float s = 0.0f;
        for (int i = 0; i < n; i++) {
            float w;
            if (type == QUANT_F32) memcpy(&w, r + 4 * i, 4);
            else w = type == QUANT_F16 ? rd_f16(r + 2 * i) : bf16_to_f32(rd16(r + 2 * i));
            s += w * x[i];
        }
        return s;
    }
    float acc[8] = {0};
    for (int64_t i = 0; i < n / 32; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f;
        int nan = 0;
        for (int l = 0; l < 32; l++) {
            nan |= isnan(xb[l]) || isinf(xb[l]);
            amax = fmaxf(amax, fabsf(xb[l]));
        }
        int16_t v[32] = {0};
        int32_t sum = 0;
        float dx = 0.0f;
        if (nan) {
            dx = NAN;
        } else if (amax >= 0x1p-100f) {
            const float inv = 32767.0f / amax;
            for (int l = 0; l < 32; l++) sum += v[l] = (int16_t)nearbyint((double)xb[l] * (double)inv);
            dx = amax / 32767.0f;
        }
        block_terms(type, row, i, v, dx, dx * (float)sum, acc);
    }
    return sum8(acc);
}

/* ---------------------------------------------------------------------------------------------
 * The fast paths
 *
 * Every path works a group of 8 blocks (a K super-block, or 8 blocks of the 32-weight formats) at a
 * time, on the buffer's layout: xg the group's arrays of token 0, token t's ts bytes further. cnt
 * (1..8) is how many of the group's blocks the row has (below 8 only in a last group). */
#if !defined(QUANT_SIMD_AVX512) && !defined(QUANT_SIMD_AVX2)
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define QUANT_SIMD_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QUANT_SIMD_AVX2 1
#endif
#endif

#define QT 4 /* tokens the most */
#define INLINE static inline __attribute__((always_inline))
#define TOK(p, t, ts) ((const void *)((const uint8_t *)(p) + (size_t)(t) * (ts)))

#if defined(QUANT_SIMD_AVX512) || defined(QUANT_SIMD_AVX2)
/* The integers as exact sums, SIMD: a pair of blocks' 64 weights are widened to int16 in the pair
 * layout (wpair) and multiplied with the input's x16 in pairs (vpmaddwd: two exact int16 products
 * summed into an int32 lane; with AVX512-VNNI, vpdpwssd adds the second half's in the same
 * instruction), leaving each block's 32 products in 8 int32 lanes (ipair); reduce8 turns four pairs'
 * lanes into one vector of the 8 blocks' sums, which are converted and scaled as the scalar twin
 * does, lane j % 8 each. Every weight fits int8 (nibbles to 31, Q8_0 and Q6_K's q - 32 signed), so
 * the weights are built as bytes, 32 of each half of the pair (y1: weights [0..16) of both blocks,
 * y2: [16..32)), then widened. |lane| <= 4 * 128 * 32767 < 2^31. */
#if defined(QUANT_SIMD_AVX512)
typedef struct { __m512i w1, w2; } wpair; /* [A 0..16, B 0..16] and [A 16..32, B 16..32], int16 */
typedef __m512i ipair;                    /* lanes 0..8: block A's partial sums, 8..16: B's */
INLINE ipair ipair_zero(void) { return _mm512_setzero_si512(); }
INLINE wpair wpair_of(__m256i y1, __m256i y2) { return (wpair){_mm512_cvtepi8_epi16(y1), _mm512_cvtepi8_epi16(y2)}; }
INLINE wpair wpair_zero(void) { return (wpair){_mm512_setzero_si512(), _mm512_setzero_si512()}; }
INLINE ipair ipair_dot(wpair w, const int16_t *x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(w.w1, _mm512_loadu_si512(x)), w.w2, _mm512_loadu_si512(x + 32));
#else
    return _mm512_add_epi32(_mm512_madd_epi16(w.w1, _mm512_loadu_si512(x)), _mm512_madd_epi16(w.w2, _mm512_loadu_si512(x + 32)));
#endif
}
/* Q6_K, whose 16 weights of a block's two halves take different scales: half h of each block alone */
INLINE ipair ipair_dot_half(wpair w, const int16_t *x, int h) { return _mm512_madd_epi16(h ? w.w2 : w.w1, _mm512_loadu_si512(x + 32 * h)); }
/* The 8 blocks' sums of p[0..4) (pair k: blocks 2k, 2k+1), in block order; q6: the pairs are
 * Q6_K's units (u0, u2), (u1, u3), (u4, u6), (u5, u7), returned in unit order. Lanes transposed
 * and added a level at a time: pairs of 32-bit lanes, of 64-bit lanes, the 128-bit quarters. */
INLINE __m256i reduce8(const ipair p[4], int q6) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    /* quarter k (k = 0, 1: the A blocks' lanes; 2, 3: the B blocks'): partial sums of pairs 0..4 */
    const __m512i e = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
    const __m512i f = _mm512_add_epi32(e, _mm512_shuffle_i32x4(e, e, _MM_SHUFFLE(2, 3, 0, 1)));
    /* quarter 0: blocks 0, 2, 4, 6; quarter 2: 1, 3, 5, 7 */
    const __m512i order = q6 ? _mm512_setr_epi32(0, 1, 8, 9, 2, 3, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0)
                             : _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, f));
}
/* The 4 blocks' sums of p0 (blocks 0, 1) and p1 (blocks 2, 3), in block order: a last group's
 * first 4 blocks without the 8-block transpose. Each quarter's lanes summed within it (lane 0: p0's,
 * lane 1: p1's), then quarters 0 + 1 (the A blocks 0, 2) and 2 + 3 (the B blocks 1, 3). */
INLINE __m128i reduce4(ipair p0, ipair p1) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i e = _mm512_add_epi32(a, _mm512_unpackhi_epi64(a, a));
    const __m512i f = _mm512_add_epi32(e, _mm512_shuffle_i32x4(e, e, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_unpacklo_epi32(_mm512_castsi512_si128(f), _mm512_extracti32x4_epi32(f, 2));
}
#define QUANT_ISA_SIMD "avx512"
#else
typedef struct { __m256i w[4]; } wpair; /* A 0..16, B 0..16, A 16..32, B 16..32, int16 */
typedef struct { __m256i a, b; } ipair; /* block A's 8 partial sums, B's */
INLINE ipair ipair_zero(void) { return (ipair){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
INLINE wpair wpair_of(__m256i y1, __m256i y2) {
    return (wpair){{_mm256_cvtepi8_epi16(_mm256_castsi256_si128(y1)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(y1, 1)),
                    _mm256_cvtepi8_epi16(_mm256_castsi256_si128(y2)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(y2, 1))}};
}
INLINE wpair wpair_zero(void) { return (wpair){{_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}}; }
#define LD256(p) _mm256_loadu_si256((const __m256i *)(p))
INLINE ipair ipair_dot(wpair w, const int16_t *x) {
    return (ipair){_mm256_add_epi32(_mm256_madd_epi16(w.w[0], LD256(x)), _mm256_madd_epi16(w.w[2], LD256(x + 32))),
                   _mm256_add_epi32(_mm256_madd_epi16(w.w[1], LD256(x + 16)), _mm256_madd_epi16(w.w[3], LD256(x + 48)))};
}
INLINE ipair ipair_dot_half(wpair w, const int16_t *x, int h) {
    return (ipair){_mm256_madd_epi16(w.w[2 * h], LD256(x + 32 * h)), _mm256_madd_epi16(w.w[2 * h + 1], LD256(x + 32 * h + 16))};
}
INLINE __m256i reduce8(const ipair p[4], int q6) {
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0].a, p[0].b), _mm256_hadd_epi32(p[1].a, p[1].b));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[2].a, p[2].b), _mm256_hadd_epi32(p[3].a, p[3].b));
    const __m256i r = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
    return q6 ? _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7)) : r;
}
INLINE __m128i reduce4(ipair p0, ipair p1) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0.a, p0.b), _mm256_hadd_epi32(p1.a, p1.b));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#define QUANT_ISA_SIMD "avx2"
#endif

typedef __m256 acc8; /* the 8 fp32 lanes */
#define ACC_ZERO() _mm256_setzero_ps()
static inline __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline __m256i bcast16(const uint8_t *p) { return _mm256_broadcastsi128_si256(ld16(p)); }
static inline float hsum8(acc8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#define LDQ(p) ((const int16_t *)(p))
#define LDF(p) _mm256_loadu_ps((const float *)(p))

/* Q8_0, Q4_0, Q4_1: blocks of 32 at b (bytes apart), the group's fp16 fields read by fields32. */
/* Pair p's weights of a group of blocks of 32 at b (blocks 2p and 2p + 1; a missing second one's zeros) */
INLINE wpair pair32(int type, const uint8_t *b, int p, int cnt) {
    const int bytes = type == QUANT_Q8_0 ? 34 : type == QUANT_Q4_0 ? 18 : 20;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const uint8_t *a = b + bytes * 2 * p, *c = a + bytes;
    const int has_c = 2 * p + 1 < cnt; /* the pair's second block; x16 of a missing one are zeros */
    if (type == QUANT_Q8_0)
        return wpair_of(_mm256_set_m128i(has_c ? ld16(c + 2) : _mm_setzero_si128(), ld16(a + 2)),
                        _mm256_set_m128i(has_c ? ld16(c + 18) : _mm_setzero_si128(), ld16(a + 18)));
    const int off = type == QUANT_Q4_0 ? 2 : 4;
    const __m256i y = _mm256_set_m128i(has_c ? ld16(c + off) : _mm_setzero_si128(), ld16(a + off));
    __m256i y1 = _mm256_and_si256(y, m4), y2 = _mm256_and_si256(_mm256_srli_epi16(y, 4), m4);
    if (type == QUANT_Q4_0) y1 = _mm256_sub_epi8(y1, _mm256_set1_epi8(8)), y2 = _mm256_sub_epi8(y2, _mm256_set1_epi8(8));
    return wpair_of(y1, y2);
}

/* Q4_K, Q5_K: sub-blocks 2j, 2j + 1, the low and high nibbles of qs[32 j .. 32 j + 32) (+ bits 2j and
 * 2j + 1 of qh: Q5_K). The two halves of a 128-bit load are shifted apart by 64-bit lane (vpsrlvq:
 * 0 for the low nibbles, 4 for the high), a byte mask keeping each byte's own bits. */
INLINE wpair pair_k(const uint8_t *b, int five, int j) {
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1), nib = _mm256_setr_epi64x(0, 0, 4, 4);
    const uint8_t *qs = b + (five ? 48 : 16);
    __m256i y1 = _mm256_and_si256(_mm256_srlv_epi64(bcast16(qs + 32 * j), nib), m4);
    __m256i y2 = _mm256_and_si256(_mm256_srlv_epi64(bcast16(qs + 32 * j + 16), nib), m4);
    if (five) {
        const __m256i sh = _mm256_setr_epi64x(2 * j, 2 * j, 2 * j + 1, 2 * j + 1);
        y1 = _mm256_or_si256(y1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(bcast16(b + 16), sh), one), 4));
        y2 = _mm256_or_si256(y2, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(bcast16(b + 32), sh), one), 4));
    }
    return wpair_of(y1, y2);
}

/* The weights of a pair of blocks as the products take them (wts), their products with token t's
 * input (wts_dot: pair p's 16 int32 lanes, an ipair) and the blocks' integer sums made exact
 * (fix8, fix4: a group's 8 or a last group's first 4, in block order), on one of two paths: the
 * weights widened to int16 times x16 (wpair, ipair_dot), or, with AVX512-VNNI and one token
 * (BYTES(T)), the weights kept as bytes.
 *
 * The bytes path: 64 weights a vector, and vpdpbusd (4 products of an unsigned and a signed byte
 * summed into an int32 lane) takes x16 as its two bytes, x16 = 256 hi + lo (the buffer's lo, hi):
 * a lane is 256 * sum(u hi) + sum(lo w), with u the weights as unsigned bytes and w as signed ones.
 * Q4_1 and the K formats' weights are nibbles (Q5_K's 5 bits), u = w: the sum is exact as it is.
 * Q4_0's u = w = the nibble q, whose weight is q - 8: fix subtracts 8 S. Q8_0's w is the signed
 * byte and u = w + 128: fix subtracts 32768 times the sum of hi. The same integers, so the same
 * bits as the int16 path. |lane| <= 256 * 4 * 255 * 128 + 4 * 255 * 128 < 2^26, a block's 8 lanes
 * < 2^29. It saves the widening (two vpmovsxbw a pair, on the shuffle port) but spends three
 * multiply-add port instructions a pair and token where the int16 path spends two: a gain for one
 * token (decode: rows of 4096 in L2, one thread, Q4_0 +21%, Q4_K +18%, Q4_1 +9%, Q8_0 +2%), a loss
 * for four (a prompt's rows: 1B Q4_0 prompt -15%), so only one token takes it (D139). */
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
#define BYTES(T) ((T) == 1)
typedef struct { wpair i; __m512i u, w; } wts; /* bytes: [A 0..32, B 0..32] */
#else
#define BYTES(T) 0
typedef struct { wpair i; } wts;
#endif
INLINE wts wts_zero(void) {
    wts r;
    r.i = wpair_zero();
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
    r.u = r.w = _mm512_setzero_si512();
#endif
    return r;
}
INLINE wts wts32(int bytes_path, int type, const uint8_t *b, int p, int cnt) {
    wts r = wts_zero();
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
    if (bytes_path) {
        const int bytes = type == QUANT_Q8_0 ? 34 : type == QUANT_Q4_0 ? 18 : 20;
        const uint8_t *a = b + bytes * 2 * p, *c = a + bytes;
        const int has_c = 2 * p + 1 < cnt; /* the pair's second block; x16 of a missing one are zeros */
        if (type == QUANT_Q8_0) {
            const __m256i wa = _mm256_loadu_si256((const __m256i *)(a + 2));
            r.w = _mm512_inserti64x4(_mm512_castsi256_si512(wa), has_c ? _mm256_loadu_si256((const __m256i *)(c + 2)) : _mm256_setzero_si256(), 1);
            r.u = _mm512_xor_si512(r.w, _mm512_set1_epi8((char)0x80));
            return r;
        }
        const int off = type == QUANT_Q4_0 ? 2 : 4;
        /* the 16 bytes of each block twice ([A A B B]), the second copy shifted by a nibble */
        const __m512i y = has_c ? _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(ld16(a + off)), 0xFF00, ld16(c + off))
                                : _mm512_maskz_broadcast_i32x4(0x00FF, ld16(a + off));
        r.u = r.w = _mm512_and_si512(_mm512_srlv_epi64(y, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0xF));
        return r;
    }
#endif
    (void)bytes_path;
    r.i = pair32(type, b, p, cnt);
    return r;
}
/* Q4_K, Q5_K: sub-blocks 2j, 2j + 1 (pair_k); as bytes [2j, 2j + 1], the nibbles of a 256-bit load
 * shifted apart by 64-bit lane the same way, Q5_K's bits of qh or'ed in times 16 */
INLINE wts wts_k(int bytes_path, const uint8_t *b, int five, int j) {
    wts r = wts_zero();
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
    if (bytes_path) {
        const __m512i y = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * j)));
        __m512i u = _mm512_and_si512(_mm512_srlv_epi64(y, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0xF));
        if (five) {
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
            const __m512i sh = _mm512_setr_epi64(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
            u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, sh), _mm512_set1_epi8(1)), 4));
        }
        r.u = r.w = u;
        return r;
    }
#endif
    (void)bytes_path;
    r.i = pair_k(b, five, j);
    return r;
}
INLINE ipair wts_dot(int bytes_path, wts w, xgroup xg, int t, size_t ts, int p) {
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
    if (bytes_path) {
        const __m512i lo = _mm512_loadu_si512((const uint8_t *)TOK(xg.lo, t, ts) + 64 * p);
        const __m512i hi = _mm512_loadu_si512((const int8_t *)TOK(xg.hi, t, ts) + 64 * p);
        return _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w.u, hi), 8), lo, w.w);
    }
#endif
    (void)bytes_path;
    return ipair_dot(w.i, (const int16_t *)TOK(xg.q, t, ts) + 64 * p);
}
INLINE __m256i fix8(int bytes_path, int type, __m256i sums, xgroup xg, int t, size_t ts) {
    if (bytes_path && type == QUANT_Q4_0) return _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)TOK(xg.sv, t, ts)), 3));
    if (bytes_path && type == QUANT_Q8_0) return _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)TOK(xg.hv, t, ts)), 15));
    return sums;
}
INLINE __m128i fix4(int bytes_path, int type, __m128i sums, xgroup xg, int t, size_t ts) {
    if (bytes_path && type == QUANT_Q4_0) return _mm_sub_epi32(sums, _mm_slli_epi32(_mm_loadu_si128((const __m128i *)TOK(xg.sv, t, ts)), 3));
    if (bytes_path && type == QUANT_Q8_0) return _mm_sub_epi32(sums, _mm_slli_epi32(_mm_loadu_si128((const __m128i *)TOK(xg.hv, t, ts)), 15));
    return sums;
}

/* The fp16 fields of blocks from..from + 4 of a group of blocks of 32 at b, read as scalars (a
 * gather is slow on CPUs with the Gather Data Sampling mitigation): d into dd, Q4_1's m into mm, 16
 * bits a block; the blocks from cnt on zeros. */
INLINE void fields32(int type, const uint8_t *b, int from, int cnt, uint64_t *dd, uint64_t *mm) {
    const int bytes = type == QUANT_Q8_0 ? 34 : type == QUANT_Q4_0 ? 18 : 20;
    *dd = *mm = 0;
    for (int i = 0; i < 4; i++)
        if (from + i < cnt) {
            *dd |= (uint64_t)rd16(b + bytes * (from + i)) << 16 * i;
            if (type == QUANT_Q4_1) *mm |= (uint64_t)rd16(b + bytes * (from + i) + 2) << 16 * i;
        }
}

/* A last group of 1..4 blocks of 32 (cnt), lanes 0..cnt: the same terms as group32's, but its
 * fp16 fields read as scalars (no gather), its sums by reduce4 and its arithmetic on the low 4
 * lanes (the others' scales are zeros there, as group32's missing blocks', so they would add +0 to
 * a lane that is never -0). */
INLINE void tail32(int type, const uint8_t *b, xgroup xg, size_t ts, int cnt, int T, acc8 *acc) {
    const int by = BYTES(T);
    const wts w0 = wts32(by, type, b, 0, cnt), w1 = cnt > 2 ? wts32(by, type, b, 1, cnt) : wts_zero();
    uint64_t dd, mm; /* the blocks' d (and Q4_1's m) as 4 fp16, the missing ones zeros */
    fields32(type, b, 0, cnt, &dd, &mm);
    const __m128 c = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dd)), m = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)mm));
    for (int t = 0; t < T; t++) {
        const __m128i sums = fix4(by, type, reduce4(wts_dot(by, w0, xg, t, ts, 0), cnt > 2 ? wts_dot(by, w1, xg, t, ts, 1) : ipair_zero()), xg, t, ts);
        __m128 lo = _mm256_castps256_ps128(acc[t]);
        lo = _mm_fmadd_ps(_mm_mul_ps(c, _mm_loadu_ps((const float *)TOK(xg.d, t, ts))), _mm_cvtepi32_ps(sums), lo);
        if (type == QUANT_Q4_1) lo = _mm_fmadd_ps(m, _mm_loadu_ps((const float *)TOK(xg.s, t, ts)), lo);
        acc[t] = _mm256_blend_ps(acc[t], _mm256_castps128_ps256(lo), 0x0F);
    }
}

INLINE void group32(int type, const uint8_t *b, xgroup xg, size_t ts, int cnt, int T, acc8 *acc) {
    if (cnt <= 4) {
        tail32(type, b, xg, ts, cnt, T, acc);
        return;
    }
    const int by = BYTES(T);
    wts w[4];
    for (int p = 0; p < 4; p++) w[p] = 2 * p < cnt ? wts32(by, type, b, p, cnt) : wts_zero();
    uint64_t dd[2] = {0, 0}, mm[2] = {0, 0}; /* the blocks' d (and Q4_1's m), 4 fp16 a word; the missing ones zeros */
    fields32(type, b, 0, cnt, &dd[0], &mm[0]);
    fields32(type, b, 4, cnt, &dd[1], &mm[1]);
    const __m256 c = _mm256_cvtph_ps(_mm_set_epi64x((long long)dd[1], (long long)dd[0]));
    const __m256 m = _mm256_cvtph_ps(_mm_set_epi64x((long long)mm[1], (long long)mm[0]));
    for (int t = 0; t < T; t++) {
        ipair ip[4]; /* a last group's missing pairs: zeros, without the multiplies */
        for (int p = 0; p < 4; p++) ip[p] = 2 * p < cnt ? wts_dot(by, w[p], xg, t, ts, p) : ipair_zero();
        const __m256 sums = _mm256_cvtepi32_ps(fix8(by, type, reduce8(ip, 0), xg, t, ts));
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(c, LDF(TOK(xg.d, t, ts))), sums, acc[t]);
        if (type == QUANT_Q4_1) acc[t] = _mm256_fmadd_ps(m, LDF(TOK(xg.s, t, ts)), acc[t]);
    }
}

/* Q4_K, Q5_K: a super-block, its sub-blocks in pairs (wts_k) */
INLINE void group_q45_k(const uint8_t *b, int five, xgroup xg, size_t ts, int T, acc8 *acc) {
    /* the 8 scales and mins (scale_min_k4) with 64-bit integer ops: lo = bytes 0-7 (scales 0-3,
     * mins 0-3 and, in their top 2 bits, the top bits of scales and mins 4-7), hi = bytes 8-11 */
    uint64_t lo;
    uint32_t hi;
    memcpy(&lo, b + 4, 8);
    memcpy(&hi, b + 12, 4);
    const uint64_t k03 = lo & 0x3F3F3F3F3F3F3F3FULL;
    const uint64_t k47 = ((uint64_t)(hi & 0x0F0F0F0F) | (uint64_t)((hi >> 4) & 0x0F0F0F0F) << 32) | ((lo >> 6) & 0x0303030303030303ULL) << 4;
    /* bytes: scales 0-7, then mins 0-7 */
    const __m128i sm = _mm_unpacklo_epi32(_mm_cvtsi64_si128((long long)k03), _mm_cvtsi64_si128((long long)k47));
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd16(b) | (int)rd16(b + 2) << 16)); /* d, dmin */
    const __m256 c = _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
    const __m256 o = _mm256_mul_ps(_mm256_xor_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_set1_ps(-0.0f)),
                                   _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
    const int by = BYTES(T);
    wts w[4];
    for (int j = 0; j < 4; j++) w[j] = wts_k(by, b, five, j);
    for (int t = 0; t < T; t++) {
        const ipair ip[4] = {wts_dot(by, w[0], xg, t, ts, 0), wts_dot(by, w[1], xg, t, ts, 1), wts_dot(by, w[2], xg, t, ts, 2),
                             wts_dot(by, w[3], xg, t, ts, 3)};
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(c, LDF(TOK(xg.d, t, ts))), _mm256_cvtepi32_ps(reduce8(ip, 0)), acc[t]);
        acc[t] = _mm256_fmadd_ps(o, LDF(TOK(xg.s, t, ts)), acc[t]);
    }
}

/* Q6_K: a super-block, two halves of 128 weights, each 4 blocks and 8 units of 16 (unit 2k + h:
 * block k's weights [16 h, 16 h + 16)). Blocks k and k + 1 (k = 0, 2) are one pair: the low (k = 0)
 * or high (k = 2) nibbles of ql[l] and ql[32 + l], with bits 2k, 2k + 1 (2k + 2, 2k + 3) of qh[l]. */
INLINE void group_q6_k(const uint8_t *b, xgroup xg, size_t ts, int T, acc8 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    const float d = rd_f16(b + 208);
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        float dsc[8];
        for (int u = 0; u < 8; u++) dsc[u] = d * (float)(int8_t)b[192 + 8 * half + u];
        wpair w[2];
        for (int pk = 0; pk < 2; pk++) {
            const __m256i sh = pk ? _mm256_setr_epi64x(4, 4, 6, 6) : _mm256_setr_epi64x(0, 0, 2, 2);
            __m256i y[2];
            for (int h = 0; h < 2; h++) {
                const __m256i l = _mm256_set_m128i(ld16(ql + 32 + 16 * h), ld16(ql + 16 * h));
                const __m256i lo = _mm256_and_si256(pk ? _mm256_srli_epi16(l, 4) : l, m4);
                const __m256i hb = _mm256_and_si256(_mm256_srlv_epi64(bcast16(qh + 16 * h), sh), m2);
                y[h] = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 4)), c32);
            }
            w[pk] = wpair_of(y[0], y[1]);
        }
        const __m256 c = _mm256_loadu_ps(dsc);
        for (int t = 0; t < T; t++) {
            const int16_t *x = (const int16_t *)TOK(xg.q, t, ts) + 128 * half;
            const ipair ip[4] = {ipair_dot_half(w[0], x, 0), ipair_dot_half(w[0], x, 1), ipair_dot_half(w[1], x + 64, 0),
                                 ipair_dot_half(w[1], x + 64, 1)};
            /* each unit's dx: its block's, twice */
            const __m256 dx = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)TOK(xg.d, t, ts) + 4 * half)),
                                                       _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(c, dx), _mm256_cvtepi32_ps(reduce8(ip, 1)), acc[t]);
        }
    }
}

INLINE void group_dot(int type, const uint8_t *b, xgroup xg, size_t ts, int cnt, int T, acc8 *acc) {
    switch (type) {
    case QUANT_Q4_K: group_q45_k(b, 0, xg, ts, T, acc); return;
    case QUANT_Q5_K: group_q45_k(b, 1, xg, ts, T, acc); return;
    case QUANT_Q6_K: group_q6_k(b, xg, ts, T, acc); return;
    default: group32(type, b, xg, ts, cnt, T, acc); return;
    }
}
#define QUANT_ISA QUANT_ISA_SIMD
#else
/* The scalar path: the twin's block terms on the buffer's x16 */
typedef struct { float l[8]; } acc8;
#define ACC_ZERO() ((acc8){{0}})
static inline float hsum8(acc8 v) { return sum8(v.l); }
static void group_dot(int type, const uint8_t *b, xgroup xg, size_t ts, int cnt, int T, acc8 *acc) {
    for (int t = 0; t < T; t++) {
        const int16_t *q = TOK(xg.q, t, ts);
        const float *d = TOK(xg.d, t, ts), *s = TOK(xg.s, t, ts);
        for (int i = 0; i < cnt; i++) {
            int16_t v[32];
            memcpy(v, q + 64 * (i / 2) + 16 * (i % 2), 16 * sizeof *v);
            memcpy(v + 16, q + 64 * (i / 2) + 16 * (i % 2) + 32, 16 * sizeof *v);
            /* block i of the group, whose first block (b) is a multiple of 8 blocks into the row: the
             * same weights and the same lane (i % 8) as the row's block 8 g + i */
            block_terms(type, b, i, v, d[i], s[i], acc[t].l);
        }
    }
}
#define QUANT_ISA "scalar"
#endif

/* A row's last group of cnt blocks (1 to 7: the blocks of 32's), with cnt a constant in each copy of
 * group_dot, so that its tests on cnt fold away as a whole group's do: with cnt read at run time
 * the default model's rows of 576 (two groups and 2 blocks) spent more on their last 2 blocks than
 * on a whole group (docs/performance.md, D137). */
INLINE void group_dot_last(int type, const uint8_t *b, xgroup xg, size_t ts, int cnt, int T, acc8 *acc) {
    if (formats[type].block != 32) return; /* the K formats' rows are whole groups (n a multiple of 256) */
    switch (cnt) {
    case 1: group_dot(type, b, xg, ts, 1, T, acc); return;
    case 2: group_dot(type, b, xg, ts, 2, T, acc); return;
    case 3: group_dot(type, b, xg, ts, 3, T, acc); return;
    case 4: group_dot(type, b, xg, ts, 4, T, acc); return;
    case 5: group_dot(type, b, xg, ts, 5, T, acc); return;
    case 6: group_dot(type, b, xg, ts, 6, T, acc); return;
    default: group_dot(type, b, xg, ts, 7, T, acc); return;
    }
}

/* The dot products over a row's groups: nb8 / 8 groups of the row's blocks, the input either
 * quantized already (xq, token t's xs bytes on) or quantized here a group at a time from fp32 x
 * (token t's at x + t xs floats), into the same layout: the same bits either way. */
#define GROUP_BYTES(type) ((size_t)formats[type].bytes * (size_t)(256 / formats[type].block))
INLINE void dot_q_t(int type, const uint8_t *row, const void *xq, size_t xs, int n, int T, float *o) {
    const qx_view v = qx_at(xq, n);
    const int nb = n / 32;
    acc8 acc[QT];
    for (int t = 0; t < T; t++) acc[t] = ACC_ZERO();
    int g = 0;
    for (; 8 * g + 8 <= nb; g++) { /* whole groups: cnt a constant, the tail's tests folded away */
        const uint8_t *b = row + GROUP_BYTES(type) * (size_t)g;
        PREFETCH_AHEAD(b, GROUP_BYTES(type)); /* cpu_kernels.h: the hardware prefetcher alone is too late (D140) */
        group_dot(type, b, xgroup_at(v, g), xs, 8, T, acc);
    }
    if (8 * g < nb) group_dot_last(type, row + GROUP_BYTES(type) * (size_t)g, xgroup_at(v, g), xs, nb - 8 * g, T, acc);
    for (int t = 0; t < T; t++) o[t] = hsum8(acc[t]);
}

typedef struct {
    _Alignas(64) uint8_t bytes[QUANT_INPUT_BYTES(256)];
} qx_group; /* one group's buffer: quant_input's layout for n = 256 */

INLINE void dot_f32_t(int type, const uint8_t *row, const float *x, size_t xs, int n, int T, float *o) {
    const int nb = n / 32;
    acc8 acc[QT];
    qx_group gq[QT];
    for (int t = 0; t < T; t++) acc[t] = ACC_ZERO();
    for (int g = 0; 8 * g < nb; g++) {
        const int cnt = nb - 8 * g < 8 ? nb - 8 * g : 8;
        for (int t = 0; t < T; t++) x16_group(x + (size_t)t * xs + 256 * (size_t)g, cnt, qx_at(gq[t].bytes, 256), 0);
        const xgroup xg = xgroup_at(qx_at(gq[0].bytes, 256), 0);
        if (cnt == 8) group_dot(type, row + GROUP_BYTES(type) * (size_t)g, xg, sizeof gq[0], 8, T, acc);
        else group_dot_last(type, row + GROUP_BYTES(type) * (size_t)g, xg, sizeof gq[0], cnt, T, acc);
    }
    for (int t = 0; t < T; t++) o[t] = hsum8(acc[t]);
}

static float dot_dense(int type, const void *row, const float *x, int n) {
    return type == QUANT_F32 ? dot_f32(row, x, n) : type == QUANT_F16 ? dot_f16(row, x, n) : type == QUANT_BF16 ? dot_bf16(row, x, n) : 0.0f;
}

/* call with the block format type a constant in each case (the callees inlined: each copy's tests
 * on the type fold away, where a type read at run time branched on it inside every group) */
#define BY_TYPE(type, call)                                  \
    switch (type) {                                          \
    case QUANT_Q8_0: { const int type_ = QUANT_Q8_0; call; } break; \
    case QUANT_Q4_0: { const int type_ = QUANT_Q4_0; call; } break; \
    case QUANT_Q4_1: { const int type_ = QUANT_Q4_1; call; } break; \
    case QUANT_Q4_K: { const int type_ = QUANT_Q4_K; call; } break; \
    case QUANT_Q5_K: { const int type_ = QUANT_Q5_K; call; } break; \
    default: /* QUANT_Q6_K: the callers take block formats only */  \
             { const int type_ = QUANT_Q6_K; call; } break;          \
    }

float quant_dot(int type, const void *row, const float *x, int n) {
    if (formats[type].block == 1) return dot_dense(type, row, x, n);
    float o;
    BY_TYPE(type, dot_f32_t(type_, row, x, 0, n, 1, &o))
    return o;
}

void quant_dot_x4(int type, const void *row, const float *x, size_t xs, int n, float o[4]) {
    if (formats[type].block == 1) {
        for (int t = 0; t < 4; t++) o[t] = dot_dense(type, row, x + (size_t)t * xs, n);
        return;
    }
    BY_TYPE(type, dot_f32_t(type_, row, x, xs, n, 4, o))
}

float quant_dot_q(int type, const void *row, const void *xq, int n) {
    float o;
    BY_TYPE(type, dot_q_t(type_, row, xq, 0, n, 1, &o))
    return o;
}

void quant_dot_x4_q(int type, const void *row, const void *xq, size_t xqs, int n, float o[4]) {
    BY_TYPE(type, dot_q_t(type_, row, xq, xqs, n, 4, o))
}

const char *quant_dot_isa(void) {
#if defined(QUANT_SIMD_AVX512) && defined(__AVX512VNNI__)
    return "avx512vnni";
#else
    return QUANT_ISA;
#endif
}
