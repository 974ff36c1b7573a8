/* cpu_read.c - which way of streaming memory gets the most read bandwidth out of a CPU: one or
 * several streams per thread, software prefetch, huge pages. Informs the matvec loop in
 * runtime/cpu_kernels.h and the probe in runtime/probe.c.
 *   gcc -O3 -march=native -fopenmp tests/bench/cpu_read.c -o cpu_read && ./cpu_read 2048 16 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* Sums [lo, hi) of p as `streams` interleaved sub-ranges, prefetching `dist` bytes ahead (0: none). */
static float sum_range(const float *p, size_t lo, size_t hi, int streams, int dist, int hint) {
    size_t len = (hi - lo) / streams / 128 * 128;
    __m512 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    for (size_t i = 0; i < len; i += 128) {
        for (int s = 0; s < streams; s++) {
            const float *q = p + lo + s * len + i;
            if (dist) {
                const char *f = (const char *)q + dist;
                if (hint == 0) { _mm_prefetch(f, _MM_HINT_T0); _mm_prefetch(f + 64 * 4, _MM_HINT_T0); }
                else { _mm_prefetch(f, _MM_HINT_T1); _mm_prefetch(f + 64 * 4, _MM_HINT_T1); }
            }
            for (int j = 0; j < 8; j++) a[j] = _mm512_add_ps(a[j], _mm512_load_ps(q + 16 * j));
        }
    }
    for (int j = 1; j < 8; j++) a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)(argc > 1 ? atol(argv[1]) : 2048) << 20;
    int nt = argc > 2 ? atoi(argv[2]) : omp_get_max_threads();
    for (int huge = 0; huge < 2; huge++) {
        float *b = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(b, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        size_t n = bytes / 4;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (size_t i = 0; i < n; i++) b[i] = (float)(i & 1023);
        static const int streams[] = {1, 2, 4}, dists[] = {0, 1024, 4096}, hints[] = {0, 1};
        for (int si = 0; si < 3; si++)
            for (int di = 0; di < 3; di++)
                for (int hi = 0; hi < (dists[di] ? 2 : 1); hi++) {
                    double best = 0;
                    volatile float sink = 0;
                    for (int rep = 0; rep < 5; rep++) {
                        double t0 = now();
                        float tot = 0;
#pragma omp parallel num_threads(nt) reduction(+ : tot)
                        {
                            size_t t = omp_get_thread_num(), ch = n / nt;
                            tot += sum_range(b, t * ch, t * ch + ch, streams[si], dists[di], hints[hi]);
                        }
                        double dt = now() - t0;
                        sink += tot;
                        if (bytes / dt > best) best = bytes / dt;
                    }
                    printf("huge=%d streams=%d prefetch=%5d %s: %6.1f GB/s\n", huge, streams[si], dists[di],
                           dists[di] ? (hints[hi] ? "T1" : "T0") : "  ", best / 1e9);
                }
        munmap(b, bytes);
    }
    return 0;
}
