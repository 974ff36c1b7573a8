/* cpu_gemm.c - the CPU prompt's matrix products alone, on the shapes of a model's layers: the GEMM
 * of runtime/cpu_gemm.h (the product's) against the dot products it replaced (dot_x4_bf16, a row
 * against four tokens), each thread its share of the rows as the forward pass splits them, in
 * GFLOP/s and as a share of the FMA probe --bench reports. For choosing the batch on a machine
 * without the noise of a whole prompt (docs/performance.md, D124):
 *   gcc -O3 -march=native -fopenmp -D_GNU_SOURCE -Iruntime tests/bench/cpu_gemm.c runtime/probe.c \
 *       runtime/errors.c -o /tmp/cpu_gemm && /tmp/cpu_gemm THREADS DIM HIDDEN KV_DIM
 * (the Llama-3.2-1B shape by default: 2048 8192 512). Random bf16 weights, every sum checked against
 * dot_bf16 bit for bit before it is timed. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_gemm.h"
#include "probe.h"

#if !GEMM_AVAILABLE
#error "cpu_gemm.c needs AVX-512 or AVX2 + FMA + F16C (cpu_gemm.h's GEMM)"
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static void share(int n, int t, int nt, int *lo, int *hi) {
    *lo = (int)((long long)n * t / nt);
    *hi = (int)((long long)n * (t + 1) / nt);
}

/* seconds of the best of `reps` passes: rows x n weights against nb tokens, by the GEMM or by dot_x4 */
static double run(int gemm, const uint16_t *w, int rows, int n, const float *x, int nb, float *out, float *scratch, int threads,
                  int reps) {
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = time_now();
#pragma omp parallel num_threads(threads)
        {
            int lo, hi;
            share(rows, omp_get_thread_num(), threads, &lo, &hi);
            if (gemm)
                gemm_rows_bf16(w, n, lo, hi, x, (size_t)n, nb, out, (size_t)rows, GEMM_SET, 0, NULL,
                               scratch + (size_t)omp_get_thread_num() * gemm_scratch_floats(nb));
            else
                for (int r = lo; r < hi; r++)
                    for (int t = 0; t + 4 <= nb; t += 4) {
                        float o[4];
                        dot_x4_bf16(w + (size_t)r * n, x + (size_t)t * n, (size_t)n, n, o);
                        for (int k = 0; k < 4; k++) out[(size_t)(t + k) * rows + r] = o[k];
                    }
        }
        double dt = time_now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    const int dim = argc > 2 ? atoi(argv[2]) : 2048, hidden = argc > 3 ? atoi(argv[3]) : 8192, kv = argc > 4 ? atoi(argv[4]) : 512;
    if (threads < 1 || dim < 16 || hidden < 16 || kv < 16) {
        fprintf(stderr, "usage: cpu_gemm THREADS DIM HIDDEN KV_DIM\n");
        return 2;
    }
    const struct { const char *name; int rows, n; } shapes[] = {
        {"q / o_proj", dim, dim}, {"k / v_proj", kv, dim}, {"gate / up_proj", hidden, dim}, {"down_proj", dim, hidden}};
    const int batches[] = {16, 32, 64, 128};
    const double fma = probe_cpu_fma_rate(threads);
    printf("%d threads, FMA probe %.1f GFLOP/s\n", threads, fma / 1e9);
    printf("%-16s %6s %6s %5s %12s %8s %12s %8s\n", "matrix", "rows", "n", "batch", "dot_x4 GF/s", "share", "GEMM GF/s", "share");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int rows = shapes[s].rows, n = shapes[s].n;
        uint16_t *w = malloc((size_t)rows * n * sizeof *w);
        float *x = malloc((size_t)128 * n * sizeof *x), *out = malloc((size_t)128 * rows * sizeof *out);
        float *scratch = aligned_alloc(64, (size_t)threads * gemm_scratch_floats(128) * sizeof(float));
        if (!w || !x || !out || !scratch) { fprintf(stderr, "cpu_gemm: out of memory\n"); return 1; }
        for (size_t i = 0; i < (size_t)rows * n; i++) {
            float f = frand();
            uint32_t u;
            memcpy(&u, &f, 4);
            w[i] = (uint16_t)(u >> 16);
        }
        for (size_t i = 0; i < (size_t)128 * n; i++) x[i] = frand();
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            const int nb = batches[b];
            run(1, w, rows, n, x, nb, out, scratch, threads, 1);
            int bad = 0;
            for (int t = 0; t < nb; t++)
                for (int r = 0; r < rows; r += 7) {
                    const float want = dot_bf16(w + (size_t)r * n, x + (size_t)t * n, n);
                    bad += memcmp(&out[(size_t)t * rows + r], &want, 4) != 0;
                }
            if (bad) { fprintf(stderr, "cpu_gemm: %s batch %d: %d sums differ from dot_bf16's\n", shapes[s].name, nb, bad); return 1; }
            const double flops = 2.0 * rows * n * nb;
            const double td = run(0, w, rows, n, x, nb, out, scratch, threads, 3), tg = run(1, w, rows, n, x, nb, out, scratch, threads, 3);
            printf("%-16s %6d %6d %5d %12.1f %7.1f%% %12.1f %7.1f%%\n", shapes[s].name, rows, n, nb, flops / td / 1e9,
                   100.0 * flops / td / fma, flops / tg / 1e9, 100.0 * flops / tg / fma);
        }
        free(w); free(x); free(out); free(scratch);
    }
    return 0;
}
