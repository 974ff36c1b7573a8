/* probe.c - see probe.h. The probe reads with the same vector width as the matvec kernels and
 * several independent accumulators, so it measures what the memory system gives a streaming
 * reader, not what a scalar loop can issue. */
#include "probe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

static float sum_block(const float *p, size_t n) {
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
    float a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += p[i + j];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
#endif
}

err_code probe_cpu_read_bandwidth(size_t bytes, int n_threads, double *bytes_per_s) {
    size_t n = bytes / sizeof(float) / 64 * 64;
    float *buf = aligned_alloc(64, n * sizeof(float));
    if (!buf) return err_set(ERR_NOMEM, "bandwidth probe: %zu bytes", n * sizeof(float));
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
            size_t chunk = (n / nt) / 64 * 64, lo = tid * chunk, hi = tid + 1 == nt ? n : lo + chunk;
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
