/* cuda_common.cuh - what every GPU kernel body reads: the weights' storage type and its conversion
 * to fp32, the KV cache's layout, the loads that stream weights past the caches, warp sums, and
 * Hopper's mbarriers with the bulk-copy engine.
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

/* GPU_W_BF16: the weights on the device are bf16 (uploaded in their own dtype; converting bf16 to
 * fp16 on upload lost the 1B's decode 1.5% at depth 0: docs/performance.md, D98) */
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define GPU_W_BF16 1
#else
#define GPU_W_BF16 0
#endif

// ---------------------------------------------------------------------------------------------
// The KV cache of a layer: (kv head, position, head_dim), so that an attention block's keys and
// values are one contiguous run (position-major put a head's 128 or 256 bytes of each position
// kv_dim * 2 bytes apart; head-major measured +1.5% on the 1B shape at every depth, +0.5% on 7B).
// The element where position pos of KV head kvh starts:

__host__ __device__ __forceinline__ size_t kv_at(int pos, int kvh, int ctx, int head_dim) {
    return ((size_t)kvh * ctx + pos) * head_dim;
}

// ---------------------------------------------------------------------------------------------
// Weights: 8 values of the storage dtype in a uint4, to fp32

/* 8 fp16 values (the KV cache) in a uint4, to fp32 */
__device__ __forceinline__ void h8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

__device__ __forceinline__ void w8_to_f32(uint4 u, float f[8]) {
#if !GPU_W_BF16
    h8_to_f32(u, f);
#else
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
#endif
}

__device__ __forceinline__ float w_to_f32(uint16_t u) {
#if GPU_W_BF16
    return __uint_as_float((uint32_t)u << 16);
#else
    return __half2float(__ushort_as_half(u));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* Streaming loads: each weight is read once per step, keep it out of L1. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) { return __ldcs(p); }

/* 16 bytes from global to shared memory, asynchronously and past L1; 16 zeros where !valid */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

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
