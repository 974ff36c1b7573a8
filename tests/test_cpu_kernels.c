/* test_cpu_kernels.c - each CPU kernel in runtime/cpu_kernels.h against its plain twin, on fresh
 * random inputs of lengths that hit every unrolled step and every tail.
 *
 * Tolerances: the vector dot products sum in another order than the scalar reference, so each
 * result may differ by a few float32 roundings of the partial sums: we allow
 * 1e-5 * sum(|w_i * x_i|) (float32 epsilon is 1.2e-7; n <= 4096 terms at most add n * eps of the
 * absolute sum in the worst case, random signs far less). Conversions must be bit-exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "cpu_kernels.h"
#include "cpu_gemm.h"


static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}
static uint16_t f32_to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }

static void test_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = f16_to_f32((uint16_t)h), b = f16_to_f32_ref((uint16_t)h);
        if (memcmp(&a, &b, 4) != 0 && !(isnan(a) && isnan(b))) bad++;
    }
    CHECK(bad == 0, "f16_to_f32 differs from the reference on %d of 65536 halves", bad);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        /* magnitudes from fp16-subnormal to overflow */
        float f = frand() * powf(2.0f, (float)(i % 42) - 26.0f);
        if (f32_to_f16(f) != f32_to_f16_ref(f)) bad++;
    }
    float edge[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f, 6.1e-5f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++)
        if (f32_to_f16(edge[i]) != f32_to_f16_ref(edge[i])) bad++;
    CHECK(bad == 0, "f32_to_f16 differs from the reference on %d values", bad);
}

static void test_dots(void) {
    static const int lengths[] = {1, 7, 16, 17, 63, 64, 65, 127, 576, 1000, 1536, 4096};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        int n = lengths[li];
        float *x = malloc(n * sizeof *x), *w32 = malloc(n * sizeof *w32);
        uint16_t *wb = malloc(n * 2), *wh = malloc(n * 2);
        double abs_sum = 0.0;
        for (int i = 0; i < n; i++) {
            x[i] = frand();
            w32[i] = frand();
            wb[i] = f32_to_bf16(w32[i]);
            wh[i] = f32_to_f16_ref(w32[i]);
            abs_sum += fabs(w32[i] * x[i]);
        }
        double tol = 1e-5 * abs_sum + 1e-6;
        float a = dot_f32(w32, x, n), b = dot_f32_ref(w32, x, n);
        CHECK(fabs(a - b) <= tol, "dot_f32 n=%d: %g vs %g", n, a, b);
        a = dot_bf16(wb, x, n), b = dot_bf16_ref(wb, x, n);
        CHECK(fabs(a - b) <= tol, "dot_bf16 n=%d: %g vs %g", n, a, b);
        a = dot_f16(wh, x, n), b = dot_f16_ref(wh, x, n);
        CHECK(fabs(a - b) <= tol, "dot_f16 n=%d: %g vs %g", n, a, b);
        float o1[4096] = {0}, o2[4096] = {0};
        axpy_f16(o1, 0.37f, wh, n);
        axpy_f16_ref(o2, 0.37f, wh, n);
        int same = 1;
        for (int i = 0; i < n; i++) same &= fabsf(o1[i] - o2[i]) <= 1e-6f;
        CHECK(same, "axpy_f16 n=%d differs from the reference", n);
        free(x); free(w32); free(wb); free(wh);
    }
}

/* dot_x4_* (one row against four tokens' inputs), dot4_x2_* (four rows against two) and dot4_*:
 * each result the same bits as dot_* gives it alone, so that every kernel computes the decode
 * step's sums. */
static void test_dots_x4(void) {
    static const int lengths[] = {1, 8, 16, 17, 31, 32, 33, 48, 63, 64, 65, 127, 576, 1000, 1536};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int n = lengths[li], xs = n + 3; /* inputs a row apart, not 64-byte aligned */
        float *x = malloc(4 * xs * sizeof *x), *w32 = malloc(n * sizeof *w32);
        uint16_t *wb = malloc(n * 2), *wh = malloc(n * 2);
        for (int i = 0; i < 4 * xs; i++) x[i] = frand();
        for (int i = 0; i < n; i++) {
            w32[i] = frand();
            wb[i] = f32_to_bf16(w32[i]);
            wh[i] = f32_to_f16_ref(w32[i]);
        }
        float o32[4], ob[4], oh[4];
        dot_x4_f32(w32, x, xs, n, o32);
        dot_x4_bf16(wb, x, xs, n, ob);
        dot_x4_f16(wh, x, xs, n, oh);
        for (int t = 0; t < 4; t++) {
            const float a32 = dot_f32(w32, x + t * xs, n), ab = dot_bf16(wb, x + t * xs, n), ah = dot_f16(wh, x + t * xs, n);
            CHECK(!memcmp(&o32[t], &a32, 4), "dot_x4_f32 n=%d token %d: %.9g vs dot_f32's %.9g", n, t, o32[t], a32);
            CHECK(!memcmp(&ob[t], &ab, 4), "dot_x4_bf16 n=%d token %d: %.9g vs dot_bf16's %.9g", n, t, ob[t], ab);
            CHECK(!memcmp(&oh[t], &ah, 4), "dot_x4_f16 n=%d token %d: %.9g vs dot_f16's %.9g", n, t, oh[t], ah);
        }
        /* dot4_x2: four distinct rows against two inputs, each token's results dot4's bits */
        float *m32 = malloc(4 * n * sizeof *m32);
        uint16_t *mb = malloc(4 * n * 2), *mh = malloc(4 * n * 2);
        for (int i = 0; i < 4 * n; i++) {
            m32[i] = frand();
            mb[i] = f32_to_bf16(m32[i]);
            mh[i] = f32_to_f16_ref(m32[i]);
        }
        const uint16_t *rb[4] = {mb, mb + n, mb + 2 * n, mb + 3 * n}, *rh[4] = {mh, mh + n, mh + 2 * n, mh + 3 * n};
        const float *r32[4] = {m32, m32 + n, m32 + 2 * n, m32 + 3 * n};
        float p32[2][4], pb[2][4], ph[2][4], q32[4], qb[4], qh[4];
        dot4_x2_f32(r32, x, xs, n, p32);
        dot4_x2_bf16(rb, x, xs, n, pb);
        dot4_x2_f16(rh, x, xs, n, ph);
        for (int t = 0; t < 2; t++) {
            dot4_f32(r32, x + t * xs, n, q32);
            dot4_bf16(rb, x + t * xs, n, qb);
            dot4_f16(rh, x + t * xs, n, qh);
            CHECK(!memcmp(p32[t], q32, sizeof q32), "dot4_x2_f32 n=%d token %d differs from dot4_f32", n, t);
            CHECK(!memcmp(pb[t], qb, sizeof qb), "dot4_x2_bf16 n=%d token %d differs from dot4_bf16", n, t);
            CHECK(!memcmp(ph[t], qh, sizeof qh), "dot4_x2_f16 n=%d token %d differs from dot4_f16", n, t);
            for (int r = 0; r < 4; r++) { /* and dot4's each row's dot_*: one order for every dense dot product */
                const float a32 = dot_f32(r32[r], x + t * xs, n), ab = dot_bf16(rb[r], x + t * xs, n), ah = dot_f16(rh[r], x + t * xs, n);
                CHECK(!memcmp(&q32[r], &a32, 4), "dot4_f32 n=%d row %d: %.9g vs dot_f32's %.9g", n, r, q32[r], a32);
                CHECK(!memcmp(&qb[r], &ab, 4), "dot4_bf16 n=%d row %d: %.9g vs dot_bf16's %.9g", n, r, qb[r], ab);
                CHECK(!memcmp(&qh[r], &ah, 4), "dot4_f16 n=%d row %d: %.9g vs dot_f16's %.9g", n, r, qh[r], ah);
            }
        }
        free(m32); free(mb); free(mh);
        free(x); free(w32); free(wb); free(wh);
    }
}

#if GEMM_AVAILABLE
/* gemm_rows_* (the prompt's matrix products, cpu_gemm.h) against dot_* pair by pair, bit for bit:
 * lengths around the vector widths and past a K block (GEMM_KC), row ranges and batches that leave
 * every partial tile, the matvec epilogue with and without the residual and the bias. */
static void test_gemm(void) {
    static const int lengths[] = {1, 8, 15, 16, 17, 31, 32, 33, 64, 65, 576, 1000, GEMM_KC, GEMM_KC + 48, 2 * GEMM_KC + 17};
    static const int batches[] = {1, 2, 3, 4, 7, 16};
    enum { ROWS = 23 };
    float *scratch = aligned_alloc(64, gemm_scratch_floats(16) * sizeof(float));
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int n = lengths[li], xs = n + 5; /* inputs not 64-byte aligned */
        float *x = malloc(16 * xs * sizeof *x), *m32 = malloc((size_t)ROWS * n * sizeof *m32), *b32 = malloc(ROWS * sizeof *b32);
        uint16_t *mb = malloc((size_t)ROWS * n * 2), *mh = malloc((size_t)ROWS * n * 2), *bb = malloc(ROWS * 2), *bh = malloc(ROWS * 2);
        for (int i = 0; i < 16 * xs; i++) x[i] = frand();
        for (int i = 0; i < ROWS * n; i++) {
            m32[i] = frand();
            mb[i] = f32_to_bf16(m32[i]);
            mh[i] = f32_to_f16_ref(m32[i]);
        }
        for (int r = 0; r < ROWS; r++) {
            b32[r] = frand();
            bb[r] = f32_to_bf16(b32[r]);
            bh[r] = f32_to_f16_ref(b32[r]);
        }
        for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
            const int nb = batches[bi], r0 = 2, r1 = ROWS; /* 21 rows: a block of 16 and one of 5 */
            float o32[16][ROWS], ob[16][ROWS], oh[16][ROWS], v[16][ROWS];
            gemm_rows_f32(m32, n, r0, r1, x, xs, nb, &o32[0][0], ROWS, GEMM_SET, 0, NULL, scratch);
            gemm_rows_bf16(mb, n, r0, r1, x, xs, nb, &ob[0][0], ROWS, GEMM_SET, 0, NULL, scratch);
            gemm_rows_f16(mh, n, r0, r1, x, xs, nb, &oh[0][0], ROWS, GEMM_SET, 0, NULL, scratch);
            int bad = 0;
            for (int t = 0; t < nb; t++)
                for (int r = r0; r < r1; r++) {
                    const float *xt = x + (size_t)t * xs;
                    const float a32 = dot_f32(m32 + (size_t)r * n, xt, n), ab = dot_bf16(mb + (size_t)r * n, xt, n),
                                ah = dot_f16(mh + (size_t)r * n, xt, n);
                    bad += memcmp(&o32[t][r], &a32, 4) != 0 || memcmp(&ob[t][r], &ab, 4) != 0 || memcmp(&oh[t][r], &ah, 4) != 0;
                }
            CHECK(bad == 0, "gemm_rows n=%d nb=%d: %d of %d sums differ from dot_*'s", n, nb, bad, 3 * nb * (r1 - r0));
            /* the matvec's epilogue: y = y + s + bias (bf16) */
            for (int t = 0; t < nb; t++)
                for (int r = 0; r < ROWS; r++) v[t][r] = ob[t][r] = frand();
            gemm_rows_bf16(mb, n, r0, r1, x, xs, nb, &ob[0][0], ROWS, GEMM_MATVEC, 1, bb, scratch);
            bad = 0;
            for (int t = 0; t < nb; t++)
                for (int r = 0; r < ROWS; r++) {
                    const float want = r < r0 ? v[t][r] : v[t][r] + dot_bf16(mb + (size_t)r * n, x + (size_t)t * xs, n) + bf16_to_f32(bb[r]);
                    bad += memcmp(&ob[t][r], &want, 4) != 0;
                }
            CHECK(bad == 0, "gemm_rows_bf16 n=%d nb=%d, residual and bias: %d sums differ (or rows outside the range written)", n, nb, bad);
            gemm_rows_f16(mh, n, r0, r1, x, xs, nb, &oh[0][0], ROWS, GEMM_MATVEC, 0, bh, scratch);
            bad = 0;
            for (int t = 0; t < nb; t++)
                for (int r = r0; r < r1; r++) {
                    const float want = 0.0f + dot_f16(mh + (size_t)r * n, x + (size_t)t * xs, n) + f16_to_f32(bh[r]);
                    bad += memcmp(&oh[t][r], &want, 4) != 0;
                }
            CHECK(bad == 0, "gemm_rows_f16 n=%d nb=%d, bias: %d sums differ", n, nb, bad);
        }
        free(x); free(m32); free(b32); free(mb); free(mh); free(bb); free(bh);
    }
    free(scratch);
}
#endif

/* attention_head against a float64 softmax-attention written out directly. */
static void test_attention(void) {
    enum { HD = 64, STRIDE = 3 * HD };
    static const int lengths[] = {1, 2, 5, 100, 333};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        int n = lengths[li];
        uint16_t *k = malloc((size_t)n * STRIDE * 2), *v = malloc((size_t)n * STRIDE * 2);
        float q[HD], out[HD], *att = malloc(n * sizeof(float));
        for (int i = 0; i < HD; i++) q[i] = 3.0f * frand();
        for (int i = 0; i < n * STRIDE; i++) { k[i] = f32_to_f16_ref(frand()); v[i] = f32_to_f16_ref(frand()); }
        attention_head(out, q, k + HD, v + HD, STRIDE, n, HD, att); /* the second head of each row */
        double *s = malloc(n * sizeof(double)), max = -1e300, sum = 0.0, err = 0.0;
        for (int t = 0; t < n; t++) {
            double d = 0.0;
            for (int i = 0; i < HD; i++) d += q[i] * (double)f16_to_f32_ref(k[t * STRIDE + HD + i]);
            s[t] = d / sqrt((double)HD);
            if (s[t] > max) max = s[t];
        }
        for (int t = 0; t < n; t++) sum += (s[t] = exp(s[t] - max));
        for (int i = 0; i < HD; i++) {
            double o = 0.0;
            for (int t = 0; t < n; t++) o += s[t] / sum * f16_to_f32_ref(v[t * STRIDE + HD + i]);
            err = fmax(err, fabs(o - out[i]));
        }
        /* float32 softmax and sums of n terms: 1e-5 absolute on outputs of magnitude <= 1 */
        CHECK(err < 1e-5, "attention_head n=%d: max error %g", n, err);
        free(k); free(v); free(att); free(s);
    }
}

/* attention_heads_x4 (four tokens of a prefill batch, one query head) against attention_head for
 * each: the same bits, also where the four see different numbers of positions. */
static void test_attention_x4(void) {
    enum { STRIDE = 3 * 128, QS = 5 * 128 };
    static const int head_dims[] = {64, 80, 128}, firsts[] = {1, 30, 200}; /* 80: the 16-wide path, not 64 in registers */
    for (size_t hi = 0; hi < 3; hi++)
        for (size_t fi = 0; fi < 3; fi++) {
            const int hd = head_dims[hi], n_pos[4] = {firsts[fi], firsts[fi] + 1, firsts[fi] + 2, firsts[fi] + 3}, n = n_pos[3];
            uint16_t *k = malloc((size_t)n * STRIDE * 2), *v = malloc((size_t)n * STRIDE * 2);
            float *q = malloc(4 * QS * sizeof *q), *out = malloc(4 * QS * sizeof *out), *att = malloc(4 * n * sizeof *att);
            float one[128], *att1 = malloc(n * sizeof *att1);
            for (int i = 0; i < 4 * QS; i++) q[i] = 3.0f * frand();
            for (int i = 0; i < n * STRIDE; i++) { k[i] = f32_to_f16_ref(frand()); v[i] = f32_to_f16_ref(frand()); }
            attention_heads_x4(out, QS, q, QS, k + hd, v + hd, STRIDE, n_pos, hd, att, n);
            for (int r = 0; r < 4; r++) {
                attention_head(one, q + r * QS, k + hd, v + hd, STRIDE, n_pos[r], hd, att1);
                CHECK(!memcmp(one, out + r * QS, hd * sizeof(float)), "attention_heads_x4 hd=%d n=%d row %d differs from attention_head",
                      hd, n_pos[r], r);
            }
            free(k); free(v); free(q); free(out); free(att); free(att1);
        }
}

/* kv_quantize_q8 on the contract's edge cases (docs/architecture.md, "The KV cache"): exact values where the rule
 * fixes them, and on random vectors the bound every element keeps. */
static void test_kv_quantize(void) {
    enum { HD = 64 };
    float x[HD], d;
    int8_t q[HD];
    int ok = 1;
    for (int i = 0; i < HD; i++) x[i] = i % 3 ? 0.0f : -0.0f;
    memset(q, 7, sizeof q);
    d = kv_quantize_q8(q, x, HD);
    for (int i = 0; i < HD; i++) ok &= q[i] == 0;
    CHECK(d == 0.0f && !signbit(d) && ok, "all-zero vector: d %g, expected 0 and every q 0", d);
    for (int bad = 0; bad < 3; bad++) { /* NaN, +inf, -inf at element 5: d NaN, q 0 */
        for (int i = 0; i < HD; i++) x[i] = frand();
        x[5] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
        memset(q, 7, sizeof q);
        d = kv_quantize_q8(q, x, HD);
        ok = 1;
        for (int i = 0; i < HD; i++) ok &= q[i] == 0;
        CHECK(isnan(d) && ok, "vector with %s: d %g, expected NaN and every q 0", bad == 0 ? "NaN" : "infinity", d);
    }
    /* max|x| = 127: id = 1, so x_i * id = x_i and rint's ties go to even */
    const float ties[] = {127.0f, -127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, 126.5f, 0.49999997f};
    const int8_t want[] = {127, -127, 2, 4, -2, 0, 0, 2, 126, 0};
    d = kv_quantize_q8(q, ties, 10);
    CHECK(d == 1.0f && !memcmp(q, want, sizeof want), "ties: d %g, q %d %d %d %d %d %d %d %d %d %d", d, q[0], q[1], q[2], q[3],
          q[4], q[5], q[6], q[7], q[8], q[9]);
    /* below KV_Q8_TINY (2^-100; 127 / max|x| would overflow near 1e-37): stored as zeros, d = 0 */
    for (int i = 0; i < HD; i++) x[i] = ldexpf(frand(), -110);
    memset(q, 7, sizeof q);
    d = kv_quantize_q8(q, x, HD);
    ok = 1;
    for (int i = 0; i < HD; i++) ok &= q[i] == 0;
    CHECK(d == 0.0f && ok, "a vector of 2^-110: d %g, expected 0 and every q 0", d);
    /* tiny and huge magnitudes above it, the element of largest |x| always at +-127 */
    for (int e = -90; e <= 127; e += 13) {
        double worst = 0.0;
        int peak = 0;
        for (int i = 0; i < HD; i++) x[i] = ldexpf(frand(), e);
        d = kv_quantize_q8(q, x, HD);
        float m = 0.0f;
        for (int i = 0; i < HD; i++) m = fmaxf(m, fabsf(x[i]));
        for (int i = 0; i < HD; i++) {
            peak |= fabsf(x[i]) == m && abs(q[i]) == 127;
            if (m > 0) worst = fmax(worst, fabs((double)x[i] - (double)d * q[i]) / ((double)m / 127.0));
        }
        /* each element within half a step of d * q (plus the fp32 roundings of id and the product) */
        CHECK(d == m / 127.0f && peak && worst <= 0.5 + 1e-5, "2^%d: d %g (m / 127 = %g), largest element at +-127: %d, error %g steps", e,
              d, m / 127.0f, peak, worst);
    }
}

/* dot_i8 and axpy_i8 against their scalar twins (the tolerance of test_dots). */
static void test_dots_i8(void) {
    static const int lengths[] = {1, 7, 16, 17, 63, 64, 65, 128, 1000};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int n = lengths[li];
        float x[1000], o1[1000] = {0}, o2[1000] = {0};
        int8_t k[1000];
        double abs_sum = 0.0;
        for (int i = 0; i < n; i++) {
            x[i] = frand();
            k[i] = (int8_t)lrintf(127.0f * frand());
            abs_sum += fabs(k[i] * x[i]);
        }
        const float a = dot_i8(k, x, n), b = dot_i8_ref(k, x, n);
        CHECK(fabs(a - b) <= 1e-5 * abs_sum + 1e-6, "dot_i8 n=%d: %g vs %g", n, a, b);
        axpy_i8(o1, 0.0037f, k, n);
        axpy_i8_ref(o2, 0.0037f, k, n);
        int same = 1;
        for (int i = 0; i < n; i++) same &= fabsf(o1[i] - o2[i]) <= 1e-6f;
        CHECK(same, "axpy_i8 n=%d differs from the reference", n);
    }
}

/* attention_head_q8 against the contract's formula in float64 (int8 vectors, scales folded into
 * score and probability), including a position whose vectors are all zero (d = 0); and with NaN as
 * one position's key or value scale, every output NaN. */
static void test_attention_q8(void) {
    enum { HD = 64, STRIDE = 3 * HD, NKV = 3 };
    static const int lengths[] = {1, 2, 5, 100, 333};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int n = lengths[li];
        int8_t *k = malloc((size_t)n * STRIDE), *v = malloc((size_t)n * STRIDE);
        float *kd = malloc((size_t)n * NKV * sizeof(float)), *vd = malloc((size_t)n * NKV * sizeof(float));
        float q[HD], out[HD], *att = malloc(n * sizeof(float)), row[HD];
        for (int i = 0; i < HD; i++) q[i] = 3.0f * frand();
        for (int t = 0; t < n; t++)
            for (int h = 0; h < NKV; h++) {
                for (int i = 0; i < HD; i++) row[i] = t == n / 2 ? 0.0f : frand();
                kd[t * NKV + h] = kv_quantize_q8(k + t * STRIDE + h * HD, row, HD);
                for (int i = 0; i < HD; i++) row[i] = t == n / 2 ? 0.0f : frand();
                vd[t * NKV + h] = kv_quantize_q8(v + t * STRIDE + h * HD, row, HD);
            }
        attention_head_q8(out, q, k + HD, v + HD, kd + 1, vd + 1, STRIDE, NKV, n, HD, att); /* the second head */
        double *s = malloc(n * sizeof(double)), max = -1e300, sum = 0.0, err = 0.0;
        for (int t = 0; t < n; t++) {
            double dd = 0.0;
            for (int i = 0; i < HD; i++) dd += q[i] * (double)k[t * STRIDE + HD + i];
            s[t] = dd * kd[t * NKV + 1] / sqrt((double)HD);
            if (s[t] > max) max = s[t];
        }
        for (int t = 0; t < n; t++) sum += (s[t] = exp(s[t] - max));
        for (int i = 0; i < HD; i++) {
            double o = 0.0;
            for (int t = 0; t < n; t++) o += s[t] / sum * vd[t * NKV + 1] * v[t * STRIDE + HD + i];
            err = fmax(err, fabs(o - out[i]));
        }
        /* float32 softmax and sums of n terms: 1e-5 absolute on outputs of magnitude <= 1 */
        CHECK(err < 1e-5, "attention_head_q8 n=%d: max error %g", n, err);
        for (int which = 0; which < 2; which++) {
            float *dd = which ? vd : kd, keep = dd[(n - 1) * NKV + 1];
            dd[(n - 1) * NKV + 1] = NAN;
            attention_head_q8(out, q, k + HD, v + HD, kd + 1, vd + 1, STRIDE, NKV, n, HD, att);
            int all_nan = 1;
            for (int i = 0; i < HD; i++) all_nan &= isnan(out[i]) != 0;
            CHECK(all_nan, "attention_head_q8 n=%d: a NaN %s scale, expected NaN in every output", n, which ? "value" : "key");
            dd[(n - 1) * NKV + 1] = keep;
        }
        free(k); free(v); free(kd); free(vd); free(att); free(s);
    }
}

/* attention_heads_x4_q8 against attention_head_q8 for each of the four: the same bits. */
static void test_attention_x4_q8(void) {
    enum { STRIDE = 3 * 128, QS = 5 * 128, NKV = 3 };
    static const int head_dims[] = {16, 64, 128}, firsts[] = {1, 30, 200};
    for (size_t hi = 0; hi < 3; hi++)
        for (size_t fi = 0; fi < 3; fi++) {
            const int hd = head_dims[hi], n_pos[4] = {firsts[fi], firsts[fi] + 1, firsts[fi] + 2, firsts[fi] + 3}, n = n_pos[3];
            int8_t *k = malloc((size_t)n * STRIDE), *v = malloc((size_t)n * STRIDE);
            float *kd = malloc((size_t)n * NKV * sizeof(float)), *vd = malloc((size_t)n * NKV * sizeof(float));
            float *q = malloc(4 * QS * sizeof *q), *out = malloc(4 * QS * sizeof *out), *att = malloc(4 * n * sizeof *att);
            float one[128], *att1 = malloc(n * sizeof *att1);
            for (int i = 0; i < 4 * QS; i++) q[i] = 3.0f * frand();
            for (int i = 0; i < n * STRIDE; i++) { k[i] = (int8_t)lrintf(127.0f * frand()); v[i] = (int8_t)lrintf(127.0f * frand()); }
            for (int i = 0; i < n * NKV; i++) { kd[i] = 0.01f * (1.0f + frand()); vd[i] = 0.01f * (1.0f + frand()); }
            attention_heads_x4_q8(out, QS, q, QS, k + hd, v + hd, kd + 1, vd + 1, STRIDE, NKV, n_pos, hd, att, n);
            for (int r = 0; r < 4; r++) {
                attention_head_q8(one, q + r * QS, k + hd, v + hd, kd + 1, vd + 1, STRIDE, NKV, n_pos[r], hd, att1);
                CHECK(!memcmp(one, out + r * QS, hd * sizeof(float)),
                      "attention_heads_x4_q8 hd=%d n=%d row %d differs from attention_head_q8", hd, n_pos[r], r);
            }
            free(k); free(v); free(kd); free(vd); free(q); free(out); free(att); free(att1);
        }
}

static void test_rope(void) {
    /* rope_rotate is a rotation: it keeps the pair's norm and turns it by pos * inv_freq. */
    float a = 0.6f, b = -0.8f;
    rope_rotate(&a, &b, 7, 0.25f);
    double angle = 7 * 0.25, ea = 0.6 * cos(angle) + 0.8 * sin(angle), eb = -0.8 * cos(angle) + 0.6 * sin(angle);
    CHECK(fabs(a - ea) < 1e-6 && fabs(b - eb) < 1e-6, "rope_rotate: (%g, %g), expected (%g, %g)", a, b, ea, eb);
    float x[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    float s = rms_scale(x, 8, 1e-5f);
    double ms = (1 + 4 + 9 + 16 + 25 + 36 + 49 + 64) / 8.0;
    CHECK(fabs(s - 1.0 / sqrt(ms + 1e-5)) < 1e-6, "rms_scale: %g", s);
}

/* exp_softmax against exp in double (under 1 ulp on [-87, 88]: 0.70 at most over 2^26 random points) and its edges; exp_shifted's
 * vector lanes against it bit for bit (the decode step and a prompt batch exponentiate a score the
 * same way) */
static void test_exp_softmax(void) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x), *e = malloc(N * sizeof *e);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        x[i] = i < N - 64 ? -87.0f + 175.0f * (float)i / (float)(N - 64) : frand() * 87.0f;
        const double want = exp((double)x[i]), got = exp_softmax(x[i]);
        const double err = fabs(got - want) / (want * 0x1p-23); /* in units of 2^-23 of the value */
        if (err > worst) worst = err;
    }
    CHECK(worst <= 1.0, "exp_softmax: %.2f ulp from exp on [-87, 88]", worst);
    const float edge[] = {0.0f, -0.0f, -1e-30f, -87.0f, -87.00001f, -100.0f, -1e30f, -INFINITY, 88.0f, 88.00001f, INFINITY, NAN};
    const float want[] = {1.0f, 1.0f, 1.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f, -1.0f, INFINITY, INFINITY, NAN};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
        const float got = exp_softmax(edge[i]);
        const int ok = isnan(want[i]) ? isnan(got) : want[i] < 0.0f ? got > 0.0f && isfinite(got) : got == want[i];
        CHECK(ok, "exp_softmax(%g) = %g", edge[i], got);
        x[i * 37] = edge[i]; /* among the vectors' lanes below, at every lane position */
    }
    for (int n = N - 5; n <= N; n += 5) { /* whole vectors and a scalar tail */
        memcpy(e, x, (size_t)n * sizeof *x);
        const float max = n == N ? 0.0f : 1.5f;
        exp_shifted(e, n, max);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const float one = exp_softmax(x[i] - max);
            if (memcmp(&one, &e[i], sizeof one) != 0 && !(isnan(one) && isnan(e[i]))) bad++;
        }
        CHECK(bad == 0, "exp_shifted n=%d: %d of its lanes differ from exp_softmax", n, bad);
    }
    free(x);
    free(e);
}

/* silu against x / (1 + e^-x) in double (within 2 ulp of the value where |x| < 87: exp_softmax's ulp and the
 * division's rounding), its edges, and silu_mul's vector lanes against the scalar form bit for bit (the decode
 * step's SiLU and a prompt batch's give the same bits) */
static void test_silu(void) {
    enum { N = 1 << 16 };
    float *g = malloc(N * sizeof *g), *h = malloc(N * sizeof *h), *y = malloc(N * sizeof *y);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        g[i] = -86.0f + 172.0f * (float)i / (float)N;
        h[i] = frand() * 4.0f - 2.0f;
        const double want = (double)g[i] / (1.0 + exp(-(double)g[i])), got = silu(g[i]);
        if (want != 0.0) {
            const double err = fabs(got - want) / (fabs(want) * 0x1p-23);
            if (err > worst) worst = err;
        }
    }
    CHECK(worst <= 2.0, "silu: %.2f ulp from x / (1 + e^-x) on [-86, 86]", worst);
    const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.5f, -88.5f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
        const float got = silu(edge[i]), x = edge[i];
        const int ok = isnan(x) ? isnan(got)
                       : x == 0.0f ? got == 0.0f && signbit(got) == signbit(x)
                       : x > 87.0f ? got == x
                       : x < -87.0f ? (isinf(x) ? isnan(got) : got == 0.0f)
                       : fabsf(got - x * 0.5f) <= fabsf(x) * 1e-6f;
        CHECK(ok, "silu(%g) = %g", x, got);
        g[i * 41] = edge[i]; /* among the vectors' lanes below, at every lane position */
    }
    for (int n = N - 7; n <= N; n += 7) { /* whole vectors and a scalar tail */
        memcpy(y, h, (size_t)n * sizeof *h);
        silu_mul(y, g, n);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const float one = silu(g[i]) * h[i];
            if (memcmp(&one, &y[i], sizeof one) != 0 && !(isnan(one) && isnan(y[i]))) bad++;
        }
        CHECK(bad == 0, "silu_mul n=%d: %d of its lanes differ from silu", n, bad);
    }
    free(g);
    free(h);
    free(y);
}

int main(void) {
    test_conversions();
    test_exp_softmax();
    test_silu();
    test_dots();
    test_dots_x4();
#if GEMM_AVAILABLE
    test_gemm();
#endif
    test_attention();
    test_attention_x4();
    test_kv_quantize();
    test_dots_i8();
    test_attention_q8();
    test_attention_x4_q8();
    test_rope();
    return check_summary();
}
