/* cuda_common.cuh - what every GPU kernel body reads: the weight formats (cuda_weights.cuh), the
 * KV cache (cuda_kv.cuh), warp sums, asynchronous copies to shared memory, and Hopper's mbarriers with
 * the bulk-copy engine.
 *
 * Written against the MODEL_* names of the generated model_config.h and model_plan.h, like every
 * kernel header; nothing here depends on a stage. */
#ifndef INGOT_CUDA_COMMON_CUH
#define INGOT_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

#include "cuda_sync.cuh"
#include "cuda_weights.cuh"
#include "cuda_kv.cuh"

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* 16 bytes from global to shared memory, asynchronously and past L1; 16 zeros where !valid */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* cp_async16 to a shared-memory address; commit and wait for groups of them */
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ldmatrix: four (x4) or two (x2) 8x8 tiles of 16-bit values from shared memory into mma fragments */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* a shared-memory mbarrier (its shared address) for `count` arrivals */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* this thread's arrival, and `bytes` more that the phase waits for (complete_tx of the copies) */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* this thread's arrival */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
/* until the phase of parity `parity` has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst on the bulk-copy engine, the phase of bar
 * waiting for them (the calling thread's arrival) */
__device__ __forceinline__ void bulk_copy_shared(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    mbar_arrive_expect_tx(bar, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}

#endif

#endif /* INGOT_CUDA_COMMON_CUH */
