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
 * statically over the threads as the CPU matvec does. Best of 5 passes; one thread's on its own
 * CPU clock (time given to other processes is not counted), all threads' on the wall clock. "in
 * L2" repeats the same 256 KiB of rows (per thread), the kernel's speed with the memory out of the
 * way. GB/s counts the
 * blocks' bytes (scales included), Gw/s weights a second. Rows "x int8" (Q8_0, Q4_0, AVX2 builds):
 * the same matrix through llama.cpp's integer method (below), for comparison.
 *
 * Measured (512 MiB a format, two runs, within 5% of each other): a 2-core AMD EPYC VM, CPU
 * family 23 (Zen/Zen 2), AVX2, shared with other jobs (load average 4-6 on 2 cores: the all-thread
 * column, on the wall clock, is not a bandwidth figure there; the one-thread columns, on the
 * thread's CPU clock, are). Read probe, 1 thread: 17.3-17.6 GB/s.
 *
 *   type    1 thread GB/s (of probe)   in L2: GB/s, G weights/s
 *   F32     15.5-15.8 (89-90%)         44.6-44.8, 11.1-11.2
 *   BF16    11.5-11.7 (65-67%)         15.0-15.1,  7.5-7.6
 *   F16     11.6-11.7 (66-67%)         15.2-15.3,  7.6-7.7
 *   Q8_0     7.3      (41-42%)          7.7-7.8,   7.2-7.4   x int8: 10.4 (59-60%), 11.1-11.7 Gw/s
 *   Q6_K     3.4-3.6  (19-21%)          3.4-3.6,   4.1-4.4
 *   Q5_K     2.5-2.6  (14-15%)          2.6-2.7,   3.8-3.9
 *   Q4_K     2.3      (13%)             2.3,       4.0-4.1
 *   Q4_1     2.5-2.6  (15%)             2.5-2.6,   4.0-4.2
 *   Q4_0     2.9-3.1  (17%)             3.1,       5.5       x int8: 5.0 (29%), 9.2-9.3 Gw/s
 *
 * So on this core quant_dot is bound by unpacking, not memory: the same speed in L2 as streaming,
 * 4-7 G weights/s against bf16's 7.5, an eighth to two fifths of one core's read bandwidth. The
 * int8 method is 1.5-1.7x faster a weight but changes the numbers; the dequantize-then-FMA route
 * with x in fp32 spends ~3.5 instructions per 8 weights (widen, convert, multiply-add) whatever
 * the format. (Zen 1 runs each 256-bit instruction as two 128-bit halves; an AVX-512 server core
 * does 16 weights an instruction, so the same route there is worth measuring before another.)
 *
 * Instructions a weight, which the load on a shared machine does not move (valgrind
 * --tool=callgrind --toggle-collect=quant_dot build/tests/quant_cli_avx2 dot TYPE 4096 W X OUT, 64
 * rows): F32 0.39, F16 0.39, BF16 0.52, Q8_0 0.61, Q4_0 0.86, Q6_K 1.19, Q4_1 1.20, Q4_K 1.46,
 * Q5_K 1.59. The K formats pay for their sub-block scales and for sum(x) of each sub-block (the
 * mins); those sums are now computed once a matvec (quant_block_sums, D134), as this program's
 * passes do.
 *
 * D136: the block formats' inputs quantized to 16 bits once a matvec (quant_input, timed inside
 * each pass), each block an exact integer sum (vpmaddwd / vpdpwssd). Measured on a 2-core AVX-512
 * VM (Intel Xeon, 2.8 GHz, AVX512-VNNI), 64 MiB a format, rows of 4096, one thread on its CPU
 * clock, best of 5, the revision before and this one alternated (two runs of this one): in L2,
 * G weights/s: Q8_0 14.0 -> 15.1, Q6_K 8.0 -> 10.7-10.8, Q5_K 8.2 -> 8.8, Q4_K 10.7 -> 9.6
 * (slower: its sub-block scales are still unpacked in scalar code a super-block, and the 128-bit
 * broadcast + vpsrlvq nibble split costs more than it saves there), Q4_1 11.4 -> 14.1, Q4_0 13.2
 * -> 14.8-14.9; streaming GB/s: Q4_1 5.8 -> 6.8-7.1, Q4_0 6.0 -> 7.0, Q8_0 8.6 -> 9.7-10.0, Q6_K
 * 5.6 -> 7.0.
 *
 * D139, D140 (the same VM, one thread pinned, best of 5, alternated): one token's products on the
 * weights as bytes (vpdpbusd), in L2, G weights/s: Q4_0 27.6 -> 33.4, Q4_K 25.8 -> 30.5, Q4_1 27.1
 * -> 29.6, Q8_0 33.7 -> 34.4; a software prefetch 4 KiB ahead, streaming GB/s: Q4_0 7.3 -> 12.0-13.0
 * (97-106% of the probe), Q4_1 7.0 -> 12.2-12.6, Q4_K 7.1-7.6 -> 12.3-12.6, Q8_0 9.9-10.2 -> 11.5-13.1. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "errors.h"
#include "probe.h"
#include "quant.h"

static const int types[] = {QUANT_F32, QUANT_BF16, QUANT_F16, QUANT_Q8_0, QUANT_Q6_K, QUANT_Q5_K, QUANT_Q4_K, QUANT_Q4_1, QUANT_Q4_0};

/* One thread's runs are timed on its own CPU clock, so that time the scheduler gives to other
 * processes (a shared machine) is not counted; runs on all threads need the wall clock. */
static double thread_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double clock_for(int threads) { return threads == 1 ? thread_time() : time_now(); }

/* The read probe on one thread's CPU clock: 128 bytes a step into four 32-byte accumulators. */
typedef float v8f __attribute__((vector_size(32)));
static double read_bw_1(const uint8_t *p, size_t bytes) {
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = thread_time();
        v8f s[4] = {{0}, {0}, {0}, {0}};
        for (size_t i = 0; i + 128 <= bytes; i += 128)
            for (int k = 0; k < 4; k++) {
                v8f v;
                memcpy(&v, p + i + 32 * k, sizeof v);
                s[k] += v;
            }
        const double dt = thread_time() - t0;
        volatile float sink = (s[0] + s[1] + s[2] + s[3])[0];
        (void)sink;
        if (dt < best) best = dt;
    }
    return bytes / best;
}

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
    uint8_t *xq = aligned_alloc(64, QUANT_INPUT_BYTES(n));
    const int blocks = quant_format_of(type)->block > 1;
    for (int p = 0; p < passes; p++) {
        double t0 = clock_for(threads);
        if (blocks) quant_input(x, n, xq); /* once a matvec, as the CPU forward's */
        if (!l2_rows) {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (size_t r = 0; r < rows; r++)
                y[r] = blocks ? quant_dot_q(type, w + r * row_bytes, xq, n) : quant_dot(type, w + r * row_bytes, x, n);
        } else {
#pragma omp parallel num_threads(threads)
            {
                const size_t t = (size_t)omp_get_thread_num(), first = t * l2_rows, reps = rows / l2_rows / (size_t)threads;
                for (size_t k = 0; k < reps; k++)
                    for (size_t r = first; r < first + l2_rows; r++)
                        y[r] += blocks ? quant_dot_q(type, w + r * row_bytes, xq, n) : quant_dot(type, w + r * row_bytes, x, n);
            }
        }
        double dt = clock_for(threads) - t0;
        if (dt < best) best = dt;
    }
    free(xq);
    return best;
}

/* ---------------------------------------------------------------------------------------------
 * The variant not taken (yet): llama.cpp's method, x quantized once per matvec to Q8_0 blocks
 * (int8 and an fp16-sized scale per 32), then integer dot products (maddubs: 32 multiplies in
 * one instruction) and one float multiply-add per block. It changes the numbers (x rounded to 8
 * bits, 256 times coarser than quant_dot's 16): here only to measure how much faster it is.
 * AVX2 only. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

typedef struct {
    float d;
    int8_t qs[32];
} x_q8; /* one block of x quantized: x[i] ~ d * qs[i] */

static void x_quantize(const float *x, x_q8 *xq, int n) {
    for (int b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fabsf(x[32 * b + i]) > amax ? fabsf(x[32 * b + i]) : amax;
        const float d = amax / 127, id = d ? 1 / d : 0;
        xq[b].d = d;
        for (int i = 0; i < 32; i++) xq[b].qs[i] = (int8_t)lrintf(x[32 * b + i] * id);
    }
}

static inline __m256 sum_i8_pairs(__m256i a, __m256i b) { /* 32 int8 a * int8 b, as 8 fp32 partial sums */
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

static float dot_q4_0_q8(const uint8_t *w, const x_q8 *xq, int n) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), eight = _mm256_set1_epi8(8);
    for (int b = 0; b < n / 32; b++, w += 18) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
        const __m256i wq = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4), eight);
        const float d = _cvtsh_ss((uint16_t)(w[0] | w[1] << 8)) * xq[b].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), sum_i8_pairs(wq, _mm256_loadu_si256((const __m256i *)xq[b].qs)), acc);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

static float dot_q8_0_q8(const uint8_t *w, const x_q8 *xq, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / 32; b++, w += 34) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)(w + 2));
        const float d = _cvtsh_ss((uint16_t)(w[0] | w[1] << 8)) * xq[b].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), sum_i8_pairs(wq, _mm256_loadu_si256((const __m256i *)xq[b].qs)), acc);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* As time_matvec, for the two int8-activation kernels. */
static double time_matvec_q8(int type, const uint8_t *w, size_t rows, size_t row_bytes, const x_q8 *xq, int n, float *y,
                             int threads, size_t l2_rows, int passes) {
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        double t0 = clock_for(threads);
#pragma omp parallel num_threads(threads)
        {
            const size_t t = (size_t)omp_get_thread_num();
            const size_t lo = l2_rows ? t * l2_rows : rows * t / (size_t)threads;
            const size_t hi = l2_rows ? lo + l2_rows : rows * (t + 1) / (size_t)threads;
            const size_t reps = l2_rows ? rows / l2_rows / (size_t)threads : 1;
            for (size_t k = 0; k < reps; k++)
                for (size_t r = lo; r < hi; r++)
                    y[r] += type == QUANT_Q4_0 ? dot_q4_0_q8(w + r * row_bytes, xq, n) : dot_q8_0_q8(w + r * row_bytes, xq, n);
        }
        double dt = clock_for(threads) - t0;
        if (dt < best) best = dt;
    }
    return best;
}
#endif

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    const int n = argc > 2 ? atoi(argv[2]) : 4096;
    const int all = omp_get_max_threads();
    double probe1, proben;
    err_code rc = probe_cpu_read_bandwidth(mib << 20, all, &proben);
    if (rc) {
        fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
        return 1;
    }
    {
        uint8_t *buf = mmap(NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED) return 1;
        madvise(buf, mib << 20, MADV_HUGEPAGE);
        memset(buf, 1, mib << 20);
        probe1 = read_bw_1(buf, mib << 20);
        munmap(buf, mib << 20);
    }
    printf("quant_dot (%s), rows of %d weights, %zu MiB a format, %d threads; read probe: 1 thread %.1f GB/s (its CPU "
           "clock), %d threads %.1f GB/s (wall clock, runtime/probe.c)\n", quant_dot_isa(), n, mib, all, probe1 / 1e9, all,
           proben / 1e9);
    printf("%-5s %6s | %-22s | %-22s | %-22s\n", "type", "bits/w", "1 thread GB/s (probe%)", "all threads GB/s (%)",
           "in L2, 1 thr: GB/s Gw/s");
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 1000.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        size_t row_bytes;
        if (n % quant_format_of(type)->block) continue; /* the K formats need whole super-blocks */
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
        const double l2_bytes = (double)(rows / l2_rows) * (double)l2_rows * (double)row_bytes;
        const double w_per_byte = (double)quant_format_of(type)->block / quant_format_of(type)->bytes;
        for (int variant = 0; variant < 2; variant++) {
            double t1, tn, tl2;
            if (!variant) {
                t1 = time_matvec(type, w, rows, row_bytes, x, n, y, 1, 0, 5);
                tn = time_matvec(type, w, rows, row_bytes, x, n, y, all, 0, 5);
                tl2 = time_matvec(type, w, rows, row_bytes, x, n, y, 1, l2_rows, 3);
            } else {
#if defined(__AVX2__) && defined(__FMA__)
                if (type != QUANT_Q4_0 && type != QUANT_Q8_0) break;
                x_q8 *xq = malloc(sizeof *xq * (size_t)(n / 32));
                x_quantize(x, xq, n);
                t1 = time_matvec_q8(type, w, rows, row_bytes, xq, n, y, 1, 0, 5);
                tn = time_matvec_q8(type, w, rows, row_bytes, xq, n, y, all, 0, 5);
                tl2 = time_matvec_q8(type, w, rows, row_bytes, xq, n, y, 1, l2_rows, 3);
                free(xq);
#else
                break;
#endif
            }
            double sink = 0;
            for (size_t r = 0; r < rows; r++) sink += y[r];
            printf("%-5s %6.2f | %7.2f (%5.1f%%)        | %7.2f (%5.1f%%)        | %6.2f %6.2f%s\n",
                   variant ? "x int8" : quant_format_of(type)->name, 8.0 / w_per_byte, bytes / t1 / 1e9, 100 * bytes / t1 / probe1,
                   bytes / tn / 1e9, 100 * bytes / tn / proben, l2_bytes / tl2 / 1e9, l2_bytes / tl2 / 1e9 * w_per_byte,
                   sink == 12345.678 ? " " : "");
        }
        munmap(w, bytes);
        free(y);
    }
    free(x);
    return 0;
}
