/* probe.c - see probe.h. The probe reads with the same vector width as the matvec kernels and
 * several independent accumulators, so it measures what the memory system gives a streaming
 * reader, not what a scalar loop can issue. */
#include "probe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sums [lo, hi) as `streams` equal runs read side by side, eight accumulators per step: fewer leave
 * the loop bound by add latency rather than by memory. */
static float sum_range(const float *p, size_t lo, size_t hi, int streams) {
    size_t len = (hi - lo) / (size_t)streams / 128 * 128;
#if defined(__AVX512F__)
    __m512 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    for (size_t i = 0; i < len; i += 128)
        for (int s = 0; s < streams; s++)
            for (int j = 0; j < 8; j++) a[j] = _mm512_add_ps(a[j], _mm512_loadu_ps(p + lo + s * len + i + 16 * j));
    for (int j = 1; j < 8; j++) a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
#else
    float a[16] = {0};
    for (size_t i = 0; i < len; i += 16)
        for (int s = 0; s < streams; s++)
            for (int j = 0; j < 16; j++) a[j] += p[lo + s * len + i + j];
    float sum = 0.0f;
    for (int j = 0; j < 16; j++) sum += a[j];
    return sum;
#endif
}

/* Best of five passes over buf (n floats) with each thread reading its share as `streams` runs. */
static double read_rate(const float *buf, size_t n, int n_threads, int streams) {
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = time_now();
        float total = 0.0f;
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
        {
#ifdef _OPENMP
            size_t tid = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
#else
            size_t tid = 0, nt = 1;
#endif
            total += sum_range(buf, n * tid / nt, n * (tid + 1) / nt, streams);
        }
        double dt = time_now() - t0;
        sink += total;
        if (dt > 0 && (double)(n * sizeof(float)) / dt > best) best = (double)(n * sizeof(float)) / dt;
    }
    (void)sink;
    return best;
}

/* The peak is the best of the reading patterns the decode step may use: one or four sequential
 * streams per thread, on 4 KiB pages and on pages hinted huge (which helps on some machines and
 * hurts in some VMs: tests/bench/cpu_read.c). */
err_code probe_cpu_read_bandwidth(size_t bytes, int n_threads, double *bytes_per_s) {
    size_t n = bytes / sizeof(float);
    double best = 0.0;
    for (int huge = 0; huge < 2; huge++) {
        float *buf = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED) return err_set(ERR_NOMEM, "bandwidth probe: %zu bytes", n * sizeof(float));
        madvise(buf, n * sizeof(float), huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        /* Real data, written by the threads that will read it (first touch places pages near them). */
#pragma omp parallel for num_threads(n_threads) schedule(static)
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
        for (int streams = 1; streams <= 4; streams *= 4) {
            double r = read_rate(buf, n, n_threads, streams);
            if (r > best) best = r;
        }
        munmap(buf, n * sizeof(float));
    }
    *bytes_per_s = best;
    return ERR_OK;
}

/* Sixteen independent accumulators, enough to cover an FMA's latency (4 cycles) on two FMA units with
 * room to spare, each its own variable so that they stay in registers. The empty asm makes every
 * chain's value opaque to the compiler at every step: it can neither fold a chain nor drop one. */
#define FMA_STEPS 4000000
#define FMA16(OP, V)                                                                              \
    OP(V, 0) OP(V, 1) OP(V, 2) OP(V, 3) OP(V, 4) OP(V, 5) OP(V, 6) OP(V, 7) OP(V, 8) OP(V, 9) OP(V, 10) \
    OP(V, 11) OP(V, 12) OP(V, 13) OP(V, 14) OP(V, 15)
#if defined(__AVX512F__)
typedef __m512 fma_vec;
#define FMA_LANES 16
#define FMA_SET(v) _mm512_set1_ps(v)
#define FMA_STEP(a, m, c) _mm512_fmadd_ps(a, m, c)
#define FMA_SUM(v) _mm512_reduce_add_ps(v)
#define FMA_REG "+v"
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 fma_vec;
#define FMA_LANES 8
#define FMA_SET(v) _mm256_set1_ps(v)
#define FMA_STEP(a, m, c) _mm256_fmadd_ps(a, m, c)
#define FMA_SUM(v) _mm_cvtss_f32(_mm256_castps256_ps128(v)) /* one lane: only a sink */
#define FMA_REG "+x"
#else
typedef float fma_vec;
#define FMA_LANES 1
#define FMA_SET(v) (v)
#define FMA_STEP(a, m, c) ((a) * (m) + (c))
#define FMA_SUM(v) (v)
#define FMA_REG "+g"
#endif
#define FMA_DECL(V, j) fma_vec V##j = FMA_SET((float)j);
#define FMA_DO(V, j) V##j = FMA_STEP(V##j, m, c); __asm__ volatile("" : FMA_REG(V##j));
#define FMA_ADD(V, j) total += FMA_SUM(V##j);

static double fma_pass(int n_threads) {
    volatile float sink;
    float total = 0.0f;
    double t0 = time_now();
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
    {
        const fma_vec m = FMA_SET(0.999f), c = FMA_SET(1e-3f);
        FMA16(FMA_DECL, a)
        for (long i = 0; i < FMA_STEPS; i++) { FMA16(FMA_DO, a) }
        FMA16(FMA_ADD, a)
    }
    double dt = time_now() - t0;
    sink = total;
    (void)sink;
    return 2.0 * FMA_LANES * 16 * (double)FMA_STEPS * n_threads / dt;
}

double probe_cpu_fma_rate(int n_threads) {
    double best = 0.0;
    for (int pass = 0; pass < 3; pass++) {
        double r = fma_pass(n_threads);
        if (r > best) best = r;
    }
    return best;
}
