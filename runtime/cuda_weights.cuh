/* cuda_weights.cuh - the weight formats: how a matrix is stored on the device and how the matvec
 * and GEMM cores read it. The cores take the format as a template parameter (W), so a new format
 * (8-bit, 4-bit with block scales) adds a type here, its upload and the plan's rules for it, not a
 * pass over every kernel.
 *
 * A format W gives:
 *   W::mat                 a matrix as the kernels take it (for a dense format a pointer to its
 *                          values; a format with scales holds their pointer beside the values')
 *   W::row_t, W::row(m, r, K)  where row r of a matrix of K columns starts
 *   W::chunk, W::VALS      what a lane loads of a row at once, and the weights in it: one 16-byte
 *                          load of values (and whatever scale they need), so that a warp's 32
 *                          lanes read 512 contiguous bytes
 *   W::load(row, c)        chunk c of a row, streamed past L1 (each weight is read once a step)
 *   W::to_f32(chunk, f)    its VALS weights as fp32, in the order of the row
 *   W::dot(chunk, x)       its weights dotted with their VALS inputs, fp32 (x(p): the p-th float4
 *                          of them, p < VALS / 4, loaded when the format asks): the matvec core's
 *                          inner product, where a format folds its scale in once a chunk
 *   W::word(chunk)         one 32-bit word of it (load_lots' exit test reads the lot's data)
 *   W::BF16                the tensor cores' input type of the prompt's GEMMs (bf16, else fp16):
 *                          the GEMM cores take dense 16-bit formats only (W::DENSE16); a quantized
 *                          format reaches them as tiles dequantized to one of these.
 *
 * The matvec's staged input is laid out for the chunk (stage_input, sx_group): chunk c's VALS
 * inputs are the float4s c, K / VALS + c, ... (VALS / 4 planes), so that a warp's lanes read
 * consecutive float4s of each plane, no two lanes of a quarter-warp in one bank.
 *
 * Vectors (norm weights, biases, the embedding rows) stay in the model's 16-bit dtype whatever the
 * matrices' format: they are a fraction of a percent of the bytes (w_to_f32). */
#ifndef INGOT_CUDA_WEIGHTS_CUH
#define INGOT_CUDA_WEIGHTS_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

/* GPU_W_BF16: the weights on the device are bf16 (uploaded in their own dtype; converting bf16 to
 * fp16 on upload lost the 1B's decode 1.5% at depth 0: docs/performance.md, D98) */
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define GPU_W_BF16 1
#else
#define GPU_W_BF16 0
#endif

/* Streaming loads: each weight is read once per step, keep it out of L1. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) { return __ldcs(p); }

/* 8 fp16 values (the KV cache, fp16 weights) in a uint4, to fp32 */
__device__ __forceinline__ void h8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

/* 8 bf16 values in a uint4, to fp32: a bf16 is the high half of its fp32 */
__device__ __forceinline__ void b8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

/* Dense 16-bit weights, bf16 (IS_BF16) or fp16: rows of K values, 8 a chunk. */
template <bool IS_BF16>
struct w16 {
    static constexpr bool DENSE16 = true;
    static constexpr bool BF16 = IS_BF16;
    static constexpr int VALS = 8;
    using mat = const uint16_t *;
    using row_t = const uint4 *;
    using chunk = uint4;
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) { return reinterpret_cast<row_t>(m + (size_t)r * K); }
    __device__ __forceinline__ static chunk load(row_t row, int c) { return ld_stream(row + c); }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        if constexpr (IS_BF16)
            b8_to_f32(u, f);
        else
            h8_to_f32(u, f);
    }
    template <typename X>
    __device__ __forceinline__ static float dot(chunk u, X x) {
        float w[VALS];
        to_f32(u, w);
        const float4 a = x(0), b = x(1);
        return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.x; }
};
using w_bf16 = w16<true>;
using w_f16 = w16<false>;

/* GGUF's Q8_0 (blocks of 32 int8 values q and an fp16 scale d; a weight is d * q in fp32, as
 * gguf's dequantizer and ggml compute it), repacked on upload for 16-byte loads: a matrix's values
 * as int8 (rows, K) and its scales as fp16 (rows, K / 32), apart. A chunk is half a block: 16
 * values and their block's scale, which two lanes read (1.0625 bytes a weight). K a multiple of 32. */
struct w_q8_0 {
    static constexpr bool DENSE16 = false;
    static constexpr bool BF16 = false;
    static constexpr int VALS = 16;
    static constexpr int BLOCK = 32;
    struct mat {
        const int8_t *q;
        const __half *d;
    };
    struct row_t {
        const uint4 *q;
        const unsigned short *d;
    };
    struct chunk {
        uint4 q;
        unsigned short d;
    };
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) {
        return {reinterpret_cast<const uint4 *>(m.q + (size_t)r * K), reinterpret_cast<const unsigned short *>(m.d) + (size_t)r * (K / BLOCK)};
    }
    __device__ __forceinline__ static chunk load(row_t row, int c) { return {ld_stream(row.q + c), __ldcs(row.d + c / 2)}; }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        const float d = __half2float(__ushort_as_half(u.d));
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) f[4 * i + b] = d * (float)(int8_t)(w[i] >> (8 * b));
    }
    /* sum_i q_i x_i in fp32, then times d once: q_i as fp32 by the byte-in-mantissa trick (q_i + 128
     * into the low byte of 2^23's mantissa, 2^23 + 128 taken off: exact), one byte permute and one
     * add a weight where I2F runs at a quarter of the FMA rate */
    template <typename X>
    __device__ __forceinline__ static float dot(chunk u, X x) {
        const uint32_t w[4] = {u.q.x ^ 0x80808080u, u.q.y ^ 0x80808080u, u.q.z ^ 0x80808080u, u.q.w ^ 0x80808080u};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float q0 = __int_as_float(__byte_perm(w[i], 0x4B000000u, 0x7440)) - 8388736.0f;
            const float q1 = __int_as_float(__byte_perm(w[i], 0x4B000000u, 0x7441)) - 8388736.0f;
            const float q2 = __int_as_float(__byte_perm(w[i], 0x4B000000u, 0x7442)) - 8388736.0f;
            const float q3 = __int_as_float(__byte_perm(w[i], 0x4B000000u, 0x7443)) - 8388736.0f;
            const float4 v = x(i);
            s += q0 * v.x + q1 * v.y + q2 * v.z + q3 * v.w;
        }
        return __half2float(__ushort_as_half(u.d)) * s;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }
};

/* The model's matrices' format: what forward_cuda.cu instantiates the cores with. */
using model_w = std::conditional_t<GPU_W_BF16, w_bf16, w_f16>;

/* One value of the model's 16-bit dtype (vectors: norm weights, biases, embedding rows), to fp32 */
__device__ __forceinline__ float w_to_f32(uint16_t u) {
#if GPU_W_BF16
    return __uint_as_float((uint32_t)u << 16);
#else
    return __half2float(__ushort_as_half(u));
#endif
}

#endif /* INGOT_CUDA_WEIGHTS_CUH */
