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

/* Eight independent accumulators: fewer leave the loop bound by add latency rather than by
 * memory (measured on a 2-core EPYC: 24 GB/s with four, 32 GB/s with eight). */
static float sum_block(const float *p, size_t n) {
#if defined(__AVX512F__)
    __m512 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    for (size_t i = 0; i + 128 <= n; i += 128)
        for (int j = 0; j < 8; j++) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(p + i + 16 * j));
    for (int j = 1; j < 8; j++) a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
#else
    float a[16] = {0};
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) a[j] += p[i + j];
    float s = 0.0f;
    for (int j = 0; j < 16; j++) s += a[j];
    return s;
#endif
}

err_code probe_cpu_read_bandwidth(size_t bytes, int n_threads, double *bytes_per_s) {
    size_t n = bytes / sizeof(float) / 128 * 128;
    float *buf = aligned_alloc((size_t)2 << 20, n * sizeof(float));
    if (!buf) return err_set(ERR_NOMEM, "bandwidth probe: %zu bytes", n * sizeof(float));
    madvise(buf, n * sizeof(float), MADV_HUGEPAGE); /* a hint; fewer TLB misses where granted */
    /* Real data, written by the threads that will read it (first touch places pages near them). */
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
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
            size_t chunk = (n / nt) / 128 * 128, lo = tid * chunk, hi = tid + 1 == nt ? n : lo + chunk;
            total += sum_block(buf + lo, hi - lo);
        }
        double dt = time_now() - t0;
        sink += total;
        if (dt > 0 && (double)(n * sizeof(float)) / dt > best) best = (double)(n * sizeof(float)) / dt;
    }
    (void)sink;
    free(buf);
    *bytes_per_s = best;
    return ERR_OK;
}
