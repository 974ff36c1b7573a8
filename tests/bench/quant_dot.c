/* quant_dot.c - how fast runtime/quant.c's dot products read quantized weights: GB/s of block
 * bytes per core and on all cores, for each format, against the read-bandwidth probe that --bench
 * reports its share of (runtime/probe.c). Tells whether a CPU matvec built on quant_dot can reach
 * the bandwidth, or is bound by unpacking.
 *
 *   gcc -O3 -march=native -fopenmp -std=c11 -D_GNU_SOURCE -Iruntime tests/bench/quant_dot.c \
 *       runtime/quant.c runtime/probe.c runtime/errors.c -o build/quant_dot -lm
 *   build/quant_dot [MiB] [n]        (default 512 MiB of weights a format, rows of n = 4096)
 *
 * For each format: a matrix of rows of n weights, `MiB` of blocks (far past L2 and L3), random
 * bytes with sane fp16 scales, and x (n) fp32; y = W x, each row by one quant_dot, rows split
 * statically over the threads as the CPU matvec does. Best of 5 passes. "in L2" repeats the same
 * 256 KiB of rows (per thread), the kernel's speed with the memory out of the way. GB/s counts the
 * blocks' bytes (scales included), Gw/s weights a second. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "errors.h"
#include "probe.h"
#include "quant.h"

static const int types[] = {QUANT_F32, QUANT_BF16, QUANT_F16, QUANT_Q8_0, QUANT_Q6_K, QUANT_Q5_K, QUANT_Q4_K, QUANT_Q4_1, QUANT_Q4_0};

static uint64_t rng = 0x9E3779B97F4A7C15u;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* Random rows with every fp16 field of each block (and every F16/BF16/F32 weight) a small normal
 * number, so no path meets NaN or subnormal slow cases. */
static void fill(int type, uint8_t *w, size_t rows, size_t row_bytes, int n) {
    const quant_format *f = quant_format_of(type);
    size_t blocks = rows * (size_t)(n / f->block);
    for (size_t i = 0; i < rows * row_bytes; i += 8) {
        uint64_t r = next();
        memcpy(w + i, &r, rows * row_bytes - i < 8 ? rows * row_bytes - i : 8);
    }
    const uint16_t h = 0x2000 | (uint16_t)(next() & 0x3FF); /* fp16 ~2^-7 */
    const uint16_t b = 0x3C00;                              /* bf16 ~2^-7 */
    const float one = 0.01f;
    for (size_t k = 0; k < blocks; k++) {
        uint8_t *p = w + k * f->bytes;
        switch (type) {
        case QUANT_F32: memcpy(p, &one, 4); break;
        case QUANT_F16: memcpy(p, &h, 2); break;
        case QUANT_BF16: memcpy(p, &b, 2); break;
        case QUANT_Q8_0: case QUANT_Q4_0: memcpy(p, &h, 2); break;
        case QUANT_Q4_1: case QUANT_Q4_K: case QUANT_Q5_K: memcpy(p, &h, 2); memcpy(p + 2, &h, 2); break;
        case QUANT_Q6_K: memcpy(p + 208, &h, 2); break;
        }
    }
}

/* Seconds of the best of `passes` passes of y = W x over rows [0, rows), each thread taking its
 * static share; with `l2_rows` > 0 each thread instead runs its first l2_rows rows `rows / l2_rows
 * / threads` times (the same bytes from its L2). */
static double time_matvec(int type, const uint8_t *w, size_t rows, size_t row_bytes, const float *x, int n, float *y,
                          int threads, size_t l2_rows, int passes) {
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        double t0 = time_now();
        if (!l2_rows) {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (size_t r = 0; r < rows; r++) y[r] = quant_dot(type, w + r * row_bytes, x, n);
        } else {
#pragma omp parallel num_threads(threads)
            {
                const size_t t = (size_t)omp_get_thread_num(), first = t * l2_rows, reps = rows / l2_rows / (size_t)threads;
                for (size_t k = 0; k < reps; k++)
                    for (size_t r = first; r < first + l2_rows; r++) y[r] += quant_dot(type, w + r * row_bytes, x, n);
            }
        }
        double dt = time_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    const int n = argc > 2 ? atoi(argv[2]) : 4096;
    const int all = omp_get_max_threads();
    double probe1, proben;
    err_code rc = probe_cpu_read_bandwidth(mib << 20, 1, &probe1);
    if (!rc) rc = probe_cpu_read_bandwidth(mib << 20, all, &proben);
    if (rc) {
        fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
        return 1;
    }
    printf("quant_dot (%s), rows of %d weights, %zu MiB a format, %d threads; read probe: 1 thread %.1f GB/s, "
           "%d threads %.1f GB/s\n", quant_dot_isa(), n, mib, all, probe1 / 1e9, all, proben / 1e9);
    printf("%-5s %6s | %-22s | %-22s | %-22s\n", "type", "bits/w", "1 thread GB/s (probe%)", "all threads GB/s (%)",
           "in L2, 1 thr: GB/s Gw/s");
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 1000.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        size_t row_bytes;
        if ((rc = quant_row_bytes(type, n, &row_bytes))) {
            fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
            return 1;
        }
        const size_t rows = (mib << 20) / row_bytes, bytes = rows * row_bytes;
        uint8_t *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        float *y = calloc(rows, sizeof *y);
        if (w == MAP_FAILED || !y) {
            fprintf(stderr, "out of memory: %zu bytes\n", bytes);
            return 1;
        }
        madvise(w, bytes, MADV_HUGEPAGE);
        fill(type, w, rows, row_bytes, n);
        const size_t l2_rows = ((size_t)256 << 10) / row_bytes ? ((size_t)256 << 10) / row_bytes : 1;
        const double t1 = time_matvec(type, w, rows, row_bytes, x, n, y, 1, 0, 5);
        const double tn = time_matvec(type, w, rows, row_bytes, x, n, y, all, 0, 5);
        const double tl2 = time_matvec(type, w, rows, row_bytes, x, n, y, 1, l2_rows, 3);
        const double l2_bytes = (double)(rows / l2_rows) * (double)l2_rows * (double)row_bytes;
        double sink = 0;
        for (size_t r = 0; r < rows; r++) sink += y[r];
        printf("%-5s %6.2f | %7.2f (%5.1f%%)        | %7.2f (%5.1f%%)        | %6.2f %6.2f%s\n",
               quant_format_of(type)->name, 8.0 * quant_format_of(type)->bytes / quant_format_of(type)->block,
               bytes / t1 / 1e9, 100 * bytes / t1 / probe1, bytes / tn / 1e9, 100 * bytes / tn / proben,
               l2_bytes / tl2 / 1e9, l2_bytes / tl2 / 1e9 * 8.0 * quant_format_of(type)->block / (8.0 * quant_format_of(type)->bytes),
               sink == 12345.678 ? " " : "");
        munmap(w, bytes);
        free(y);
    }
    free(x);
    return 0;
}
