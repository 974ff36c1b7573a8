/* cuda_kv.cuh - the KV cache on the GPU: its layout, its element types (--kv-cache), how a kernel
 * writes a key or value and reads 8 elements of one.
 *
 * kv_f16: fp16 elements, written by the QKV kernels as they finish each row.
 * kv_q8: int8 elements with one fp32 scale a (position, KV head) vector, half the bytes. A vector's
 * scale needs all head_dim of its values, which the QKV kernels compute in many warps and blocks, so
 * they stage the fp32 values (kv_view::stage) and kv_quantize_kernel, launched after them, writes
 * the cache: the same numbers as the CPU's (runtime/model.h, kv_cache_type). The attention kernels
 * read the int8 elements as exact fp16 integers and fold the scales into the scores (key) and the
 * probabilities (value), never into the elements, so the tensor cores' products stay exact. */
#ifndef INGOT_CUDA_KV_CUH
#define INGOT_CUDA_KV_CUH

#include <cuda_fp16.h>
#include <float.h>
#include <stdint.h>

#include "cuda_sync.cuh"

// ---------------------------------------------------------------------------------------------
// The KV cache of a layer: (kv head, position, head_dim), so that an attention block's keys and
// values are one contiguous run (position-major put a head's 128 or 256 bytes of each position
// kv_dim * 2 bytes apart; head-major measured +1.5% on the 1B shape at every depth, +0.5% on 7B).
// The element where position pos of KV head kvh starts (q8's scales: kv_at(pos, kvh, ctx, 1)):

__host__ __device__ __forceinline__ size_t kv_at(int pos, int kvh, int ctx, int head_dim) {
    return ((size_t)kvh * ctx + pos) * head_dim;
}

/* Eight elements at p (8-aligned): load() as stored (raw), h8() of those as eight fp16 values in a
 * uint4: kv_f16's as they are, kv_q8's as the exact integers -127..127 (each byte b ^ 0x80 put under
 * fp16's exponent of 1024, 1024 + 128 taken off: a byte permute and a half2 subtraction a pair).
 * Loads in flight hold raw words; each is converted where it is used, so that a load is not waited
 * for where it is issued. */
struct kv_f16 {
    static constexpr bool Q8 = false;
    typedef uint16_t elem;
    typedef uint4 raw;
    static __device__ __forceinline__ raw load(const elem *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
    static __device__ __forceinline__ uint4 h8(raw r) { return r; }
    static __device__ __forceinline__ raw zero(void) { return make_uint4(0, 0, 0, 0); }
};
struct kv_q8 {
    static constexpr bool Q8 = true;
    typedef int8_t elem;
    static __device__ __forceinline__ uint32_t pair(uint32_t biased, uint32_t sel) {
        const uint32_t h = __byte_perm(biased, 0x64646464u, sel);
        const __half2 v = __hsub2(*reinterpret_cast<const __half2 *>(&h), __half2half2(__ushort_as_half(0x6480))); /* 1152 */
        return *reinterpret_cast<const uint32_t *>(&v);
    }
    static __device__ __forceinline__ uint4 convert8(uint2 w) {
        const uint32_t a = w.x ^ 0x80808080u, b = w.y ^ 0x80808080u;
        return make_uint4(pair(a, 0x4140), pair(a, 0x4342), pair(b, 0x4140), pair(b, 0x4342));
    }
    typedef uint2 raw;
    static __device__ __forceinline__ raw load(const elem *p) { return __ldcg(reinterpret_cast<const uint2 *>(p)); }
    static __device__ __forceinline__ uint4 h8(raw r) { return convert8(r); }
    static __device__ __forceinline__ raw zero(void) { return make_uint2(0, 0); }
};

/* One layer's cache as the kernels take it. ks, vs: kv_q8's scales (n_kv_heads, ctx); stage: its
 * QKV kernels' fp32 keys and values (tokens, 2, kv_dim), which kv_quantize_kernel reads. */
template <typename KV>
struct kv_view {
    typename KV::elem *k, *v;
    float *ks, *vs;
    float *stage;
};

/* kind 1 (key) or 2 (value), row `row` of kv_dim, of token t of a batch at position pos: kv_f16 into
 * the cache, kv_q8 into the stage */
template <typename KV>
__device__ __forceinline__ void kv_put(const kv_view<KV> &c, int kind, int t, int pos, int row, float v, int kv_dim, int head_dim,
                                       int ctx) {
    if constexpr (KV::Q8) {
        c.stage[((size_t)t * 2 + kind - 1) * kv_dim + row] = v;
    } else {
        uint16_t *cache = kind == 1 ? c.k : c.v;
        cache[kv_at(pos, row / head_dim, ctx, head_dim) + row % head_dim] = __half_as_ushort(__float2half_rn(v));
    }
}

/* The scale of the key (value) vector at position j of a run that starts at `start`: 1 in fp16 */
template <typename KV>
__device__ __forceinline__ float kv_key_scale(const kv_view<KV> &c, int kvh, int ctx, int pos) {
    if constexpr (KV::Q8) return __ldcg(c.ks + kv_at(pos, kvh, ctx, 1));
    else return 1.0f;
}
template <typename KV>
__device__ __forceinline__ float kv_value_scale(const kv_view<KV> &c, int kvh, int ctx, int pos) {
    if constexpr (KV::Q8) return __ldcg(c.vs + kv_at(pos, kvh, ctx, 1));
    else return 1.0f;
}

/* Below this largest magnitude a vector is stored as zeros (d = 0): 127 / m would overflow near
 * 1e-37 (docs/architecture.md; runtime/cpu_kernels.h's the same) */
#define KV_Q8_TINY 0x1p-100f

/* The staged keys and values of tokens [0, count) at positions io[IO_POS] on (count: 1 in a decode
 * step, io[IO_COUNT] in a prompt batch) into the q8 cache, one warp a
 * (token, kind, KV head) vector: m = max |x| (NaN kept), d = m / 127, q = rint(x * (127 / m)); a
 * vector with NaN or infinity gets d = NaN (its scores and outputs NaN, as an fp16 cache's would
 * be), an all-zero one (or one below KV_Q8_TINY) d = 0. */
__device__ __forceinline__ void kv_quantize_body(const kv_view<kv_q8> &c, const int *io, bool batch, int n_kv_heads, int head_dim,
                                                 int ctx) {
    const int pos0 = __ldcg(&io[IO_POS]), count = batch ? __ldcg(&io[IO_COUNT]) : 1;
    const int lane = threadIdx.x % WARP_SIZE;
    const int vecs = 2 * n_kv_heads, w = (int)(blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE);
    const int t = w / vecs, kind = w % vecs / n_kv_heads, kvh = w % n_kv_heads;
    if (t >= count) return;
    const float *x = c.stage + ((size_t)t * 2 + kind) * n_kv_heads * head_dim + (size_t)kvh * head_dim;
    float m = 0.0f;
    for (int i = lane; i < head_dim; i += WARP_SIZE) {
        const float a = fabsf(__ldcg(x + i));
        m = a > m || a != a ? a : m;
    }
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
        const float a = __shfl_xor_sync(0xFFFFFFFFu, m, o);
        m = a > m || a != a ? a : m;
    }
    const bool finite = m <= FLT_MAX, tiny = m < KV_Q8_TINY;
    const float d = !finite ? __int_as_float(0x7FC00000) : tiny ? 0.0f : m / 127.0f, id = finite && !tiny ? 127.0f / m : 0.0f;
    int8_t *out = (kind == 0 ? c.k : c.v) + kv_at(pos0 + t, kvh, ctx, head_dim);
    for (int i = lane; i < head_dim; i += WARP_SIZE) out[i] = (int8_t)(finite ? __float2int_rn(__fmul_rn(__ldcg(x + i), id)) : 0);
    if (lane == 0) (kind == 0 ? c.ks : c.vs)[kv_at(pos0 + t, kvh, ctx, 1)] = d;
}

#endif /* INGOT_CUDA_KV_CUH */
