/* bench_common.cuh - what the GPU machine's measuring programs under tests/bench/ share
 * (read_patterns.cu, stream_chain.cu): error checks, the word fold that stands in for arithmetic,
 * programmatic dependent launch, bulk copies on mbarriers, the fill and the read probe. */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CHECK(call)                                                                                           \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "%s: %s at line %d: %s\n", __FILE__, cudaGetErrorString(e_), __LINE__, #call);    \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

#define ROW_BYTES 8192 /* a weight row of 4096 bf16 */
#define ROW_WORDS (ROW_BYTES / 16)
#define MAGIC 0x9E3779B9u               /* a fold no data here gives: the sink store never happens */
#define SPIN_LIMIT (1ull << 31)         /* iterations of a wait before it gives up (a trap, not a hang) */

__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* bytes (a multiple of 16) from src to shared dst on the bulk-copy engine, completing on bar */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(saddr(dst)),
                 "l"(src), "r"(bytes), "r"(saddr(bar))
                 : "memory");
}

/* until bar's phase of the given parity has completed */
__device__ __forceinline__ void bar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done;
    unsigned long long spins = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(saddr(bar)), "r"(parity)
                     : "memory");
        if (++spins == SPIN_LIMIT) __trap();
    } while (!done);
}

__global__ void fill_kernel(uint4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4((unsigned)i, (unsigned)i * 3u, (unsigned)i * 5u, (unsigned)i * 7u);
}

/* the read probe: grid-stride, 8 words in flight a thread (pdl: waits first, as a stage would) */
__global__ void probe_kernel(const uint4 *p, size_t n, unsigned *sink, int pdl) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (pdl) {
        pdl_wait();
        pdl_trigger();
    }
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 8; u++) acc ^= fold(v[u]);
    }
    for (; i < n; i += stride) acc ^= fold(__ldcs(p + i));
    if (acc == MAGIC) *sink = acc;
}

/* rows: a warp per R rows at a time, U words per lane per row in flight, the first loads before
 * the wait when pdl (the decode matvecs' pattern) */

template <int R, int THREADS, int U = 8>
__global__ void __launch_bounds__(THREADS) rows_kernel(const uint4 *p, int rows, unsigned *sink, int pdl) {
    const int lane = threadIdx.x % 32, G = gridDim.x * (blockDim.x / 32);
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    unsigned acc = 0;
    uint4 v[R][U];
    bool first = true;
    auto load = [&](int r0, int step) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r0 + r * G < rows)
#pragma unroll
                for (int u = 0; u < U; u++) v[r][u] = __ldcs(p + (size_t)(r0 + r * G) * ROW_WORDS + (step * U + u) * 32 + lane);
    };
    if (row < rows) load(row, 0);
    if (pdl) {
        pdl_wait();
        pdl_trigger();
    }
    for (; row < rows; row += R * G, first = false) {
        for (int step = 0; step < ROW_WORDS / (32 * U); step++) {
            if (step > 0 || !first) load(row, step);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (row + r * G < rows)
#pragma unroll
                    for (int u = 0; u < U; u++) acc ^= fold(v[r][u]);
        }
    }
    if (acc == MAGIC) *sink = acc;
}

/* best of 5 timed replays (after one untimed) of what enqueue puts on the stream, in ms */
template <typename F>
static float best_ms(cudaStream_t st, F enqueue) {
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    float best = 1e30f;
    for (int r = 0; r < 6; r++) {
        CHECK(cudaEventRecord(t0, st));
        enqueue();
        CHECK(cudaEventRecord(t1, st));
        CHECK(cudaEventSynchronize(t1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        if (r > 0 && ms < best) best = ms;
    }
    CHECK(cudaGetLastError());
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return best;
}
