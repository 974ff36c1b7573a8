/* cpu_dpbf16.c - the CPU prompt's matrix products with bf16 inputs (vdpbf16ps, AVX512_BF16), against
 * the product's exact GEMM (runtime/cpu_gemm.h: fp32 inputs, dot_w's sums), on a model's layer shapes
 * at 16 threads or as many as asked: the measurement behind the decision docs/performance.md names
 * (rounding the prompt's inputs to bf16 on the CPU, as the GPU's prompt does since D120). Not the
 * product: a standalone program.
 *   gcc -O3 -march=native -fopenmp -D_GNU_SOURCE -Iruntime tests/bench/cpu_dpbf16.c runtime/probe.c \
 *       runtime/errors.c -o /tmp/cpu_dpbf16 -lm && /tmp/cpu_dpbf16 THREADS DIM HIDDEN KV_DIM
 * The bf16 GEMM: a tile of 4 rows x 6 tokens, one accumulator each (24 zmm), K in blocks of 512
 * (a tile's weights, 4 KB as stored, and its tokens' inputs, 6 KB, in L1), each step 32 elements:
 * 4 weight loads and 6 input loads for 24 vdpbf16ps. Its twin without AVX512_BF16 does each
 * vdpbf16ps as two fp32 FMAs, the odd element of each pair first, as the SDM's pseudocode orders
 * them (each accumulation rounded to nearest even; the instruction also treats denormal inputs as
 * zero and flushes denormal results, which random normal inputs never meet). Printed: GFLOP/s and
 * the share of the FMA probe for the exact GEMM, the twin and the instruction; whether the
 * instruction's sums equal the twin's bit for bit; each one's largest error against a double sum
 * of the exact inputs, as a share of the sum of |products|. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_gemm.h"
#include "probe.h"

#if !GEMM_AVAILABLE || VW != 16
#error "cpu_dpbf16.c needs AVX-512"
#endif

#define BR 4     /* rows a tile */
#define BT 6     /* tokens a tile */
#define BRB 16   /* rows a block */
#define BKC 512  /* elements a K block (a multiple of 32) */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static uint16_t to_bf16(float f) { /* round to nearest even (no NaNs here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* acc + the 16 pairs' products of w and x (32 bf16 each), as vdpbf16ps sums them */
static inline __attribute__((always_inline)) __m512 dp_twin(__m512 acc, __m512i w, __m512i x) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi)), _mm512_castsi512_ps(_mm512_and_si512(x, hi)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc);
}

#ifdef __AVX512BF16__
static inline __attribute__((always_inline)) __m512 dp_hw(__m512 acc, __m512i w, __m512i x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}
#endif

/* The tile: R rows of bf16 weights w (n apart) against T tokens' bf16 inputs x (n apart) over kc
 * elements, onto the accumulators acc[r * BT + t]. */
#define DP_TILE(NAME, DP)                                                                                        \
    static inline __attribute__((always_inline)) void NAME(int R, int T, const uint16_t *w, const uint16_t *x, int n, int kc, \
                                                           __m512 *acc) {                                       \
        __m512 a[BR][BT];                                                                                        \
        for (int r = 0; r < R; r++)                                                                              \
            for (int t = 0; t < T; t++) a[r][t] = acc[r * BT + t];                                               \
        for (int i = 0; i < kc; i += 32) {                                                                       \
            __m512i wv[BR];                                                                                      \
            for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_si512(w + (size_t)r * n + i);                       \
            for (int t = 0; t < T; t++) {                                                                        \
                const __m512i xv = _mm512_loadu_si512(x + (size_t)t * n + i);                                   \
                for (int r = 0; r < R; r++) a[r][t] = DP(a[r][t], wv[r], xv);                                    \
            }                                                                                                    \
        }                                                                                                        \
        for (int r = 0; r < R; r++)                                                                              \
            for (int t = 0; t < T; t++) acc[r * BT + t] = a[r][t];                                               \
    }
DP_TILE(tile_twin, dp_twin)
#ifdef __AVX512BF16__
DP_TILE(tile_hw, dp_hw)
#endif

/* rows [r0, r1) of w against nb tokens' bf16 inputs xb: out[t * rows + r]; acc: BRB * nb vectors */
#define DP_ROWS(NAME, TILE)                                                                                      \
    static void NAME(const uint16_t *w, int n, int r0, int r1, const uint16_t *xb, int nb, float *out, int rows, __m512 *acc) { \
        for (int rb = r0; rb < r1; rb += BRB) {                                                                  \
            const int rn = r1 - rb < BRB ? r1 - rb : BRB;                                                        \
            for (int i = 0; i < rn * nb; i++) acc[i] = _mm512_setzero_ps();                                      \
            for (int kb = 0; kb < n; kb += BKC) {                                                                \
                const int kc = n - kb < BKC ? n - kb : BKC;                                                      \
                for (int t = 0; t < nb; t += BT) {                                                               \
                    const int T = nb - t < BT ? nb - t : BT;                                                     \
                    for (int q = 0; q < rn; q += BR) {                                                           \
                        const int R = rn - q < BR ? rn - q : BR;                                                 \
                        __m512 tacc[BR * BT];                                                                    \
                        for (int r = 0; r < R; r++)                                                              \
                            for (int u = 0; u < T; u++) tacc[r * BT + u] = acc[(q + r) * nb + t + u];            \
                        if (R == BR && T == BT) TILE(BR, BT, w + (size_t)(rb + q) * n + kb, xb + (size_t)t * n + kb, n, kc, tacc); \
                        else TILE(R, T, w + (size_t)(rb + q) * n + kb, xb + (size_t)t * n + kb, n, kc, tacc);   \
                        for (int r = 0; r < R; r++)                                                              \
                            for (int u = 0; u < T; u++) acc[(q + r) * nb + t + u] = tacc[r * BT + u];            \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            for (int r = 0; r < rn; r++)                                                                         \
                for (int t = 0; t < nb; t++) out[(size_t)t * rows + rb + r] = _mm512_reduce_add_ps(acc[r * nb + t]); \
        }                                                                                                        \
    }
DP_ROWS(rows_twin, tile_twin)
#ifdef __AVX512BF16__
DP_ROWS(rows_hw, tile_hw)
#endif

static void share(int n, int t, int nt, int *lo, int *hi) {
    *lo = (int)((long long)n * t / nt);
    *hi = (int)((long long)n * (t + 1) / nt);
}

enum { EXACT, TWIN, HW };

/* seconds of the best of reps passes; the bf16 kinds convert the batch's inputs first (timed: the
 * product would do it once a matrix product) */
static double run(int kind, const uint16_t *w, int rows, int n, const float *x, uint16_t *xb, int nb, float *out, float *scratch,
                  __m512 *accs, int threads, int reps) {
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = time_now();
#pragma omp parallel num_threads(threads)
        {
            int lo, hi;
            const int me = omp_get_thread_num();
            if (kind != EXACT) {
                share(nb * n, me, threads, &lo, &hi);
                for (int i = lo; i < hi; i++) xb[i] = to_bf16(x[i]);
#pragma omp barrier
            }
            share(rows, me, threads, &lo, &hi);
            if (kind == EXACT)
                gemm_rows_bf16(w, n, lo, hi, x, (size_t)n, nb, out, (size_t)rows, GEMM_SET, 0, NULL,
                               scratch + (size_t)me * gemm_scratch_floats(nb));
            else if (kind == TWIN)
                rows_twin(w, n, lo, hi, xb, nb, out, rows, accs + (size_t)me * BRB * nb);
#ifdef __AVX512BF16__
            else
                rows_hw(w, n, lo, hi, xb, nb, out, rows, accs + (size_t)me * BRB * nb);
#endif
        }
        double dt = time_now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* the largest |sum - exact| / sum |products| over every 7th row, exact in double from fp32 x */
static double worst_error(const float *out, const uint16_t *w, const float *x, int rows, int n, int nb) {
    double worst = 0;
    for (int t = 0; t < nb; t++)
        for (int r = 0; r < rows; r += 7) {
            double s = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                const double p = (double)from_bf16(w[(size_t)r * n + i]) * x[(size_t)t * n + i];
                s += p;
                mag += fabs(p);
            }
            const double e = fabs(out[(size_t)t * rows + r] - s) / mag;
            worst = e > worst ? e : worst;
        }
    return worst;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    const int dim = argc > 2 ? atoi(argv[2]) : 2048, hidden = argc > 3 ? atoi(argv[3]) : 8192, kv = argc > 4 ? atoi(argv[4]) : 512;
    if (threads < 1 || dim < 32 || hidden < 32 || kv < 32 || dim % 32 || hidden % 32) {
        fprintf(stderr, "usage: cpu_dpbf16 THREADS DIM HIDDEN KV_DIM (DIM and HIDDEN multiples of 32)\n");
        return 2;
    }
#ifdef __AVX512BF16__
    const int kinds = 3;
#else
    const int kinds = 2;
    printf("no AVX512_BF16 in this build: the twin only\n");
#endif
    const struct { const char *name; int rows, n; } shapes[] = {
        {"q / o_proj", dim, dim}, {"k / v_proj", kv, dim}, {"gate / up_proj", hidden, dim}, {"down_proj", dim, hidden}};
    const int batches[] = {64, 128};
    const double fma = probe_cpu_fma_rate(threads);
    printf("%d threads, FMA probe %.1f GFLOP/s (fp32)\n", threads, fma / 1e9);
    printf("%-16s %6s %6s %5s %10s %6s %10s %6s %10s %6s %6s %9s %9s %9s\n", "matrix", "rows", "n", "batch", "exact GF/s", "share",
           "twin GF/s", "share", "hw GF/s", "share", "hw=tw", "err exact", "err twin", "err hw");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int rows = shapes[s].rows, n = shapes[s].n;
        uint16_t *w = malloc((size_t)rows * n * sizeof *w), *xb = aligned_alloc(64, (size_t)128 * n * sizeof *xb);
        float *x = malloc((size_t)128 * n * sizeof *x), *out[3];
        float *scratch = aligned_alloc(64, (size_t)threads * gemm_scratch_floats(128) * sizeof(float));
        __m512 *accs = aligned_alloc(64, (size_t)threads * BRB * 128 * sizeof(__m512));
        for (int k = 0; k < 3; k++) out[k] = malloc((size_t)128 * rows * sizeof(float));
        if (!w || !xb || !x || !scratch || !accs || !out[0] || !out[1] || !out[2]) { fprintf(stderr, "cpu_dpbf16: out of memory\n"); return 1; }
        for (size_t i = 0; i < (size_t)rows * n; i++) w[i] = to_bf16(frand());
        for (size_t i = 0; i < (size_t)128 * n; i++) x[i] = frand();
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            const int nb = batches[b];
            double gf[3] = {0, 0, 0}, err[3] = {0, 0, 0};
            const double flops = 2.0 * rows * n * nb;
            for (int k = 0; k < kinds; k++) {
                run(k, w, rows, n, x, xb, nb, out[k], scratch, accs, threads, 1);
                err[k] = worst_error(out[k], w, x, rows, n, nb);
                gf[k] = flops / run(k, w, rows, n, x, xb, nb, out[k], scratch, accs, threads, 3) / 1e9;
            }
            const int same = kinds == 3 && memcmp(out[1], out[2], (size_t)nb * rows * sizeof(float)) == 0;
            char hw[64] = "         -      -", hw_err[16] = "        -";
            if (kinds == 3) {
                snprintf(hw, sizeof hw, "%10.1f %5.1f%%", gf[2], 100 * gf[2] * 1e9 / fma);
                snprintf(hw_err, sizeof hw_err, "%9.2e", err[2]);
            }
            printf("%-16s %6d %6d %5d %10.1f %5.1f%% %10.1f %5.1f%% %s %6s %9.2e %9.2e %s\n", shapes[s].name, rows, n, nb, gf[0],
                   100 * gf[0] * 1e9 / fma, gf[1], 100 * gf[1] * 1e9 / fma, hw, kinds == 3 ? (same ? "yes" : "NO") : "-", err[0], err[1],
                   hw_err);
            /* bf16 inputs: each product off by at most 2^-8 of itself (x's rounding), the sums' own
             * rounding far below; the exact GEMM's error is fp32 summation's alone */
            for (int k = 0; k < kinds; k++)
                if (err[k] > (k == EXACT ? 1e-5 : 4e-3)) {
                    fprintf(stderr, "cpu_dpbf16: %s batch %d: %s sums off by %.2e of their |products|\n", shapes[s].name, nb,
                            k == EXACT ? "the exact GEMM's" : k == TWIN ? "the twin's" : "vdpbf16ps's", err[k]);
                    return 1;
                }
        }
        free(w); free(xb); free(x); free(scratch); free(accs);
        for (int k = 0; k < 3; k++) free(out[k]);
    }
    return 0;
}
