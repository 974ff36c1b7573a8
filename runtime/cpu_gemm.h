/* cpu_gemm.h - the CPU prompt's matrix products: rows of a dense weight matrix against a batch of
 * tokens' inputs, each (row, token) sum in dot_w's order, so that a prompt's batch gives the decode
 * step's bits (tests/test_numerics.py compares them; tests/test_cpu_kernels.c checks each sum
 * against dot_w's).
 *
 * dot_w keeps two partial vectors a pair (cpu_kernels.h). A tile of GEMM_R rows x GEMM_T tokens
 * keeps both of each pair in registers (4 x 3 x 2 = 24 of AVX-512's 32; 2 x 3 x 2 = 12 of AVX2's 16)
 * while it walks a block of GEMM_KC elements: each step loads R weight vectors and T input vectors
 * for 2 R T fused multiply-adds. A thread takes GEMM_RB of its rows at a time; each K block of them is
 * converted to fp32 once for the whole batch (a dot product converts its row once per token) into
 * its scratch, where a tile's weights stay in L1 while it serves every group of tokens; the next
 * block's weights are prefetched into L2 meanwhile. The partial vectors wait between blocks in the
 * scratch; after the last, each pair ends as dot_w ends (a whole vector left over into a, the
 * reduction, the scalar tail).
 *
 * AVX-512 or AVX2 + FMA + F16C builds (GEMM_AVAILABLE); elsewhere the prompt uses the dot products.
 * Include after cpu_kernels.h (and model.h, for gemm_rows_w). */
#ifndef INGOT_CPU_GEMM_H
#define INGOT_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The vectors of cpu_kernels.h (VW lanes); a 4-row tile with AVX-512's 32 registers, 2 rows with AVX2's 16. */
#if defined(VW)
#define GEMM_AVAILABLE 1
#define GEMM_W VW
#if VW == 16
#define GEMM_R 4
#else
#define GEMM_R 2
#endif
#else
#define GEMM_AVAILABLE 0
#endif

#if GEMM_AVAILABLE
#define GEMM_T 3     /* tokens a tile */
#define GEMM_RB 16   /* rows a thread converts and finishes at a time */
#define GEMM_KC 1024 /* elements a K block: a multiple of 2 GEMM_W; a tile's weights, 4 x 4 KB, in L1 */

/* Floats of one thread's scratch for batches of up to nb tokens: the block's fp32 weights and the
 * partial vectors (both 64-byte aligned when the scratch is). */
static inline size_t gemm_scratch_floats(int nb) {
    return (size_t)GEMM_RB * GEMM_KC + (size_t)GEMM_RB * (size_t)nb * 2 * GEMM_W;
}

/* The tile: R rows of fp32 weights w (ws floats apart, 64-byte aligned) against T tokens' inputs x
 * (xs floats apart) over kc elements (a multiple of 2 GEMM_W), onto the partial vectors acc (pair
 * (r, t) at acc[(r * nb + t) * 2], a then b). */
#define GEMM_TILE(R, T)                                                                                  \
    static inline __attribute__((always_inline)) void gemm_tile_##R##_##T(const float *w, const float *x, size_t xs, \
                                                                         int kc, vecf *acc, int nb) { \
        vecf a[R][T], b[R][T];                                                                       \
        for (int r = 0; r < R; r++)                                                                      \
            for (int t = 0; t < T; t++) {                                                                \
                a[r][t] = acc[((size_t)r * nb + t) * 2];                                                 \
                b[r][t] = acc[((size_t)r * nb + t) * 2 + 1];                                             \
            }                                                                                            \
        for (int i = 0; i < kc; i += 2 * GEMM_W) {                                                       \
            vecf wa[R], wb[R];                                                                       \
            for (int r = 0; r < R; r++) {                                                                \
                wa[r] = V_LOAD(w + (size_t)r * GEMM_KC + i);                                            \
                wb[r] = V_LOAD(w + (size_t)r * GEMM_KC + i + GEMM_W);                                   \
            }                                                                                            \
            for (int t = 0; t < T; t++) {                                                                \
                const vecf x0 = V_LOADU(x + (size_t)t * xs + i), x1 = V_LOADU(x + (size_t)t * xs + i + GEMM_W); \
                for (int r = 0; r < R; r++) {                                                            \
                    a[r][t] = V_FMA(wa[r], x0, a[r][t]);                                                \
                    b[r][t] = V_FMA(wb[r], x1, b[r][t]);                                                \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (int r = 0; r < R; r++)                                                                      \
            for (int t = 0; t < T; t++) {                                                                \
                acc[((size_t)r * nb + t) * 2] = a[r][t];                                                 \
                acc[((size_t)r * nb + t) * 2 + 1] = b[r][t];                                             \
            }                                                                                            \
    }
#define GEMM_TILES(R) GEMM_TILE(R, 1) GEMM_TILE(R, 2) GEMM_TILE(R, 3)
GEMM_TILES(1)
GEMM_TILES(2)
#if GEMM_R == 4
GEMM_TILES(3)
GEMM_TILES(4)
#endif

/* The tile for R <= GEMM_R rows and T <= GEMM_T tokens, each a constant in its own copy. */
static inline __attribute__((always_inline)) void gemm_tile(int R, int T, const float *w, const float *x, size_t xs, int kc,
                                                            vecf *acc, int nb) {
#define GEMM_CASE(r, t) \
    case (r) * 4 + (t): gemm_tile_##r##_##t(w, x, xs, kc, acc, nb); break;
    switch (R * 4 + T) {
        GEMM_CASE(1, 1) GEMM_CASE(1, 2) GEMM_CASE(1, 3) GEMM_CASE(2, 1) GEMM_CASE(2, 2) GEMM_CASE(2, 3)
#if GEMM_R == 4
        GEMM_CASE(3, 1) GEMM_CASE(3, 2) GEMM_CASE(3, 3) GEMM_CASE(4, 1) GEMM_CASE(4, 2) GEMM_CASE(4, 3)
#endif
    }
#undef GEMM_CASE
}

/* What gemm_rows does with a pair's sum s: GEMM_SET stores it; GEMM_MATVEC is the decode matvec's
 * y = (accumulate ? y : 0) + s + bias, in its order. */
enum { GEMM_SET, GEMM_MATVEC };

/* The weights of the block after (rb, kb) (its rows rb.. of rn, elements kb.. of kc; the next rows'
 * first block after the last), prefetched into L2 a share at a time: `left` lines, `each` a tile. */
typedef struct {
    const char *row;   /* the next line's row start */
    size_t row_bytes;  /* bytes between rows */
    int line, lines;   /* the next line in the row, lines a row */
    int rows_left, each;
} gemm_prefetch;

static inline gemm_prefetch gemm_prefetch_next(const void *w, size_t elem, int n, int n2, int rb, int rn, int kb, int r1, int nb) {
    gemm_prefetch p = {0};
    int nrb = rb, nkb = kb + GEMM_KC, nrn = rn;
    if (nkb >= n2) {
        nrb = rb + GEMM_RB;
        nkb = 0;
        nrn = r1 - nrb < GEMM_RB ? r1 - nrb : GEMM_RB;
    }
    if (nrb >= r1 || n2 == 0) return p;
    const int kc = n2 - nkb < GEMM_KC ? n2 - nkb : GEMM_KC;
    p.row_bytes = (size_t)n * elem;
    p.row = (const char *)w + (size_t)nrb * p.row_bytes + (size_t)nkb * elem;
    p.lines = (int)(((size_t)kc * elem + 63) / 64);
    p.rows_left = nrn;
    const int tiles = (rn + GEMM_R - 1) / GEMM_R * ((nb + GEMM_T - 1) / GEMM_T);
    p.each = (nrn * p.lines + tiles - 1) / tiles;
    return p;
}

static inline __attribute__((always_inline)) void gemm_prefetch_some(gemm_prefetch *p) {
    for (int k = 0; k < p->each && p->rows_left > 0; k++) {
        _mm_prefetch(p->row + (size_t)p->line * 64, _MM_HINT_T1);
        if (++p->line == p->lines) {
            p->line = 0;
            p->row += p->row_bytes;
            p->rows_left--;
        }
    }
}

/* gemm_rows_<dtype> (bf16, f16, f32; gemm_rows_w the model's): for rows [r0, r1) of the dense
 * matrix w (rows of n weights) and tokens t < nb (inputs x + t xs): out[t * os + r] = s (GEMM_SET)
 * or (accumulate ? out : 0) + s + bias[r] (GEMM_MATVEC), s the row's dot product with the token's
 * input in dot_w's order. scratch: gemm_scratch_floats(nb), 64-byte aligned, this thread's alone. */
#define GEMM_ROWS(SFX, T, LOAD_W, TAIL_REF, TO_F32)                                                       \
    static inline __attribute__((always_inline)) void gemm_rows_##SFX(const T *w, int n, int r0, int r1, const float *x, \
                                                                     size_t xs, int nb, float *out, size_t os, int mode, \
                                                                     int accumulate, const T *bias, float *scratch) { \
        float *wbuf = scratch;                                                                           \
        vecf *acc = (vecf *)(scratch + (size_t)GEMM_RB * GEMM_KC);                               \
        const int n2 = n / (2 * GEMM_W) * (2 * GEMM_W); /* the part dot_w sums two vectors a step */     \
        for (int rb = r0; rb < r1; rb += GEMM_RB) {                                                      \
            const int rn = r1 - rb < GEMM_RB ? r1 - rb : GEMM_RB;                                        \
            for (size_t i = 0; i < (size_t)rn * nb * 2; i++) acc[i] = V_ZERO();                         \
            for (int kb = 0; kb < n2; kb += GEMM_KC) {                                                   \
                const int kc = n2 - kb < GEMM_KC ? n2 - kb : GEMM_KC;                                    \
                for (int r = 0; r < rn; r++) {                                                           \
                    const T *src = w + (size_t)(rb + r) * n + kb;                                        \
                    for (int i = 0; i < kc; i += GEMM_W) V_STORE(wbuf + (size_t)r * GEMM_KC + i, LOAD_W(src + i)); \
                }                                                                                        \
                /* the next block's weights into L2 while this one's tiles run, a share after each tile  \
                 * (its rows are new pages, which the hardware's prefetchers would start cold) */        \
                gemm_prefetch pf = gemm_prefetch_next(w, sizeof(T), n, n2, rb, rn, kb, r1, nb);          \
                for (int q = 0; q < rn; q += GEMM_R)                                                     \
                    for (int t = 0; t < nb; t += GEMM_T) {                                               \
                        gemm_tile(rn - q < GEMM_R ? rn - q : GEMM_R, nb - t < GEMM_T ? nb - t : GEMM_T,  \
                                  wbuf + (size_t)q * GEMM_KC, x + (size_t)t * xs + kb, xs, kc, acc + ((size_t)q * nb + t) * 2, nb); \
                        gemm_prefetch_some(&pf);                                                         \
                    }                                                                                    \
            }                                                                                            \
            for (int r = 0; r < rn; r++) {                                                               \
                const T *row = w + (size_t)(rb + r) * n;                                                 \
                const float add = bias ? TO_F32(bias[rb + r]) : 0.0f;                                    \
                for (int t = 0; t < nb; t++) {                                                           \
                    const float *xt = x + (size_t)t * xs;                                                \
                    vecf a = acc[((size_t)r * nb + t) * 2];                                          \
                    int i = n2;                                                                          \
                    if (i + GEMM_W <= n) { /* a whole vector left: into a, as dot_w */                   \
                        a = V_FMA(LOAD_W(row + i), V_LOADU(xt + i), a);                                \
                        i += GEMM_W;                                                                     \
                    }                                                                                    \
                    float s = V_SUM(a, acc[((size_t)r * nb + t) * 2 + 1]);                              \
                    s = n > i ? s + TAIL_REF(row + i, xt + i, n - i) : s;                                \
                    float *y = out + (size_t)t * os + rb + r;                                            \
                    *y = mode == GEMM_SET ? s : (accumulate ? *y : 0.0f) + s + add;                      \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }
static inline float gemm_f32_id(float v) { return v; }
GEMM_ROWS(bf16, uint16_t, V_LOAD_BF16, dot_bf16_ref, bf16_to_f32)
GEMM_ROWS(f16, uint16_t, V_LOAD_F16, dot_f16_ref, f16_to_f32)
GEMM_ROWS(f32, float, V_LOAD_F32, dot_f32_ref, gemm_f32_id)
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define gemm_rows_w gemm_rows_bf16
#elif defined(MODEL_WEIGHT_DTYPE_F16)
#define gemm_rows_w gemm_rows_f16
#elif defined(MODEL_WEIGHT_DTYPE_F32)
#define gemm_rows_w gemm_rows_f32
#endif
#endif /* GEMM_AVAILABLE */

#endif
